"""Translate a glob pattern into a regular expression."""

from __future__ import annotations

import re


class GlobError(ValueError):
    """The pattern is malformed (for example an unclosed ``[``)."""


def _translate_class(pattern: str, start: int) -> tuple[str, int]:
    """Translate the ``[...]`` starting at ``start``; return (regex, index after it)."""
    index = start + 1
    negate = index < len(pattern) and pattern[index] in "!^"
    if negate:
        index += 1
    body_start = index
    if index < len(pattern) and pattern[index] == "]":  # a leading ] is literal
        index += 1
    while index < len(pattern) and pattern[index] != "]":
        index += 1
    if index >= len(pattern):
        raise GlobError(f"unclosed character class in {pattern!r}")
    body = pattern[body_start:index].replace("\\", "\\\\").replace("^", "\\^")
    body = body.replace("[", "\\[").replace("]", "\\]")
    if negate:
        return f"[^/{body}]", index + 1
    return f"[{body}]", index + 1


def translate(pattern: str) -> str:
    """Return a regex (without anchors) equivalent to ``pattern``."""
    if not pattern:
        raise GlobError("empty pattern")
    out: list[str] = []
    index = 0
    length = len(pattern)
    while index < length:
        char = pattern[index]
        if char == "*":
            if pattern.startswith("**", index):
                at_segment_start = index == 0 or pattern[index - 1] == "/"
                end = index + 2
                if at_segment_start and pattern.startswith("/", end):
                    out.append(".*/")
                    index = end + 1
                    continue
                if at_segment_start and end == length:
                    out.append(".*")
                    index = end
                    continue
                raise GlobError(f"'**' must be a whole path segment in {pattern!r}")
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            regex, index = _translate_class(pattern, index)
            out.append(regex)
            continue
        else:
            out.append(re.escape(char))
        index += 1
    return "".join(out)


def compile_glob(pattern: str, *, case_sensitive: bool = True) -> re.Pattern[str]:
    flags = 0 if case_sensitive else re.IGNORECASE
    return re.compile(translate(pattern), flags)
