"""The soak against a cluster: `harness cluster serve FILE` (the project's launcher and router,
`cluster.launcher`) in the place of one `harness serve`, and the fault only a cluster has, a
replica killed.

Why its own process wrapper: the soak starts, stops and restarts its server through the same
four things `harness.server_process.ServerProcess` has (`start`, `stop`, `base_url`,
`process`); a cluster is one more command with the same shape, whose replicas the router lists
(``GET /v1/cluster``: each replica's URL, pid and whether it is alive). The sampler reads the
scheduler status and the gauges of each live replica and sums them, beside the router's own
program books (``programs_held``); the drain's keep-alive reaches every live replica, since an
engine with no work never steps and so never forgets a silent program.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from common.errors import UserError
from common.processes import free_port, killpg, open_server_log, stop_process_group

#: how long the cluster may take to come up (several vLLM servers side by side on few cores)
CLUSTER_STARTUP_S = 900.0
#: where in the run (share of its driving time) a replica is killed (``kill_replica``)
KILL_REPLICA_AT = 0.3


class ClusterStartError(UserError):
    pass


class ClusterProcess:
    """`harness cluster serve FILE` in its own session, its logs under `log_dir`."""

    def __init__(self, cluster_file: str | Path, log_dir: Path,
                 startup_timeout_s: float = CLUSTER_STARTUP_S,
                 stale_after_s: float | None = None) -> None:
        self.cluster_file = Path(cluster_file)
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s
        #: the replicas' and the router's silent-program bound (None: the file's)
        self.stale_after_s = stale_after_s
        self.port = free_port()
        self.base_port = free_port()  # the replicas take this and the ports after it
        self.process: subprocess.Popen[bytes] | None = None
        self.served_model: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ClusterProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / "cluster.log"
        with open_server_log(log, "harness cluster serve") as out:
            self.process = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ClusterStartError(f"harness cluster serve exited with "
                                        f"{self.process.returncode}; its log: {log}")
            try:
                replicas = self.replicas()
                if replicas and all(r.get("alive") for r in replicas):
                    return self
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(1.0)
        self.stop()
        raise ClusterStartError(f"the cluster did not answer in {self.startup_timeout_s:.0f} s;"
                                f" its log: {log}")

    def command(self) -> list[str]:
        """`harness cluster serve FILE` on this wrapper's ports, logs and bound."""
        bound = ([] if self.stale_after_s is None
                 else ["--stale-after-s", f"{self.stale_after_s:g}"])
        return [sys.executable, "-m", "cli", "cluster", "serve", str(self.cluster_file),
                "--port", str(self.port), "--base-port", str(self.base_port),
                "--log-dir", str(self.log_dir), *bound]

    def stop(self) -> int | None:
        if self.process is None:
            return None
        return stop_process_group(self.process, grace_s=60)

    def replicas(self) -> list[dict[str, Any]]:
        """The router's view of its replicas (``GET /v1/cluster``)."""
        return list(httpx.get(f"{self.base_url}/v1/cluster", timeout=5.0).json()["replicas"])

    def kill_replica(self) -> str | None:
        """SIGKILL the last live replica's process group (its API server and engine core), as
        a machine that dies would; its name, or None when none is left to kill."""
        live = [r for r in self.replicas() if r.get("alive") and r.get("pid")]
        if len(live) < 2:
            return None  # the last one standing is the restart's business, not this fault's
        victim = live[-1]
        try:
            killpg(os.getpgid(int(victim["pid"])), signal.SIGKILL)
        except ProcessLookupError:
            return None
        return str(victim["name"])


@dataclass(frozen=True)
class StatusTargets:
    """Where a sample reads: the scheduler status and gauges of each live replica of a
    cluster (or of the one server), and the size of the router's own program books
    (``programs_held`` of ``GET /v1/cluster``; None: one server, or a router keeping none)."""

    bases: tuple[str, ...]
    router_programs: int | None = None


async def status_targets(client: httpx.AsyncClient, server: Any) -> StatusTargets:
    """The `StatusTargets` of `server` now (a cluster's router not answering: none)."""
    if not isinstance(server, ClusterProcess):
        return StatusTargets((server.base_url,))
    try:
        response = await client.get(f"{server.base_url}/v1/cluster", timeout=5.0)
        view = response.json()
        held = view.get("programs_held")
        return StatusTargets(tuple(r["url"] for r in view["replicas"] if r.get("alive")),
                             held if isinstance(held, int) else None)
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return StatusTargets(())
