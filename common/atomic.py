"""Write a file so that readers see the old version or the new one, never half of either.

Everything the project leaves on disk for later (trajectories, results, summaries, traces,
reports, plots) goes through `atomic_write`: the content goes to a temporary file beside the
target, which is renamed over it; on failure the temporary file is removed and the old file
stays. The new file gets the usual mode (0666 less the umask), not mkstemp's 0600.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path to write; it replaces `path` when the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                               suffix=target.suffix or ".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[str]], Any]) -> Path:
    """Call `write(file)` on a text file that then atomically becomes `path`."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        write(f)
    return Path(path)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text))


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    return atomic_write(path, lambda f: json.dump(data, f, indent=1))
