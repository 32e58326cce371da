"""One replica of a cluster file as a Ray Serve replica: the engine `harness serve` runs (its
`vllm serve` command, `cluster.launcher.replica_command`) as a child process on the replica's
Ray node, listening on the node's address.

Why a plain Serve deployment and not Ray Serve LLM (`ray.serve.llm`): LLM Serve runs vLLM's
engine in-process behind its own OpenAI ingress. Our engine needs vLLM's own API server: the
agent-events endpoint (`/v1/agent/events`, our `harness_agent_events` vLLM plugin) lives in it
and talks to the scheduler over the replica's events channel (`HARNESS_EVENTS_IPC`), and the
policy settings reach the engine core through the environment `harness serve` builds. Running
that command unchanged keeps one engine path for the local and the Ray cluster.

All replicas of a cluster are replicas of ONE deployment, so one Serve request router sees all
of them (`cluster.ray_router`). Which replica of the file a Serve replica is comes from its
Serve rank (0..N-1, reused by the replica Ray starts in place of a dead one, so the restarted
replica is the same name, role and policy). What it tells the router:

* `record_replica_metadata`: its name, role, node, the pids of its actor and engine;
* `record_routing_stats` (every `ROUTING_STATS_PERIOD_S`): vLLM's KV-usage and queue gauges and
  the scheduler's pin and event counters, read from its engine's Prometheus `/metrics`;
* `check_health`: fails once its engine process exited, and Ray replaces the replica.

Requests arrive as `HttpCall`s and are answered as a stream: first `{"status", "headers"}`,
then the body's bytes as the engine sends them (`cluster.ray_router.ServeTransport` turns
that back into an httpx response for the router proxy).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import ray
from ray import serve

from cluster.config import ClusterConfig
from cluster.launcher import (
    LauncherError,
    death_signal_preexec,
    replica_command,
)
from cluster.router_state import engine_gauges
from common.processes import free_port, stop_process_group

#: How often Serve asks each replica for its gauges (seconds); the router's KV view is this old.
ROUTING_STATS_PERIOD_S = 1.0
STARTUP_TIMEOUT_S = 600.0
STOP_GRACE_S = 20.0


@dataclass
class HttpCall:
    """One HTTP request for the replica named `target` (the router proxy's upstream request)."""

    target: str
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def reap_predecessor(record: Path, node_id: str) -> None:
    """Kill what is left of the engine a dead predecessor of this replica started on this node.

    Its API server dies with its actor (PDEATHSIG), but vLLM's engine core, its child, does
    not: it would hold its memory for ever. Its process group is in `record`; only processes
    of that group on this node whose command line is vLLM's are killed (a reused group id
    belongs to someone else)."""
    try:
        last = json.loads(record.read_text())
    except (OSError, ValueError):
        return
    if last.get("node_id") != node_id or not isinstance(last.get("pgid"), int):
        return
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.getpgid(int(proc.name)) != last["pgid"]:
                continue
            command = (proc / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if b"vllm" in command.lower():
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass


class ReplicaProcess:
    """The Serve replica: starts its engine in `__init__` (and waits for `/health`), relays
    `HttpCall`s to it, stops it when Serve stops the replica."""

    def __init__(self, config: dict[str, Any], log_dir: str,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S,
                 api_key: str | None = None) -> None:
        self.config = ClusterConfig.model_validate(config)
        context = serve.get_replica_context()
        rank = context.rank.rank
        if not 0 <= rank < len(self.config.replicas):
            raise LauncherError(f"Serve gave this replica rank {rank}, but the cluster file has "
                                f"{len(self.config.replicas)} replicas")
        self.spec = self.config.replicas[rank]
        self.node_id = ray.get_runtime_context().get_node_id()
        self.node_ip = ray.util.get_node_ip_address()
        self.port = free_port(self.node_ip)
        # on the node's address: the router reaches it there with `--transport http`
        self.url = f"http://{self.node_ip}:{self.port}"
        side = free_port() if self.config.carries_kv(self.spec) else None
        argv, env = replica_command(self.config, self.spec, self.port, host=self.node_ip,
                                    side_channel_port=side, side_channel_host=self.node_ip,
                                    api_key=api_key)
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.log_path = Path(log_dir) / f"{self.spec.name}.log"
        self.engine_record = Path(log_dir) / f"{self.spec.name}.engine.json"
        reap_predecessor(self.engine_record, self.node_id)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **env}, start_new_session=True,
                # SIGKILL: an engine whose actor died must not linger; on SIGTERM vLLM's API
                # server waits for its requests, whose engine core is gone, forever
                preexec_fn=death_signal_preexec(signal.SIGKILL))
        self.engine_record.write_text(json.dumps({"node_id": self.node_id,
                                                  "pgid": self.process.pid}))
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(connect=5.0, read=None,
                                                              write=60.0, pool=None))
        self._wait_ready(startup_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self.process.poll() is not None:
                    raise LauncherError(f"replica {self.spec.name}: its engine exited with code "
                                        f"{self.process.returncode} while starting; last lines "
                                        f"of {self.log_path}:\n{self.log_tail()}")
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self._stop()
                    raise LauncherError(f"replica {self.spec.name} did not answer within "
                                        f"{timeout_s:.0f} s; last lines of {self.log_path}:\n"
                                        f"{self.log_tail()}")
                time.sleep(1.0)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no log)"
        return "\n".join(f"    {line}" for line in text)

    # -- what Serve asks ------------------------------------------------------------------------
    def record_replica_metadata(self) -> dict[str, Any]:
        return {"name": self.spec.name, "role": self.spec.role, "node_id": self.node_id,
                "node_ip": self.node_ip, "actor_pid": os.getpid(), "pid": self.process.pid,
                "engine_url": self.url,
                "log": str(self.log_path)}

    async def record_routing_stats(self) -> dict[str, Any]:
        try:
            answer = await self.client.get(self.url + "/metrics", timeout=2.0)
            answer.raise_for_status()
        except httpx.HTTPError:
            return {}
        return engine_gauges(answer.text)

    def check_health(self) -> None:
        if self.process.poll() is not None:
            raise LauncherError(f"replica {self.spec.name}: its engine exited with code "
                                f"{self.process.returncode}")

    async def __call__(self, call: HttpCall) -> AsyncIterator[Any]:
        """Relay one request to the engine: `{"status", "headers"}`, then the body's chunks.
        Cancelling the stream (the client went away) closes the engine's connection, and
        vLLM aborts the request."""
        request = self.client.build_request(call.method, self.url + call.path,
                                            headers=call.headers, content=call.body)
        answer = await self.client.send(request, stream=True)
        try:
            yield {"status": answer.status_code, "headers": dict(answer.headers)}
            async for chunk in answer.aiter_raw():
                yield chunk
        finally:
            await answer.aclose()

    # -- stop -----------------------------------------------------------------------------------
    def _stop(self) -> None:
        """Ctrl-C the engine's process group (as `harness serve` would get), then SIGKILL what
        is left after a grace period (its engine core included)."""
        process = getattr(self, "process", None)
        if process is None:
            return
        stop_process_group(process, STOP_GRACE_S)

    def __del__(self) -> None:
        self._stop()
