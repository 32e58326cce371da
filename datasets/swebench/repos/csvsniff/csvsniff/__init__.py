"""Sniff the dialect of delimited text."""

from .reader import read_rows
from .sniffer import DEFAULT_CANDIDATES, Dialect, SniffError, sniff

__all__ = ["DEFAULT_CANDIDATES", "Dialect", "SniffError", "read_rows", "sniff"]
