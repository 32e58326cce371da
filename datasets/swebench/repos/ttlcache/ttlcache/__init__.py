"""LRU cache with time-to-live."""

from .cache import CacheStats, TTLCache
from .memo import make_key, memoize

__all__ = ["CacheStats", "TTLCache", "make_key", "memoize"]
