"""Claude Code sessions as kv-cache-tester records them (its ``traces/`` folder): a session and
its sub-agents, each a program of its own, with the prompt each request really had.

A session file is ``{"id", "models", "block_size": 64, "hash_id_scope": "local", "tool_tokens",
"system_tokens", "requests": [...], "totals"}``. A request is ``{"t": start s, "in": prompt
tokens, "out", "hash_ids": one id per full block of the prompt (the same id, the same block and
everything before it, within the session), "stop": "tool_use" / "end_turn" / "", "input_types",
"think_time": s before it, "api_time": s it took, ...}``; a sub-agent is an entry ``{"type":
"subagent", "agent_id", "t", "duration_ms", "status", "requests": [...], ...}`` among its
parent's requests, where it ended (``t`` is its end; it started ``duration_ms`` before, or at
``t`` when it was launched without the parent waiting: ``"status": "async_launched"``, no
duration). Nothing is cut at a context limit: sessions reach 785k tokens.

Request ``j`` is turn ``j`` of its conversation (the session's or a sub-agent's):

- its prompt is ``in``: what turn ``j`` keeps of the conversation before it, then new tokens.
  The block hashes say what it keeps: ``B`` = the blocks this request's ``hash_ids`` share,
  from the start, with the previous request's. When they share all of the previous prompt's
  blocks and the prompt holds at least the previous prompt and answer, the turn keeps it all
  (the accounting's default: an appended conversation); when they share all of them but the
  prompt is shorter than that, it keeps the previous prompt (``kept_tokens = in`` of the
  previous request: hashes cover prompts only, so how much of the answer stays is not known;
  thinking is not sent back); otherwise it keeps ``B x block_size`` tokens (a compaction, a
  dropped reminder, any rewrite). The rest of the prompt is new;
- the gap after turn ``j`` is the next request's ``think_time`` (else its start less this
  request's start and ``api_time``), of kind ``subagent`` when sub-agents the parent waited for
  ended in it, else ``tool`` for ``stop = tool_use`` and ``person`` for ``end_turn`` (any other
  stop: ``tool`` when the next request opens with a tool result, else ``person``); the kind is
  the turn's ``tool`` name too. New tokens after a ``tool`` or ``subagent`` gap are the tool's
  return, after a ``person`` one the next turn's input;
- a sub-agent's ``parent`` is the parent's last request before it and the seconds from that
  request's end (``t + api_time``) to the sub-agent's start; its ``arrival_s`` is its start.

`check_round_trip` compares imported programs with the session: for every request, the imported
prompt is ``in`` tokens and the prefix it shares with the previous prompt, in whole blocks, is
what the hashes say. ``datasets/traces/import_claude_code.py`` runs it over a folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from common.trace import ParentLink, Program, Turn
from eval.workloads.importers.shared import Format, need, seconds

Entry = dict[str, Any]

#: The request fields the importer reads, and what each must be.
_REQUIRED = {"t": "a number of seconds", "in": "a positive integer",
             "out": "a non-negative integer", "hash_ids": "a list of integers"}


@dataclass(frozen=True)
class Conversation:
    """One program's requests in a session: the session's own or a sub-agent's, with the
    entries it comes from (to find its sub-agents) and where it sits (for messages)."""

    program_id: str
    requests: tuple[Entry, ...]
    entries: tuple[Entry, ...]
    where: str
    arrival_s: float
    parent: ParentLink | None = None
    entry: Entry | None = None  # the sub-agent entry; None for the session itself


def from_claude_code(data: dict[str, Any], *, program_id: str | None = None,
                     arrival_s: float = 0.0) -> Program:
    """The session's own program (its sub-agents: `programs_from_claude_code`)."""
    return programs_from_claude_code(data, program_id=program_id, arrival_s=arrival_s)[0]


def programs_from_claude_code(data: dict[str, Any], *, program_id: str | None = None,
                              arrival_s: float = 0.0) -> list[Program]:
    """The session's program, then one per sub-agent (id ``SESSION/AGENT_ID``), in the order
    they appear; a sub-agent with no requests is left out (counted in the session's
    ``meta["empty_subagents"]``). Errors name the request and field."""
    need(isinstance(data, dict), "a Claude Code session is a JSON object")
    block = data.get("block_size", 64)
    need(isinstance(block, int) and not isinstance(block, bool) and block > 0,
         f'"block_size" must be a positive integer, got {block!r}')
    conversations = list(conversations_of(data, program_id, arrival_s))
    programs = [_program(c, block) for c in conversations]
    empty = sum(1 for c in conversations for e in c.entries
                if _is_subagent(e) and not e.get("requests"))
    programs[0].meta.update(session=data.get("id"), models=data.get("models"),
                            tool_tokens=data.get("tool_tokens"),
                            system_tokens=data.get("system_tokens"), empty_subagents=empty)
    return programs


