"""What tests that run `harness` in a child process share (not a test module)."""

from __future__ import annotations

import subprocess


def finish(run: subprocess.Popen[str], timeout: float = 300) -> str:
    """The child's output once it exits; killed (and the timeout raised) if it runs over."""
    try:
        output, _ = run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        run.kill()
        raise
    return output
