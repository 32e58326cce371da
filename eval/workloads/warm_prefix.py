"""kv-cache-tester's warm prefix: the first tokens of every session's first prompt made one
prefix that all sessions share.

Why: the public Claude Code sessions hash their blocks per session (``hash_id_scope:
local``), so replayed as recorded no two sessions share a token, while in a real deployment
Claude Code's tool definitions and system prompt (about 15k tokens) are the same for every
user. kv-cache-tester's replayer, whose sessions-per-GPU criterion the bench's `--capacity`
follows, stands a canonical prefix in for them by default (its `--warm-prefix-pct`, 0.5): of
the largest tool + system token count among the loaded sessions, that fraction opens every
user's first prompt (sub-agents' too), the rest of the prompt its own; the first user computes
it, the next ones find it cached. This module gives a trace the same prefix, as the trace
format says it (`Program.shared_prefix_tokens` under one `shared_prefix_id`), so the replay's
token ids agree on it across programs and the engine's prefix cache decides what hits.
"""

from __future__ import annotations

import math

from common.trace import Trace

#: The shared prefix's id: one for every program given it.
WARM_PREFIX_ID = "warm-prefix"


def check_share(pct: float) -> None:
    """Refuses a share outside [0, 1] (the bench checks it before it loads anything)."""
    if not (0 <= pct <= 1 and math.isfinite(pct)):
        raise ValueError(f"--warm-prefix-pct must be in [0, 1], not {pct!r}")


def describe(pct: float) -> str:
    """The prefix in the words a report or `capacity.md` gives it."""
    return (f"a warm prefix of {pct:.0%} of the largest tool + system prompt shared by every "
            "program's first prompt (kv-cache-tester's)")


def warm_prefix_tokens(trace: Trace, pct: float) -> int:
    """`pct` of the largest tool + system token count any program of `trace` records (a
    Claude Code session's ``tool_tokens`` and ``system_tokens``), rounded down."""
    sizes = [int(p.meta.get("tool_tokens") or 0) + int(p.meta.get("system_tokens") or 0)
             for p in trace.programs]
    largest = max(sizes, default=0)
    if largest <= 0:
        raise ValueError(f"--warm-prefix-pct needs Claude Code sessions that record their tool "
                         f"and system tokens (tool_tokens, system_tokens); {trace.name!r} has "
                         f"none")
    return int(pct * largest)


def with_warm_prefix(trace: Trace, pct: float) -> Trace:
    """`trace` with the first ``warm_prefix_tokens(trace, pct)`` tokens of every program's
    first prompt (all of it when shorter) one shared prefix; `pct` 0 returns it as it is.
    A program that already shares a prefix of its own is refused: two shared prefixes are
    not one the format can say."""
    check_share(pct)
    if pct == 0:
        return trace
    tokens = warm_prefix_tokens(trace, pct)
    own = [p.id for p in trace.programs if p.shared_prefix_tokens and p.shared_prefix_id]
    if own:
        raise ValueError(f"--warm-prefix-pct: {own[0]} already shares a prefix "
                         f"({trace.name!r} is not a trace of Claude Code sessions)")
    programs = [p.model_copy(update={
        "shared_prefix_tokens": min(tokens, p.turns[0].input_tokens),
        "shared_prefix_id": WARM_PREFIX_ID if tokens else None}) for p in trace.programs]
    return trace.model_copy(update={"programs": programs,
                                    "params": {**trace.params, "warm_prefix_pct": pct}})
