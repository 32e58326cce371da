"""The router's own API key (`harness cluster serve --api-key`): what vLLM's `--api-key` check
does, in front of the whole cluster.

Why the same rule as vLLM (`vllm.entrypoints.serve.middleware.authenticate`): a client that
talks to one `harness serve --api-key` talks to the cluster unchanged. Paths under `/v1` need
`Authorization: Bearer KEY` (completions, models, agent events, `/v1/cluster`); `/health` and
`/metrics` stay open for probes. A pure ASGI middleware, not Starlette's `BaseHTTPMiddleware`:
that one wraps `receive`, and the router watches `receive` to cancel a turn whose client went
away (`cluster.router_app._disconnected`). Key comparison hashes both sides and compares in
constant time, as vLLM does.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from cluster.router_wire import error_body

GUARDED_PREFIX = "/v1"


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class RequireApiKey:
    """Answers 401 to a `/v1` request without `Authorization: Bearer <api_key>`."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self._key = _digest(api_key)

    def allowed(self, headers: Headers) -> bool:
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(_digest(token), self._key)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") != "OPTIONS" \
                and scope["path"].startswith(GUARDED_PREFIX) \
                and not self.allowed(Headers(scope=scope)):
            body = error_body("this router needs `Authorization: Bearer KEY` (the key it was "
                              "started with, `harness cluster serve --api-key`)", 401,
                              "authentication_error")
            await JSONResponse(body, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)
