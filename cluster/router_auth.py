"""The router's API keys (`harness cluster serve --api-key`, and the tenants' keys of the
cluster file's `router.api_keys`): what vLLM's `--api-key` check does, in front of the whole
cluster.

Why the same rule as vLLM (`vllm.entrypoints.serve.middleware.authenticate`): a client that
talks to one `harness serve --api-key` talks to the cluster unchanged. Paths under `/v1` need
`Authorization: Bearer KEY` with one of the keys (completions, models, agent events,
`/v1/cluster`); `/health` and `/metrics` stay open for probes. A pure ASGI middleware, not
Starlette's `BaseHTTPMiddleware`: that one wraps `receive`, and the router watches `receive` to
cancel a turn whose client went away (`cluster.router_app._disconnected`). Key comparison
hashes both sides and compares in constant time, as vLLM does.

With tenants (several keys) the router is their only door: it keeps who opened each program
(`server.intake.ownership`), so each request carries its key's fingerprint on
(`credential_of_scope`), and the replicas, which know the cluster's own key only
(`--api-key`, given to each as `VLLM_API_KEY`), get that key in place of the tenant's (none
when the cluster has no key of its own). With one key a client's `Authorization` goes on as it
came.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from cluster.router_wire import error_body
from server.intake.ownership import credential_of, several_keys

GUARDED_PREFIX = "/v1"
#: Where the middleware leaves the fingerprint of a request's key (`scope["state"]`).
CREDENTIAL = "harness_credential"


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def credential_of_scope(scope: Any) -> str | None:
    """The fingerprint of the key a request came with (None: the router checks no keys)."""
    return (scope.get("state") or {}).get(CREDENTIAL)


class RequireApiKey:
    """Answers 401 to a `/v1` request without `Authorization: Bearer <one of api_keys>`.
    `upstream`: with several keys, the `Authorization` the replicas get instead of the
    client's (`Bearer <the cluster's key>`, or none)."""

    def __init__(self, app: Any, api_keys: Sequence[str], upstream: str | None = None) -> None:
        self.app = app
        self._keys = [_digest(key) for key in api_keys]
        self._tenants = several_keys(api_keys)
        self._upstream = [(b"authorization", f"Bearer {upstream}".encode())] if upstream else []

    def allowed(self, headers: Headers) -> bool:
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        digest = _digest(token)
        match = False
        for key in self._keys:  # every key compared: the time does not say which matched
            match |= secrets.compare_digest(digest, key)
        return scheme.lower() == "bearer" and match

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") != "OPTIONS" \
                and scope["path"].startswith(GUARDED_PREFIX):
            headers = Headers(scope=scope)
            if not self.allowed(headers):
                body = error_body("this router needs `Authorization: Bearer KEY` (a key it was "
                                  "started with, `harness cluster serve --api-key`, or one of "
                                  "the cluster file's `router.api_keys`)", 401,
                                  "authentication_error")
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
            if self._tenants:
                scope = self._for_replicas(scope, credential_of(headers.get("authorization")))
        await self.app(scope, receive, send)

    def _for_replicas(self, scope: Any, credential: str | None) -> Any:
        """The request as the router passes it on: the tenant's key replaced by the
        cluster's, its fingerprint kept in the scope's state."""
        kept = [(k, v) for k, v in scope["headers"] if k.lower() != b"authorization"]
        return {**scope, "headers": kept + self._upstream,
                "state": {**(scope.get("state") or {}), CREDENTIAL: credential}}
