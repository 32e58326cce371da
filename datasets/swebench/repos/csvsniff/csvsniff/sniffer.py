"""Dialect detection."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

DEFAULT_CANDIDATES = ",;\t|"
_NUMBER_RE = re.compile(r"[-+]?(\d+([.,]\d*)?|[.,]\d+)([eE][-+]?\d+)?")


class SniffError(ValueError):
    """No consistent delimiter could be found."""


@dataclass(frozen=True)
class Dialect:
    delimiter: str
    quotechar: str = '"'
    has_header: bool = False
    line_terminator: str = "\n"


def _lines(sample: str, limit: int) -> list[str]:
    return [line for line in sample.splitlines() if line.strip()][:limit]


def _line_terminator(sample: str) -> str:
    if "\r\n" in sample:
        return "\r\n"
    if "\r" in sample:
        return "\r"
    return "\n"


def _quotechar(lines: list[str]) -> str:
    counts: Counter[str] = Counter()
    for line in lines:
        for quote in "\"'":
            if line.startswith(quote) or re.search(rf"[,;\t|]\s*{quote}", line):
                counts[quote] += 1
    return counts.most_common(1)[0][0] if counts else '"'


def _count(line: str, delimiter: str, quotechar: str) -> int:
    """How many times ``delimiter`` separates fields on ``line``."""
    return line.count(delimiter)


def _choose_delimiter(lines: list[str], candidates: str, quotechar: str) -> str:
    best: tuple[int, int, str] | None = None
    for position, candidate in enumerate(candidates):
        counts = {_count(line, candidate, quotechar) for line in lines}
        if len(counts) != 1:
            continue
        (per_line,) = counts
        if per_line == 0:
            continue
        key = (per_line, -position, candidate)
        if best is None or key > best:
            best = key
    if best is None:
        raise SniffError("no delimiter occurs the same number of times on every line")
    return best[2]


def _is_number(field: str) -> bool:
    return bool(_NUMBER_RE.fullmatch(field.strip()))


def _has_header(rows: list[list[str]]) -> bool:
    if len(rows) < 2:
        return False
    header, data = rows[0], rows[1:]
    for column, title in enumerate(header):
        values = [row[column] for row in data if column < len(row)]
        if values and all(_is_number(v) for v in values) and not _is_number(title):
            return True
    return False


def sniff(sample: str, candidates: str = DEFAULT_CANDIDATES, max_lines: int = 20) -> Dialect:
    """Guess the dialect of ``sample`` (the first lines of a file)."""
    from .reader import split_line

    lines = _lines(sample, max_lines)
    if not lines:
        raise SniffError("empty sample")
    quotechar = _quotechar(lines)
    delimiter = _choose_delimiter(lines, candidates, quotechar)
    rows = [split_line(line, delimiter, quotechar) for line in lines]
    return Dialect(delimiter, quotechar, _has_header(rows), _line_terminator(sample))
