"""The bash tool's container: its life cycle, its limits, the scripts it runs commands with.

One container per program, created on the first command (or by ``BashTool.start()``) and
kept for the program's life, so files the agent writes persist between commands;
``close()`` removes it.  Kept apart from the tool so that what a container is (its limits,
labels and installed scripts) and the Docker calls on it read in one place, and the tool's
module is left with running a command.

The container has no network, a memory limit with no extra swap (the kernel's OOM killer
ends the biggest process inside), a pids limit (a fork bomb hits it and stalls instead of
taking the host down; the next command finds the container near the limit and first kills
what earlier commands left running), a CPU quota, ``no-new-privileges`` and an init process
(``init=True``) that reaps orphaned processes, whose zombies would otherwise count against
the pids limit forever.  Its main process (``sleep infinity``) runs as root, so the agent
cannot stop the container by killing its own processes (``kill -9 -1``).

When it starts, the two scripts in ``sandbox_scripts/`` (package data) are installed
root-owned, so the agent cannot change them: ``RUNNER``, which runs every command under
``timeout``, and ``KILLER``, which kills the processes of one command (each explains itself).

Containers carry the labels ``harness.tool=bash``, ``harness.program`` and
``harness.owner`` (the harness's pid or run id), the process that made them
(``harness.host``, ``harness.pid``, ``harness.pid_started``) and what the caller
adds (``harness.run``, ``harness.task``: see ``harness.tools.labels``);
``remove_leftovers`` removes those of an owner, ``harness sandbox prune`` those
whose process is gone.

The docker SDK is imported inside the functions that need it (start-up cost).
"""

from __future__ import annotations

import functools
import io
import os
import re
import shlex
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from harness.tools.base import SandboxError
from harness.tools.docker_client import shared_client
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
DEFAULT_MEM_LIMIT = "1g"  # memory + swap: no swap on top of it
DEFAULT_PIDS_LIMIT = 256
DEFAULT_NANO_CPUS = 1_000_000_000  # 1 CPU
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

# Where the scripts are installed in the container, and which of sandbox_scripts/ each is.
RUNNER = "/usr/local/lib/harness/run"  # sh RUNNER TIMEOUT COMMAND PIDS_HIGH
KILLER = "/usr/local/lib/harness/kill"  # sh KILLER EXEC_ID
_SCRIPTS = {RUNNER: "run.sh", KILLER: "kill.sh"}

_NAME_RE = re.compile(r"[^a-zA-Z0-9_.-]+")


@functools.cache
def _script(name: str) -> bytes:
    """One of the scripts shipped in ``sandbox_scripts/``."""
    return (resources.files(__package__) / "sandbox_scripts" / name).read_bytes()


def _scripts_tar() -> bytes:
    """A tar of RUNNER's directory with RUNNER and KILLER (root-owned), for its parent."""
    buf = io.BytesIO()
    directory = RUNNER.rsplit("/", 2)[1]
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w") as tar:
        d = tarfile.TarInfo(directory)
        d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o755, now
        tar.addfile(d)
        for path, name in _SCRIPTS.items():
            data = _script(name)
            f = tarfile.TarInfo(f"{directory}/{path.rsplit('/', 1)[1]}")
            f.size, f.mode, f.mtime = len(data), 0o755, now
            tar.addfile(f, io.BytesIO(data))
    return buf.getvalue()


def remove_leftovers(client: Any = None, owner: str | None = None) -> list[str]:
    """Force-remove bash-tool containers (of ``owner``, or of every owner); return their names.

    For after an interrupted run.  ``owner=None`` removes the containers of every
    harness process on this engine, including ones still running: pass the owner
    (pid or run id) when another harness may be using the engine.
    """
    import docker.errors  # type: ignore[import-untyped]  # docker SDK: start-up cost

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


@dataclass(frozen=True)
class ContainerSpec:
    """What container a program's commands run in, the same for every program of a run: its
    image, the owner its label names (the harness's pid or run id, for ``remove_leftovers``),
    the working directory, the environment on top of ``BASE_ENV``, and its limits on memory
    (memory + swap), pids and CPU (see the module docstring)."""

    image: str = DEFAULT_IMAGE
    owner: str = DEFAULT_OWNER
    workdir: str = TESTBED
    env: Mapping[str, str] | None = None
    mem_limit: str | int = DEFAULT_MEM_LIMIT
    pids_limit: int = DEFAULT_PIDS_LIMIT
    nano_cpus: int = DEFAULT_NANO_CPUS


