"""The one metrics module: latency summaries every report uses (JCT, TTFT, queueing)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values: Sequence[float], prefix: str) -> dict[str, float]:
    """`{prefix}_mean_s, _p50_s, _p95_s, _p99_s` for a list of seconds."""
    mean = sum(values) / len(values) if values else math.nan
    return {f"{prefix}_mean_s": mean, f"{prefix}_p50_s": percentile(values, 50),
            f"{prefix}_p95_s": percentile(values, 95), f"{prefix}_p99_s": percentile(values, 99)}


def replay_metrics(result: Any, isolated: dict[str, float] | None = None) -> dict[str, Any]:
    """Everything the policy benchmark reports for one replay (an ``eval.replay.ReplayResult``)
    and, if given, each program's isolated JCT (alone on the engine, the lower bound).

    Per program: JCT (finish - arrival), normalised latency (JCT / isolated JCT). Per turn: TTFT
    (first token - the time the request was due), queueing delay (admission - due). Totals:
    makespan (last finish - first arrival), throughput, prefix-cache hit tokens, recomputed
    tokens (computed for an earlier turn of the program but not found in the cache), preemptions,
    the time-weighted share of KV memory held by pins, scheduler CPU time per step.
    """
    programs = [p for p in result.programs.values() if p.finished is not None]
    turns = [t for p in programs for t in p.turns]
    jcts = [p.jct for p in programs]
    makespan = float(result.makespan)
    out: dict[str, Any] = {"programs": len(programs), "turns": len(turns)}
    out.update(summarize(jcts, "jct"))
    out["makespan_s"] = makespan
    minutes = makespan / 60.0
    out["throughput_programs_per_min"] = len(programs) / minutes if minutes > 0 else math.nan
    output_tokens = sum(t.output_tokens for t in turns)
    prompt_tokens = sum(t.prompt_tokens for t in turns)
    cached = sum(t.cached_tokens for t in turns)
    out["throughput_output_tokens_per_s"] = output_tokens / makespan if makespan > 0 else math.nan
    out["throughput_computed_tokens_per_s"] = (
        (prompt_tokens - cached + output_tokens) / makespan if makespan > 0 else math.nan)
    out.update(summarize([t.first_token - t.arrival for t in turns
                          if t.first_token is not None], "ttft"))
    out.update(summarize([t.admitted - t.arrival for t in turns if t.admitted is not None],
                         "queue"))
    if isolated:
        normalised = [p.jct / isolated[p.program_id] for p in programs
                      if isolated.get(p.program_id)]
        mean = sum(normalised) / len(normalised) if normalised else math.nan
        out["isolated_jct_mean_s"] = sum(isolated.values()) / len(isolated)
        out["normalised_latency_mean"] = mean
        out["normalised_latency_p50"] = percentile(normalised, 50)
        out["normalised_latency_p95"] = percentile(normalised, 95)
    out["prompt_tokens"] = prompt_tokens
    out["output_tokens"] = output_tokens
    out["prefix_hit_tokens"] = cached
    out["prefix_hit_rate"] = cached / prompt_tokens if prompt_tokens else math.nan
    out["recomputed_tokens"] = sum(t.recomputed_tokens for t in turns)
    out["preemptions"] = sum(t.preemptions for t in turns)
    pins = dict(result.pin_stats)
    denominator = makespan * result.total_blocks
    out["pin_memory_share"] = pins["block_seconds"] / denominator if denominator > 0 else 0.0
    out["pins"] = {k: v for k, v in pins.items() if k != "block_seconds"}
    # a pin "hits" when the program's next turn is admitted while it is held (hand-off)
    out["pin_hit_rate"] = pins["handoff"] / pins["pinned"] if pins.get("pinned") else math.nan
    out["engine_steps"] = result.engine_steps
    out["sched_steps"] = result.sched_steps
    steps = result.sched_steps
    out["sched_cpu_ms_per_step"] = 1000.0 * result.sched_cpu_seconds / steps if steps else 0.0
    return out


#: Keys of `replay_metrics` that measure this machine (CPU time), not the replay: they differ
#: between identical replays.
MACHINE_DEPENDENT = ("sched_cpu_ms_per_step", "wall_s")
