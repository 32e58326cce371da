"""The served router's messages: what it reads from a request (program id, turn), what it sends
a replica (headers, a P/D prefill's body), and what it answers (`Reply`, OpenAI-style errors).

Why apart from the web framework: `Reply` is what the router's classes (`cluster.router_turns`,
`cluster.router_events`, `cluster.router_proxy`) return, so they run and are tested without
FastAPI; `cluster.router_app` renders a `Reply` as a Starlette response.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from cluster.router_state import ReplicaState

SESSION_HEADER = "X-Session-ID"
REPLICA_HEADER = "X-Harness-Replica"
PREFILL_HEADER = "X-Harness-Prefill"
#: Request headers not passed on to a replica (hop-by-hop, or set by httpx itself).
_DROP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding",
                 "te", "trailer", "upgrade", "proxy-authorization", "proxy-connection",
                 "accept-encoding"}
#: How long the router keeps an idle upstream connection: under vLLM's API server's own
#: keep-alive (uvicorn's, `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, 5 s by default). At equal values a
#: request sent on a connection the server is closing that instant fails with a `ReadError`
#: (the likely cause of one seen in a 4-replica served comparison: a live replica marked down,
#: the run lost).
KEEPALIVE_EXPIRY_S = 2.0
#: Transport errors that mean the replica is gone (or its process is), not a slow answer.
GONE = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError,
        httpx.ConnectTimeout, httpx.CloseError)


@dataclass
class Reply:
    """An answer to the router's client, before a web framework renders it: a JSON value
    (`payload`), bytes passed on as a replica sent them (`content`), or a relayed stream
    (`stream`, the chunks as they arrive)."""

    status: int = 200
    payload: Any = None
    content: bytes | None = None
    stream: AsyncIterator[bytes] | None = None
    media_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        """The answer as JSON (not for a stream)."""
        return self.payload if self.content is None else json.loads(self.content)


def program_of(body: dict[str, Any], headers: Any) -> str | None:
    """The program id: the body's `session_id`, else the `X-Session-ID` header."""
    session = body.get("session_id")
    if session is None or session == "":
        session = headers.get(SESSION_HEADER) if headers is not None else None
    return None if session is None or session == "" else str(session)


def turn_of(body: dict[str, Any]) -> int:
    """`vllm_xargs.turn` as an int (0 when absent or not a number)."""
    xargs = body.get("vllm_xargs")
    if not isinstance(xargs, dict):
        return 0
    try:
        return int(xargs.get("turn", 0))
    except (TypeError, ValueError):
        return 0


def prefill_body(body: dict[str, Any], kv_transfer_params: dict[str, Any],
                 chat: bool) -> dict[str, Any]:
    """The request to a prefill replica: the same prompt with `kv_transfer_params`, one output
    token and no streaming (what vLLM's toy P/D proxy sends)."""
    out = dict(body)
    out["kv_transfer_params"] = kv_transfer_params
    out["stream"] = False
    out.pop("stream_options", None)
    out.pop("min_tokens", None)
    out["max_tokens"] = 1
    if chat and "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    return out


def forward_headers(headers: Any, program_id: str | None,
                    request_id: str | None = None) -> dict[str, str]:
    out = {k: v for k, v in headers.items() if k.lower() not in _DROP_HEADERS}
    if program_id is not None and not any(k.lower() == SESSION_HEADER.lower() for k in out):
        out[SESSION_HEADER] = program_id
    if request_id is not None:
        out = {k: v for k, v in out.items() if k.lower() != "x-request-id"}
        out["X-Request-Id"] = request_id
    return out


def auth_of(headers: Any) -> dict[str, str]:
    """The client's `Authorization` header, for the requests the router makes on its behalf
    (events, models, a kept program_start): replicas started with `--api-key` want it."""
    value = headers.get("authorization") if headers is not None else None
    return {"Authorization": value} if value else {}


def error_body(message: str, status: int, kind: str = "replica_unavailable",
               replica: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object (what the `openai` package shows as the message)."""
    error: dict[str, Any] = {"message": message, "type": kind, "code": status}
    if replica is not None:
        error["replica"] = replica
    return {"error": error}


def error_reply(message: str, status: int, kind: str = "replica_unavailable",
                replica: str | None = None) -> Reply:
    return Reply(status, payload=error_body(message, status, kind, replica))


def sse_error(message: str, replica: str | None) -> bytes:
    """An error event for a stream whose replica went away after the answer began (blank lines
    first, to close an event the replica left half-sent)."""
    return b"\n\ndata: " + json.dumps(error_body(message, 502, replica=replica)).encode() + b"\n\n"


def gone_reply(replica: ReplicaState, exc: BaseException, counters: dict[str, int]) -> Reply:
    """The replica stopped answering (`GONE`): it is marked dead, the request fails with 502."""
    message = replica.not_answering(exc)
    replica.mark_dead(message)
    replica.errors += 1
    counters["failed"] += 1
    return error_reply(message, 502, replica=replica.name)


def failed_reply(replica: ReplicaState, exc: BaseException, counters: dict[str, int]) -> Reply:
    """Another transport error (a timeout, say): the request fails with 502, the replica
    stays alive."""
    replica.errors += 1
    counters["failed"] += 1
    return error_reply(f"replica {replica.name} at {replica.address} failed: "
                       f"{str(exc) or type(exc).__name__}", 502, replica=replica.name)
