"""Our routing on Ray Serve: the Serve request router of the replicas' deployment, the view of
the replicas it keeps for the cluster's router, and the httpx transport that sends the router
proxy's upstream requests through Serve.

Who decides what (no second copy of any decision): the placement decision is the cluster's
`cluster.routing` / `cluster.ampd` object, called by the router proxy (`ClusterState.route`,
`cluster.router_turns`) exactly as behind the local launcher; P/D hand-off, the SSE relay and
the event fan-out are the proxy's too. Ray supplies what the proxy used to do itself:

* which replicas run, where, and what they hold: `HarnessRequestRouter.update_replicas`
  (`cluster.ray_request_router`) (Serve's
  controller pushes the running replicas with each one's `replica_metadata` and
  `routing_stats`) feeds `ReplicaView`, which marks each named replica alive or gone in the
  proxy's `ClusterState` at once and copies its KV-usage and queue gauges (instead of the
  proxy's own `/metrics` poll); a replica that leaves the running set, or whose call fails with
  a dead actor, takes no new turn and its programs rebind (the proxy's rule);
* the transport: by default `EngineTransport` sends each upstream request straight to the
  engine of the replica the proxy chose, over HTTP to its node (Ray placed it there and
  reports where it runs); with `--transport serve`, `ServeTransport` sends it through a
  `DeploymentHandle` to that replica's actor, which relays it, and the request router's
  `choose_replicas` ranks exactly that replica (our decision) and nothing else, so Serve never
  moves a turn away from its KV cache. Not the default, for measured reasons
  (docs/cluster.md): a Ray message per streamed token, and requests that sometimes waited
  seconds in the ingress before reaching any replica;
* restarts: a replica whose engine dies fails its health check and Ray starts another with the
  same Serve rank, hence the same name; it rejoins the view when it is running.

Where the routing state lives: in the one ingress replica (`cluster.ray_app`), in the same
process as its request router: the bindings, the placement of each program, AMPD's windowed
TTFT/ITL and the queued prefill tokens are the proxy's `ClusterState`; the replicas' gauges come
from Serve (`routing_stats`). The ingress therefore runs as a single replica (state is not
shared between ingress replicas); `session` is a consistent hash, so a restarted ingress binds
programs where they were (unless the KV guard moved them).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import RunningReplica

from cluster.ray_replica import HttpCall
from cluster.router_state import ClusterState, DownReason
from cluster.router_wire import KEEPALIVE_EXPIRY_S

log = logging.getLogger("harness.cluster.router")

#: Ray errors that mean the replica (its actor, or its node) is gone.
REPLICA_GONE = (ActorDiedError, ActorUnavailableError, RayActorError)


#: Seconds between asking the GCS whether the node of a replica Serve dropped is gone.
RECHECK_S = 2.0
#: How a message about a lost node ends.
NODE_GONE = (" (lost or stopped); Ray places the replica on another node when one has the "
             "resources")


class ReplicaGoneError(RuntimeError):
    """The replica a request was meant for is not running (Ray is restarting it)."""


@dataclass
class RayReplica:
    """A running Serve replica as the view knows it."""

    name: str
    role: str
    replica_id: str
    node_id: str
    node_ip: str
    pid: int | None  # its engine's (`harness serve`'s) process group
    actor_pid: int | None  # the Serve replica's actor process
    engine_url: str  # the engine, on its node's address
    stats: dict[str, Any]


class ReplicaView:
    """The replicas Serve runs now, by cluster-file name, and the `ClusterState` they update.

    Written by the request router (on Serve's router loop), read by the ingress (its own
    loop); both in the ingress replica's process, so one lock suffices."""

    def __init__(self) -> None:
        self.running: dict[str, RayReplica] = {}
        self.state: ClusterState | None = None
        self.restarts: dict[str, int] = {}
        self._seen: set[str] = set()  # Serve replica ids seen, to count restarts
        self._nodes: dict[str, str] = {}  # last node each name ran on
        self._lock = threading.Lock()
        self.ready = threading.Event()  # set once every named replica has run
        self._recheck: threading.Timer | None = None

    def attach(self, state: ClusterState) -> None:
        with self._lock:
            self.state = state
            self._apply()

    def update(self, replicas: list[RunningReplica]) -> None:
        running: dict[str, RayReplica] = {}
        for r in replicas:
            meta = r.replica_metadata
            name = meta.get("name")
            if name is None:
                continue
            running[name] = RayReplica(
                name=name, role=meta.get("role", "colocated"),
                replica_id=r.replica_id.unique_id, node_id=r.node_id or meta.get("node_id", ""),
                node_ip=meta.get("node_ip", ""), pid=meta.get("pid"),
                actor_pid=meta.get("actor_pid"), engine_url=meta.get("engine_url", ""),
                stats=dict(r.routing_stats or {}))
        with self._lock:
            for name, replica in running.items():
                if replica.replica_id not in self._seen:
                    if name in self._nodes:
                        self.restarts[name] = self.restarts.get(name, 0) + 1
                    self._seen.add(replica.replica_id)
                self._nodes[name] = replica.node_id
            self.running = running
            self._apply()

    def _apply(self) -> None:
        state = self.state
        if state is None:
            return
        unsure = False  # a replica is gone and its node not (yet) known to be
        for name, replica in state.replicas.items():
            ray_replica = self.running.get(name)
            if ray_replica is None:
                # again when already dead: a failed call, or Serve, may have dropped it before
                # the GCS declared its node dead, and the node is what the user needs to hear
                if replica.alive or replica.down_reason is not DownReason.NODE_GONE:
                    reason, message = self.why_gone(name)
                    replica.mark_dead(message, reason)
                    unsure |= name in self._nodes and reason is not DownReason.NODE_GONE
                continue
            replica.pid = ray_replica.pid
            replica.extra = {"node": ray_replica.node_id, "node_ip": ray_replica.node_ip,
                             "engine_url": ray_replica.engine_url,
                             "actor_pid": ray_replica.actor_pid,
                             "restarts": self.restarts.get(name, 0)}
            replica.apply_gauges(ray_replica.stats)
            if not replica.alive:
                if replica.routed or replica.prefills:
                    log.warning("replica %s runs again (Ray node %s)", name,
                                ray_replica.node_id[:12])
                replica.mark_alive(forget_error=True)
        if all(name in self.running for name in state.replicas):
            self.ready.set()
        if unsure and self._recheck is None:
            # Serve says nothing more until the replica runs again: ask the GCS meanwhile
            self._recheck = threading.Timer(RECHECK_S, self._recheck_nodes)
            self._recheck.daemon = True
            self._recheck.start()

    def _recheck_nodes(self) -> None:
        with self._lock:
            self._recheck = None
            self._apply()

    def why_gone(self, name: str) -> tuple[DownReason, str]:
        """Why `name` takes no request: not run yet, its node is gone (named), or Ray
        restarts it; with the message that says so."""
        node = self._nodes.get(name)
        if node is None:
            return DownReason.NOT_STARTED, f"replica {name} is not running yet"
        if not node_alive(node):
            return DownReason.NODE_GONE, node_gone(name, node)
        return DownReason.RESTARTING, (f"replica {name} (Ray node {node[:12]}) is not running; "
                                       "Ray is restarting it")

    def gone_message(self, name: str) -> str:
        return self.why_gone(name)[1]

    def find(self, name: str) -> RayReplica | None:
        return self.running.get(name)


