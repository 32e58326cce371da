"""The bash tool: agent commands run in one Docker container per program.

One container per program, created on the first command (or by ``start()``)
and kept for the program's life, so files the agent writes persist between
commands; each command is a fresh ``bash -lc`` (via ``docker exec``), so the
working directory and exported variables do not.  ``aclose()`` removes the
container.

Containment, from the inside out:

* the command runs as user ``agent`` (uid 1000) under
  ``timeout -s KILL N`` in its own process group, with stderr merged into
  stdout (so the agent sees both in the order they were written);
* the container has no network, a memory limit with no extra swap (the
  kernel's OOM killer ends the biggest process inside), a pids limit (a fork
  bomb hits it and stalls instead of taking the host down; the next command
  finds the container near the limit and first kills what earlier commands
  left running), a CPU quota, ``no-new-privileges`` and an init process
  (``init=True``) that reaps orphaned processes, whose zombies would
  otherwise count against the pids limit forever.  Its main process
  (``sleep infinity``) runs as root, so the agent cannot stop the container
  by killing its own processes (``kill -9 -1``);
* a command whose main process has ended while a background process still
  holds its output is cut off by Docker itself two seconds later (the
  background process lives on, as it would in a terminal);
* a host-side deadline (``N`` + slack) for the rest (the wrapper stopped with
  SIGSTOP, an engine that does not close the stream): every process tagged
  with this command's ``HARNESS_EXEC_ID`` environment variable and its
  process group are killed; if the stream stays open, all of the agent's
  processes; if it still stays open, it is abandoned.  A command can
  therefore never hang the agent.

The observation text follows mini-swe-agent's shape: return code and output,
long outputs cut to their head and tail with a marker saying how much was
left out.  Blocking Docker calls run in threads; the one that reads a
command's output runs in its own daemon thread, so that many programs running
long commands at once do not exhaust asyncio's default thread pool.

When the engine itself fails (it stops answering or restarts, the program's container is
removed or stopped under a running command), the tool raises ``SandboxError`` naming what
happened instead of returning an observation: the program cannot go on in that sandbox, and
the run keeps its task for ``--resume``.

Containers carry the labels ``harness.tool=bash``, ``harness.program`` and
``harness.owner`` (the harness's pid or run id), the process that made them
(``harness.host``, ``harness.pid``, ``harness.pid_started``) and what the caller
adds (``harness.run``, ``harness.task``: see ``harness.tools.labels``);
``remove_leftovers`` removes those of an owner, ``harness sandbox prune`` those
whose process is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import select
import shlex
import socket
import struct
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.tools.base import Observation, SandboxError, Tool
from harness.tools.labels import OWNER_LABEL, PROGRAM_LABEL, process_labels
from harness.tools.sandbox_image import (
    AGENT_UID,
    AGENT_USER,
    DEFAULT_IMAGE,
    TESTBED,
    SandboxImageError,
)

TOOL_LABEL = "harness.tool"
TOOL_NAME = "bash"

DEFAULT_OWNER = str(os.getpid())
DEFAULT_TIMEOUT = 60.0  # seconds per command
DEFAULT_MEM_LIMIT = "1g"  # memory + swap: no swap on top of it
DEFAULT_PIDS_LIMIT = 256
DEFAULT_NANO_CPUS = 1_000_000_000  # 1 CPU
DEFAULT_HEAD_CHARS = 5000
DEFAULT_TAIL_CHARS = 5000
HOST_SLACK = 5.0  # host-side deadline = timeout + this (docker itself waits 2 s for stdio)
KILL_GRACE = 1.5  # seconds to wait for the stream to end after each kill step
BASE_ENV: dict[str, str] = {
    "PAGER": "cat",
    "MANPAGER": "cat",
    "GIT_PAGER": "cat",
    "LESS": "-R",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PIP_PROGRESS_BAR": "off",
    "TQDM_DISABLE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    # Threads count against the pids limit, and BLAS/OpenMP start one per host CPU (the CPU
    # quota does not hide them): a numpy import on a 192-core host would need 192 pids.
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}

# Installed as RUNNER (root-owned: the agent cannot change it) when the container starts;
# runs as `sh RUNNER TIMEOUT COMMAND PIDS_HIGH` (dash).  stderr joins stdout.
# `timeout` puts itself in a new process group and SIGKILLs that group after TIMEOUT
# seconds; SIGKILL cannot be caught, so the group kill takes timeout along and the exit
# status is 137.  Background jobs (`cmd &`) outlive the command, as in a terminal, except
# when the container is near its pids limit (PIDS_HIGH tasks; 0: no check): a fork bomb
# or a runaway.  Then, before the command, every process left by earlier commands is
# killed (kill -1: all processes the agent may signal, the wrapper excepted); after it,
# the command's own process group.  Only builtins run before `timeout` starts, so this
# works even when no process can be forked: `docker exec` itself still starts, because
# moving a process into a cgroup is not limited by pids.max, only fork is.
RUNNER = "/usr/local/lib/harness/run"
KILLER = "/usr/local/lib/harness/kill"
_RUNNER_SCRIPT = r"""# harness bash tool: sh run TIMEOUT COMMAND PIDS_HIGH
exec 2>&1
count() {  # tasks in the container's pids cgroup (v1, then v2); builtins only
  n=0
  { read n </sys/fs/cgroup/pids/pids.current || read n </sys/fs/cgroup/pids.current; } 2>/dev/null
}
if [ "$3" -gt 0 ]; then
  count
  if [ "$n" -ge "$3" ]; then
    was=$n
    kill -KILL -1 2>/dev/null
    i=0
    while [ "$i" -lt 20000 ]; do count; [ "$n" -lt "$3" ] && break; i=$((i + 1)); done
    echo "[sandbox: out of processes ($was tasks):" \
      "all processes left by earlier commands were killed]"
  fi
