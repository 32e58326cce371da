"""Roman numerals: conversion functions and a small integer type."""

from .convert import MAX_VALUE, MIN_VALUE, RomanError, from_roman, is_roman, to_roman
from .numeral import Roman

__all__ = [
    "MAX_VALUE",
    "MIN_VALUE",
    "Roman",
    "RomanError",
    "from_roman",
    "is_roman",
    "to_roman",
]
__version__ = "0.3.0"
