"""The :class:`Version` type (Semantic Versioning 2.0.0)."""

from __future__ import annotations

import re
from typing import NamedTuple

_VERSION_RE = re.compile(
    r"""
    (?P<major>0|[1-9]\d*)\.(?P<minor>0|[1-9]\d*)\.(?P<patch>0|[1-9]\d*)
    (?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?
    (?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?
    """,
    re.VERBOSE,
)


class InvalidVersion(ValueError):
    """The text is not a valid semantic version."""


def _compare_prerelease(left: tuple[str, ...], right: tuple[str, ...]) -> int:
    """Compare two pre-release tuples; an empty tuple (a release) ranks highest."""
    if left == right:
        return 0
    if not left:
        return 1
    if not right:
        return -1
    for a, b in zip(left, right):
        if a != b:
            return -1 if a < b else 1
    return -1 if len(left) < len(right) else 1


class Version(NamedTuple("_Version", [("major", int), ("minor", int), ("patch", int),
                                      ("prerelease", tuple), ("build", tuple)])):
    """A parsed version.  Ordering ignores build metadata, as the spec requires.

    The comparison operators are all defined here: the ones inherited from
    ``tuple`` would compare field by field, which is wrong for pre-releases.
    """

    @classmethod
    def parse(cls, text: str) -> Version:
        match = _VERSION_RE.fullmatch(text.strip().lstrip("v"))
        if match is None:
            raise InvalidVersion(f"invalid version: {text!r}")
        pre = tuple(match["pre"].split(".")) if match["pre"] else ()
        for part in pre:
            if part.isdigit() and len(part) > 1 and part.startswith("0"):
                raise InvalidVersion(f"leading zero in pre-release identifier: {text!r}")
        build = tuple(match["build"].split(".")) if match["build"] else ()
        return cls(int(match["major"]), int(match["minor"]), int(match["patch"]), pre, build)

    @classmethod
    def coerce(cls, value: Version | str) -> Version:
        return value if isinstance(value, Version) else cls.parse(value)

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def _compare(self, other: Version) -> int:
        mine, theirs = self[:3], other[:3]
        if mine != theirs:
            return -1 if mine < theirs else 1
        return _compare_prerelease(self.prerelease, other.prerelease)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._compare(other) == 0

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._compare(other) != 0

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._compare(other) < 0

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._compare(other) <= 0

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._compare(other) > 0

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._compare(other) >= 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.prerelease))

    @property
    def is_prerelease(self) -> bool:
        return bool(self.prerelease)

    def bump_major(self) -> Version:
        return Version(self.major + 1, 0, 0, (), ())

    def bump_minor(self) -> Version:
        return Version(self.major, self.minor + 1, 0, (), ())

    def bump_patch(self) -> Version:
        if self.prerelease:  # 1.2.3-rc.1 -> 1.2.3
            return Version(self.major, self.minor, self.patch, (), ())
        return Version(self.major, self.minor, self.patch + 1, (), ())
