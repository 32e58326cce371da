"""Reading JSON Lines files whose errors name the file and the line.

Tasks, traces and predictor examples are all JSONL written by hand or by our builders; a broken
line must be reported as `FILE:LINE: what is wrong`, the same way everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def json_lines(lines: Iterable[str], origin: str,
               error: type[Exception] = ValueError) -> Iterator[tuple[int, str, Any]]:
    """(line number, "origin:line", value) for each non-blank line; a line that is not JSON
    raises `error` with that location."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{origin}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        yield number, where, value
