"""The ended programs a policy remembers: a policy lives as long as the server, so what it
remembers about ended programs must not grow without bound. One place for the bound, shared by
the policies that remember (their sliding means are `predictor.means.SlidingMean`, which the
program schedulers use too).
"""

from __future__ import annotations

from collections import OrderedDict

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
