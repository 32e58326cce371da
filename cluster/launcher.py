"""`harness cluster serve`: one real `harness serve` process per replica of a cluster file, and
the router (`cluster.router_app`) in front of them, started and stopped together.

Why processes and not vLLM's data parallelism: replicas of one cluster may differ in role,
profile, policy and KV size, and vLLM's DP ranks share all of those. Each replica is the
command `harness serve` would run (`server.launch.build_command`), with its own port, its own
events channel (`HARNESS_EVENTS_IPC`) and its own log file.

Nothing outlives the launcher:

* every replica runs in a process group of its own (so a terminal's Ctrl-C reaches only the
  launcher, which then stops the replicas in order: SIGINT to each group, as Ctrl-C would,
  then SIGKILL to what is left after a grace period);
* on Linux each replica asks the kernel for SIGTERM when the launcher dies
  (`prctl(PR_SET_PDEATHSIG)`, set in the child before `exec`): `vllm serve` then shuts its
  engine core down itself;
* a small reaper process (its own session; SIGINT/SIGTERM/SIGHUP ignored) holds the replicas'
  process-group ids and the read end of a pipe from the launcher. If the launcher vanishes
  without saying `done` (SIGKILL, a crash), the reaper waits for the groups to empty and
  SIGKILLs whatever is left, engine cores included (a `vllm serve` killed hard leaves its
  engine core running, and PR_SET_PDEATHSIG only covers the direct child).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from cluster import pd
from cluster.config import ClusterConfig, ReplicaSpec
from cluster.router_state import ReplicaEndpoint
from common.processes import free_port, killpg
from server.engine_spec import EngineSpec

DEFAULT_BASE_PORT = 8100
DEFAULT_ROUTER_PORT = 8000
DEFAULT_STARTUP_TIMEOUT_S = 600.0
STOP_GRACE_S = 30.0
_PR_SET_PDEATHSIG = 1


class LauncherError(RuntimeError):
    """The cluster could not be started (the message says which replica and why)."""


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def replica_ports(config: ClusterConfig, base_port: int = DEFAULT_BASE_PORT) -> dict[str, int]:
    """Each replica's HTTP port: its `port:` or `base_port + index` in file order."""
    ports = {spec.name: spec.port if spec.port is not None else base_port + index
             for index, spec in enumerate(config.replicas)}
    seen: dict[int, str] = {}
    for name, port in ports.items():
        if port in seen:
            raise LauncherError(f"replicas {seen[port]} and {name} would both use port {port}; "
                                "pick another --base-port or change their `port:`")
        if not 1024 <= port <= 65535:
            raise LauncherError(f"replica {name}: port {port} is out of range; pick another "
                                "--base-port")
        seen[port] = name
    return ports


def replica_command(config: ClusterConfig, spec: ReplicaSpec, port: int,
                    host: str = "127.0.0.1", side_channel_port: int | None = None,
                    events_ipc: str | None = None,
                    side_channel_host: str = "127.0.0.1",
                    api_key: str | None = None) -> tuple[list[str], dict[str, str]]:
    """argv and environment (additions) of one replica's `vllm serve`, as `harness serve`
    builds them, on the engine the cluster file gives it (`ClusterConfig.engine_spec`, the
    cluster's TTFT SLO among it, as the virtual-time cluster's engines have it). A P/D replica
    advertises `side_channel_host:side_channel_port` to its peers (on Ray: its node's address).
    `api_key`: the replica wants it, as the router does (`VLLM_API_KEY`, which vLLM reads as
    `--api-key`: in the environment, not in the process list)."""
    # server.launch, server.intake.events (pydantic): start-up cost (~0.5 s), paid only when
    # replicas are built; the reaper (`python -m cluster.launcher reap`) runs this module too
    from server.intake.events import ENV_API_KEY, ENV_EVENTS_IPC, default_ipc_path
    from server.launch import ServeError, build_command

    engine = config.engine_spec(spec, EngineSpec(seed=config.router.seed))
    env: dict[str, str] = {}
    if config.carries_kv(spec):
        engine = replace(engine, kv_transfer=pd.kv_transfer_config(
            spec.name, spec.role, pd.links_to(config, spec.name)))
        if side_channel_port is None:
            raise LauncherError(f"replica {spec.name}: a P/D replica needs a side-channel port")
        env.update(pd.side_channel_env(side_channel_port, side_channel_host))
    try:
        command = build_command(spec.policy, engine, host=host, port=port)
    except ServeError as exc:
        raise LauncherError(f"replica {spec.name}: {exc}") from None
    env = {**command.env, **env, **({ENV_API_KEY: api_key} if api_key else {})}
    # each replica its own channel from its API server to its scheduler
    env[ENV_EVENTS_IPC] = events_ipc or default_ipc_path()
    return command.argv, env


