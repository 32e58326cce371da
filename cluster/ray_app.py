"""`harness cluster serve FILE --ray`: the cluster file on Ray Serve.

Two deployments in one Serve application (named after the cluster):

* `replicas`: every replica of the file, one Serve replica each (`cluster.ray_replica`: the
  engine `harness serve` runs, on whichever Ray node has the resources the replica asks for;
  Ray restarts it when it dies), behind our Serve request router (`cluster.ray_router`);
* `router`: the ingress, one replica, the same FastAPI router app as the local cluster
  (`cluster.router_app`: routing by the cluster's strategy, P/D hand-off, SSE relay, event
  fan-out, `GET /v1/cluster`), its upstream requests sent over HTTP to the engine on the chosen
  replica's node (`--transport http`, the default) or through the replica's Serve actor
  (`--transport serve`). Serve's HTTP proxy puts it on `host:port` (OpenAI-compatible).

`serve_on_ray` connects to a running Ray cluster (`address`, e.g. `HEAD:6379` after `ray start
--head` there and `ray start --address HEAD:6379` on the other machines) or starts a local one
and stops it afterwards; it deploys, waits until every replica answers, and serves until
SIGINT / SIGTERM, then deletes the application (and stops the Ray it started).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from fastapi import FastAPI
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from cluster.config import ClusterConfig
from cluster.launcher import DEFAULT_ROUTER_PORT, DEFAULT_STARTUP_TIMEOUT_S, LauncherError
from cluster.ray_replica import ROUTING_STATS_PERIOD_S, ReplicaProcess
from cluster.ray_request_router import HarnessRequestRouter
from cluster.ray_router import EngineTransport, ServeTransport, view_for
from cluster.router_app import create_app
from cluster.router_state import ReplicaEndpoint

REPLICAS_DEPLOYMENT = "replicas"
#: The custom resource Ray gives its head node (Ray's own libraries pin actors there with it).
HEAD_NODE_RESOURCE = "node:__internal_head__"
ROUTER_DEPLOYMENT = "router"
#: Requests one replica may hold at once (vLLM queues them itself; Serve's default is 5).
MAX_ONGOING = 4096


def replica_url(name: str) -> str:
    """The logical URL the router proxy uses for a replica (`ServeTransport` reads it)."""
    return f"http://ray/{name}"


@dataclass
class RayResources:
    """What each replica asks Ray for: CPUs, GPUs and custom resources (e.g. `{"node_a": 1}`
    to pin replicas to a node started with that resource)."""

    cpus: float = 1.0
    gpus: float = 0.0
    custom: dict[str, float] = field(default_factory=dict)

    def actor_options(self) -> dict[str, Any]:
        return {"num_cpus": self.cpus, "num_gpus": self.gpus,
                **({"resources": dict(self.custom)} if self.custom else {})}


@dataclass(frozen=True)
class RayServe:
    """How a cluster file is served on Ray: the Ray cluster (`address`, e.g. ``HEAD:6379``;
    None: a local one, started here and stopped afterwards), the router's `host:port`, the
    replicas' logs, what each replica asks Ray for, how long the replicas may take to start,
    how the router reaches the engines (`transport`: ``http`` or ``serve``) and the API key
    the router and the replicas' engines want."""

    log_dir: str | Path
    address: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_ROUTER_PORT
    resources: RayResources = field(default_factory=RayResources)
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    transport: str = "http"
    api_key: str | None = None


@serve.ingress()
class ClusterIngress:
    """The router: our FastAPI router app, its upstream through the replicas' handle."""

    def __init__(self, config: dict[str, Any], replicas: DeploymentHandle,
                 transport: str = "http", api_key: str | None = None) -> None:
        self.config = ClusterConfig.model_validate(config)
        self.api_key = api_key
        self.replicas = replicas
        self.transport = transport
        self.view = view_for(replicas.app_name, replicas.deployment_name)
        self.replicas._init()  # start its request router now: the view fills before a request

    def __serve_build_asgi_app__(self) -> FastAPI:
        endpoints = [ReplicaEndpoint(name=s.name, role=s.role, url=replica_url(s.name))
                     for s in self.config.replicas]
        app = create_app(endpoints, self.config.router, name=self.config.name,
                         poll_interval_s=None, cluster=self.config, api_key=self.api_key,
                         transport=(EngineTransport(self.view) if self.transport == "http"
                                    else ServeTransport(self.replicas, self.view)))
        self.view.attach(app.state.cluster)
        return app


