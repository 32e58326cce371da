"""`common.agentic_context` and `server.intake.agentic_context`: our hints in the canonical
`vllm_xargs.agentic_context` shape and vLLM's `kv_hints` envelope, and the server-side body
conversion (driven through the ASGI middleware with a recording app, no server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

from common.agentic_context import (
    ACTION_AGENTIC_CONTEXT,
    ACTION_HARNESS_HINTS,
    CANONICAL_FIELDS,
    AgenticContextError,
    agentic_context,
    flatten_vllm_xargs,
    hints_from_agentic_context,
    hints_from_kv_hints,
    kv_hints_envelope,
)
from harness.model_client import chat_body
from server.intake.agentic_context import AgenticContextMiddleware, convert_body


def test_canonical_context_from_our_hints() -> None:
    assert agentic_context("swe-1@r", {"turn": 3, "tool": "bash", "last": None}) == {
        "program_id": "swe-1@r", "session_id": "swe-1@r", "step_id": 3,
        "expected_resume": True}
    last = agentic_context("p", {"turn": 7, "last": 1, "predicted_output_tokens": 250},
                           parent_program_id="lead", kv_retention_ttl_seconds=5)
    assert last == {"program_id": "p", "session_id": "p", "step_id": 7,
                    "expected_resume": False, "expected_output_length": 250,
                    "parent_program_id": "lead", "kv_retention_ttl_seconds": 5}
    assert set(last) <= set(CANONICAL_FIELDS)
    with pytest.raises(AgenticContextError, match="not canonical.*tool_name"):
        agentic_context("p", {}, tool_name="bash")


def test_hints_round_trip_through_the_canonical_context() -> None:
    ours = {"turn": 4, "last": 1, "predicted_output_tokens": 90}
    assert hints_from_agentic_context(agentic_context("p", ours)) == ours
    assert hints_from_agentic_context({"program_id": "p", "step_id": "x"}) == {}


def test_flatten_vllm_xargs_keeps_the_clients_own_hints_and_stringifies_the_object() -> None:
    context = {"program_id": "p", "step_id": 2, "expected_resume": False,
               "expected_output_length": 64}
    flat = flatten_vllm_xargs({"turn": 9, "tool": "bash", "agentic_context": context})
    assert flat is not None
    assert json.loads(flat["agentic_context"]) == context
    assert flat["turn"] == 9  # the client's own hint wins over step_id
    assert (flat["last"], flat["predicted_output_tokens"], flat["session_id"]) == (1, 64, "p")
    # every value is one vLLM's `vllm_xargs` validation takes (str / int / float / list)
    assert all(isinstance(v, str | int | float | list) for v in flat.values())
    assert flatten_vllm_xargs({"turn": 1}) is None
    assert flatten_vllm_xargs({"agentic_context": "already text"}) is None


def test_kv_hints_envelope_is_vllms_struct_and_reads_back() -> None:
    from vllm.v1.kv_hints.protocol import KvHintsEnvelope  # vLLM: start-up cost

    hints = {"turn": 5, "tool": "bash", "predicted_s": 2.5, "last": None}
    envelope = kv_hints_envelope("swe-1", hints, message_id="m-7")
    typed = msgspec.convert(envelope, KvHintsEnvelope)
    assert typed.message_id == "m-7"
    assert [a.action_type for a in typed.actions] == [ACTION_AGENTIC_CONTEXT,
                                                      ACTION_HARNESS_HINTS]
    assert [a.action_id for a in typed.actions] == ["m-7.0", "m-7.1"]
    assert typed.actions[0].payload["step_id"] == 5
    assert typed.actions[1].payload == {"tool": "bash", "predicted_s": 2.5}
    assert hints_from_kv_hints(envelope) == ("swe-1", {"turn": 5, "tool": "bash",
                                                       "predicted_s": 2.5})
    only_canonical = kv_hints_envelope("p", {"turn": 0}, message_id="m")
    assert [a["action_type"] for a in only_canonical["actions"]] == [ACTION_AGENTIC_CONTEXT]
    with pytest.raises(AgenticContextError):
        hints_from_kv_hints({"actions": [{"action_type": "x"}]})


def test_chat_body_carries_the_context_only_when_asked() -> None:
    messages = [{"role": "user", "content": "hi"}]
    plain = chat_body("m", messages, program_id="p", hints={"turn": 1})
    assert plain["vllm_xargs"] == {"turn": 1}
    rich = chat_body("m", messages, program_id="p", hints={"turn": 1, "tool": None},
                     agentic_context=True)
    assert rich["vllm_xargs"] == {"turn": 1, "agentic_context": {
        "program_id": "p", "session_id": "p", "step_id": 1, "expected_resume": True}}
    no_program = chat_body("m", messages, hints={"turn": 1}, agentic_context=True)
    assert "agentic_context" not in no_program["vllm_xargs"]


def test_convert_body_leaves_other_bodies_alone() -> None:
    assert convert_body(b'{"prompt": [1], "vllm_xargs": {"turn": 1}}') is None
    assert convert_body(b"not json agentic_context") is None
    raw = json.dumps({"prompt": [1], "vllm_xargs": {"agentic_context": {"program_id": "p",
                                                                          "step_id": 0}}})
    body = json.loads(convert_body(raw.encode()) or b"")
    assert body["prompt"] == [1]
    assert body["vllm_xargs"]["turn"] == 0
    assert json.loads(body["vllm_xargs"]["agentic_context"])["program_id"] == "p"


def _through_middleware(path: str, body: bytes, chunks: int = 1) -> tuple[dict[str, Any], bytes]:
    """Send `body` (in `chunks` pieces) through the middleware to a recording app."""
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        seen["scope"] = scope
        seen["body"] = b"".join(parts)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    size = -(-len(body) // chunks)
    messages = [{"type": "http.request", "body": body[i:i + size],
                 "more_body": i + size < len(body)} for i in range(0, len(body), size)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path,
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    asyncio.run(AgenticContextMiddleware(app)(scope, receive, send))
    assert sent[0]["status"] == 200
    return seen["scope"], seen["body"]


def test_middleware_rewrites_completions_bodies_and_their_length() -> None:
    body = json.dumps({"model": "m", "messages": [], "vllm_xargs": {
        "agentic_context": {"program_id": "p", "step_id": 3, "expected_resume": False}}})
    scope, got = _through_middleware("/v1/chat/completions", body.encode(), chunks=3)
    xargs = json.loads(got)["vllm_xargs"]
    assert (xargs["turn"], xargs["last"], xargs["session_id"]) == (3, 1, "p")
    assert dict(scope["headers"])[b"content-length"] == str(len(got)).encode()
    # another path: the body passes as it came
    _, same = _through_middleware("/v1/agent/events", body.encode())
    assert same == body.encode()
