"""The one metrics module: latency summaries every report uses (JCT, TTFT, TPOT, queueing, SLO
attainment and goodput).

It sits in `common/` because the agent (`harness run`), the simulator, the planner and the
benchmarks all summarise latencies the same way; it is pure (standard library only) and reads
its records by attribute, so it needs none of the layers that produce them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
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


@dataclass(frozen=True)
class SLO:
    """Per-turn latency bounds for SLO attainment and goodput (AugServe's effective throughput).

    Defaults: TTFT <= 2 s (an agent waiting on its next step), TPOT <= 0.1 s (10 tokens/s, faster
    than anyone reads a streamed answer); `harness bench --slo-ttft / --slo-tpot` change them.
    """

    ttft_s: float = 2.0
    tpot_s: float = 0.1

    def met(self, turn: Any) -> bool:
        """A turn meets the SLO when both its TTFT and its TPOT are within bounds."""
        if turn.first_token is None or turn.finished is None:
            return False
        tpot = tpot_of(turn)
        return (turn.first_token - turn.arrival <= self.ttft_s
                and (tpot is None or tpot <= self.tpot_s))


def tpot_of(turn: Any) -> float | None:
    """Mean time per output token after the first (None for a one-token answer)."""
    if turn.first_token is None or turn.finished is None or turn.output_tokens < 2:
        return None
    return (turn.finished - turn.first_token) / (turn.output_tokens - 1)


def slo_metrics(programs: Sequence[Any], makespan: float, slo: SLO) -> dict[str, float]:
    """SLO attainment per turn and per program (every turn met), and goodput: the turns and
    programs that met it per unit of time."""
    met_by_program = [[slo.met(t) for t in p.turns] for p in programs]
    met = [m for program in met_by_program for m in program]
    whole = [all(program) for program in met_by_program]
    tpots = [x for x in (tpot_of(t) for p in programs for t in p.turns) if x is not None]
    return {
        "slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s,
        "tpot_mean_s": sum(tpots) / len(tpots) if tpots else math.nan,
        "slo_attainment": sum(met) / len(met) if met else math.nan,
        "program_slo_attainment": sum(whole) / len(whole) if whole else math.nan,
        "goodput_turns_per_s": sum(met) / makespan if makespan > 0 else math.nan,
        "goodput_programs_per_min": 60.0 * sum(whole) / makespan if makespan > 0 else math.nan,
    }


def replay_metrics(result: Any, isolated: dict[str, float] | None = None,
                   slo: SLO | None = None) -> dict[str, Any]:
    """Everything the policy benchmark reports for one replay (a ``sim.records.ReplayResult``)
    and, if given, each program's isolated JCT (alone on the engine, the lower bound).

    Per program: JCT (finish - arrival), normalised latency (JCT / isolated JCT). Per turn: TTFT
    (first token - the time the request was due), TPOT, queueing delay (admission - due), and
    whether it met `slo` (attainment and goodput, see `SLO`). Totals:
    makespan (last finish - first arrival), throughput, prefix-cache hit tokens, recomputed
    tokens (computed for an earlier turn of the program but not found in the cache), preemptions,
    the time-weighted share of KV memory held by pins, scheduler CPU time per step.
    """
    measured = getattr(result, "measured", None)
    programs = [p for p in result.programs.values() if p.finished is not None
                and (measured is None or p.program_id in measured)]
    turns = [t for p in programs for t in p.turns]
    jcts = [p.jct for p in programs]
    makespan = float(result.makespan)
    if measured is not None and programs:  # the measured programs' own span
        makespan = max(p.finished for p in programs) - min(p.arrival for p in programs)
    out: dict[str, Any] = {"programs": len(programs), "turns": len(turns)}
    out.update(summarize(jcts, "jct"))
    # completion from release (a closed loop's burst start; else the arrival): a scheduler
    # that holds programs back is charged for the wait (`ReplayResult.released`)
    released = getattr(result, "released", None)
    completions = [p.finished - (released if released is not None else p.arrival)
                   for p in programs]
    out["completion_mean_s"] = sum(completions) / len(completions) if completions else math.nan
    out["completion_p95_s"] = percentile(completions, 95) if completions else math.nan
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
    out.update(slo_metrics(programs, makespan, slo or SLO()))
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
    out["reloaded_tokens"] = sum(t.reloaded_tokens for t in turns)
    computed = prompt_tokens - cached
    out["recomputed_share"] = out["recomputed_tokens"] / computed if computed > 0 else math.nan
    out["throughput_turns_per_min"] = len(turns) / minutes if minutes > 0 else math.nan
    program_stats = getattr(result, "program_stats", None)
    if program_stats:  # a program scheduler's time per state, pauses and resumes
        out["program_states"] = dict(program_stats)
    out["preemptions"] = sum(t.preemptions for t in turns)
    pins = dict(result.pin_stats)
    denominator = float(result.makespan) * result.total_blocks  # pins: the whole run
    out["pin_memory_share"] = pins["block_seconds"] / denominator if denominator > 0 else 0.0
    out["pins"] = {k: v for k, v in pins.items() if k != "block_seconds"}
    # a pin "hits" when the program's next turn is admitted while it is held (hand-off)
    out["pin_hit_rate"] = pins["handoff"] / pins["pinned"] if pins.get("pinned") else math.nan
    out["engine_steps"] = result.engine_steps
    out["sched_steps"] = result.sched_steps
    steps = result.sched_steps
    # wall ms inside schedule() per step (one thread: its CPU time on an idle machine); the key
    # keeps its first name so reports of every commit compare
    out["sched_cpu_ms_per_step"] = 1000.0 * result.sched_seconds / steps if steps else 0.0
    return out


#: Keys of a bench row that measure this machine (CPU and wall time), not the replay: they
#: differ between identical replays.
MACHINE_DEPENDENT = ("sched_cpu_ms_per_step", "wall_s", "cpu_s", "engine_steps_per_s")


def cluster_metrics(result: Any, slo: SLO | None = None) -> dict[str, Any]:
    """What a replay on several replicas adds (a `sim.records.ReplayResult` of several replicas).

    TTFT split into initial prefill (a program's first turn: its whole prompt) and incremental
    prefill (later turns: the tool return and new input on top of the history), each with its
    mean, P50, P95 and P99 and its SLO attainment; inter-token latency (the per-turn TPOT, as
    AMPD's ITL); where prompts were computed (local: on the replica that decodes; remote: on a
    prefill replica); KV moved between replicas; programs whose turns did not all run on one
    replica (each such move loses the history's KV cache unless it travels); and the load
    balance across replicas of a role (busiest replica's busy time over the role's mean, 1.0 =
    even).
    """
    slo = slo or SLO()
    programs = [p for p in result.programs.values() if p.finished is not None]
    turns = [t for p in programs for t in p.turns]
    out: dict[str, Any] = {"router": result.router,
                           "migrations": int(getattr(result, "migrations", 0))}
    for name, subset in (("initial", [t for t in turns if t.turn == 0]),
                         ("incremental", [t for t in turns if t.turn > 0])):
        ttfts = [t.first_token - t.arrival for t in subset if t.first_token is not None]
        out[f"ttft_{name}_mean_s"] = sum(ttfts) / len(ttfts) if ttfts else math.nan
        out[f"ttft_{name}_p95_s"] = percentile(ttfts, 95)
        out[f"ttft_{name}_p50_s"] = percentile(ttfts, 50)
        out[f"ttft_{name}_p99_s"] = percentile(ttfts, 99)
        met = [slo.met(t) for t in subset]
        out[f"slo_attainment_{name}"] = sum(met) / len(met) if met else math.nan
    itls = [x for x in (tpot_of(t) for t in turns) if x is not None]
    out["itl_mean_s"] = sum(itls) / len(itls) if itls else math.nan
    out["itl_p95_s"] = percentile(itls, 95)
    remote = sum(1 for t in turns if t.prefill_replica is not None)
    out["remote_prefills"] = remote
    out["local_prefills"] = len(turns) - remote
    out["local_prefill_share"] = (len(turns) - remote) / len(turns) if turns else math.nan
    out["programs_split_across_replicas"] = sum(
        1 for p in programs if len({t.replica for t in p.turns}) > 1)
    replicas = [asdict(r) for r in result.replicas]
    makespan = float(result.makespan)
    for r in replicas:
        r["busy_share"] = r["busy_s"] / makespan if makespan > 0 else math.nan
    out["kv_bytes_moved"] = sum(r["kv_bytes_in"] for r in replicas)
    out["kv_seconds_moved"] = sum(r["kv_seconds_in"] for r in replicas)
    for role in sorted({r["role"] for r in replicas}):
        busy = [r["busy_s"] for r in replicas if r["role"] == role]
        mean = sum(busy) / len(busy)
        out[f"load_balance_{role}"] = max(busy) / mean if mean > 0 else math.nan
    out["replicas"] = replicas
    return out
