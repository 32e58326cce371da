"""Matching paths against one pattern or an ordered set of patterns."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from .translate import compile_glob


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str, case_sensitive: bool) -> re.Pattern[str]:
    return compile_glob(pattern, case_sensitive=case_sensitive)


def _normalize(path: str) -> str:
    path = path.replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path.strip("/")


def match(pattern: str, path: str, *, case_sensitive: bool = True) -> bool:
    """True when the whole of ``path`` matches ``pattern``.

    A pattern without ``/`` is matched against the last path segment only,
    so ``*.py`` matches ``pkg/mod.py``.
    """
    path = _normalize(path)
    if "/" not in pattern.strip("/"):
        path = path.rsplit("/", 1)[-1]
    pattern = pattern.strip("/")
    return _compiled(pattern, case_sensitive).fullmatch(path) is not None


class PatternSet:
    """Ordered include/exclude patterns; ``!pattern`` excludes, the last match wins."""

    def __init__(self, patterns: Iterable[str], *, case_sensitive: bool = True) -> None:
        self.rules: list[tuple[bool, str]] = []
        self.case_sensitive = case_sensitive
        for raw in patterns:
            raw = raw.strip()
            if not raw or raw.startswith("#"):
                continue
            if raw.startswith("!"):
                self.rules.append((False, raw[1:]))
            else:
                self.rules.append((True, raw))

    def matches(self, path: str) -> bool:
        result = False
        for include, pattern in self.rules:
            if match(pattern, path, case_sensitive=self.case_sensitive):
                result = include
        return result


def filter_paths(patterns: Iterable[str], paths: Iterable[str], **options: bool) -> list[str]:
    """The paths that the pattern set selects, in their original order."""
    selector = PatternSet(patterns, **options)
    return [path for path in paths if selector.matches(path)]
