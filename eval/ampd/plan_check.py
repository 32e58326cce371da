"""The planner's plans replayed by the bench: `harness plan ... --bench N`.

Why: the planner (`cluster.planner`, `sim.planning`) predicts a plan's SLO attainment from its
own simulations; the claim "the planner finds the best deployment" is only as good as that
prediction on the deployment the bench actually builds. So each plan it prints is built the
way `harness cluster bench` builds a P/D deployment (`eval.ampd.bench.run_one`: its cluster
file, node placement, engines, mixed TP per role through ``decode_profile``), replayed on a
trace drawn with another seed than the planner's (a fresh sample of the same workload, not
the programs the prediction was made on), and its attainment printed beside the predicted
one. ``TOLERANCE`` (10 %, relative) is issue 28's bar for "within".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.metrics import SLO
from eval.ampd.bench import STRATEGIES, Fleet, RunConfig, run_one
from eval.workloads.registry import load_or_generate

TOLERANCE = 0.10
#: the bench strategy that replays a plan made under each planner routing
STRATEGY_OF_ROUTER = {"pd": "pd", "ampd": "ampd"}


@dataclass(frozen=True)
class Checked:
    """One plan: what the planner predicted (per-role model; whole-plan replay, if stage two
    replayed it: the mean over its seeds) and what the bench measured (the mean over the bench
    seeds, each seed's in ``replays``). One replay of 80 programs varies by more than 10 %
    from draw to draw (0.54-0.94 over five draws of one deployment, docs/ampd-regime.md), so both
    sides are means over several draws before "within 10 %" can mean anything."""

    label: str
    predicted_roles: float
    predicted_whole: float
    replayed: float
    row: dict[str, Any]
    replays: tuple[float, ...] = ()  # per bench seed; () means just `replayed`

    def per_seed(self) -> tuple[float, ...]:
        return self.replays or (self.replayed,)

    def error(self) -> float:
        """Relative error of the planner's best prediction (the whole-plan replay when there
        is one, else the per-role model) against the bench's replay."""
        pred = self.predicted_whole if not math.isnan(self.predicted_whole) else (
            self.predicted_roles)
        if self.replayed == 0:
            return 0.0 if pred == 0 else math.inf
        return abs(pred - self.replayed) / self.replayed


def plan_label(prefill: tuple[int, int], decode: tuple[int, int]) -> str:
    """``P TP4 x2 + D TP8 x1``."""
    return f"P TP{prefill[0]} x{prefill[1]} + D TP{decode[0]} x{decode[1]}"


@dataclass(frozen=True)
class PlannedDeployment:
    """A plan as the bench builds it: `prefill` and `decode` replicas, ``(TP degree, count)``
    each, of `gpu` GPUs serving `model` (each role's profile is ``{gpu}x{degree}-{model}``)."""

    gpu: str
    model: str
    prefill: tuple[int, int]
    decode: tuple[int, int]

    def profile_at(self, degree: int) -> str:
        return f"{self.gpu}x{degree}-{self.model}"


def replay_plan(plan: PlannedDeployment, *, trace: str, rate: float, programs: int, seed: int,
                slo: SLO, router: str, history: str) -> dict[str, Any]:
    """One plan replayed by the bench; its row."""
    prefill, decode = plan.prefill, plan.decode
    run = RunConfig(STRATEGIES[STRATEGY_OF_ROUTER[router]], (prefill[1], decode[1]))
    programs_ = load_or_generate(trace, programs, rate, seed)
    fleet = Fleet(prefill[1] + decode[1], plan.profile_at(prefill[0]),
                  decode_profile=plan.profile_at(decode[0]), history=history)
    return run_one(programs_, run, fleet, slo=slo, seed=seed)


def bench_seeds(seed: int, verify_seeds: int, bench_seed: int | None,
                count: int) -> list[int]:
    """The bench's seeds: `count` of them from `bench_seed`, by default the first seed after
    the planner's own (``seed`` .. ``seed + verify_seeds - 1``), so the bench replays programs
    the prediction was not made on."""
    if count < 1:
        raise ValueError("--bench-seeds must be at least 1")
    first = seed + max(1, verify_seeds) if bench_seed is None else bench_seed
    return [first + i for i in range(count)]


def report(checked: Sequence[Checked], *, programs: int, seeds: Sequence[int]) -> str:
    """Predicted beside replayed, as markdown (with several bench seeds, each seed's replay
    and their spread as well)."""
    several = len(seeds) > 1
    named = (", ".join(str(s) for s in seeds) if len(seeds) <= LISTED_SEEDS
             else f"{seeds[0]}-{seeds[-1]}")
    lines = [f"Plans replayed by the bench (`eval.ampd.bench.run_one`, {programs} programs, "
             f"seed{'s' if several else ''} {named}), SLO attainment per turn"
             + (" (the mean over the seeds)" if several else "") + ":", "",
             "| plan | predicted (per-role model) | predicted (whole-plan replay) | replayed "
             "(bench) | error | within 10 % |" + (" bench per seed |" if several else ""),
             "|---|---:|---:|---:|---:|---|" + ("---|" if several else "")]
    for c in checked:
        err = c.error()
        row = (f"| {c.label} | {_f(c.predicted_roles)} | {_f(c.predicted_whole)} | "
               f"{_f(c.replayed)} | {100 * err:.1f} % | {'yes' if err <= TOLERANCE else 'no'} |")
        if several:
            row += " " + _spread(c.per_seed()) + " |"
        lines.append(row)
    if not several:
        lines += ["", "One bench seed: a single draw of the programs varies by more than the "
                  "10 % bar; `--bench-seeds N` compares means over N draws."]
    return "\n".join(lines)


#: bench seeds listed one by one in the report; more are summarised (range, sd)
LISTED_SEEDS = 10


def _spread(values: Sequence[float]) -> str:
    """Each seed's figure, or for many seeds their range and standard deviation."""
    if len(values) <= LISTED_SEEDS:
        return " / ".join(_f(x) for x in values)
    sd = statistics.stdev(values)
    return f"{_f(min(values))}-{_f(max(values))}, sd {sd:.3f} ({len(values)} seeds)"


def _f(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3f}"
