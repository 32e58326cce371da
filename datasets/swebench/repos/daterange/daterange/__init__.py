"""Date range expressions."""

from .parse import DateRangeError, parse_period, parse_range
from .range import DateRange

__all__ = ["DateRange", "DateRangeError", "parse_period", "parse_range"]
