"""Child servers we start and stop: a free port to give one, waiting until it answers, and
stopping its process group.

Every server the project starts (`harness serve`, a router, a cluster replica, a served
cluster) runs in its own session, so its process group holds its helpers too: vLLM's engine
core outlives a killed API server and keeps its GPU memory. Stopping the leader alone is not
enough; these helpers are the one way the project does it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import BinaryIO, Literal

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at `host` now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def open_server_log(path: str | os.PathLike[str], what: str) -> BinaryIO:
    """`path` opened for a child server's output, appended to under a line that says `what`
    started and when: a server started again (a soak's restart) keeps its earlier lives'
    logs, where the errors that ended them are."""
    log = open(path, "ab")  # noqa: SIM115 - the caller hands it to the child, then closes it
    log.write(f"--- {what} started {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
    log.flush()
    return log


def wait_until_answers(process: subprocess.Popen, url: str, timeout_s: float,
                       poll_s: float) -> Literal["ready", "exited", "timeout"]:
    """Poll `url` until it answers 200 (``ready``), the process ends first (``exited``) or
    `timeout_s` passes (``timeout``); each caller says in its own words what went wrong."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return "exited"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return "ready"
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    return "timeout"


def killpg(pgid: int, sig: int) -> None:
    """Signal a process group; one already gone (or not ours) is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_process_group(process: subprocess.Popen, grace_s: float, *,
                       first: int = signal.SIGINT, whole_group_first: bool = True,
                       reap_s: float | None = 10.0) -> int | None:
    """Ask `process` (the leader of its own group) to stop with `first` (sent to the whole
    group, as a terminal's Ctrl-C is, or to the leader alone when it stops its own children),
    wait up to `grace_s` for it, then SIGKILL whatever is left of the group and reap the
    leader (`reap_s` None: wait as long as it takes). Its exit status, None if unknown."""
    if process.poll() is None:
        if whole_group_first:
            killpg(process.pid, first)
        else:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(first)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    killpg(process.pid, signal.SIGKILL)  # stragglers of the group (an engine core)
    try:
        return process.wait(timeout=reap_s)
    except subprocess.TimeoutExpired:
        return None


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Inside, SIGTERM raises KeyboardInterrupt (main thread), so the caller's `finally` stops
    the servers it started instead of leaving them behind; the old handler returns after."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