def build_app(config: ClusterConfig, options: RayServe) -> Any:
    """The Serve application (bound deployments) of a cluster file served as `options` say
    (the API key travels in the deployments' arguments)."""
    data = config.model_dump()
    replicas = serve.deployment(ReplicaProcess).options(
        name=REPLICAS_DEPLOYMENT, num_replicas=len(config.replicas),
        max_ongoing_requests=MAX_ONGOING, ray_actor_options=options.resources.actor_options(),
        health_check_period_s=2.0, health_check_timeout_s=30.0,
        graceful_shutdown_timeout_s=30.0,
        request_router_config=RequestRouterConfig(
            # by import path: each process that routes imports it (and its shared view)
            request_router_class=f"{HarnessRequestRouter.__module__}:"
                                 f"{HarnessRequestRouter.__name__}",
            request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
            request_routing_stats_timeout_s=5.0),
    ).bind(data, str(Path(options.log_dir).resolve()), options.startup_timeout_s,
           options.api_key)
    router = serve.deployment(ClusterIngress).options(
        name=ROUTER_DEPLOYMENT, num_replicas=1, max_ongoing_requests=MAX_ONGOING,
        # on the head node, with Serve's controller: the routing state (and what the router
        # knows of each replica's node) outlives the loss of any other node
        ray_actor_options={"num_cpus": 0, "resources": {HEAD_NODE_RESOURCE: 0.001}})
    return router.bind(data, replicas, options.transport, options.api_key)


class _Stop(Exception):
    """SIGINT / SIGTERM arrived."""


def serve_on_ray(config: ClusterConfig, options: RayServe, *,
                 out: Callable[[str], None] | None = None,
                 until: threading.Event | None = None) -> int:
    """Deploy the cluster on Ray as `options` say and serve it until SIGINT / SIGTERM (or
    `until` is set); returns the exit code (0 on a requested stop)."""
    say = out or (lambda line: print(line, flush=True))
    address, host, port = options.address, options.host, options.port
    log_dir, transport = options.log_dir, options.transport
    started_ray = address is None and not ray.is_initialized()
    if not ray.is_initialized():
        try:
            # "local": a new Ray for this cluster, never one that happens to run here; with
            # as many logical CPUs as its replicas ask for (they share this machine anyway)
            wanted = options.resources.cpus * len(config.replicas)
            local = {} if address else {"num_cpus": max(os.cpu_count() or 1, math.ceil(wanted))}
            ray.init(address=address or "local", include_dashboard=False,
                     log_to_driver=False, configure_logging=False, **local)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise LauncherError(f"cannot reach the Ray cluster at {address}: {exc}") from None
    stop = until or threading.Event()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, lambda *_: stop.set())
                    for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        say(f"harness cluster: deploying {len(config.replicas)} replica(s) of {config.name!r} on "
            f"Ray ({len(nodes)} node(s)"
            + (", started here" if started_ray else f", at {address}") + f"); logs in {log_dir}")
        serve.start(http_options={"host": host, "port": port})
        # Serve's HTTP options belong to the Ray cluster: its first `serve.start` set them
        http = serve.context._get_global_client().http_config
        if (http.host, http.port) != (host, port):
            say(f"harness cluster: Serve already runs on this Ray cluster with its HTTP proxy on "
                f"{http.host}:{http.port}; the router answers there, not on {host}:{port}")
            host, port = http.host, http.port
        began = time.monotonic()
        app = build_app(config, options)
        try:
            serve.run(app, name=config.name, route_prefix="/", blocking=False)
        except Exception as exc:  # noqa: BLE001 - a replica failed to start: Serve's message
            raise LauncherError(f"the cluster did not start on Ray: {exc}") from None
        say(f"harness cluster: {len(config.replicas)} replica(s) up after "
            f"{time.monotonic() - began:.0f} s")
        shown = host if host not in ("0.0.0.0", "::") else "127.0.0.1"
        say(f"harness cluster: router ({config.router.strategy}) on http://{shown}:{port}/v1 "
            f"on Ray Serve (to the engines: {transport}); GET /v1/cluster for the replicas and "
            "their nodes, Ctrl-C to stop")
        while not stop.wait(0.5):
            pass
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        say("harness cluster: stopping the replicas")
        try:
            serve.delete(config.name)
            if started_ray:
                serve.shutdown()
        finally:
            if started_ray:
                ray.shutdown()
        say("harness cluster: stopped")
