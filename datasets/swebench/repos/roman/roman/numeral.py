"""``Roman``: an ``int`` subclass that prints as a Roman numeral."""

from __future__ import annotations

from .convert import from_roman, to_roman


class Roman(int):
    """An integer in the Roman range; arithmetic stays ``Roman`` when it can.

    ``Roman("XIV")`` and ``Roman(14)`` are equal.  Results outside the range
    raise :class:`~roman.RomanError`, like the conversion functions.
    """

    def __new__(cls, value: int | str) -> Roman:
        number = from_roman(value) if isinstance(value, str) else int(value)
        to_roman(number)  # validates the range
        return super().__new__(cls, number)

    def __str__(self) -> str:
        return to_roman(int(self))

    def __repr__(self) -> str:
        return f"Roman({str(self)!r})"

    def __add__(self, other: object) -> Roman:
        if not isinstance(other, int):
            return NotImplemented
        return Roman(int(self) + int(other))

    __radd__ = __add__

    def __sub__(self, other: object) -> Roman:
        if not isinstance(other, int):
            return NotImplemented
        return Roman(int(self) - int(other))

    def __mul__(self, other: object) -> Roman:
        if not isinstance(other, int):
            return NotImplemented
        return Roman(int(self) * int(other))

    __rmul__ = __mul__
