"""SWE-bench-like programs: ``swe`` after Continuum's Table 2 (GPT-5 programs, 10.9 turns) and
``swe-long`` after 500 public mini-swe-agent runs (40.3 turns).

Both draw from the same three tool families (edits, look-ups, runs of Python), whose mixture
has Continuum's measured per-call mean and sd; the numbers and their sources are beside them.
"""

from __future__ import annotations

import math
from functools import cache

from scipy import optimize

from common.trace import Trace
from eval.workloads.distributions import ClippedLogNormal, DiscreteNormal
from eval.workloads.shapes import ShapeSpec, ToolSpec, draw_programs

__all__ = ["SWE_LONG_TARGETS", "SWE_TARGETS", "swe_like", "swe_long_like"]


# --- SWE-bench (Continuum, Table 2) -----------------------------------------------------------

#: Continuum, Table 2, SWE-bench: turns per program 10.9 +- 2.1; tool call 925 +- 3550 ms;
#: about 70k tokens per program.
SWE_TARGETS = {
    "turns_mean": 10.9,
    "turns_sd": 2.1,
    "tool_s_mean": 0.925,
    "tool_s_sd": 3.55,
    "tokens_per_program_mean": 70_000.0,
}

# Three tool families whose mixture has the published per-call mean and sd: quick edits and
# views, shell look-ups (grep/find/ls), and runs of Python (reproduction scripts, tests) that make
# the long tail. Mixture: 0.35*0.12 + 0.45*0.45 + 0.20*m = 0.925 -> m = 3.4025; second moment
# 0.35*(0.1^2+0.12^2) + 0.45*(0.8^2+0.45^2) + 0.20*(s^2+m^2) = 0.925^2 + 3.55^2 -> s = 7.333.
_SWE_TOOLS = (
    ToolSpec("str_replace_editor", 0.35, ClippedLogNormal(0.12, 0.10, 0.01, 5.0)),
    ToolSpec("bash", 0.45, ClippedLogNormal(0.45, 0.80, 0.01, 30.0)),
    ToolSpec("python", 0.20, ClippedLogNormal(3.4025, 7.3330, 0.05, 120.0)),
)
_SWE_PREFIX = 800  # system prompt + tool documentation shared by all SWE programs
_SWE_TURNS = DiscreteNormal(10.9, 2.1, 2, 30)
_SWE_PROMPT = ClippedLogNormal(2500.0 - _SWE_PREFIX, 700.0, 200.0, 12_000.0)
_SWE_OUTPUT = ClippedLogNormal(180.0, 90.0, 20.0, 1500.0)


def _swe_return_mean() -> float:
    """Mean tool return that makes E[processed_tokens] = 70k given the other choices:
    ``E[T] = E[n]*P + o*E[n(n+1)/2] + r*E[n(n-1)/2]``."""
    t = _SWE_TURNS
    p = _SWE_PROMPT.mean + _SWE_PREFIX
    rest = SWE_TARGETS["tokens_per_program_mean"] - t.moment(lambda n: n) * p
    rest -= _SWE_OUTPUT.mean * t.moment(lambda n: n * (n + 1) / 2)
    return rest / t.moment(lambda n: n * (n - 1) / 2)


def _swe_spec() -> ShapeSpec:
    r = _swe_return_mean()
    return ShapeSpec(
        benchmark="swe",
        turns=_SWE_TURNS,
        prompt=_SWE_PROMPT,
        output=_SWE_OUTPUT,
        tool_return=ClippedLogNormal(r, 1.3 * r, 5.0, 10_000.0),
        tools=_SWE_TOOLS,
        shared_prefix_tokens=_SWE_PREFIX,
        shared_prefix_id="swe-system",
    )


def swe_like(n: int, jps: float, seed: int = 0, *, cv: float | None = None) -> Trace:
    """SWE-bench-like agent programs, after Continuum's Table 2 (SWE-bench workload).

    Targets (from the paper): turns per program 10.9 ± 2.1; tool call 925 ± 3550 ms per call;
    about 70k tokens per program.

    * Turns: integers 2..30 whose mean and sd are exactly 10.9 and 2.1 (:class:`DiscreteNormal`).
    * Tool time: a mixture of three tools, each a clipped lognormal, whose per-call mean and sd
      are exactly 0.925 s and 3.55 s: ``str_replace_editor`` (35 %, 0.12 ± 0.10 s), ``bash``
      look-ups (45 %, 0.45 ± 0.80 s, clipped at 30 s) and ``python`` runs of scripts and tests
      (20 %, 3.40 ± 7.33 s, clipped at 120 s) — most calls are fast (median ~0.2 s), a few
      are long. Per-tool distributions differ, so per-tool duration CDFs (Continuum) learn
      something.
    * Tokens: "tokens per program" is read as ``Program.processed_tokens`` = the sum over turns
      of the prompt processed plus the output (what a no-reuse engine computes). Reading it as
      the final context would need ~6k tokens per tool return, far more than SWE agents see;
      this reading gives contexts that grow from ~2.5k to ~10k. Choices: first prompt
      2500 ± 700 tokens (800 of them a system prompt shared by all programs, id
      ``swe-system``), outputs 180 ± 90 tokens, and tool returns with the mean that makes
      E[tokens per program] = 70k exactly (≈ 550 tokens, sd 1.3x the mean, clipped to
      5..10000; long tails from file views and test logs).
    * Arrivals: Poisson at ``jps`` jobs/s, or Gamma with coefficient of variation ``cv``.
    """
    programs = draw_programs(_swe_spec(), n, jps, seed, cv, "swe", "synthetic:swe_like")
    return Trace(
        name=f"swe-{n}",
        description="SWE-bench-like programs (Continuum Table 2 statistics)",
        params={"generator": "swe", "n": n, "jps": jps, "cv": cv, "targets": SWE_TARGETS},
        seed=seed,
        programs=programs,
    )


