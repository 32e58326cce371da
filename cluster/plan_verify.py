"""Stage two of planning: replay the near-tied plans as whole deployments, choose the best measured.

Why: the ILP (``cluster.planner``) ranks plans by a separable model, tau per role measured on one
replica beside a fixed partner of the other role. A whole deployment couples the roles (the
prefill P95 TTFT depends on how the decode replicas take the KV hand-offs and on the router's
spread), so among plans whose predicted objectives differ by less than the model's own error the
ILP's order carries no information; replaying those plans does. In the 16-GPU DuReader check
(docs/planner.md) three plans tied at 0.431 and the replays ranked the ILP's second first.

What counts as near-tied (``TIE_TOLERANCE`` = 0.2, relative to the first plan's predicted
objective): the per-role model's P95s were off by up to 19 % against whole-deployment replays in
that check (predicted TTFT 0.861 s, measured 0.723-0.793 s); two plans closer than that are
inside the model's error. Plans farther from the first are not replayed: the model's margin
exceeds its error, and a replay of a large deployment costs as much as many per-role
simulations. ``--tie-tolerance inf`` replays the whole shortlist regardless.

The choice is the plan with the lowest measured objective (the planner's own
``Objective.score`` on the measured P95s); equal measured objectives go to the planner's order.
Pure Python: the replays come from ``replay(prefill, decode, programs)`` ->
``(P95 TTFT, P95 ITL)`` (``cluster.plan_sim.SimulatedTau.deployment``), so the selection is
tested with hand-made measurements.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from cluster.planner import Objective, Plan, PlanError

TIE_TOLERANCE = 0.2
SHORTLIST = 3  # plans stage two may replay when planning by simulation (`--verify` default)

Replay = Callable[[tuple[int, int], tuple[int, int], int], tuple[float, float]]


@dataclass(frozen=True)
class Measured:
    """One plan replayed whole: its measured P95s and objective."""

    plan: Plan
    planned_rank: int  # 1-based rank in the ILP's order
    ttft: float
    itl: float
    score: float
    seconds: float = 0.0


def near_ties(plans: Sequence[Plan], tolerance: float = TIE_TOLERANCE) -> list[Plan]:
    """The leading plans whose predicted objective is within ``tolerance`` (relative) of the
    first plan's, in the ILP's order (the first plan always)."""
    if not (tolerance >= 0):
        raise PlanError(f"--tie-tolerance must be >= 0, got {tolerance!r}")
    if not plans:
        return []
    limit = plans[0].score * (1 + tolerance) if math.isfinite(tolerance) else math.inf
    return [p for p in plans if p.score <= limit]


def measure(replay: Replay, plans: Sequence[Plan], objective: Objective, programs: int,
            progress: Callable[[str], None] | None = None) -> list[Measured]:
    """Each plan replayed whole (in the ILP's order) and scored with ``objective``."""
    out = []
    for rank, p in enumerate(plans, 1):
        started = time.perf_counter()
        ttft, itl = replay((p.prefill.degree, p.prefill.count),
                           (p.decode.degree, p.decode.count), programs)
        score = objective.score(replace(p.prefill, tau=ttft), replace(p.decode, tau=itl))
        out.append(Measured(p, rank, ttft, itl, score, time.perf_counter() - started))
        if progress is not None:
            progress(f"replayed plan {rank} ({p.prefill.label()} + {p.decode.label()}): P95 "
                     f"TTFT {ttft:.3f} s, P95 ITL {1000 * itl:.1f} ms ({out[-1].seconds:.0f} s)")
    return out


def ranked(measured: Sequence[Measured]) -> list[Measured]:
    """Best measured first; equal measured objectives in the planner's order."""
    return sorted(measured, key=lambda m: (m.score, m.planned_rank))


def choose(measured: Sequence[Measured]) -> Measured:
    """The plan stage two reports as the planner's choice."""
    if not measured:
        raise PlanError("no plan was replayed")
    return ranked(measured)[0]


def report(measured: Sequence[Measured], programs: int) -> str:
    """The replays as markdown, best measured first, and which plan is chosen."""
    lines = [f"Near-tied plans replayed as whole deployments ({programs} programs at the full "
             "rate, `pd` routing), best measured first:", "",
             "| measured rank | planned rank | prefill | decode | P95 TTFT | P95 ITL | "
             "measured objective | planned objective |", "|---:|---:|---|---|---:|---:|---:|---:|"]
    order = ranked(measured)
    for i, m in enumerate(order, 1):
        lines.append(f"| {i} | {m.planned_rank} | {m.plan.prefill.label()} | "
                     f"{m.plan.decode.label()} | {m.ttft:.3f} s | {1000 * m.itl:.1f} ms | "
                     f"{m.score:.3f} | {m.plan.score:.3f} |")
    best = order[0]
    spread = (order[-1].score - best.score) / best.score if best.score > 0 else 0.0
    lines += ["", f"Measured objectives span {100 * spread:.1f} % of the best; "
              + ("the ILP's first plan is also the best measured."
                 if best.planned_rank == 1 else
                 f"the best measured is the ILP's plan {best.planned_rank}, chosen over its "
                 "first.")]
    return "\n".join(lines)
