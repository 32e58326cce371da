"""Our server accepts the ecosystem's `vllm_xargs.agentic_context` (an ASGI middleware).

Why: routers and engines of the ecosystem (`vllm-router`'s program scheduling, AgentInfer)
identify agent programs by a nested object, `vllm_xargs.agentic_context`, and `vllm-router`
forwards it to its backends as it came. vLLM 0.32 (and 0.33) validate `vllm_xargs` values as
str / int / float / list only, so a stock server answers such a request with a 400. This
middleware, given to `vllm serve` as `--middleware
server.intake.agentic_context.AgenticContextMiddleware` (`server.launch` always does), rewrites the
body of a completions request before vLLM parses it
(`common.agentic_context.flatten_vllm_xargs`): the object becomes its JSON text, and the
hints it implies (`turn` from `step_id`, `last` from `expected_resume`,
`predicted_output_tokens` from `expected_output_length`, the program id as the session) are
added where the client did not send ours. So our policies see a program whether its client
speaks our hints, the canonical context, or both.

Cost: a request whose body does not contain the bytes `agentic_context` is passed on as it
came (one substring test over the buffered body); only the others are parsed and re-encoded.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from common.agentic_context import AGENTIC_CONTEXT_KEY, flatten_vllm_xargs

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: request paths whose bodies may carry `vllm_xargs` (OpenAI chat, completions, responses)
PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
_MARKER = AGENTIC_CONTEXT_KEY.encode()


def convert_body(raw: bytes) -> bytes | None:
    """The body with its nested `vllm_xargs.agentic_context` flattened (see the module
    docstring); None when there is nothing to change (no such object, or not JSON: vLLM then
    answers as it would)."""
    if _MARKER not in raw:
        return None
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("vllm_xargs"), dict):
        return None
    flat = flatten_vllm_xargs(body["vllm_xargs"])
    if flat is None:
        return None
    return json.dumps({**body, "vllm_xargs": flat}, separators=(",", ":")).encode()


class AgenticContextMiddleware:
    """ASGI middleware: `convert_body` on POSTs to `PATHS`; everything else untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") != "POST"
                or scope.get("path") not in PATHS):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        early: list[Message] = []  # a disconnect before the body was complete
        while True:
            message = await receive()
            if message["type"] != "http.request":
                early.append(message)
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        converted = None if early else convert_body(body)
        if converted is not None:
            body = converted
            headers = [(k, v) for k, v in scope.get("headers", [])
                       if k.lower() != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False},
                                  *early]

        async def replay() -> Message:
            if pending:
                return pending.pop(0)
            return await receive()

        await self.app(scope, replay, send)