fi
timeout -s KILL "$1" bash -lc "$2" &
pg=$!
wait "$pg"
rc=$?
if [ "$3" -gt 0 ]; then
  count
  if [ "$n" -ge "$3" ]; then
    kill -KILL -- "-$pg" 2>/dev/null
    echo "[sandbox: out of processes ($n tasks):" \
      "the command's background processes were killed]"
  fi
fi
exit "$rc"
"""

# Installed as KILLER; runs as `sh KILLER EXEC_ID` as the agent (it may read its own
# processes' /proc/PID/environ; root without CAP_SYS_PTRACE may not): kill the process
# groups of, then the processes themselves tagged HARNESS_EXEC_ID=$1.  Three rounds catch
# children forked during the first.
_KILLER_SCRIPT = r"""# harness bash tool: sh kill EXEC_ID
for round in 1 2 3; do
  pids=$(grep -lsz "^HARNESS_EXEC_ID=$1\$" /proc/[0-9]*/environ | cut -d/ -f3)
  [ -z "$pids" ] && exit 0
  for p in $pids; do
    g=$(ps -o pgid= -p "$p" 2>/dev/null | tr -d ' ')
    [ -n "$g" ] && kill -KILL -- "-$g" 2>/dev/null
  done
  kill -KILL $pids 2>/dev/null
  sleep 0.1
