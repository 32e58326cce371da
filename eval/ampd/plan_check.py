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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.metrics import SLO
from eval.ampd.bench import STRATEGIES, RunConfig, run_one
from eval.workloads.registry import load_or_generate

TOLERANCE = 0.10
#: the bench strategy that replays a plan made under each planner routing
STRATEGY_OF_ROUTER = {"pd": "pd", "ampd": "ampd"}


@dataclass(frozen=True)
class Checked:
    """One plan: what the planner predicted (per-role model; whole-plan replay, if stage two
    replayed it) and what the bench measured."""

    label: str
    predicted_roles: float
    predicted_whole: float
    replayed: float
    row: dict[str, Any]

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


def replay_plan(gpu: str, model: str, prefill: tuple[int, int], decode: tuple[int, int], *,
                trace: str, rate: float, programs: int, seed: int, slo: SLO, router: str,
                history: str) -> dict[str, Any]:
    """One plan (``(degree, count)`` per role) replayed by the bench; its row."""
    run = RunConfig(STRATEGIES[STRATEGY_OF_ROUTER[router]], (prefill[1], decode[1]))
    programs_ = load_or_generate(trace, programs, rate, seed)
    return run_one(programs_, run, replicas=prefill[1] + decode[1],
                   profile=f"{gpu}x{prefill[0]}-{model}", slo=slo, seed=seed,
                   history=history, decode_profile=f"{gpu}x{decode[0]}-{model}")


def report(checked: Sequence[Checked], *, programs: int, seed: int) -> str:
    """Predicted beside replayed, as markdown."""
    lines = [f"Plans replayed by the bench (`eval.ampd.bench.run_one`, {programs} programs, "
             f"seed {seed}), SLO attainment per turn:", "",
             "| plan | predicted (per-role model) | predicted (whole-plan replay) | replayed "
             "(bench) | error | within 10 % |", "|---|---:|---:|---:|---:|---|"]
    for c in checked:
        err = c.error()
        lines.append(f"| {c.label} | {_f(c.predicted_roles)} | {_f(c.predicted_whole)} | "
                     f"{_f(c.replayed)} | {100 * err:.1f} % | "
                     f"{'yes' if err <= TOLERANCE else 'no'} |")
    return "\n".join(lines)


def _f(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3f}"
