"""Encoding query strings."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Union

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

Params = Union[Mapping[str, Any], Iterable[tuple[str, Any]]]


def quote(text: str, *, safe: str = "", space_as_plus: bool = True) -> str:
    """Percent-encode ``text`` as UTF-8; spaces become ``+`` for form data."""
    out: list[str] = []
    for char in text:
        if char in _UNRESERVED or char in safe:
            out.append(char)
        elif char == " " and space_as_plus:
            out.append("+")
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8"))
    return "".join(out)


def _text(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def build(params: Params, *, skip_none: bool = True) -> str:
    """Encode ``params``; list or tuple values repeat the key, ``None`` values are skipped."""
    items = params.items() if isinstance(params, Mapping) else params
    parts: list[str] = []
    for key, value in items:
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if item is None and skip_none:
                continue
            parts.append(f"{quote(str(key))}={quote(_text('' if item is None else item))}")
    return "&".join(parts)