def conversations_of(data: dict[str, Any], program_id: str | None = None,
                     arrival_s: float = 0.0) -> Iterator[Conversation]:
    """The session's conversation, then its sub-agents' (depth first), each checked."""
    pid = str(program_id or data.get("id") or "claude-code")
    entries = data.get("requests")
    need(isinstance(entries, list), 'a Claude Code session needs a "requests" list')
    root = _conversation(pid, entries, "requests", arrival_s)
    need(bool(root.requests), "requests: the session has no requests")
    yield from _with_subagents(root)


def _with_subagents(conv: Conversation) -> Iterator[Conversation]:
    yield conv
    last: int | None = None  # the index of the parent's last request so far
    for k, entry in enumerate(conv.entries):
        if not _is_subagent(entry):
            last = 0 if last is None else last + 1
            continue
        where = f"{conv.where}[{k}]"
        need(isinstance(entry.get("requests"), list), f'{where}: a sub-agent needs "requests"')
        if not entry["requests"]:
            continue
        need(last is not None, f"{where}: a sub-agent before its parent's first request")
        assert last is not None
        start = _subagent_start(entry, where)
        answered = _number(conv.requests[last], "t", where) + (
            seconds(conv.requests[last].get("api_time")) or 0.0)
        link = ParentLink(id=conv.program_id, after_turn=last,
                          delay_s=round(max(0.0, start - answered), 6))
        agent = str(entry.get("agent_id") or f"agent_{k}")
        child = _conversation(f"{conv.program_id}/{agent}", entry["requests"],
                              f"{where}.requests", conv.arrival_s + start, link, entry)
        yield from _with_subagents(child)


def _conversation(pid: str, entries: list[Any], where: str, arrival_s: float,
                  parent: ParentLink | None = None, entry: Entry | None = None) -> Conversation:
    requests = []
    for k, e in enumerate(entries):
        need(isinstance(e, dict), f"{where}[{k}] must be a JSON object")
        if not _is_subagent(e):
            _check_request(e, f"{where}[{k}]")
            requests.append(e)
    return Conversation(pid, tuple(requests), tuple(entries), where, arrival_s, parent, entry)


def _check_request(r: Entry, where: str) -> None:
    for key, what in _REQUIRED.items():
        need(key in r, f'{where}: missing "{key}" ({what})')
    need(isinstance(r["hash_ids"], list) and all(isinstance(h, int) for h in r["hash_ids"]),
         f"{where}.hash_ids must be {_REQUIRED['hash_ids']}")
    for key, low in (("in", 1), ("out", 0)):
        value = r[key]
        need(isinstance(value, int) and not isinstance(value, bool) and value >= low,
             f"{where}.{key} must be {_REQUIRED[key]}, got {value!r}")
    _number(r, "t", where)


def _number(r: Entry, key: str, where: str) -> float:
    value = seconds(r.get(key))
    need(value is not None, f"{where}.{key} must be a number of seconds, got {r.get(key)!r}")
    assert value is not None
    return value


def _is_subagent(entry: Any) -> bool:
    return isinstance(entry, dict) and entry.get("type") == "subagent"


def _waited(entry: Entry) -> bool:
    """Whether the parent waited for this sub-agent (it has a duration; not launched apart)."""
    return _duration(entry) is not None


def _subagent_start(entry: Entry, where: str) -> float:
    """When a sub-agent started: its end ``t`` less its duration, or ``t`` when it was
    launched without a duration (asynchronous)."""
    end = _number(entry, "t", where)
    duration = _duration(entry)
    return end if duration is None else max(0.0, end - duration)


