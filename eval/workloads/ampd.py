"""AMPD's multi-round workloads (its Table 1: ToolBench, GAIA, HotpotQA, DuReader).

The paper gives three means per workload (rounds, prefill and decode tokens per round); every
shape around them is our choice, documented in `ampd_like`. Each workload is registered as a
trace name of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.trace import Trace
from eval.workloads.arrivals import arrival_times, streams
from eval.workloads.distributions import ClippedLogNormal, DiscreteNormal, FixedCount
from eval.workloads.infercept import INFERCEPT_TABLE
from eval.workloads.shapes import ShapeSpec, ToolSpec, check_n, draw_program
from server.perf.registry import load_profile

__all__ = ["AMPD_MAX_CONTEXT", "AMPD_TABLE", "READINGS", "AmpdRow", "ampd_like",
           "idle_ttft_s", "new_tokens_per_round", "row_of"]


@dataclass(frozen=True)
class AmpdRow:
    """One workload of AMPD's Table 1 (the three means) and our choices for the rest."""

    name: str
    rounds: float  # mean LLM calls per program (the table)
    prefill: float  # mean new tokens prefilled per round (the table)
    decode: float  # mean tokens decoded per round (the table)
    rounds_sd: float  # 0: every program has exactly `rounds` rounds (our choice)
    tool: str  # what runs between rounds (our choice)
    tool_seconds: ClippedLogNormal  # its duration per call (our choice, see ampd_like)


# Retrieval (HotpotQA's Wikipedia, DuReader's search) takes the project's one measured figure
# for it: InferCept's Wikipedia call (its Table 1 "qa" row, 0.69 s).
_RETRIEVAL = next(r for r in INFERCEPT_TABLE if r.kind == "qa")
_RETRIEVAL_S = ClippedLogNormal(
    _RETRIEVAL.seconds, _RETRIEVAL.seconds_sd, *_RETRIEVAL.seconds_range
)

#: AMPD ("Efficient Multi-round LLM Inference over Disaggregated Serving"), Table 1: mean rounds,
#: prefill tokens per round and decode tokens per round. Everything else in a row is ours.
AMPD_TABLE: tuple[AmpdRow, ...] = (
    AmpdRow("toolbench", 3.96, 703.79, 50.39, 1.5, "rapidapi",
            ClippedLogNormal(1.0, 1.0, 0.05, 30.0)),
    AmpdRow("gaia", 11.32, 6161.02, 528.76, 3.0, "browser",
            ClippedLogNormal(3.0, 4.0, 0.1, 120.0)),
    AmpdRow("hotpotqa", 3.0, 1569.8, 80.03, 0.0, "wikipedia", _RETRIEVAL_S),
    AmpdRow("dureader", 3.0, 3081.23, 150.10, 0.0, "search", _RETRIEVAL_S),
)
_AMPD_CV = 0.6  # sd / mean of prefill and decode tokens per round (our choice)
#: Llama-3.1's context: a longer program could never run, so it is redrawn (see ampd_like).
AMPD_MAX_CONTEXT = 131_072


#: How Table 1's "Prefill Length" is read: ``new`` (the tokens a round adds: its first prompt or
#: the last tool's return) or ``context`` (the round's whole prompt, cached history included, so
#: a round adds far fewer: AMPD's own premise of small increments). Trace names: ``hotpotqa``
#: reads ``new``, ``hotpotqa-ctx`` reads ``context`` (and so for every row).
READINGS = ("new", "context")


def row_of(trace: str) -> AmpdRow:
    """The Table 1 row of a trace name (``hotpotqa``, ``hotpotqa-ctx``, ...)."""
    rows = {row.name: row for row in AMPD_TABLE}
    base = trace.removesuffix("-ctx")
    if base not in rows:
        raise ValueError(f"{trace!r} is not one of AMPD's workloads ({', '.join(rows)}, each "
                         "also as NAME-ctx)")
    return rows[base]


def idle_ttft_s(trace: str, profile: str) -> float:
    """The TTFT of the trace's Table 1 "Prefill Length" (its mean tokens per round) prefilled
    from scratch on an idle replica of `profile`: the unit of a per-trace TTFT SLO (k x this),
    the same under both readings (the table's figure, not the reading's new tokens)."""
    return load_profile(profile).prefill_seconds(round(row_of(trace).prefill))


def _turns(row: AmpdRow) -> DiscreteNormal | FixedCount:
    if row.rounds_sd:
        return DiscreteNormal(row.rounds, row.rounds_sd, 1, int(math.ceil(row.rounds * 2.5)))
    return FixedCount(int(row.rounds))


def new_tokens_per_round(row: AmpdRow, reading: str = "new") -> float:
    """The mean new tokens of a round under `reading`. ``context``: round k (from 0) of a
    program prompts with k + 1 increments of mean m and k answers of mean d, so over a
    program of R rounds the prompts add up to m R(R+1)/2 + d R(R-1)/2; the table's mean per
    round is that sum's expectation over E[R] rounds, solved for m."""
    if reading not in READINGS:
        raise ValueError(f"reading {reading!r}: choose {' or '.join(READINGS)}")
    if reading == "new":
        return row.prefill
    turns = _turns(row)
    rounds = turns.moment(lambda n: n)
    up = turns.moment(lambda n: n * (n + 1) / 2) / rounds
    down = turns.moment(lambda n: n * (n - 1) / 2) / rounds
    m = (row.prefill - row.decode * down) / up
    if m <= 0:
        raise ValueError(f"{row.name}: its decode tokens alone exceed the table's prefill "
                         "length under the context reading")
    return m


