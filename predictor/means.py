"""A mean kept in O(1) per value: the estimators the serving policies and the program
schedulers learn their running figures with (a turn's output, a prompt's growth, a wait).

Why here, below the server: the policies (`server.policies`) and the program schedulers
(`server.programs`) both learn such figures and neither may import the other; this floor holds
what both stand on.
"""

from __future__ import annotations

from collections import deque


class SlidingMean:
    """The mean of the last `window` values, in O(1) per value; with `window` None, of every
    value added (only their sum and count are kept, so memory stays bounded either way)."""

    __slots__ = ("_count", "_sum", "_values")

    def __init__(self, window: int | None) -> None:
        self._values: deque[float] | None = deque(maxlen=window) if window is not None else None
        self._sum = 0.0
        self._count = 0

    def add(self, x: float) -> None:
        values = self._values
        if values is not None:
            if len(values) == values.maxlen:
                self._sum -= values[0]
                self._count -= 1
            values.append(x)
        self._sum += x
        self._count += 1

    def __len__(self) -> int:
        return self._count

    @property
    def total(self) -> float:
        """The sum of the values the mean is over (a caller that scales the mean multiplies
        this before dividing by `len`, where the order of the float operations matters)."""
        return self._sum

    def mean(self, default: float) -> float:
        return self._sum / self._count if self._count else default