#: every default: the offline sandbox image, this process as owner, the limits above
DEFAULT_CONTAINER = ContainerSpec()


class BashContainer:
    """The container of one program: created lazily, removed by ``close()``.

    Its methods block (Docker calls); the tool runs them in threads.
    """

    def __init__(
        self,
        program_id: str,
        *,
        client: Any = None,
        spec: ContainerSpec = DEFAULT_CONTAINER,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """``labels``: more container labels (``harness.run``, ``harness.task``, ...)."""
        self.program_id = program_id
        self.labels = dict(labels or {})
        self._client = client
        self.image = spec.image
        self.owner = spec.owner
        self.workdir = spec.workdir
        self.env = {**BASE_ENV, **(spec.env or {})}
        self.mem_limit = spec.mem_limit
        self.pids_limit = spec.pids_limit
        self.nano_cpus = spec.nano_cpus
        # the runner's "near the pids limit" mark (0: no check)
        pids_limit = spec.pids_limit
        self.pids_high = int(pids_limit * 0.9) if pids_limit and pids_limit > 0 else 0
        self.container: Any = None
        self._closed = False
        self._start_lock = threading.Lock()

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = shared_client()
        return self._client

    @property
    def container_id(self) -> str | None:
        return None if self.container is None else self.container.id

    # -- life cycle --------------------------------------------------------

    def ensure_started(self) -> Any:
        """The program's container, created (and its scripts installed) on the first call."""
        import docker.errors  # type: ignore[import-untyped]  # docker SDK: start-up cost

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
                    "`sudo .venv/bin/harness sandbox build`"
                ) from exc
            self.container.put_archive(RUNNER.rsplit("/", 2)[0], _scripts_tar())
            return self.container

    def close(self) -> None:
        """Force-remove the container; safe to call twice."""
        import docker.errors  # type: ignore[import-untyped]  # docker SDK: start-up cost

        with self._start_lock:
            self._closed = True
            container, self.container = self.container, None
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass

    # -- one command ---------------------------------------------------------

    def exec_create(self, container: Any, cmd: list[str], tag: str) -> str:
        """Create the command's exec; start the container again if it has stopped."""
        import docker.errors  # type: ignore[import-untyped]  # docker SDK: start-up cost

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
    def check_running(container: Any) -> None:
        """Raise ``SandboxError`` when the container stopped (a command killed with it)."""
        container.reload()
        if container.status != "running":
            raise SandboxError(
                f"the container {container.name} stopped ({container.status}) while a "
                "command ran: the Docker engine restarted, or someone stopped the container")

    def kill(self, cmd: list[str]) -> None:
        """Start a kill command as the agent (who may signal its own processes); never raise."""
        try:
            self.container.exec_run(cmd, user=AGENT_USER, detach=True)
        except Exception:  # noqa: BLE001 - e.g. the pids limit is exhausted; the next step follows
            pass

    def exit_code(self, exec_id: str) -> int | None:
        """The command's exit status; None when it is (still) unknown."""
        for _ in range(50):
            info = self.client.api.exec_inspect(exec_id)
            if not info.get("Running"):
                return info.get("ExitCode")
            time.sleep(0.02)
        return None

    # -- files -------------------------------------------------------------

    def copy_in(self, source: str | os.PathLike[str] | bytes, dest: str) -> None:
        """Put a directory, a file, a tar archive (path or bytes) into ``dest``, owned by agent.

        A directory's contents (not the directory itself) land in ``dest``; a tar archive
        (plain, gzip, bzip2 or xz) is extracted there; any other file is copied into it.
        """
        container = self.ensure_started()
        self.root(["mkdir", "-p", dest])
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
        self.root(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", dest])

    def root(self, cmd: list[str]) -> None:
        """Run a setup command as root in the container; raise when it fails."""
        rc, out = self.ensure_started().exec_run(cmd, user="0:0")
        if rc != 0:
            raise RuntimeError(f"{shlex.join(cmd)} failed in the sandbox ({rc}): {out!r}")

    def path(self, path: str) -> str:
        """``path`` in the container: relative paths are under the working directory."""
        return path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write one file (owned by agent); relative paths are under the working directory."""
        directory, _, base = self.path(path).rpartition("/")
        container = self.ensure_started()
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

    def read_file(self, path: str) -> bytes:
        """Read one file from the container (raises FileNotFoundError when it is missing)."""
        import docker.errors  # type: ignore[import-untyped]  # docker SDK: start-up cost

        full = self.path(path)
        container = self.ensure_started()
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
