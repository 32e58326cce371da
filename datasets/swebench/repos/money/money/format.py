"""Formatting, parsing and splitting amounts."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from .currency import CURRENCIES, Currency, get_currency


def quantize(amount: Decimal | int | str, currency: str | Currency = "USD") -> Decimal:
    """Round ``amount`` to the currency's minor unit (half away from zero)."""
    cur = get_currency(currency)
    value = Decimal(amount) if not isinstance(amount, Decimal) else amount
    if not value.is_finite():
        raise ValueError(f"not a finite amount: {amount!r}")
    exponent = Decimal(1).scaleb(-cur.decimals)
    return value.quantize(exponent)


def _group(digits: str, separator: str) -> str:
    head = len(digits) % 3 or 3
    groups = [digits[:head]] + [digits[i:i + 3] for i in range(head, len(digits), 3)]
    return separator.join(groups)


def format_money(
    amount: Decimal | int | str,
    currency: str | Currency = "USD",
    *,
    grouping: bool = True,
    symbol: bool = True,
) -> str:
    """Format ``amount`` with the currency's symbol, separators and minor unit."""
    cur = get_currency(currency)
    value = quantize(amount, cur)
    negative = value < 0
    text = f"{abs(value):f}"
    whole, _, fraction = text.partition(".")
    if grouping:
        whole = _group(whole, cur.thousands)
    number = whole + (cur.decimal_point + fraction if cur.decimals else "")
    if symbol:
        number = f"{cur.symbol}{number}" if cur.symbol_first else f"{number} {cur.symbol}"
        if cur.symbol.isalpha() and cur.symbol_first:
            number = number.replace(cur.symbol, cur.symbol + " ", 1)
    return ("-" if negative else "") + number


def parse_money(text: str, default_currency: str = "USD") -> tuple[Decimal, str]:
    """Parse output of :func:`format_money` (or similar) back into ``(amount, code)``."""
    raw = text.strip()
    negative = raw.startswith("-") or (raw.startswith("(") and raw.endswith(")"))
    raw = raw.strip("-()").strip()
    code = default_currency.upper()
    for cur in sorted(CURRENCIES.values(), key=lambda c: -len(c.symbol)):
        if raw.startswith(cur.symbol) or raw.endswith(cur.symbol) or raw.startswith(cur.code):
            code = cur.code
            raw = raw.replace(cur.code, "").replace(cur.symbol, "").strip()
            break
    cur = CURRENCIES[code]
    raw = raw.replace(cur.thousands, "").replace(cur.decimal_point, ".")
    if not re.fullmatch(r"\d+(\.\d+)?", raw):
        raise ValueError(f"cannot parse money amount: {text!r}")
    try:
        value = Decimal(raw)
    except InvalidOperation:  # pragma: no cover - the regex already checked
        raise ValueError(f"cannot parse money amount: {text!r}") from None
    return (-value if negative else value), code


def split_evenly(amount: Decimal | int | str, parts: int, currency: str = "USD") -> list[Decimal]:
    """Split into ``parts`` amounts that differ by at most one minor unit and add up exactly."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    cur = get_currency(currency)
    total = quantize(amount, cur)
    unit = Decimal(1).scaleb(-cur.decimals)
    units = int(total / unit)
    base, extra = divmod(abs(units), parts)
    sign = -1 if units < 0 else 1
    return [sign * (base + (1 if i < extra else 0)) * unit for i in range(parts)]
