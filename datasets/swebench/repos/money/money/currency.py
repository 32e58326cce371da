"""The built-in currency table."""

from __future__ import annotations

from typing import NamedTuple


class Currency(NamedTuple):
    code: str
    symbol: str
    decimals: int
    symbol_first: bool = True
    thousands: str = ","
    decimal_point: str = "."


class UnknownCurrency(KeyError):
    """The currency code is not in the table."""


CURRENCIES: dict[str, Currency] = {
    c.code: c
    for c in (
        Currency("USD", "$", 2),
        Currency("GBP", "£", 2),
        Currency("EUR", "€", 2, symbol_first=False, thousands=".", decimal_point=","),
        Currency("CHF", "CHF", 2, thousands="'"),
        Currency("JPY", "¥", 0),
        Currency("KWD", "KD", 3),
    )
}


def get_currency(code: str | Currency) -> Currency:
    if isinstance(code, Currency):
        return code
    try:
        return CURRENCIES[code.upper()]
    except KeyError:
        raise UnknownCurrency(code) from None