def node_gone(name: str, node_id: str) -> str:
    """What to say of replica `name` whose Ray node is gone."""
    return f"replica {name}: its Ray node {node_id} is gone{NODE_GONE}"


def node_alive(node_id: str) -> bool:
    """Is the Ray node alive (asks the GCS; only on a replica set change or a failure)?"""
    try:
        return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())
    except Exception:  # noqa: BLE001 - the GCS itself unreachable: say the node is not alive
        return False


#: One view per (app, deployment), shared by the request router and the ingress of a process.
_VIEWS: dict[tuple[str, str], ReplicaView] = {}
_VIEWS_LOCK = threading.Lock()


def view_for(app_name: str, deployment: str) -> ReplicaView:
    with _VIEWS_LOCK:
        return _VIEWS.setdefault((app_name, deployment), ReplicaView())


class _ServeStream(httpx.AsyncByteStream):
    """A replica's answer body, chunk by chunk, from a Serve response generator."""

    def __init__(self, generator: Any, name: str, gone: Callable[[BaseException], Exception]):
        self.generator = generator
        self.name = name
        self.gone = gone

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.generator:
                yield chunk
        except REPLICA_GONE as exc:
            raise httpx.ReadError(str(self.gone(exc))) from None

    async def aclose(self) -> None:
        self.generator.cancel()


