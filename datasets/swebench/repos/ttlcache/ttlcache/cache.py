"""The :class:`TTLCache` container."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    expirations: int = 0


class TTLCache:
    """A mapping of at most ``maxsize`` entries; entries may expire.

    ``ttl`` (seconds) is the default lifetime of an entry; ``None`` means
    entries only leave when evicted.  Reads count as uses for the LRU order.
    """

    def __init__(
        self,
        maxsize: int = 128,
        ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self.ttl = ttl
        self.clock = clock
        self.stats = CacheStats()
        self._data: OrderedDict[Hashable, tuple[Any, float | None]] = OrderedDict()

    def _expired(self, deadline: float | None) -> bool:
        return deadline is not None and self.clock() >= deadline

    def get(self, key: Hashable, default: Any = None) -> Any:
        entry = self._data.get(key, _MISSING)
        if entry is _MISSING:
            self.stats.misses += 1
            return default
        value, deadline = entry
        if self._expired(deadline):
            del self._data[key]
            self.stats.expirations += 1
            self.stats.misses += 1
            return default
        self._data.move_to_end(key)
        self.stats.hits += 1
        return value

    def set(self, key: Hashable, value: Any, ttl: float | None = _MISSING) -> None:  # type: ignore[assignment]
        lifetime = self.ttl if ttl is _MISSING else ttl
        deadline = None if lifetime is None else self.clock() + lifetime
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = (value, deadline)
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)
            self.stats.evictions += 1

    def delete(self, key: Hashable) -> bool:
        return self._data.pop(key, _MISSING) is not _MISSING

    def purge(self) -> int:
        """Drop all expired entries; return how many were dropped."""
        dead = [key for key, (_, deadline) in self._data.items() if self._expired(deadline)]
        for key in dead:
            del self._data[key]
        self.stats.expirations += len(dead)
        return len(dead)

    def clear(self) -> None:
        self._data.clear()

    def __contains__(self, key: object) -> bool:
        entry = self._data.get(key, _MISSING)  # type: ignore[arg-type]
        return entry is not _MISSING and not self._expired(entry[1])

    def __len__(self) -> int:
        return sum(1 for _, deadline in self._data.values() if not self._expired(deadline))

    def keys(self) -> list[Hashable]:
        """Live keys, least recently used first."""
        return [key for key, (_, deadline) in self._data.items() if not self._expired(deadline)]
