"""The served router without a web framework: `RouterProxy` owns the cluster's state, the
upstream httpx client and the metric poll, and answers each endpoint with a `Reply`.

Why a class apart from `cluster.router_app`: the proxy's behaviour (routing, P/D hand-off,
the SSE relay, the event fan-out) is driven and tested directly against replicas, and the
FastAPI app only renders its replies. Each job is its own small class: `TurnForwarder`
(`cluster.router_turns`), `EventFanout` (`cluster.router_events`), `ClusterInfo` (below).
Use it as an async context manager (`async with RouterProxy(...) as proxy:`), or call
`start()` / `close()`: the client and the poll live inside the running event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from cluster.router_events import EventFanout
from cluster.router_state import ClusterState, ReplicaEndpoint, poll_forever
from cluster.router_turns import TurnForwarder
from cluster.router_wire import (
    GONE,
    KEEPALIVE_EXPIRY_S,
    Reply,
    auth_of,
    error_reply,
    failed_reply,
    gone_reply,
)
from cluster.routers import make_router
from cluster.routing import Router
from server.intake.ownership import ProgramOwners


class ClusterInfo:
    """`GET /v1/models` (from the first live replica), `GET /health` (200 while a replica
    lives), `GET /v1/cluster` (per-replica state and the routing counters)."""

    def __init__(self, state: ClusterState, client: Callable[[], httpx.AsyncClient]) -> None:
        self.state = state
        self.client = client  # the router's upstream client, opened when it starts

    async def models(self, headers: Any = None) -> Reply:
        live = self.state.live()
        if not live:
            return error_reply("no live replica", 503)
        replica = live[0]
        try:
            answer = await self.client().get(replica.url + "/v1/models", timeout=10.0,
                                             headers=auth_of(headers))
        except GONE as exc:
            return gone_reply(replica, exc, self.state.counters)
        except httpx.HTTPError as exc:
            return failed_reply(replica, exc, self.state.counters)
        return Reply(answer.status_code, content=answer.content,
                     media_type=answer.headers.get("content-type"))

    def health(self) -> Reply:
        live = [r.name for r in self.state.live()]
        return Reply(200 if live else 503,
                     payload={"status": "ok" if live else "no live replica", "alive": live})

    def cluster(self) -> Reply:
        return Reply(payload=self.state.to_json())


class RouterProxy:
    """The router in front of `replicas`. `router`: a `cluster.routing.Router`, or a
    `RouterSpec` to build one (`ampd` needs `cluster`, the `ClusterConfig`, whose profiles
    and links price its estimates). `transport`: an httpx transport for the upstream client
    (tests use a mock one). `owners`: who opened each program, where the router has tenants
    (`server.intake.ownership`; None: one tenant, nothing checked)."""

    def __init__(self, replicas: Sequence[ReplicaEndpoint], router: Router | Any, *,
                 name: str = "cluster", poll_interval_s: float | None = 0.5,
                 transport: httpx.AsyncBaseTransport | None = None,
                 connect_timeout_s: float = 5.0, cluster: Any = None,
                 owners: ProgramOwners | None = None) -> None:
        if not isinstance(router, Router):
            router = make_router(router, cluster)
        self.state = ClusterState(replicas, router, name=name)
        self.poll_interval_s = poll_interval_s
        self._transport = transport
        self._connect_timeout_s = connect_timeout_s
        self._client: httpx.AsyncClient | None = None
        self._poll: asyncio.Task[None] | None = None
        self.events = EventFanout(self.state, self.client, owners)
        self.turns = TurnForwarder(self.state, self.client, self.events)
        self.info = ClusterInfo(self.state, self.client)

    def client(self) -> httpx.AsyncClient:
        """The upstream client (only while started)."""
        if self._client is None:
            raise RuntimeError("the router proxy is not started: use `async with` or start()")
        return self._client

    async def start(self) -> None:
        """Open the upstream client and start polling the replicas' metrics."""
        self._client = httpx.AsyncClient(
            transport=self._transport,
            timeout=httpx.Timeout(connect=self._connect_timeout_s, read=None, write=60.0,
                                  pool=None),
            limits=httpx.Limits(max_connections=4096, max_keepalive_connections=256,
                                keepalive_expiry=KEEPALIVE_EXPIRY_S))
        if self.poll_interval_s is not None:  # None: something else keeps the gauges (Ray)
            self._poll = asyncio.create_task(poll_forever(self._client, self.state,
                                                          self.poll_interval_s))

    async def close(self) -> None:
        """Stop the poll and close the upstream client."""
        if self._poll is not None:
            self._poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll
            self._poll = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> RouterProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the endpoints ------------------------------------------------------------------------
    async def complete(self, path: str, raw: bytes, headers: Any,
                       client_gone: Callable[[], Awaitable[None]] | None = None,
                       credential: str | None = None) -> Reply:
        """`POST /v1/chat/completions` or `POST /v1/completions` (`TurnForwarder.complete`);
        its program is opened for `credential` (its key's fingerprint) if nobody has, and
        refused (403) when another key opened it (`EventFanout.claim`)."""
        refused = self.events.claim(raw, headers, credential)
        if refused is not None:
            return refused
        return await self.turns.complete(path, raw, headers, client_gone)

    async def post_events(self, raw: bytes, headers: Any = None,
                          credential: str | None = None) -> Reply:
        """`POST /v1/agent/events` (`EventFanout.receive`)."""
        return await self.events.receive(raw, headers, credential)

    def events_stats(self) -> Reply:
        """`GET /v1/agent/events`: the router's event counters (`EventFanout.stats`)."""
        return Reply(payload=self.events.stats())

    async def models(self, headers: Any = None) -> Reply:
        return await self.info.models(headers)

    def health(self) -> Reply:
        return self.info.health()

    def cluster(self) -> Reply:
        return self.info.cluster()
