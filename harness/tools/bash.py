"""The bash tool: agent commands run in one Docker container per program.

One container per program (``harness.tools.bash_container``), created on the first
command (or by ``start()``) and kept for the program's life, so files the agent writes
persist between commands; each command is a fresh ``bash -lc`` (via ``docker exec``), so
the working directory and exported variables do not.  ``aclose()`` removes the container.

Containment, from the inside out:

* the command runs as user ``agent`` (uid 1000) under
  ``timeout -s KILL N`` in its own process group, with stderr merged into
  stdout (so the agent sees both in the order they were written): the runner
  script, ``harness/tools/sandbox_scripts/run.sh``;
* the container has no network and limits on memory, pids and CPU (see
  ``harness.tools.bash_container``), and the agent cannot stop it;
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
left out (``harness.tools.bash_output``).  Blocking Docker calls run in threads; the one
that reads a command's output runs in its own daemon thread
(``harness.tools.bash_exec``), so that many programs running long commands at once do
not exhaust asyncio's default thread pool.

When the engine itself fails (it stops answering or restarts, the program's container is
removed or stopped under a running command), the tool raises ``SandboxError`` naming what
happened instead of returning an observation: the program cannot go on in that sandbox, and
the run keeps its task for ``--resume`` (``harness.tools.docker_client``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.tools.base import Observation, Tool
from harness.tools.bash_container import (
    DEFAULT_CONTAINER,
    KILLER,
    RUNNER,
    BashContainer,
    ContainerSpec,
)
from harness.tools.bash_exec import ExecReader, wait_done
from harness.tools.bash_output import HeadTailCapture, format_observation
from harness.tools.docker_client import engine_failures
from harness.tools.sandbox_image import AGENT_USER, TESTBED

DEFAULT_TIMEOUT = 60.0  # seconds per command
DEFAULT_HEAD_CHARS = 5000
DEFAULT_TAIL_CHARS = 5000
HOST_SLACK = 5.0  # host-side deadline = timeout + this (docker itself waits 2 s for stdio)
KILL_GRACE = 1.5  # seconds to wait for the stream to end after each kill step


@dataclass(frozen=True)
class CommandLimits:
    """What one command may take, the same for every command of a program: ``timeout``
    seconds (``run`` may give one command another), ``host_slack`` more before the host
    kills what is left of it (see the module docstring), and the first ``head_chars`` and last
    ``tail_chars`` of its output, which is all the agent sees of a long one."""

    timeout: float = DEFAULT_TIMEOUT
    host_slack: float = HOST_SLACK
    head_chars: int = DEFAULT_HEAD_CHARS
    tail_chars: int = DEFAULT_TAIL_CHARS


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
        container: ContainerSpec = DEFAULT_CONTAINER,
        commands: CommandLimits = CommandLimits(),
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """``container``: the program's container (image, owner, limits); ``commands``: what
        each command may take; ``labels``: more container labels (``harness.run``,
        ``harness.task``, ...)."""
        self.program_id = program_id or uuid.uuid4().hex[:12]
        self.workdir = container.workdir
        self.timeout = float(commands.timeout)
        self.head_chars = commands.head_chars
        self.tail_chars = commands.tail_chars
        self.host_slack = commands.host_slack
        self.sandbox = BashContainer(self.program_id, client=client, spec=container,
                                     labels=labels)

    # -- lifecycle ---------------------------------------------------------

    @property
    def container(self) -> Any:
        """The program's docker SDK container; None before it starts and after ``aclose()``."""
        return self.sandbox.container

    @property
    def container_id(self) -> str | None:
        return self.sandbox.container_id

    async def start(self) -> None:
        """Create the container now (otherwise the first command does)."""
        await asyncio.to_thread(self.sandbox.ensure_started)

    async def aclose(self) -> None:
        """Force-remove the container; safe to call twice."""
        await asyncio.to_thread(self.sandbox.close)

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
        sandbox = self.sandbox
        with engine_failures(f"program {self.program_id} started a command"):
            container = await asyncio.to_thread(sandbox.ensure_started)
            api = sandbox.client.api
            t0 = time.monotonic()
            tag = uuid.uuid4().hex
            limit_arg = f"{limit:g}"
            exec_id = await asyncio.to_thread(
                sandbox.exec_create,
                container,
                ["sh", RUNNER, limit_arg, command, str(sandbox.pids_high)],
                tag,
            )
        capture = HeadTailCapture(self.head_chars, self.tail_chars)
        reader = ExecReader(api, exec_id, capture)
        reader.start()

        try:
            host_killed = await self._wait_or_kill(reader, limit, tag)
        except asyncio.CancelledError:  # the program was interrupted: stop the command too
            reader.shutdown()
            threading.Thread(target=sandbox.kill, args=(["sh", KILLER, tag],),
                             daemon=True).start()
            raise
        with engine_failures(f"program {self.program_id}'s command ran in container "
                             f"{container.name}"):
            if reader.error is not None:
                raise reader.error
            exit_code = await asyncio.to_thread(sandbox.exit_code, exec_id)
            if exit_code in (None, 137) and not host_killed:  # killed: by whom?
                await asyncio.to_thread(sandbox.check_running, container)
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

    async def _wait_or_kill(self, reader: ExecReader, limit: float, tag: str) -> str:
        """Wait for the command's stream to end, escalating past the host-side deadline.

        Returns "" (ended by itself), "tagged", "all" or "abandoned" (the last step taken).
        """
        if await wait_done(reader.done, limit + self.host_slack):
            return ""
        # Still open past the deadline: the wrapper could not end the command.
        await asyncio.to_thread(self.sandbox.kill, ["sh", KILLER, tag])
        if await wait_done(reader.done, KILL_GRACE):
            return "tagged"
        await asyncio.to_thread(self.sandbox.kill, ["pkill", "-KILL", "-u", AGENT_USER])
        if await wait_done(reader.done, KILL_GRACE):
            return "all"
        reader.shutdown()
        await wait_done(reader.done, KILL_GRACE)
        return "abandoned"

    # -- files -------------------------------------------------------------

    async def copy_in(self, source: str | os.PathLike[str] | bytes, dest: str = TESTBED) -> None:
        """Put a directory, a file, a tar archive (path or bytes) into ``dest``, owned by agent.

        A directory's contents (not the directory itself) land in ``dest``; a tar archive
        (plain, gzip, bzip2 or xz) is extracted there; any other file is copied into it.
        """
        await asyncio.to_thread(self.sandbox.copy_in, source, dest)

    async def write_file(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        """Write one file (owned by agent); relative paths are under the working directory."""
        data = content.encode() if isinstance(content, str) else content
        await asyncio.to_thread(self.sandbox.write_file, path, data, mode)

    async def read_file(self, path: str) -> bytes:
        """Read one file from the container (raises FileNotFoundError when it is missing)."""
        return await asyncio.to_thread(self.sandbox.read_file, path)
