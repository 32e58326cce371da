"""Requirement strings: ``>=1.2.0 <2.0.0``, ``^1.2``, ``~1.4.2``, ``=1.0.0``.

A requirement is a blank-separated list of comparators that must all hold.
``^X.Y.Z`` allows changes that do not modify the left-most non-zero part;
``~X.Y.Z`` allows patch-level changes.  Missing minor or patch parts are 0.
Pre-releases only match comparators that name a pre-release of the same
``major.minor.patch``, so ``>=1.0.0`` does not match ``2.0.0-alpha``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .version import Version

_COMPARATOR_RE = re.compile(r"(>=|<=|>|<|=|\^|~)?v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(-[0-9A-Za-z.-]+)?")


class Requirement:
    def __init__(self, text: str) -> None:
        self.text = text
        self.comparators: list[tuple[str, Version]] = []
        for token in text.split():
            match = _COMPARATOR_RE.fullmatch(token)
            if match is None:
                raise ValueError(f"invalid comparator {token!r} in {text!r}")
            op, major, minor, patch, pre = match.groups()
            base = Version.parse(f"{major}.{minor or 0}.{patch or 0}{pre or ''}")
            self.comparators.extend(self._expand(op or "=", base, minor, patch))
        if not self.comparators:
            raise ValueError("empty requirement")

    @staticmethod
    def _expand(op: str, base: Version, minor: str | None, patch: str | None):
        if op == "^":
            if base.major:
                upper = base.bump_major()
            elif base.minor or minor is None:
                upper = Version(0, base.minor + 1 if minor is not None else 1, 0, (), ())
            else:
                upper = Version(0, 0, base.patch + 1, (), ())
            return [(">=", base), ("<", upper)]
        if op == "~":
            upper = base.bump_major() if minor is None else base.bump_minor()
            return [(">=", base), ("<", upper)]
        return [(op, base)]

    def matches(self, version: Version | str) -> bool:
        version = Version.coerce(version)
        if version.prerelease and not any(
            bound.prerelease and bound[:3] == version[:3] for _, bound in self.comparators
        ):
            return False
        for op, bound in self.comparators:
            ok = {
                "=": version == bound,
                ">": version > bound,
                ">=": version >= bound,
                "<": version < bound,
                "<=": version <= bound,
            }[op]
            if not ok:
                return False
        return True

    def __repr__(self) -> str:
        return f"Requirement({self.text!r})"


def satisfies(version: Version | str, requirement: str) -> bool:
    return Requirement(requirement).matches(version)


def max_satisfying(versions: Iterable[Version | str], requirement: str) -> str | None:
    req = Requirement(requirement)
    candidates = [Version.coerce(v) for v in versions]
    matching = [v for v in candidates if req.matches(v)]
    return str(max(matching)) if matching else None