done
"""

_NAME_RE = re.compile(r"[^a-zA-Z0-9_.-]+")
_CONT = bytes(range(0x80, 0xC0))  # UTF-8 continuation bytes: not the start of a character


# --------------------------------------------------------------------------
# Docker client
# --------------------------------------------------------------------------

_shared_client: Any = None
_shared_lock = threading.Lock()


def shared_client() -> Any:
    """One docker SDK client for all tools of this process (a larger connection pool).

    Raises SandboxImageError, with what to do about it, when no engine answers.
    """
    global _shared_client
    with _shared_lock:
        if _shared_client is None:
            try:
                import docker  # type: ignore[import-untyped]

                client = docker.from_env(version="auto", timeout=120, max_pool_size=64)
                client.ping()
            except Exception as exc:
                raise SandboxImageError(
                    f"no Docker engine answers ({exc}). Start one with "
                    "`sudo scripts/docker_engine.sh`, or start your Docker daemon and "
                    "make sure this user may use its socket."
                ) from exc
            _shared_client = client
        return _shared_client


def engine_failure(exc: BaseException, doing: str) -> SandboxError | None:
    """A ``SandboxError`` saying what broke when ``exc`` is the Docker engine failing under
    ``doing`` (it stopped answering or restarted, a container is gone); None for anything
    else (then it is the caller's own error)."""
    import docker.errors  # type: ignore[import-untyped]
    import requests

    if isinstance(exc, SandboxError):
        return exc
    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return SandboxError(f"the Docker engine stopped answering while {doing} "
                            f"({type(exc).__name__}: {exc}); was it restarted or stopped?")
    if isinstance(exc, docker.errors.NotFound):
        return SandboxError(f"the container was gone while {doing} ({exc.explanation or exc}): "
                            "it was removed outside the harness, or the Docker engine lost it")
    if isinstance(exc, docker.errors.APIError) and (exc.status_code or 0) >= 500:
        return SandboxError(f"the Docker engine failed while {doing}: {exc}")
    return None


@contextlib.contextmanager
def engine_failures(doing: str) -> Iterator[None]:
    """Raise the Docker engine failing inside the block as ``engine_failure``'s
    ``SandboxError``; any other exception passes through unchanged."""
    try:
        yield
    except Exception as exc:
        failure = engine_failure(exc, doing)
        if failure is None or failure is exc:
            raise
        raise failure from exc


def remove_leftovers(client: Any = None, owner: str | None = None) -> list[str]:
    """Force-remove bash-tool containers (of ``owner``, or of every owner); return their names.

    For after an interrupted run.  ``owner=None`` removes the containers of every
    harness process on this engine, including ones still running: pass the owner
    (pid or run id) when another harness may be using the engine.
    """
    import docker.errors  # type: ignore[import-untyped]

    client = client or shared_client()
    labels = [f"{TOOL_LABEL}={TOOL_NAME}"]
    if owner is not None:
        labels.append(f"{OWNER_LABEL}={owner}")
    removed: list[str] = []
    # ignore_removed: a container that goes away between the listing and its inspection (another
    # run's clean-up) is not an error
    for container in client.containers.list(all=True, filters={"label": labels},
                                            ignore_removed=True):
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            continue
        removed.append(container.name)
    return removed


# --------------------------------------------------------------------------
# Output: bounded head + tail capture and formatting
# --------------------------------------------------------------------------


class _Capture:
    """Keeps the first and last bytes of a stream of any length, and counts its characters."""

    def __init__(self, head_chars: int, tail_chars: int) -> None:
        self.head_chars = head_chars
        self.tail_chars = tail_chars
        self.head_max = 4 * head_chars  # a UTF-8 character is at most 4 bytes
        self.tail_max = 4 * tail_chars
        self.head = bytearray()
        self.tail = bytearray()
        self.total_bytes = 0
        self.total_chars = 0  # characters = bytes that are not UTF-8 continuation bytes

    def add(self, data: bytes) -> None:
        self.total_bytes += len(data)
        self.total_chars += len(data.translate(None, _CONT))
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_max:  # trim now and then, not every chunk
                del self.tail[: len(self.tail) - self.tail_max]

    def text(self) -> tuple[str, int]:
        """The output as text, cut to head + marker + tail; and how many characters were cut."""
        if self.total_bytes <= self.head_max + self.tail_max:  # everything was kept
            full = bytes(self.head + self.tail).decode("utf-8", errors="replace")
            if len(full) <= self.head_chars + self.tail_chars:
                return full, 0
            head, tail = full[: self.head_chars], full[-self.tail_chars :]
            elided = len(full) - self.head_chars - self.tail_chars
        else:
            head = bytes(self.head).decode("utf-8", errors="replace")[: self.head_chars]
            tail_text = bytes(self.tail[-self.tail_max :]).decode("utf-8", errors="replace")
            tail = tail_text[-self.tail_chars :] if self.tail_chars else ""
            elided = max(self.total_chars - len(head) - len(tail), 1)
        marker = (
            f"\n[... {elided} characters elided: the output had {elided + len(head) + len(tail)}"
            f" characters; showing the first {len(head)} and the last {len(tail)} ...]\n"
        )
        return head + marker + tail, elided


def format_observation(
    exit_code: int | None, output: str, *, timed_out: bool, timeout: float, note: str = ""
) -> str:
    """The text the agent sees: return code, output, and a warning on timeout or truncation."""
    rc = "none" if exit_code is None else str(exit_code)
    parts = [f"<returncode>{rc}</returncode>", f"<output>\n{output}</output>"]
    if timed_out:
        parts.append(
            f"<warning>The command was killed after {timeout:g} s: it did not finish within "
            "the time limit. Use a shorter or non-interactive command, or run long jobs in "
            "the background with their output redirected to a file.</warning>"
        )
    if note:
        parts.append(f"<warning>{note}</warning>")
    return "\n".join(parts)


# --------------------------------------------------------------------------
# One command: exec, read, deadline
# --------------------------------------------------------------------------


class _Exec:
    """The output reader of one command, running in its own daemon thread."""

    def __init__(self, api: Any, exec_id: str, capture: _Capture) -> None:
        self.api = api
        self.exec_id = exec_id
        self.capture = capture
        self.abort = threading.Event()
        loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self.error: BaseException | None = None
        self._sock: Any = None
        self._pending = b""

    def start(self) -> None:
        name = f"bash-exec-{self.exec_id[:12]}"
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            raw = self.api.exec_start(self.exec_id, socket=True)
            sock = getattr(raw, "_sock", raw)  # SocketIO on a unix socket: its socket
            self._sock = sock
            try:
                self._pending = self._drain_buffered(raw, sock)
                sock.settimeout(None)
                self._read_frames()
            finally:
                raw.close()
                sock.close()
        except BaseException as exc:  # noqa: BLE001 - reported to the awaiting coroutine
            self.error = exc
        finally:
            try:
                self._loop.call_soon_threadsafe(self._finish)
            except RuntimeError:  # the loop is closed: no one is waiting any more
                pass

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    @staticmethod
    def _drain_buffered(raw: Any, sock: Any) -> bytes:
        """Stream bytes that http.client's buffered reader took along with the headers.

        The SDK hands out the raw socket beneath the reader that parsed the HTTP
        response, so output that arrived together with the headers would be lost
        (docker/docker-py#3332).  With the socket non-blocking, read1 returns what is
        buffered (and what is ready on the socket) without waiting.
        """
        try:
            reader = raw._response.raw._fp.fp
        except AttributeError:
            return b""
        out = bytearray()
        sock.settimeout(0)
        try:
            while chunk := reader.read1(65536):
                out += chunk
        except OSError:  # BlockingIOError: nothing more is ready
            pass
        return bytes(out)

    def _recv(self, n: int) -> bytes:
        """Up to n bytes; b'' at the end of the stream or when aborted."""
        if self._pending:
            data, self._pending = self._pending[:n], self._pending[n:]
            return data
        while not self.abort.is_set():
            ready, _, _ = select.select([self._sock], [], [], 0.2)
            if ready:
                try:
                    return self._sock.recv(n)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    return b""
        return b""

    def _read_exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._recv(n - len(buf))
            if not chunk:
                break
            buf += chunk
        return bytes(buf)

    def _read_frames(self) -> None:
        """Docker's multiplexed stream: 8-byte header (stream, 3 zero bytes, size), then data."""
        while True:
            header = self._read_exactly(8)
            if len(header) < 8:
                return
            _stream, size = struct.unpack(">BxxxL", header)
            while size > 0:
                chunk = self._recv(min(size, 65536))
                if not chunk:
                    return
                self.capture.add(chunk)
                size -= len(chunk)

    def shutdown(self) -> None:
        """Give up on the stream: make the reader return now."""
        self.abort.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


async def _wait_done(done: asyncio.Future[None], timeout: float) -> bool:
    """Wait up to ``timeout`` s for the reader to finish; True when it has."""
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout)
    except TimeoutError:
        return False
    return True


