"""The inclusive :class:`DateRange` value."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta


@dataclass(frozen=True)
class DateRange:
    """All days from ``start`` to ``end``, both included."""

    start: date
    end: date

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"range ends ({self.end}) before it starts ({self.start})")

    def __len__(self) -> int:
        return (self.end - self.start).days + 1

    def __contains__(self, day: object) -> bool:
        return isinstance(day, date) and self.start <= day <= self.end

    def __iter__(self) -> Iterator[date]:
        return self.days()

    def days(self, step: int = 1) -> Iterator[date]:
        if step < 1:
            raise ValueError("step must be positive")
        day = self.start
        while day <= self.end:
            yield day
            day += timedelta(days=step)

    def overlaps(self, other: DateRange) -> bool:
        return self.start <= other.end and other.start <= self.end

    def intersection(self, other: DateRange) -> DateRange | None:
        if not self.overlaps(other):
            return None
        return DateRange(max(self.start, other.start), min(self.end, other.end))

    def shift(self, days: int) -> DateRange:
        delta = timedelta(days=days)
        return DateRange(self.start + delta, self.end + delta)

    def __str__(self) -> str:
        if self.start == self.end:
            return self.start.isoformat()
        return f"{self.start.isoformat()}..{self.end.isoformat()}"
