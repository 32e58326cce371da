"""BFCL-multi-turn-like programs, after Continuum's Table 2 (BFCL workload).

The paper gives turns, tool time and tokens per program (mean and sd); the first prompt (the
function documentation of the task's API classes) is solved so the tokens per program hold.
"""

from __future__ import annotations

from common.trace import Trace
from eval.workloads.arrivals import arrival_times, streams
from eval.workloads.distributions import ClippedLogNormal, DiscreteNormal
from eval.workloads.shapes import ShapeSpec, ToolSpec, check_n, draw_program

__all__ = ["BFCL_TARGETS", "bfcl_like"]


#: Continuum, Table 2, BFCL: turns 6.3 +- 2.3; tool call 1923 +- 2133 ms; tokens per program
#: 93k +- 69k.
BFCL_TARGETS = {
    "turns_mean": 6.3,
    "turns_sd": 2.3,
    "tool_s_mean": 1.923,
    "tool_s_sd": 2.133,
    "tokens_per_program_mean": 93_000.0,
    "tokens_per_program_sd": 69_000.0,
}
_BFCL_PREFIX = 600  # shared system prompt
_BFCL_TURNS = DiscreteNormal(6.3, 2.3, 2, 20)
_BFCL_OUTPUT = ClippedLogNormal(70.0, 40.0, 8.0, 800.0)
_BFCL_RETURN = ClippedLogNormal(220.0, 250.0, 5.0, 4000.0)
_BFCL_TOOL_S = ClippedLogNormal(1.923, 2.133, 0.02, 60.0)
_BFCL_TOOLS = tuple(
    ToolSpec(name, 1.0, _BFCL_TOOL_S)
    for name in (
        "GorillaFileSystem",
        "MathAPI",
        "MessageAPI",
        "TicketAPI",
        "TradingBot",
        "TravelAPI",
        "TwitterAPI",
        "VehicleControlAPI",
    )
)


def _bfcl_spec() -> ShapeSpec:
    """First-prompt mean and sd solved so that processed tokens have mean 93k and sd 69k."""
    t = _BFCL_TURNS
    o, r = _BFCL_OUTPUT, _BFCL_RETURN
    target_mean = BFCL_TARGETS["tokens_per_program_mean"]
    target_sd = BFCL_TARGETS["tokens_per_program_sd"]
    p_total = (
        target_mean
        - o.mean * t.moment(lambda n: n * (n + 1) / 2)
        - r.mean * t.moment(lambda n: n * (n - 1) / 2)
    ) / t.moment(lambda n: n)
    p_unique = p_total - _BFCL_PREFIX

    def make(p_sd: float) -> ShapeSpec:
        return ShapeSpec(
            benchmark="bfcl",
            turns=t,
            prompt=ClippedLogNormal(p_unique, p_sd, 200.0, 200_000.0),
            output=o,
            tool_return=r,
            tools=_BFCL_TOOLS,
            shared_prefix_tokens=_BFCL_PREFIX,
            shared_prefix_id="bfcl-system",
        )

    # sd of T is increasing in the prompt sd: solve sd(T) = target by bisection
    lo, hi = 1.0, 5.0 * p_unique
    for _ in range(60):
        mid = (lo + hi) / 2
        if make(mid).expected_tokens()[1] < target_sd:
            lo = mid
        else:
            hi = mid
    return make((lo + hi) / 2)


def bfcl_like(
    n: int, jps: float, seed: int = 0, scale: float = 1.0, *, cv: float | None = None
) -> Trace:
    """BFCL-multi-turn-like programs, after Continuum's Table 2 (BFCL workload).

    Targets (from the paper): turns 6.3 ± 2.3; tool call 1923 ± 2133 ms; tokens per program
    93k ± 69k (read as ``Program.processed_tokens``, as in :func:`swe_like`).

    * Turns: integers 2..20 with mean 6.3 and sd 2.3 exactly.
    * Tool time: one clipped lognormal (0.02..60 s) with mean 1.923 s and sd 2.133 s, for all
      tools; tool names are BFCL's multi-turn API classes, drawn uniformly (no per-tool data).
    * Tokens: outputs (function calls) 70 ± 40 tokens, tool returns 220 ± 250 tokens; the first
      prompt (function documentation of the task's API classes, so long: ≈ 14k tokens, 600 of
      them a shared system prompt ``bfcl-system``) has its mean and sd solved in closed form so
      that tokens per program are 93k ± 69k exactly (the first prompt is re-sent every turn,
      so it dominates).
    * ``scale`` multiplies every token count (shared prefix included), e.g. 0.25 for a model
      with a short context.
    * Arrivals: Poisson at ``jps``, or Gamma with ``cv``.
    """
    check_n(n)
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    spec = _bfcl_spec()
    content, arr = streams(seed)
    times = arrival_times(n, jps, arr, cv)
    programs = [
        draw_program(spec, content, f"bfcl-{i:05d}", times[i], "synthetic:bfcl_like", scale)
        for i in range(n)
    ]
    return Trace(
        name=f"bfcl-{n}",
        description="BFCL-multi-turn-like programs (Continuum Table 2 statistics)",
        params={
            "generator": "bfcl",
            "n": n,
            "jps": jps,
            "cv": cv,
            "scale": scale,
            "targets": BFCL_TARGETS,
        },
        seed=seed,
        programs=programs,
    )
