"""Read INI-style configuration text into a :class:`Config`."""

from .config import Config, ConfigError, MissingOption
from .parser import load, parse

__all__ = ["Config", "ConfigError", "MissingOption", "load", "parse"]