def check_commands(config: ClusterConfig, base_port: int = DEFAULT_BASE_PORT) -> None:
    """Build every replica's command without starting anything (raises `LauncherError`)."""
    ports = replica_ports(config, base_port)
    for spec in config.replicas:
        replica_command(config, spec, ports[spec.name], side_channel_port=ports[spec.name],
                        events_ipc="ipc:///dev/null")


def death_signal_preexec(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A preexec_fn asking for `sig` when the launcher dies (Linux), or None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before the request took hold
            os.kill(os.getpid(), sig)

    return preexec


def reap(grace_s: float, lines: Any = None) -> int:
    """The reaper (`python -m cluster.launcher reap GRACE_S`): reads process-group ids, one a
    line, until `done` (the launcher stopped them itself) or the end of its input (the launcher
    died): then waits up to `grace_s` for the groups to empty (on Linux PR_SET_PDEATHSIG has
    already asked each `vllm serve` to stop; elsewhere it sends SIGINT) and SIGKILLs what is
    left of them."""
    groups: list[int] = []
    for line in lines if lines is not None else sys.stdin:
        line = line.strip()
        if line == "done":
            return 0
        if line.isdigit():
            groups.append(int(line))
    if not sys.platform.startswith("linux"):
        for g in groups:
            killpg(g, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(group_alive(g) for g in groups):
        time.sleep(0.5)
    for g in groups:
        killpg(g, signal.SIGKILL)
    return 0


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group (Linux: from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry))
    return members


def group_alive(pgid: int) -> bool:
    if os.path.isdir("/proc"):
        return bool(group_members(pgid))
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@dataclass
class Replica:
    """One replica process of a launched cluster."""

    spec: ReplicaSpec
    port: int
    log_path: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    ready_after_s: float | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no log)"
        return "\n".join(f"    {line}" for line in text)


