"""The two endpoints that take agent events, in this process and without servers: the engine's
(a FastAPI app with our vLLM endpoint plugin attached, as vLLM's `build_app` attaches it, behind
a key check that does what vLLM's `--api-key` does) and the cluster router's (`create_app`
over replicas behind an httpx mock transport that record what reaches them).

Used by tests/test_event_ownership.py and tests/test_events_input.py."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Sequence
from typing import Any

import httpx
from fastapi import FastAPI, Request
from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from cluster.config import RouterSpec
from cluster.router_app import create_app
from cluster.router_state import ReplicaEndpoint
from server.intake.event_plugin import AgentEventsPlugin

ROUTE = "/v1/agent/events"


class KeyCheck:
    """vLLM's `--api-key` check (`vllm.entrypoints.serve.middleware.authenticate`), without
    importing vLLM: `/v1` needs `Authorization: Bearer` one of `keys`."""

    def __init__(self, app: Any, keys: Sequence[str]) -> None:
        self.app = app
        self.keys = {f"Bearer {key}" for key in keys}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1") \
                and Headers(scope=scope).get("authorization") not in self.keys:
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def engine_app(keys: Sequence[str] = ()) -> tuple[FastAPI, AgentEventsPlugin]:
    """An API server started with `--api-key` `keys` (none: open): the plugin's routes and a
    chat endpoint that only reads its body, as vLLM's would."""
    app = FastAPI()
    app.state.args = Namespace(api_key=list(keys) or None)  # what vLLM's build_app sets
    plugin = AgentEventsPlugin()
    plugin.attach_router(app)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        await request.json()
        return {"choices": [], "usage": {"prompt_tokens": 1}}

    if keys:  # vLLM adds its key check after the plugins (`build_app`)
        app.add_middleware(KeyCheck, keys=keys)
    return app, plugin


class Replicas:
    """Replicas behind an httpx mock transport: each request's path, Authorization and body."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, bytes]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        self.seen.append((request.url.path, request.headers.get("authorization"), body))
        if request.url.path == ROUTE:
            return httpx.Response(200, json={"forwarded": len(body.splitlines())})
        return httpx.Response(200, json={"choices": [], "usage": {"prompt_tokens": 1}})

    def events(self) -> list[tuple[str | None, bytes]]:
        return [(auth, body) for path, auth, body in self.seen if path == ROUTE]


def router_app(tenants: Sequence[str] = (), api_key: str | None = None,
               strategy: str = "session") -> tuple[FastAPI, Replicas]:
    """A one-replica router with the cluster's key `api_key` and the tenants' keys `tenants`
    (`router.api_keys` of a cluster file)."""
    replicas = Replicas()
    app = create_app([ReplicaEndpoint("a", "colocated", "http://127.0.0.1:9301")],
                     RouterSpec(strategy=strategy, api_keys=list(tenants)), name="tenants",
                     poll_interval_s=None, transport=httpx.MockTransport(replicas),
                     api_key=api_key)
    return app, replicas


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat_body(program: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "session_id": program}