def _scripts_tar() -> bytes:
    """A tar of RUNNER's directory with RUNNER and KILLER (root-owned), for its parent."""
    buf = io.BytesIO()
    directory = RUNNER.rsplit("/", 2)[1]
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w") as tar:
        d = tarfile.TarInfo(directory)
        d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o755, now
        tar.addfile(d)
        for path, script in ((RUNNER, _RUNNER_SCRIPT), (KILLER, _KILLER_SCRIPT)):
            data = script.encode()
            f = tarfile.TarInfo(f"{directory}/{path.rsplit('/', 1)[1]}")
            f.size, f.mode, f.mtime = len(data), 0o755, now
            tar.addfile(f, io.BytesIO(data))
    return buf.getvalue()


# --------------------------------------------------------------------------
# The tool
# --------------------------------------------------------------------------


class BashTool(Tool):
    """Runs bash commands in the program's own sandbox container (see the module docstring)."""

    name = "bash"
    description = (
        "Run a bash command in a Linux sandbox (no network, working directory "
        f"{TESTBED}). Each command runs in a new shell: files persist between commands, "
        "but `cd` and exported variables do not (chain them: `cd dir && make`). "
        "Returns the exit code and the output (stdout and stderr together; long output "
        "keeps only its beginning and end)."
    )

    def __init__(
        self,
        program_id: str | None = None,
        *,
        client: Any = None,
        image: str = DEFAULT_IMAGE,
        owner: str = DEFAULT_OWNER,
        workdir: str = TESTBED,
        env: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        mem_limit: str | int = DEFAULT_MEM_LIMIT,
        pids_limit: int = DEFAULT_PIDS_LIMIT,
        nano_cpus: int = DEFAULT_NANO_CPUS,
        head_chars: int = DEFAULT_HEAD_CHARS,
        tail_chars: int = DEFAULT_TAIL_CHARS,
        host_slack: float = HOST_SLACK,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """``labels``: more container labels (``harness.run``, ``harness.task``, ...)."""
        self.program_id = program_id or uuid.uuid4().hex[:12]
        self.labels = dict(labels or {})
        self._client = client
        self.image = image
        self.owner = owner
        self.workdir = workdir
        self.env = {**BASE_ENV, **(env or {})}
        self.timeout = float(timeout)
        self.mem_limit = mem_limit
        self.pids_limit = pids_limit
        self.nano_cpus = nano_cpus
        self.head_chars = head_chars
        self.tail_chars = tail_chars
        self.host_slack = host_slack
        # the wrapper's "near the pids limit" mark (0: no check)
        self._pids_high = int(pids_limit * 0.9) if pids_limit and pids_limit > 0 else 0
        self.container: Any = None
        self._closed = False
        self._start_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = shared_client()
        return self._client

    @property
    def container_id(self) -> str | None:
        return None if self.container is None else self.container.id

    async def start(self) -> None:
        """Create the container now (otherwise the first command does)."""
        await asyncio.to_thread(self._ensure_started)

    def _ensure_started(self) -> Any:
        import docker.errors  # type: ignore[import-untyped]

        with self._start_lock:
            if self._closed:
                raise RuntimeError(f"bash tool of program {self.program_id} is closed")
            if self.container is not None:
                return self.container
            name = "harness-bash-" + _NAME_RE.sub("-", self.program_id)[:40].strip("-.")
            name += "-" + uuid.uuid4().hex[:6]
            try:
                self.container = self.client.containers.run(
                    self.image,
                    ["sleep", "infinity"],
                    name=name,
                    detach=True,
                    init=True,  # tini as PID 1 reaps orphans (their zombies hold pids)
                    auto_remove=False,  # we remove it ourselves, also after a crash
                    user="0:0",  # only `sleep infinity`; agent commands run as `agent`
                    network_mode="none",
                    mem_limit=self.mem_limit,
                    memswap_limit=self.mem_limit,  # equal: no swap beyond the memory limit
                    pids_limit=self.pids_limit,
                    nano_cpus=self.nano_cpus,
                    security_opt=["no-new-privileges"],
                    working_dir=self.workdir,
                    environment=self.env,
                    hostname="sandbox",
                    labels={
                        **process_labels(program_id=self.program_id),
                        **self.labels,
                        TOOL_LABEL: TOOL_NAME,
                        PROGRAM_LABEL: self.program_id,
                        OWNER_LABEL: self.owner,
                    },
                )
            except docker.errors.ImageNotFound as exc:
                raise SandboxImageError(
                    f"sandbox image {self.image} not found: build it with "
                    "`sudo .venv/bin/python -m harness.tools.sandbox_image`"
                ) from exc
            self.container.put_archive(RUNNER.rsplit("/", 2)[0], _scripts_tar())
            return self.container

    async def aclose(self) -> None:
        """Force-remove the container; safe to call twice."""
        await asyncio.to_thread(self._close_sync)

    def _close_sync(self) -> None:
        import docker.errors  # type: ignore[import-untyped]

        with self._start_lock:
            self._closed = True
            container, self.container = self.container, None
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass

    # -- commands ----------------------------------------------------------

    async def run(self, argument: str, timeout: float | None = None) -> Observation:
        """Run ``argument`` with ``bash -lc`` as user agent; see the module docstring."""
        command = argument
        limit = self.timeout if timeout is None else float(timeout)
        if not command.strip():
            return Observation(
                "<returncode>none</returncode>\n<output>\n</output>\n"
                "<warning>Empty command: nothing was run.</warning>",
                ok=False,
                info={"exit_code": None, "timed_out": False, "truncated": False, "seconds": 0.0},
            )
        with engine_failures(f"program {self.program_id} started a command"):
            container = await asyncio.to_thread(self._ensure_started)
            api = self.client.api
            t0 = time.monotonic()
            tag = uuid.uuid4().hex
            limit_arg = f"{limit:g}"
            exec_id = await asyncio.to_thread(
                self._exec_create,
                container,
                ["sh", RUNNER, limit_arg, command, str(self._pids_high)],
                tag,
            )
        capture = _Capture(self.head_chars, self.tail_chars)
        reader = _Exec(api, exec_id, capture)
        reader.start()

        try:
            host_killed = await self._wait_or_kill(reader, limit, tag)
        except asyncio.CancelledError:  # the program was interrupted: stop the command too
            reader.shutdown()
            threading.Thread(target=self._kill, args=(["sh", KILLER, tag],), daemon=True).start()
            raise
        with engine_failures(f"program {self.program_id}'s command ran in container "
                             f"{container.name}"):
            if reader.error is not None:
                raise reader.error
            exit_code = await asyncio.to_thread(self._exit_code, exec_id)
            if exit_code in (None, 137) and not host_killed:  # killed: by whom?
                await asyncio.to_thread(self._check_running, container)
        seconds = time.monotonic() - t0
        timed_out = bool(host_killed) or (exit_code == 137 and seconds >= limit - 0.05)
        output, elided = capture.text()
        note = ""
        if host_killed == "all":
            note = (
                "A process of the command escaped the time limit; all processes of the "
                "sandbox user were killed, background ones included."
            )
        elif host_killed == "abandoned":
            note = "The command could not be stopped; its output was abandoned."
        text = format_observation(exit_code, output, timed_out=timed_out, timeout=limit, note=note)
        return Observation(
            text,
            ok=exit_code == 0 and not timed_out,
            info={
                "exit_code": exit_code,
                "timed_out": timed_out,
                "truncated": elided > 0,
                "elided_chars": elided,
                "seconds": round(seconds, 3),
                "host_killed": host_killed or None,
            },
        )

    async def _wait_or_kill(self, reader: _Exec, limit: float, tag: str) -> str:
        """Wait for the command's stream to end, escalating past the host-side deadline.

        Returns "" (ended by itself), "tagged", "all" or "abandoned" (the last step taken).
        """
        if await _wait_done(reader.done, limit + self.host_slack):
            return ""
        # Still open past the deadline: the wrapper could not end the command.
        await asyncio.to_thread(self._kill, ["sh", KILLER, tag])
        if await _wait_done(reader.done, KILL_GRACE):
            return "tagged"
        await asyncio.to_thread(self._kill, ["pkill", "-KILL", "-u", AGENT_USER])
        if await _wait_done(reader.done, KILL_GRACE):
            return "all"
        reader.shutdown()
        await _wait_done(reader.done, KILL_GRACE)
        return "abandoned"

    def _exec_create(self, container: Any, cmd: list[str], tag: str) -> str:
        """Create the command's exec; start the container again if it has stopped."""
        import docker.errors  # type: ignore[import-untyped]

        def create() -> str:
            return self.client.api.exec_create(
                container.id,
                cmd,
                stdout=True,
                stderr=True,
                stdin=False,
                tty=False,
                user=AGENT_USER,
                workdir=self.workdir,
                environment={"HARNESS_EXEC_ID": tag},
            )["Id"]

        try:
            return create()
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: the container is not running
                raise
        container.start()  # its files survive; only its processes are gone
        return create()

    @staticmethod
    def _check_running(container: Any) -> None:
        """Raise ``SandboxError`` when the container stopped (a command killed with it)."""
        container.reload()
        if container.status != "running":
            raise SandboxError(
                f"the container {container.name} stopped ({container.status}) while a "
                "command ran: the Docker engine restarted, or someone stopped the container")

    def _kill(self, cmd: list[str]) -> None:
        """Start a kill command as the agent (who may signal its own processes); never raise."""
        try:
            self.container.exec_run(cmd, user=AGENT_USER, detach=True)
        except Exception:  # noqa: BLE001 - e.g. the pids limit is exhausted; the next step follows
            pass

    def _exit_code(self, exec_id: str) -> int | None:
        """The command's exit status; None when it is (still) unknown."""
        for _ in range(50):
            info = self.client.api.exec_inspect(exec_id)
            if not info.get("Running"):
                return info.get("ExitCode")
            time.sleep(0.02)
        return None

    # -- files -------------------------------------------------------------

    async def copy_in(self, source: str | os.PathLike[str] | bytes, dest: str = TESTBED) -> None:
        """Put a directory, a file, a tar archive (path or bytes) into ``dest``, owned by agent.

        A directory's contents (not the directory itself) land in ``dest``; a tar archive
        (plain, gzip, bzip2 or xz) is extracted there; any other file is copied into it.
        """
        await asyncio.to_thread(self._copy_in_sync, source, dest)

    def _copy_in_sync(self, source: str | os.PathLike[str] | bytes, dest: str) -> None:
        container = self._ensure_started()
        self._root(["mkdir", "-p", dest])
        if isinstance(source, bytes | bytearray):
            container.put_archive(dest, bytes(source))
        else:
            path = Path(source)
            if path.is_file() and tarfile.is_tarfile(path):  # the engine also unpacks gz/bz2/xz
                with open(path, "rb") as fh:
                    container.put_archive(dest, fh)
            else:
                with tempfile.TemporaryFile() as tmp:
                    with tarfile.open(fileobj=tmp, mode="w") as tar:
                        if path.is_dir():
                            for child in sorted(path.iterdir()):
                                tar.add(child, arcname=child.name)
                        else:
                            tar.add(path, arcname=path.name)
                    tmp.seek(0)
                    container.put_archive(dest, tmp)
        self._root(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", dest])

    def _root(self, cmd: list[str]) -> None:
        """Run a setup command as root in the container; raise when it fails."""
        rc, out = self._ensure_started().exec_run(cmd, user="0:0")
        if rc != 0:
            raise RuntimeError(f"{shlex.join(cmd)} failed in the sandbox ({rc}): {out!r}")

    async def write_file(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        """Write one file (owned by agent); relative paths are under the working directory."""
        data = content.encode() if isinstance(content, str) else content
        full = path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"
        directory, _, base = full.rpartition("/")

        def put() -> None:
            container = self._ensure_started()
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                info = tarfile.TarInfo(base)
                info.size, info.mode, info.mtime = len(data), mode, int(time.time())
                info.uid = info.gid = AGENT_UID
                info.uname = info.gname = AGENT_USER
                tar.addfile(info, io.BytesIO(data))
            rc, out = container.exec_run(["mkdir", "-p", directory or "/"], user=AGENT_USER)
            if rc != 0:
                raise OSError(f"cannot create {directory} in the sandbox: {out!r}")
            container.put_archive(directory or "/", buf.getvalue())

        await asyncio.to_thread(put)

    async def read_file(self, path: str) -> bytes:
        """Read one file from the container (raises FileNotFoundError when it is missing)."""
        import docker.errors  # type: ignore[import-untyped]

        full = path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"

        def get() -> bytes:
            container = self._ensure_started()
            try:
                stream, _stat = container.get_archive(full)
            except docker.errors.NotFound as exc:
                raise FileNotFoundError(full) from exc
            buf = io.BytesIO(b"".join(stream))
            with tarfile.open(fileobj=buf) as tar:
                member = tar.next()
                fh = tar.extractfile(member) if member is not None else None
                if fh is None:
                    raise IsADirectoryError(full)
                return fh.read()

        return await asyncio.to_thread(get)