def common_blocks(a: list[int], b: list[int]) -> int:
    """How many blocks two prompts share from the start (their ``hash_ids``' common prefix)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _program(conv: Conversation, block: int) -> Program:
    reqs = conv.requests
    kinds = _gap_kinds(conv)
    turns: list[dict[str, Any]] = []
    after = 0  # the conversation as the previous turn left it
    for j, r in enumerate(reqs):
        out = max(1, r["out"])
        turn: dict[str, Any] = {"output_tokens": out, "input_tokens": r["in"]}
        if j > 0:
            prev = reqs[j - 1]
            kept = _kept(prev, r, after, block)
            new = r["in"] - (after if kept is None else kept)
            if kept is not None:
                turn["kept_tokens"] = kept
            if kinds[j - 1] == "person":
                turn["input_tokens"] = new
            else:
                turn["input_tokens"] = 0
                turns[-1]["tool_return_tokens"] = new
            turns[-1].update(tool=kinds[j - 1], gap_kind=kinds[j - 1],
                             tool_seconds=_gap_seconds(prev, r))
        turns.append(turn)
        after = r["in"] + out
    entry = conv.entry or {}
    return Program(
        id=conv.program_id,
        arrival_s=round(conv.arrival_s, 6),
        turns=[Turn(**t) for t in turns],
        benchmark="claude-code",
        source="import:claude-code",
        parent=conv.parent,
        meta={
            "models": sorted({str(r.get("model")) for r in reqs if r.get("model")}),
            "api_s": [seconds(r.get("api_time")) for r in reqs],
            "zero_outputs": sum(1 for r in reqs if r["out"] < 1),
            **({"subagent_type": entry.get("subagent_type"), "status": entry.get("status"),
                "duration_s": _duration(entry)} if entry else {}),
        },
    )


def _kept(prev: Entry, r: Entry, after: int, block: int) -> int | None:
    """What request ``r`` keeps of the conversation ``prev`` left (``after`` tokens): None for
    all of it, else a prefix (module docstring)."""
    shared = common_blocks(prev["hash_ids"], r["hash_ids"])
    if shared == len(prev["hash_ids"]):  # every whole block of the previous prompt
        if r["in"] >= after:
            return None
        if r["in"] >= prev["in"]:
            return prev["in"]
    return shared * block


def _duration(entry: Entry) -> float | None:
    ms = seconds(entry.get("duration_ms"))
    return None if ms is None else ms / 1000.0


def _gap_kinds(conv: Conversation) -> list[str]:
    """The kind of the gap after each request but the last (module docstring)."""
    between: list[bool] = []  # per gap: did the parent wait for a sub-agent in it
    started = waited = False
    for entry in conv.entries:
        if _is_subagent(entry):
            waited = waited or (started and _waited(entry))
        else:
            if started:
                between.append(waited)
            started, waited = True, False
    reqs = conv.requests
    return ["subagent" if w else _stop_kind(reqs[j], reqs[j + 1]) for j, w in enumerate(between)]


def _stop_kind(r: Entry, following: Entry) -> str:
    stop = r.get("stop")
    if stop == "tool_use":
        return "tool"
    if stop == "end_turn":
        return "person"
    return "tool" if "tool_result" in (following.get("input_types") or []) else "person"


def _gap_seconds(prev: Entry, r: Entry) -> float:
    """Seconds from ``prev``'s answer to ``r``'s request: ``think_time``, else the starts'
    difference less ``prev``'s ``api_time``."""
    think = seconds(r.get("think_time"))
    if think is not None:
        return think
    return max(0.0, r["t"] - prev["t"] - (seconds(prev.get("api_time")) or 0.0))


def check_round_trip(session: dict[str, Any], programs: list[Program]) -> list[str]:
    """What the imported ``programs`` get wrong about ``session``, one line each ([] when
    nothing): for every request, the imported prompt must be ``in`` tokens and the prefix it
    shares with the previous prompt, in whole blocks, what the block hashes say; every
    conversation must be a program with one turn per request, and a sub-agent its parent."""
    block = session.get("block_size", 64)
    by_id = {p.id: p for p in programs}
    wrong: list[str] = []
    for conv in conversations_of(session, programs[0].id if programs else None,
                                 programs[0].arrival_s if programs else 0.0):
        program = by_id.get(conv.program_id)
        if program is None:
            wrong.append(f"{conv.where}: no program {conv.program_id!r}")
            continue
        if program.n_turns != len(conv.requests):
            wrong.append(f"{conv.program_id}: {program.n_turns} turns for "
                         f"{len(conv.requests)} requests")
            continue
        if program.parent != conv.parent:
            wrong.append(f"{conv.program_id}: parent {program.parent} != {conv.parent}")
        wrong += _prompt_mismatches(conv, program, block)
    return wrong


def _prompt_mismatches(conv: Conversation, program: Program, block: int) -> list[str]:
    wrong = []
    contexts = program.contexts()
    for j, r in enumerate(conv.requests):
        prompt = contexts[j][0]
        if prompt != r["in"]:
            wrong.append(f"{conv.program_id} turn {j}: prompt {prompt} != in {r['in']}")
        if j == 0:
            continue
        hashed = common_blocks(conv.requests[j - 1]["hash_ids"], r["hash_ids"]) * block
        shared = min(program.reused_tokens(j), contexts[j - 1][0]) // block * block
        if shared != hashed:
            wrong.append(f"{conv.program_id} turn {j}: shares {shared} tokens with the previous "
                         f"prompt, the hashes say {hashed}")
    return wrong


def _detect(data: dict[str, Any]) -> bool:
    return isinstance(data.get("requests"), list) and "block_size" in data


FORMAT = Format("claude-code", from_claude_code, _detect,
                '"requests" and "block_size" (Claude Code sessions, kv-cache-tester)',
                options=("program_id", "arrival_s"), programs=programs_from_claude_code)
