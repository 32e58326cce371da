"""Glob matching for slash-separated paths."""

from .matcher import PatternSet, filter_paths, match
from .translate import GlobError, translate

__all__ = ["GlobError", "PatternSet", "filter_paths", "match", "translate"]
