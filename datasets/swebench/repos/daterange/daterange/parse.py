"""Parsing of range expressions (see the README for the syntax)."""

from __future__ import annotations

import re
from datetime import date, timedelta

from .range import DateRange

_DAY_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_MONTH_RE = re.compile(r"(\d{4})-(\d{2})")
_QUARTER_RE = re.compile(r"(\d{4})-[Qq]([1-4])")
_YEAR_RE = re.compile(r"(\d{4})")
_SPAN_RE = re.compile(r"(\d{4}-\d{2}-\d{2})\+(\d+)")


class DateRangeError(ValueError):
    """The expression is not a valid date range."""


def _month_range(year: int, month: int) -> DateRange:
    first = date(year, month, 1)
    last = date(year, month + 1, 1) - timedelta(days=1)
    return DateRange(first, last)


def parse_period(text: str) -> DateRange:
    """Parse a single period: a day, month, quarter or year."""
    text = text.strip()
    try:
        match = _DAY_RE.fullmatch(text)
        if match:
            day = date(*map(int, match.groups()))
            return DateRange(day, day)
        match = _MONTH_RE.fullmatch(text)
        if match:
            year, month = map(int, match.groups())
            if not 1 <= month <= 12:
                raise DateRangeError(f"month out of range in {text!r}")
            return _month_range(year, month)
        match = _QUARTER_RE.fullmatch(text)
        if match:
            year, quarter = map(int, match.groups())
            first_month = 3 * (quarter - 1) + 1
            start = _month_range(year, first_month).start
            end = _month_range(year, first_month + 2).end
            return DateRange(start, end)
        match = _YEAR_RE.fullmatch(text)
        if match:
            year = int(match.group(1))
            return DateRange(date(year, 1, 1), date(year, 12, 31))
    except DateRangeError:
        raise
    except ValueError as exc:
        raise DateRangeError(f"invalid date in {text!r}: {exc}") from None
    raise DateRangeError(f"not a day, month, quarter or year: {text!r}")


def parse_range(text: str) -> DateRange:
    """Parse a period, ``A..B`` (start of A to end of B) or ``DAY+N`` (N days)."""
    text = text.strip()
    span = _SPAN_RE.fullmatch(text)
    if span:
        count = int(span.group(2))
        if count < 1:
            raise DateRangeError(f"a span needs at least one day: {text!r}")
        start = parse_period(span.group(1)).start
        return DateRange(start, start + timedelta(days=count - 1))
    if ".." in text:
        left, _, right = text.partition("..")
        if not left.strip() or not right.strip():
            raise DateRangeError(f"open-ended ranges are not supported: {text!r}")
        start, end = parse_period(left).start, parse_period(right).end
        if end < start:
            raise DateRangeError(f"range ends before it starts: {text!r}")
        return DateRange(start, end)
    return parse_period(text)
