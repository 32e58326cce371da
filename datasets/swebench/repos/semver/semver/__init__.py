"""Semantic versions: parsing, ordering and requirement matching."""

from .spec import Requirement, max_satisfying, satisfies
from .version import InvalidVersion, Version

__all__ = ["InvalidVersion", "Requirement", "Version", "max_satisfying", "satisfies"]
