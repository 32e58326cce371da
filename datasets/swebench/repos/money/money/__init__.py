"""Money formatting and parsing on top of ``decimal``."""

from .currency import CURRENCIES, Currency, UnknownCurrency, get_currency
from .format import format_money, parse_money, quantize, split_evenly

__all__ = [
    "CURRENCIES",
    "Currency",
    "UnknownCurrency",
    "format_money",
    "get_currency",
    "parse_money",
    "quantize",
    "split_evenly",
]
