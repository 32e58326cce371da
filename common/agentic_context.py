"""Our per-request hints in the ecosystem's shapes: `vllm_xargs.agentic_context` and vLLM's
`kv_hints` envelope.

Why: our clients tell the server about a program in our own flat `vllm_xargs` keys (`turn`,
`tool`, `last`, `predicted_output_tokens`, ...). Routers and engines written by others read
other shapes. `vllm-router`'s program scheduling (and AgentInfer's engine) read the canonical
object `vllm_xargs.agentic_context` (`program_id`, `step_id`, `expected_resume`,
`expected_output_length`, `kv_retention_ttl_seconds`, parent/root program ids, ...); vLLM's
`kv_hints` plumbing (`vllm.v1.kv_hints.protocol.KvHintsEnvelope`, adopted by Dynamo and SGLang)
carries versioned actions. This module maps between them, both ways, as pure functions, so the
client (`harness.model_client`, `eval.replay.http_replay`), the server's body conversion
(`server.intake.agentic_context`) and the tests share one definition.

What maps to what (our hint -> canonical field):

* the program id (`session_id`) -> `program_id` (and `session_id`);
* `turn` -> `step_id`;
* `last` -> `expected_resume` (its negation: a program's last turn is not resumed; any other
  turn is, since an agent's turn ends in a tool call);
* `predicted_output_tokens` -> `expected_output_length`.

`tool` and `predicted_s` have no canonical field: they stay in our flat keys, and in the
envelope's `harness.hints` action.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: The key under `vllm_xargs` that routers and engines of the ecosystem read.
AGENTIC_CONTEXT_KEY = "agentic_context"

#: The canonical fields of `vllm_xargs.agentic_context` (vllm-router docs/program_scheduling.md).
CANONICAL_FIELDS = (
    "program_id", "task_id", "session_id", "agent_id", "parent_program_id", "root_program_id",
    "blocks_parent", "expected_resume", "agent_role", "spawn_reason", "request_id", "step_id",
    "priority", "deadline_seconds", "expected_output_length", "kv_retention_ttl_seconds",
)

#: `kv_hints` envelope: its protocol version, and our two action types.
KV_HINTS_PROTOCOL_VERSION = "1"
ACTION_AGENTIC_CONTEXT = "agentic_context"  # payload: the canonical object
ACTION_HARNESS_HINTS = "harness.hints"  # payload: our hints without a canonical field
ACTION_VERSION = "1"


class AgenticContextError(ValueError):
    """A canonical context or envelope that cannot be read; the message says which field."""


def agentic_context(program_id: str, hints: Mapping[str, Any] | None = None,
                    **fields: Any) -> dict[str, Any]:
    """The canonical `vllm_xargs.agentic_context` of one request of program `program_id`,
    from our flat `hints` (see the module docstring); `fields` adds or overrides canonical
    fields (`parent_program_id`, `kv_retention_ttl_seconds`, ...). None values are left out;
    a name outside `CANONICAL_FIELDS` is an `AgenticContextError`."""
    unknown = sorted(set(fields) - set(CANONICAL_FIELDS))
    if unknown:
        raise AgenticContextError(f"not canonical agentic_context fields: {', '.join(unknown)}; "
                                  f"known: {', '.join(CANONICAL_FIELDS)}")
    hints = hints or {}
    context: dict[str, Any] = {"program_id": str(program_id), "session_id": str(program_id)}
    turn = _integer(hints.get("turn"))
    if turn is not None:
        context["step_id"] = turn
    context["expected_resume"] = not _flag(hints.get("last"))
    output = _integer(hints.get("predicted_output_tokens"))
    if output is not None:
        context["expected_output_length"] = output
    context.update({k: v for k, v in fields.items() if v is not None})
    return context


def hints_from_agentic_context(context: Mapping[str, Any]) -> dict[str, Any]:
    """Our flat hints from a canonical context (the inverse of `agentic_context` on the
    fields both have): `turn`, `last` (1 when `expected_resume` is false) and
    `predicted_output_tokens`; absent or unreadable fields are left out."""
    hints: dict[str, Any] = {}
    step = _integer(context.get("step_id"))
    if step is not None:
        hints["turn"] = step
    if context.get("expected_resume") in (False, 0, "false", "False"):
        hints["last"] = 1
    output = _integer(context.get("expected_output_length"))
    if output is not None:
        hints["predicted_output_tokens"] = output
    return hints


def flatten_vllm_xargs(xargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """`vllm_xargs` with a nested `agentic_context` object made acceptable to vLLM 0.32/0.33,
    whose OpenAI server takes only str / int / float / list values there (a nested object is
    a 400): the object becomes its JSON text (so everything downstream still sees all of it,
    in `SamplingParams.extra_args`), and the hints it implies (`hints_from_agentic_context`,
    plus `session_id` from `program_id`) are added where the client did not send them itself.
    None when there is no nested object (nothing to change)."""
    context = xargs.get(AGENTIC_CONTEXT_KEY)
    if not isinstance(context, Mapping):
        return None
    flat = dict(xargs)
    flat[AGENTIC_CONTEXT_KEY] = json.dumps(dict(context), separators=(",", ":"))
    for key, value in hints_from_agentic_context(context).items():
        flat.setdefault(key, value)
    program = context.get("program_id")
    if isinstance(program, str | int) and str(program):
        flat.setdefault("session_id", str(program))  # vLLM's last resort after body and header
    return flat


# -- vLLM's kv_hints envelope ----------------------------------------------------------------
def kv_hints_envelope(program_id: str, hints: Mapping[str, Any] | None, *, message_id: str,
                      **fields: Any) -> dict[str, Any]:
    """One request's hints as a `KvHintsEnvelope` (plain JSON; `msgspec.convert(envelope,
    KvHintsEnvelope)` builds vLLM's struct): an `agentic_context` action whose payload is the
    canonical object (`agentic_context(program_id, hints, **fields)`) and, when the hints
    hold more (`tool`, `predicted_s`, ...), a `harness.hints` action with those. Action ids
    are `message_id` plus the action's index."""
    hints = {k: v for k, v in (hints or {}).items() if v is not None}
    payloads = [(ACTION_AGENTIC_CONTEXT, agentic_context(program_id, hints, **fields))]
    rest = {k: v for k, v in hints.items() if k not in _CANONICAL_HINTS}
    if rest:
        payloads.append((ACTION_HARNESS_HINTS, rest))
    return {"protocol_version": KV_HINTS_PROTOCOL_VERSION, "message_id": message_id,
            "actions": [{"action_id": f"{message_id}.{i}", "action_type": kind,
                         "action_version": ACTION_VERSION, "payload": payload}
                        for i, (kind, payload) in enumerate(payloads)]}


def hints_from_kv_hints(envelope: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(program id, flat hints) from an envelope `kv_hints_envelope` wrote; actions of other
    types are skipped (another component's), a malformed envelope is an
    `AgenticContextError`."""
    actions = envelope.get("actions")
    if not isinstance(actions, list):
        raise AgenticContextError("kv_hints envelope: `actions` must be a list")
    program: str | None = None
    hints: dict[str, Any] = {}
    for action in actions:
        if not isinstance(action, Mapping) or not isinstance(action.get("payload"), Mapping):
            raise AgenticContextError("kv_hints envelope: every action needs a `payload` object")
        payload = action["payload"]
        if action.get("action_type") == ACTION_AGENTIC_CONTEXT:
            program = str(payload["program_id"]) if "program_id" in payload else program
            hints.update(hints_from_agentic_context(payload))
        elif action.get("action_type") == ACTION_HARNESS_HINTS:
            hints.update(payload)
    return program, hints


#: our hints that the canonical object carries (so `harness.hints` leaves them out)
_CANONICAL_HINTS = frozenset({"turn", "last", "predicted_output_tokens"})


def _integer(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _flag(value: Any) -> bool:
    return value in (True, 1, "1", "true", "True")