class ServeTransport(httpx.AsyncBaseTransport):
    """The router proxy's upstream transport on Ray: `http://ray/NAME/path` goes to the Serve
    replica named NAME through `handle` (in the path, a name keeps its case); a replica that
    is not running, or whose actor died,
    is a `httpx.ConnectError` naming it (the proxy then marks it dead and answers 502, as for a
    local replica that stopped answering)."""

    def __init__(self, handle: DeploymentHandle, view: ReplicaView) -> None:
        self.handle = handle
        self.view = view

    def _gone(self, name: str, exc: BaseException | None = None) -> httpx.ConnectError:
        detail = self.view.gone_message(name)
        replica = self.view.find(name)
        if exc is not None and replica is not None:  # still in Serve's running set
            detail = (node_gone(name, replica.node_id) if not node_alive(replica.node_id)
                      else f"replica {name}'s Ray actor died ({type(exc).__name__})")
        return httpx.ConnectError(detail)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        name, _, path = request.url.raw_path.decode().lstrip("/").partition("/")
        if self.view.find(name) is None:
            raise self._gone(name)
        headers = {k.decode(): v.decode() for k, v in request.headers.raw
                   if k.lower() not in (b"host", b"content-length")}
        call = HttpCall(target=name, method=request.method, path="/" + path,
                        headers=headers, body=await request.aread())
        generator = self.handle.options(stream=True).remote(call)
        try:
            head = await generator.__anext__()
        except (ReplicaGoneError, *REPLICA_GONE) as exc:
            raise self._gone(name, exc) from None
        except asyncio.CancelledError:
            generator.cancel()
            raise
        except StopAsyncIteration:
            raise httpx.RemoteProtocolError(f"replica {name} closed the answer") from None
        except Exception as exc:  # noqa: BLE001 - the replica failed to reach its engine
            raise httpx.ConnectError(f"replica {name}: {exc}") from None
        head_headers = {k: v for k, v in head["headers"].items()
                        if k.lower() != "transfer-encoding"}
        return httpx.Response(head["status"], headers=head_headers,
                              stream=_ServeStream(generator, name,
                                                  lambda exc: self._gone(name, exc)),
                              request=request)


class EngineTransport(httpx.AsyncBaseTransport):
    """The router proxy's upstream transport on Ray with `--transport http`: `http://ray/NAME/
    path` goes straight to the engine of the Serve replica named NAME (`engine_url`, on its
    node's address), over HTTP as behind the local launcher. Ray still places, restarts and
    reports the replicas (`ReplicaView`); only the bytes skip Serve's actors, which cost a
    Ray message per streamed token (docs/cluster.md has the measurement). A replica that is
    not running, or whose engine refuses the connection, is a `httpx.ConnectError` naming it."""

    def __init__(self, view: ReplicaView) -> None:
        self.view = view
        self.http = httpx.AsyncHTTPTransport(limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=256,
            keepalive_expiry=KEEPALIVE_EXPIRY_S))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        name, _, path = request.url.raw_path.decode().lstrip("/").partition("/")
        replica = self.view.find(name)
        if replica is None or not replica.engine_url:
            raise httpx.ConnectError(self.view.gone_message(name))
        url = httpx.URL(replica.engine_url + "/" + path)
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"host"]
        upstream = httpx.Request(request.method, url, headers=[(b"Host", url.netloc), *headers],
                                 stream=request.stream, extensions=request.extensions)
        try:
            response = await self.http.handle_async_request(upstream)
        except httpx.ConnectError:
            gone = self.view.gone_message(name) if self.view.find(name) is None else (
                f"replica {name}'s engine at {replica.engine_url} refused the connection")
            raise httpx.ConnectError(gone) from None
        response.stream = _WatchedStream(response.stream, self.view, name, replica.replica_id)
        return response

    async def aclose(self) -> None:
        await self.http.aclose()


#: Seconds an engine's answer may stay silent before the stream asks whether its replica runs.
WATCH_S = 1.0


class _WatchedStream(httpx.AsyncByteStream):
    """An engine's answer that fails (`httpx.ReadError`, as a dropped connection would) once
    Ray no longer runs the replica it came from: an engine on a lost node may never close
    its connection, and a stream waiting on it would wait for ever."""

    def __init__(self, stream: Any, view: ReplicaView, name: str, replica_id: str) -> None:
        self.stream = stream
        self.view = view
        self.name = name
        self.replica_id = replica_id

    def _running(self) -> bool:
        current = self.view.find(self.name)
        return current is not None and current.replica_id == self.replica_id

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self.stream.__aiter__()
        while True:
            pending = asyncio.ensure_future(chunks.__anext__())
            while not (await asyncio.wait({pending}, timeout=WATCH_S))[0]:
                if not self._running():
                    pending.cancel()
                    raise httpx.ReadError(f"replica {self.name} stopped running while it "
                                          f"answered: {self.view.gone_message(self.name)}")
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                return
            yield chunk

    async def aclose(self) -> None:
        await self.stream.aclose()
