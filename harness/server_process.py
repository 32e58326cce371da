"""Start and stop a co-located `harness serve` from Python (tests, `harness demo`, later
`harness run`), with a readable error when it does not come up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from common.errors import UserError
from common.processes import (
    free_port,
    open_server_log,
    stop_process_group,
    wait_until_answers,
)
from server.models.store import servable_model

#: how long a CPU engine (`--device cpu`) may take to come up: importing, loading, compiling and
#: warming up a real 135M model on 2 cores shared with other work took 4.5-10 minutes when it
#: compiled (every start, before its compile cache worked; the first start still does)
CPU_STARTUP_TIMEOUT_S = 1200.0
#: niceness `ServerProcess.yield_cores_to_engine` gives the API server and the client
FRONTEND_NICE = 10


class ServerStartError(UserError):
    """`harness serve` did not come up. A message, not a traceback: it carries the server's
    log tail, which says why (most often an option the server refused, such as an unknown
    policy or profile); the client's stack would say nothing about the server."""


class ServerProcess:
    """`with ServerProcess(policy="continuum") as server: server.base_url ...`"""

    def __init__(self, policy: str = "continuum", profile: str | None = None,
                 port: int | None = None, serve_args: list[str] | None = None,
                 vllm_args: list[str] | None = None,
                 log_path: str | Path | None = None, startup_timeout_s: float = 240.0,
                 env: dict[str, str] | None = None) -> None:
        self.policy = policy
        self.profile = profile
        self.port = port or free_port()
        self.serve_args = serve_args or []  # more `harness serve` options
        self.vllm_args = vllm_args or []  # passed on to `vllm serve` after --
        self.log_path = Path(log_path) if log_path else Path(
            tempfile.mkstemp(prefix="harness-serve-", suffix=".log")[1])
        self.startup_timeout_s = startup_timeout_s
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | None = None
        #: the served model's name when known (`model_server`), else None
        self.served_model: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def exit_description(self) -> str | None:
        """What became of the server process when it has ended ("harness serve (pid 12) was
        killed by SIGKILL; its log: ..."), None while it runs (or before it started)."""
        if self.process is None or self.process.poll() is None:
            return None
        code = self.process.returncode
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        return f"harness serve (pid {self.process.pid}) {how}; its log: {self.log_path}"

    def start(self) -> ServerProcess:
        argv = [sys.executable, "-m", "cli", "serve", "--policy", self.policy,
                "--port", str(self.port)]
        if self.profile:
            argv += ["--profile", self.profile]
        argv += self.serve_args
        if self.vllm_args:
            argv += ["--", *self.vllm_args]
        log = open_server_log(self.log_path, "harness serve")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **self.env},
                                        start_new_session=True)
        state = wait_until_answers(self.process, f"{self.base_url}/health",
                                   self.startup_timeout_s, poll_s=1.0)
        if state == "ready":
            return self
        if state == "exited":
            raise ServerStartError(f"harness serve exited with {self.process.returncode}:\n"
                                   f"{self.log_tail()}")
        self.stop()
        raise ServerStartError(f"harness serve did not answer within {self.startup_timeout_s:.0f}"
                               f" s (log {self.log_path}):\n{self.log_tail()}")

    def yield_cores_to_engine(self, niceness: int = FRONTEND_NICE, client: bool = True) -> None:
        """Lower the scheduling priority of this server's API process and of the calling
        process (the client), not of the engine core and model worker (already started, so
        they keep theirs).

        Why: on a machine with few cores (2 here) the model worker takes one and the engine
        core, the API server and the client share the other. The engine core busy-waits
        (sched_yield) for each step's result, so when the API server or the client holds the
        core at that moment the step ends late: a compute-bound replay measured its steps 20%
        longer than the same batches served without such traffic. Measurements of the engine
        (`harness profile --device cpu --served`, `eval.experiments.fidelity`) call this so the
        engine gets a core the moment it needs one. A process cannot raise its own priority back
        without privileges: the caller stays at `niceness` (at least) from then on
        (`client=False` leaves the caller alone)."""
        if self.process is None:
            raise RuntimeError("yield_cores_to_engine: the server has not started")
        # `harness serve` execs the API server, so it has the pid we started
        for pid in (self.process.pid, 0) if client else (self.process.pid,):
            try:
                current = os.getpriority(os.PRIO_PROCESS, pid)
                os.setpriority(os.PRIO_PROCESS, pid, max(current, niceness))
            except OSError:
                pass  # gone, or not ours to change: the measurement goes on as it is

    def stop(self) -> int | None:
        """Ctrl-C the server's process group, as a user would, then make sure it is gone."""
        if self.process is None:
            return None
        return stop_process_group(self.process, grace_s=30)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def model_server(model: str, device: str = "cpu", policy: str = "continuum",
                 serve_args: list[str] | None = None, **options: object) -> ServerProcess:
    """A `harness serve --device DEVICE --model MODEL` (not started yet: use it in a `with`),
    its `served_model` the name to send requests to. On the CPU engine the model is resolved
    first (`server.models.store`: a known name such as smollm2-135m-instruct is added now,
    saying so), so the server only finds it. `serve_args`: more `harness serve` options."""
    name = servable_model(model).name if device == "cpu" else Path(model).name
    server = ServerProcess(policy=policy,
                           serve_args=["--device", device, "--model", model, *(serve_args or [])],
                           startup_timeout_s=CPU_STARTUP_TIMEOUT_S if device == "cpu" else 240.0,
                           **options)  # type: ignore[arg-type]
    server.served_model = name
    return server