def _ampd_spec(row: AmpdRow, reading: str = "new") -> ShapeSpec:
    """Round 0 prefills the first prompt, round i > 0 the tool return of round i - 1: both from
    one distribution, so the mean over rounds of new tokens is the reading's whatever the
    count (`new_tokens_per_round`)."""
    mean = new_tokens_per_round(row, reading)
    prefill = ClippedLogNormal(mean, _AMPD_CV * mean, mean / 16, 4 * mean)
    return ShapeSpec(
        benchmark=row.name,
        turns=_turns(row),
        prompt=prefill,
        output=ClippedLogNormal(row.decode, _AMPD_CV * row.decode, row.decode / 16,
                                4 * row.decode),
        tool_return=prefill,
        tools=(ToolSpec(row.tool, 1.0, row.tool_seconds),),
    )


def ampd_like(
    n: int,
    jps: float,
    seed: int = 0,
    *,
    workload: str,
    cv: float | None = None,
    max_context: int = AMPD_MAX_CONTEXT,
    reading: str = "new",
) -> Trace:
    """Multi-round programs after AMPD's Table 1 (``workload``: toolbench, gaia, hotpotqa,
    dureader; registered as trace names of their own).

    The paper gives three means per workload; only the means come from it, every shape below
    is our choice. Rows in :data:`AMPD_TABLE`.

    * Rounds (LLM calls per program): ToolBench 3.96 and GAIA 11.32 are discrete normals with
      exactly that mean (sd 1.5 on 1..10, sd 3 on 1..29); HotpotQA and DuReader have exactly 3
      rounds (the table's integer 3: a fixed retrieve-then-answer loop).
    * Prefill tokens per round (ToolBench 703.79, GAIA 6161.02, HotpotQA 1569.8, DuReader
      3081.23) are read as the *new* tokens of a round (``Program.new_tokens``): the first
      prompt in round 0, the previous tool's return later, the incremental prefill AMPD routes.
      Both come from one clipped lognormal with the table's mean, sd 0.6 x mean, clipped to
      [mean/16, 4 x mean]. ``reading="context"`` reads the table's figure as the round's whole
      prompt instead (history included): the new tokens per round are then solved from it
      (`new_tokens_per_round`: hotpotqa 745, dureader 1466, toolbench 222, gaia 491).
    * Decode tokens per round (50.39, 528.76, 80.03, 150.10): a clipped lognormal of the same
      shape.
    * Tool time (the paper gives none): ToolBench's RapidAPI calls 1.0 +- 1.0 s (a web API
      round trip); GAIA's browsing, file reading and code runs 3.0 +- 4.0 s (heavier, long
      tail); HotpotQA's Wikipedia and DuReader's search retrieval 0.69 s, InferCept's measured
      Wikipedia call. Tool time only spaces a program's rounds; the planner and the router see
      it as the gap before the next incremental prefill.
    * A program whose final context exceeds ``max_context`` (Llama-3.1's 131,072) could never
      run and is redrawn; only GAIA has such programs (about 1 in 70; its prefill mean drops by
      about 0.6 %).
    * Arrivals: Poisson at ``jps`` jobs/s (AMPD's), or Gamma with coefficient of variation ``cv``.
    """
    check_n(n)
    rows = {row.name: row for row in AMPD_TABLE}
    if workload not in rows:
        raise ValueError(f"unknown AMPD workload {workload!r}; choose from {', '.join(rows)}")
    row = rows[workload]
    spec = _ampd_spec(row, reading)
    content, arr = streams(seed)
    times = arrival_times(n, jps, arr, cv)
    programs = []
    for i in range(n):
        for _ in range(1000):
            program = draw_program(spec, content, f"{workload}-{i:05d}", times[i],
                                   f"synthetic:ampd/{workload}")
            if program.final_context_tokens <= max_context:
                break
        else:
            raise ValueError(f"max_context {max_context} is too small for {workload!r} programs "
                             f"(1000 draws in a row were longer); raise it")
        programs.append(program)
    targets = {"rounds_mean": row.rounds, "prefill_per_round_mean": row.prefill,
               "decode_per_round_mean": row.decode, "reading": reading,
               "new_tokens_per_round_mean": new_tokens_per_round(row, reading)}
    suffix = "" if reading == "new" else "-ctx"
    return Trace(
        name=f"{workload}{suffix}-{n}",
        description=f"{workload}-like multi-round programs (AMPD Table 1 means, "
                    f"prefill length read as {reading} tokens per round)",
        params={"generator": workload + suffix, "n": n, "jps": jps, "cv": cv,
                "max_context": max_context, "targets": targets},
        seed=seed,
        programs=programs,
    )
