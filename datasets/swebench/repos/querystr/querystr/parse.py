"""Decoding query strings."""

from __future__ import annotations

_HEX = "0123456789abcdefABCDEF"


class QueryError(ValueError):
    """Malformed input in strict mode."""


def unquote(text: str, *, plus_is_space: bool = True, strict: bool = False) -> str:
    """Decode ``%XX`` escapes (UTF-8) and, for form data, ``+`` as a space.

    Invalid escapes are kept literally unless ``strict`` is true; invalid UTF-8
    becomes U+FFFD.
    """
    data = bytearray()
    index = 0
    while index < len(text):
        char = text[index]
        if char == "%":
            digits = text[index + 1:index + 3]
            if len(digits) == 2 and all(d in _HEX for d in digits):
                data.append(int(digits, 16))
                index += 3
                continue
            if strict:
                raise QueryError(f"invalid percent escape at position {index} in {text!r}")
        data.extend(char.encode("utf-8"))
        index += 1
    decoded = data.decode("utf-8", errors="replace")
    if plus_is_space:
        decoded = decoded.replace("+", " ")
    return decoded


def parse_pairs(query: str, *, keep_blank: bool = False, strict: bool = False) -> list[tuple[str, str]]:
    """The ``(key, value)`` pairs of ``query`` in order; a leading ``?`` is ignored.

    Pairs are separated by ``&`` (or ``;``).  A pair without ``=`` has an empty
    value.  Pairs with an empty value are dropped unless ``keep_blank``.
    """
    query = query.lstrip("?")
    pairs: list[tuple[str, str]] = []
    for chunk in query.replace(";", "&").split("&"):
        if not chunk:
            continue
        if "=" not in chunk and strict:
            raise QueryError(f"missing '=' in {chunk!r}")
        raw_key, _, raw_value = chunk.partition("=")
        key = unquote(raw_key, strict=strict)
        value = unquote(raw_value, strict=strict)
        if value or keep_blank:
            pairs.append((key, value))
    return pairs


def parse(query: str, *, keep_blank: bool = False, strict: bool = False) -> dict[str, list[str]]:
    """Parse ``query`` into ``{key: [values...]}``, keys in first-seen order."""
    result: dict[str, list[str]] = {}
    for key, value in parse_pairs(query, keep_blank=keep_blank, strict=strict):
        result.setdefault(key, []).append(value)
    return result
