"""The served router: one OpenAI-compatible endpoint in front of a cluster's `harness serve`
replicas (started by `cluster.launcher`, or any replicas the caller names).

Why a thin FastAPI proxy: the placement decision is `cluster.routing` (the same objects the
virtual-time cluster uses); the router only fills in their `ReplicaLoad` views from what a
proxy can see (`cluster.router_state`: its own count of requests in flight per replica, vLLM's
`vllm:kv_cache_usage_perc` gauge polled from each replica's Prometheus `/metrics`) and moves
bytes. The proxy itself is `cluster.router_proxy.RouterProxy`, usable without a web framework;
this module only maps its endpoints to routes and renders its `Reply`s.

Endpoints:

* `POST /v1/chat/completions`, `POST /v1/completions`: the program id is the body's
  `session_id` or the `X-Session-ID` header, the turn `vllm_xargs.turn` (default 0); where the
  router has tenants, a program another key opened is refused (403). The router
  picks the replica; the answer carries `X-Harness-Replica` (and `X-Harness-Prefill` under
  P/D). Bodies are passed on unchanged (colocated); streamed answers (SSE) are relayed chunk
  by chunk as they arrive. Under P/D the request first goes to the prefill replica, and the
  returned `kv_transfer_params` go with the original request to the decode replica
  (`cluster.router_turns`).
* `POST /v1/agent/events`: read up to `server.intake.events.MAX_BODY_BYTES` (413 beyond),
  validated as the replicas validate (`server.intake.events`), checked against who opened each
  program where the router has tenants (403; `server.intake.ownership`), then fanned out by
  `cluster.placement`'s rule to the replicas that hold the program
  (`cluster.router_events`); `GET /v1/agent/events`: the router's event counters.
* `GET /v1/models` (from the first live replica), `GET /health` (200 while a replica lives),
  `GET /v1/cluster` (per-replica state and the routing counters).

A replica that stops answering (connection refused or dropped, or three failed metric polls in
a row) is marked not alive: requests in flight to it fail with a 502 whose message names it
(`replica d1 at 127.0.0.1:8102 is not answering: ...`), and new programs, and programs bound to
it, go elsewhere. A replica whose metrics answer again is alive again, unless its launcher
reported the process gone.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from cluster.router_auth import RequireApiKey, credential_of_scope
from cluster.router_proxy import RouterProxy
from cluster.router_state import ReplicaEndpoint
from cluster.router_wire import Reply
from cluster.routing import Router
from server.intake.events import EventError, read_body
from server.intake.ownership import ProgramOwners, several_keys


def create_app(replicas: Sequence[ReplicaEndpoint], router: Router | Any, *,
               name: str = "cluster", poll_interval_s: float | None = 0.5,
               transport: httpx.AsyncBaseTransport | None = None,
               connect_timeout_s: float = 5.0, cluster: Any = None,
               api_key: str | None = None) -> FastAPI:
    """The router app over a `RouterProxy` (see it for the arguments); `app.state.cluster` is
    its `ClusterState`, `app.state.proxy` the proxy. `api_key`: clients must send it, or one of
    the tenants' keys of a `RouterSpec` `router` (`api_keys`; `cluster.router_auth`). With one
    key a client's `Authorization` goes on to the replicas; with tenants the replicas get
    `api_key` instead, and each program belongs to the key that opened it."""
    keys = [*([api_key] if api_key else []), *getattr(router, "api_keys", ())]
    owners = ProgramOwners() if several_keys(keys) else None
    proxy = RouterProxy(replicas, router, name=name, poll_interval_s=poll_interval_s,
                        transport=transport, connect_timeout_s=connect_timeout_s,
                        cluster=cluster, owners=owners)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with proxy:
            yield

    app = FastAPI(title=f"harness cluster router ({name})", lifespan=lifespan)
    app.state.cluster = proxy.state
    app.state.proxy = proxy
    if keys:
        app.add_middleware(RequireApiKey, api_keys=keys, upstream=api_key)

    async def completions(request: Request, path: str) -> Response:
        return render(await proxy.complete(path, await request.body(), request.headers,
                                           client_gone=lambda: _disconnected(request),
                                           credential=credential_of_scope(request.scope)))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await completions(request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def text_completions(request: Request) -> Response:
        return await completions(request, "/v1/completions")

    @app.post("/v1/agent/events")
    async def agent_events(request: Request) -> Response:
        try:
            raw = await read_body(request.stream(), request.headers.get("content-length"))
        except EventError as exc:
            return render(proxy.events.refuse(exc))
        return render(await proxy.post_events(raw, request.headers,
                                              credential_of_scope(request.scope)))

    @app.get("/v1/agent/events")
    async def agent_events_stats() -> Response:
        return render(proxy.events_stats())

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return render(await proxy.models(request.headers))

    @app.get("/health")
    async def health() -> Response:
        return render(proxy.health())

    @app.get("/v1/cluster")
    async def cluster_state() -> Response:
        return render(proxy.cluster())

    return app


def render(reply: Reply) -> Response:
    """A `Reply` as Starlette sends it: relayed stream, bytes as the replica sent them, or
    JSON."""
    if reply.stream is not None:
        return StreamingResponse(reply.stream, status_code=reply.status,
                                 media_type=reply.media_type, headers=reply.headers)
    if reply.content is not None:
        return Response(reply.content, status_code=reply.status, media_type=reply.media_type,
                        headers=reply.headers)
    return JSONResponse(reply.payload, status_code=reply.status, headers=reply.headers)


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
