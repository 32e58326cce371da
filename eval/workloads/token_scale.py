"""Sessions at a fraction of their size: every token count of a trace multiplied by one factor.

Why: a real model on the CPU engine has a context of a few thousand tokens (SmolLM2's 8,192),
and no public Claude Code session starts that short (their first prompts run 10k to 36k
tokens). A soak of that engine asks whether it holds up under the sessions' rhythm (their
gaps, turn counts, compactions, sub-agents), not their size, so it replays them scaled down:
prompts, outputs, tool returns, kept prefixes and shared prefixes alike, each at least what
the format requires (an output of one token, a first prompt of one token), and a kept prefix
never more than the scaled conversation it keeps from. Times are left as they are
(`eval.replay.http_replay.scale_trace` scales those).
"""

from __future__ import annotations

import math

from common.trace import Program, Trace, Turn


def scale_tokens(trace: Trace, factor: float) -> Trace:
    """`trace` with every token count times `factor` (0 < factor <= 1; 1 returns it as is)."""
    if not (0 < factor <= 1 and math.isfinite(factor)):
        raise ValueError(f"the token scale must be in (0, 1], not {factor!r}")
    if factor == 1.0:
        return trace
    programs = [_scaled(p, factor) for p in trace.programs]
    return trace.model_copy(update={
        "programs": programs, "params": {**trace.params, "token_scale": factor}})


def _scaled(program: Program, factor: float) -> Program:
    turns: list[Turn] = []
    after = 0  # the scaled conversation the previous turn left
    for i, turn in enumerate(program.turns):
        kept = turn.kept_tokens
        if kept is not None:  # all of it stays all of it; a part, its share, within the whole
            whole = program.context_after(i - 1)
            kept = after if kept >= whole else min(after, round(kept * factor))
        scaled = turn.model_copy(update={
            "input_tokens": max(1 if i == 0 else 0, round(turn.input_tokens * factor)),
            "output_tokens": max(1, round(turn.output_tokens * factor)),
            "tool_return_tokens": round(turn.tool_return_tokens * factor),
            "kept_tokens": kept})
        after = Program._step(scaled, after, turns[-1] if turns else None)[1]
        turns.append(scaled)
    shared = min(round(program.shared_prefix_tokens * factor), turns[0].input_tokens)
    return Program.model_validate({**program.model_dump(), "turns": [t.model_dump() for t in turns],
                                   "shared_prefix_tokens": shared})