# --- long SWE-bench programs (public mini-swe-agent runs) ------------------------------------

#: 500 public mini-swe-agent runs on SWE-bench Verified (a frontier model, 2025), counted with our
#: tokenizer: 40.3 +- 19.9 model calls per program (median 36); first prompt 1.89k tokens;
#: output per call mean 257 (median ~71); observation per call mean 285 (median ~75); final
#: context 23.5k +- 16k (max ~93k).
SWE_LONG_TARGETS = {
    "turns_mean": 40.3,
    "turns_sd": 19.9,
    "first_prompt_mean": 1890.0,
    "output_tokens_per_turn_mean": 257.0,
    "output_tokens_per_turn_median": 71.0,
    "tool_return_tokens_mean": 285.0,
    "tool_return_tokens_median": 75.0,
    "final_context_mean": 23_500.0,
}


def _with_median(mean: float, median: float, lo: float, hi: float) -> ClippedLogNormal:
    """The clipped lognormal with this mean and median (the runs report those two, not an sd):
    the sd is found by bisection, since a larger sd with the mean held moves the median down.
    (A lognormal's own ``sd = mean sqrt(exp(2 ln(mean/median)) - 1)`` would not do: the clip
    removes part of the tail, and refitting to that sd drags the median far below.)"""

    def gap(sd: float) -> float:
        return math.exp(ClippedLogNormal(mean, sd, lo, hi).params[0]) - median

    low, high = 0.05 * mean, 0.1 * mean
    while gap(high) > 0:
        low, high = high, high * 1.5
    return ClippedLogNormal(mean, float(optimize.brentq(gap, low, high, xtol=1e-6)), lo, hi)


# mini-swe-agent has one tool, bash; its commands fall in the same three families as the `swe`
# tools (edits, look-ups, runs of Python), named as command classes (`bash:<class>`, what the
# harness's own agent sends). The runs record no tool time (only the time between model calls,
# mean 7 s with the model's own latency), so each class keeps the per-call seconds of the `swe`
# family it matches, whose mixture has Continuum's measured SWE-bench mean and sd.
_SWE_LONG_TOOLS = (
    ToolSpec("bash:edit", 0.35, _SWE_TOOLS[0].seconds),
    ToolSpec("bash:grep", 0.45, _SWE_TOOLS[1].seconds),
    ToolSpec("bash:python", 0.20, _SWE_TOOLS[2].seconds),
)
_SWE_LONG_PREFIX = 1200  # mini-swe-agent's system prompt + instance template, shared by all


@cache
def _swe_long_spec() -> ShapeSpec:
    # Built on first use, not at import: the two `_with_median` fits are root searches.
    t = SWE_LONG_TARGETS
    return ShapeSpec(
        benchmark="swe",
        turns=DiscreteNormal(t["turns_mean"], t["turns_sd"], 3, 150),
        prompt=ClippedLogNormal(t["first_prompt_mean"] - _SWE_LONG_PREFIX, 350.0, 100.0,
                                6000.0),
        output=_with_median(t["output_tokens_per_turn_mean"],
                            t["output_tokens_per_turn_median"], 5.0, 12_000.0),
        tool_return=_with_median(t["tool_return_tokens_mean"], t["tool_return_tokens_median"],
                                 1.0, 16_000.0),
        tools=_SWE_LONG_TOOLS,
        shared_prefix_tokens=_SWE_LONG_PREFIX,
        shared_prefix_id="swe-long-system",
    )


def swe_long_like(n: int, jps: float, seed: int = 0, *, cv: float | None = None) -> Trace:
    """Long SWE-bench programs like public mini-swe-agent runs (`SWE_LONG_TARGETS`), where
    `swe` follows the Continuum paper's shorter GPT-5 programs (10.9 turns).

    * Turns: integers 3..150 with mean and sd exactly 40.3 and 19.9 (the runs' median, 36, is a
      little below the mean; a discrete normal does not hold that skew).
    * First prompt 1.89k tokens, 1.2k of them shared by all programs (id ``swe-long-system``).
    * Output and tool return per call: lognormal with the runs' mean and median (257 / 71 and
      285 / 75 tokens), clipped at 12k and 16k; so the final context is about
      1.89k + 40.3 x 257 + 39.3 x 285 = 23.5k, as measured, with a tail past 100k.
    * Tools: `bash:edit`, `bash:grep`, `bash:python` with the `swe` trace's seconds per call
      (the runs do not record tool time).
    * Arrivals: Poisson at ``jps`` jobs/s, or Gamma with coefficient of variation ``cv``.
    """
    programs = draw_programs(_swe_long_spec(), n, jps, seed, cv, "swel",
                             "synthetic:swe_long_like")
    return Trace(
        name=f"swe-long-{n}",
        description="long SWE-bench programs (public mini-swe-agent run statistics)",
        params={"generator": "swe-long", "n": n, "jps": jps, "cv": cv,
                "targets": SWE_LONG_TARGETS},
        seed=seed,
        programs=programs,
    )
