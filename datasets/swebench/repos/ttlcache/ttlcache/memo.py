"""Memoizing functions with a :class:`TTLCache`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from .cache import TTLCache

F = TypeVar("F", bound=Callable[..., Any])

_KWARGS_MARK = object()


def make_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
    """A hashable key for a call; keyword order does not matter."""
    if not kwargs:
        return args
    return (*args, _KWARGS_MARK, *sorted(kwargs.items()))


def memoize(cache: TTLCache = TTLCache(maxsize=256), *, key: Callable[..., Hashable] | None = None):
    """Decorator: remember results of the decorated function in ``cache``.

    ``key(*args, **kwargs)`` may compute the cache key; by default all
    arguments are used.  The wrapper has ``cache`` and ``uncached`` attributes.
    """

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            cache_key = key(*args, **kwargs) if key is not None else make_key(args, kwargs)
            marker = object()
            result = cache.get(cache_key, marker)
            if result is marker:
                result = function(*args, **kwargs)
                cache.set(cache_key, result)
            return result

        wrapper.cache = cache  # type: ignore[attr-defined]
        wrapper.uncached = function  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate
