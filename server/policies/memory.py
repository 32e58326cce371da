"""Bounded memories the policies keep: a policy lives as long as the server, so what it
remembers about ended programs, and the recent samples it averages, must not grow without
bound. One place for the bound and the two shapes, shared by the policies that use them.
"""

from __future__ import annotations

from collections import OrderedDict, deque

#: ended program ids a policy remembers, so a late finish or event of an ended program is
#: not taken for a new one; the least recently ended are forgotten first
ENDED_MEMORY = 65_536


class RecentIds:
    """A set of at most `limit` ids; adding one beyond it forgets the oldest added."""

    __slots__ = ("_ids", "limit")

    def __init__(self, limit: int = ENDED_MEMORY) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self.limit = limit

    def add(self, item: str) -> None:
        self._ids[item] = None
        self._ids.move_to_end(item)
        while len(self._ids) > self.limit:
            self._ids.popitem(last=False)

    def discard(self, item: str) -> None:
        self._ids.pop(item, None)

    def __contains__(self, item: object) -> bool:
        return item in self._ids

    def __len__(self) -> int:
        return len(self._ids)


class SlidingMean:
    """The mean of the last `window` values, in O(1) per value."""

    __slots__ = ("_values", "_sum")

    def __init__(self, window: int) -> None:
        self._values: deque[float] = deque(maxlen=window)
        self._sum = 0.0

    def add(self, x: float) -> None:
        if len(self._values) == self._values.maxlen:
            self._sum -= self._values[0]
        self._values.append(x)
        self._sum += x

    def __len__(self) -> int:
        return len(self._values)

    def mean(self, default: float) -> float:
        return self._sum / len(self._values) if self._values else default