class Launcher:
    """Start, watch and stop a cluster's replicas (the router is `serve_cluster`'s part).

        with Launcher(config, log_dir=...) as launcher:   # start() waits until all answer
            launcher.replicas[0].url ...
    """

    def __init__(self, config: ClusterConfig, *, base_port: int = DEFAULT_BASE_PORT,
                 log_dir: str | Path, startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
                 out: Callable[[str], None] | None = None,
                 reap_grace_s: float = 20.0, api_key: str | None = None) -> None:
        self.config = config
        self.api_key = api_key  # every replica wants it (`replica_command`)
        self.log_dir = Path(log_dir)
        self.startup_timeout_s = startup_timeout_s
        self.out = out or (lambda line: print(line, flush=True))
        self.reap_grace_s = reap_grace_s
        ports = replica_ports(config, base_port)
        self.replicas = [Replica(spec=s, port=ports[s.name], log_path=self.log_dir /
                                 f"{s.name}.log") for s in config.replicas]
        self._reaper: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._watcher: threading.Thread | None = None

    # -- start ------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Build every replica's command and check its port, before anything starts."""
        taken = [f"{r.name} ({r.port})" for r in self.replicas if not port_free(r.port)]
        if taken:
            raise LauncherError(f"port(s) already in use: {', '.join(taken)}; stop what holds "
                                "them, or pick another --base-port")
        for r in self.replicas:
            side = free_port() if self.config.carries_kv(r.spec) else None
            r.argv, r.env = replica_command(self.config, r.spec, r.port, side_channel_port=side,
                                            api_key=self.api_key)

    def start(self) -> Launcher:
        """Start all replicas and wait until every one answers `/health`; on any failure stop
        the others and raise `LauncherError` with the failed replica's last log lines."""
        if not self.replicas[0].argv:
            self.prepare()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._start_reaper()
        preexec = death_signal_preexec()
        self.out(f"harness cluster: starting {len(self.replicas)} replica(s) of "
                 f"{self.config.name!r} (logs in {self.log_dir})")
        try:
            for r in self.replicas:  # spawned from this (the main) thread: PDEATHSIG is per thread
                with open(r.log_path, "wb") as log:
                    r.process = subprocess.Popen(
                        r.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        env={**os.environ, **r.env}, start_new_session=True,
                        preexec_fn=preexec)
                r.started_at = time.monotonic()
                self._tell_reaper(str(r.process.pid))
                s = r.spec
                self.out(f"  {r.name}: {s.role}, policy {s.policy}, profile {s.profile}, "
                         f"node {s.node}"
                         + (f", {s.num_gpu_blocks} KV blocks" if s.num_gpu_blocks else "")
                         + f"; port {r.port}, pid {r.pid}")
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        started = time.monotonic()
        pending = list(self.replicas)
        last_note = started
        with httpx.Client(timeout=2.0) as client:
            while pending:
                for r in list(pending):
                    assert r.process is not None
                    if r.process.poll() is not None:
                        raise LauncherError(
                            f"replica {r.name} exited with code {r.process.returncode} while "
                            f"starting; stopped the others. Last lines of {r.log_path}:\n"
                            f"{r.log_tail()}")
                    try:
                        ok = client.get(r.url + "/health").status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    if ok:
                        r.ready_after_s = time.monotonic() - r.started_at
                        pending.remove(r)
                        self.out(f"  {r.name} up on 127.0.0.1:{r.port} after "
                                 f"{r.ready_after_s:.0f} s")
                now = time.monotonic()
                if pending and now - started > self.startup_timeout_s:
                    names = ", ".join(r.name for r in pending)
                    r = pending[0]
                    raise LauncherError(
                        f"replica(s) {names} did not answer within {self.startup_timeout_s:.0f}"
                        f" s; stopped all. Last lines of {r.log_path}:\n{r.log_tail()}")
                if pending and now - last_note >= 15:
                    last_note = now
                    self.out(f"  waiting for {', '.join(r.name for r in pending)} "
                             f"({now - started:.0f} s)")
                if pending:
                    time.sleep(1.0)

    # -- reaper -----------------------------------------------------------------------------
    def _start_reaper(self) -> None:
        if self._reaper is not None:
            return
        self._reaper = subprocess.Popen(
            [sys.executable, "-m", "cluster.launcher", "reap", str(self.reap_grace_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            close_fds=True)

    def _tell_reaper(self, line: str) -> None:
        if self._reaper is None or self._reaper.stdin is None:
            return
        try:
            self._reaper.stdin.write(line.encode() + b"\n")
            self._reaper.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def _dismiss_reaper(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is None:
            return
        self._tell_reaper_of(reaper, "done")
        try:
            reaper.wait(timeout=5)
        except subprocess.TimeoutExpired:
            reaper.kill()
            reaper.wait()

    @staticmethod
    def _tell_reaper_of(reaper: subprocess.Popen[bytes], line: str) -> None:
        try:
            assert reaper.stdin is not None
            reaper.stdin.write(line.encode() + b"\n")
            reaper.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    # -- watch and stop ---------------------------------------------------------------------
    def watch(self, on_exit: Callable[[Replica, int | None], None],
              interval_s: float = 0.5) -> None:
        """Call `on_exit(replica, code)` from a daemon thread when a replica's process ends
        (not while stopping), after SIGKILLing the rest of its process group."""
        def loop() -> None:
            seen: set[str] = set()
            while not self._stopping:
                for r in self.replicas:
                    if r.name not in seen and r.process is not None \
                            and r.process.poll() is not None:
                        seen.add(r.name)
                        if self._stopping:
                            break
                        # what is left of its group (an engine core whose API server was
                        # killed keeps running, and holds its GPU) goes too
                        killpg(r.process.pid, signal.SIGKILL)
                        on_exit(r, r.process.returncode)
                time.sleep(interval_s)

        self._watcher = threading.Thread(target=loop, name="cluster-watch", daemon=True)
        self._watcher.start()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Ctrl-C every replica's process group, wait for all (together) up to `grace_s`, then
        SIGKILL every group, engine cores included."""
        self._stopping = True
        held = _hold_signals()
        try:
            self._stop(grace_s)
        finally:
            for s, handler in held.items():
                signal.signal(s, handler)

    def _stop(self, grace_s: float) -> None:
        started = [r for r in self.replicas if r.process is not None]
        for r in started:
            if r.running():
                killpg(r.process.pid, signal.SIGINT)  # type: ignore[union-attr]
        deadline = time.monotonic() + grace_s
        for r in started:
            assert r.process is not None
            try:
                r.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for r in started:
            assert r.process is not None
            killpg(r.process.pid, signal.SIGKILL)  # stragglers of the group (engine core)
            try:
                r.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._dismiss_reaper()

    def __enter__(self) -> Launcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _hold_signals() -> dict[int, Any]:
    """Ignore SIGINT / SIGTERM while stopping (main thread only): a second Ctrl-C must not
    cut the clean stop short; `stop` has its own deadline. Returns the handlers to restore."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}


class _Stop(Exception):
    """SIGINT / SIGTERM arrived: stop the cluster."""


def serve_cluster(config: ClusterConfig, *, host: str = "127.0.0.1",
                  port: int = DEFAULT_ROUTER_PORT, base_port: int = DEFAULT_BASE_PORT,
                  log_dir: str | Path, startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
                  out: Callable[[str], None] | None = None, api_key: str | None = None) -> int:
    """Start the replicas, serve the router on `host:port` until SIGINT / SIGTERM (or every
    replica is gone), then stop everything. Returns the exit code (0 on a requested stop).
    `api_key`: the router and every replica want it from clients."""
    # uvicorn, FastAPI (cluster.router_app): start-up cost (~1 s), as above
    import uvicorn

    from cluster.router_app import create_app

    say = out or (lambda line: print(line, flush=True))
    logging.basicConfig(format="harness cluster: %(message)s", level=logging.WARNING)
    if not port_free(port, host if host not in ("0.0.0.0", "::") else "127.0.0.1"):
        raise LauncherError(f"router port {port} is already in use; pass --port")
    launcher = Launcher(config, base_port=base_port, log_dir=log_dir,
                        startup_timeout_s=startup_timeout_s, out=say, api_key=api_key)
    if port in {r.port for r in launcher.replicas}:
        raise LauncherError(f"router port {port} is also a replica's port; pass another "
                            "--port or --base-port")
    launcher.prepare()

    def on_signal(signum: int, frame: Any) -> None:
        raise _Stop(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        try:
            launcher.start()
        except _Stop as stop:
            say(f"harness cluster: {stop} during start-up")
            return 0
        endpoints = [ReplicaEndpoint(name=r.name, role=r.spec.role, url=r.url, pid=r.pid)
                     for r in launcher.replicas]
        app = create_app(endpoints, config.router, name=config.name, cluster=config,
                         api_key=api_key)
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                               access_log=False, timeout_keep_alive=30))
        state = app.state.cluster
        exited: list[str] = []

        def on_exit(replica: Replica, returncode: int | None) -> None:
            nonlocal code
            state.mark_exited(replica.name, returncode)
            exited.append(replica.name)
            say(f"harness cluster: replica {replica.name} (port {replica.port}) exited with "
                f"code {returncode}; new programs go to the others. Last lines of "
                f"{replica.log_path}:\n{replica.log_tail(15)}")
            if len(exited) == len(launcher.replicas):
                say("harness cluster: every replica is gone; stopping the router")
                code = 1
                server.should_exit = True

        launcher.watch(on_exit)
        shown = host if host not in ("0.0.0.0", "::") else "127.0.0.1"
        say(f"harness cluster: router ({config.router.strategy}) on http://{shown}:{port}/v1 "
            f"in front of {len(launcher.replicas)} replica(s); GET /v1/cluster for their "
            "state, Ctrl-C to stop all")
        try:
            server.run()
        except _Stop:
            pass
        if not server.started and code == 0:
            code = 1  # uvicorn could not bind or start
        return code
    except _Stop:
        return 0
    finally:
        _hold_signals()
        say("harness cluster: stopping the replicas")
        launcher.stop()
        say("harness cluster: stopped")
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "reap":
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the reaper outlives whatever ends the launcher
        sys.exit(reap(float(sys.argv[2])))
    sys.exit("usage: python -m cluster.launcher reap GRACE_S  (internal; use "
             "`harness cluster serve FILE`)")
