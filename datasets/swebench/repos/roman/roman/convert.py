"""Conversion between ``int`` and Roman numeral strings.

Only the standard subtractive form is produced, and by default only that
form is accepted when parsing (``IIII`` and ``IC`` are rejected).  Pass
``strict=False`` to :func:`from_roman` to add up any sequence of symbols.
"""

from __future__ import annotations

import re

MIN_VALUE = 1
MAX_VALUE = 3999

_SYMBOLS = (
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
)

_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}

_CANONICAL = re.compile(r"M{0,3}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})")


class RomanError(ValueError):
    """A number outside the supported range, or a malformed numeral."""


def to_roman(number: int) -> str:
    """Return the canonical Roman numeral for ``number`` (1..3999)."""
    if isinstance(number, bool) or not isinstance(number, int):
        raise TypeError(f"expected an int, got {type(number).__name__}")
    if not MIN_VALUE <= number < MAX_VALUE:
        raise RomanError(f"{number} is out of range ({MIN_VALUE}..{MAX_VALUE})")
    parts = []
    for value, symbol in _SYMBOLS:
        count, number = divmod(number, value)
        parts.append(symbol * count)
    return "".join(parts)


def from_roman(numeral: str, *, strict: bool = True) -> int:
    """Return the value of ``numeral``; case and surrounding blanks are ignored."""
    if not isinstance(numeral, str):
        raise TypeError(f"expected a str, got {type(numeral).__name__}")
    text = numeral.strip().upper()
    if not text:
        raise RomanError("empty numeral")
    unknown = sorted(set(text) - set(_VALUES))
    if unknown:
        raise RomanError(f"{numeral!r} contains non-Roman characters: {''.join(unknown)}")
    if strict and not _CANONICAL.fullmatch(text):
        raise RomanError(f"{numeral!r} is not a canonical Roman numeral")
    total = 0
    for index, char in enumerate(text):
        value = _VALUES[char]
        following = _VALUES[text[index + 1]] if index + 1 < len(text) else 0
        total += -value if value < following else value
    return total


def is_roman(numeral: str) -> bool:
    """True when ``numeral`` is a canonical Roman numeral."""
    try:
        from_roman(numeral)
    except (RomanError, TypeError):
        return False
    return True
