"""URL query strings."""

from .build import build, quote
from .parse import QueryError, parse, parse_pairs, unquote

__all__ = ["QueryError", "build", "parse", "parse_pairs", "quote", "unquote"]
