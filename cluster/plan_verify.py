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
``Objective.score`` on the measured P95s, averaged over the replay seeds); equal measured
objectives go to the planner's order. Noise: a replay's P95 depends on the programs drawn, so
with several seeds (``--verify-seeds``) the report says under how many seeds the choice also
measured best; with one seed it cannot say, and the docs give the figures of a 3-seed check.
Pure Python: the replays come from ``replay(prefill, decode, programs, seed)`` ->
``(P95 TTFT, P95 ITL)`` (``sim.planning.SimulatedTau.deployment``), so the selection is
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

Replay = Callable[[tuple[int, int], tuple[int, int], int, int], tuple[float, float]]


@dataclass(frozen=True)
class Measured:
    """One plan replayed whole: its measured P95s and objective (means over the seeds), and
    the objective under each seed."""

    plan: Plan
    planned_rank: int  # 1-based rank in the ILP's order
    ttft: float
    itl: float
    score: float
    seconds: float = 0.0
    scores: tuple[float, ...] = ()  # per seed; () means just `score`

    def per_seed(self) -> tuple[float, ...]:
        return self.scores or (self.score,)


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
            seeds: Sequence[int] = (0,),
            progress: Callable[[str], None] | None = None) -> list[Measured]:
    """Each plan replayed whole under each seed (in the ILP's order), scored with
    ``objective``; the means over the seeds."""
    if not seeds:
        raise PlanError("--verify-seeds must be at least 1")
    out = []
    for rank, p in enumerate(plans, 1):
        started = time.perf_counter()
        runs = []
        for seed in seeds:
            ttft, itl = replay((p.prefill.degree, p.prefill.count),
                               (p.decode.degree, p.decode.count), programs, seed)
            score = objective.score(replace(p.prefill, tau=ttft), replace(p.decode, tau=itl))
            runs.append((ttft, itl, score))
            if progress is not None:
                progress(f"replayed plan {rank} ({p.prefill.label()} + {p.decode.label()}, "
                         f"seed {seed}): P95 TTFT {ttft:.3f} s, P95 ITL {1000 * itl:.1f} ms")
        mean = [sum(r[i] for r in runs) / len(runs) for i in range(3)]
        out.append(Measured(p, rank, *mean, time.perf_counter() - started,
                            tuple(r[2] for r in runs)))
    return out


def ranked(measured: Sequence[Measured]) -> list[Measured]:
    """Best measured first; equal measured objectives in the planner's order."""
    return sorted(measured, key=lambda m: (m.score, m.planned_rank))


def choose(measured: Sequence[Measured]) -> Measured:
    """The plan stage two reports as the planner's choice."""
    if not measured:
        raise PlanError("no plan was replayed")
    return ranked(measured)[0]


def report(measured: Sequence[Measured], programs: int, router: str = "pd") -> str:
    """The replays as markdown, best measured first, and which plan is chosen."""
    lines = [f"Near-tied plans replayed as whole deployments ({programs} programs at the full "
             f"rate, `{router}` routing), best measured first:", "",
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
                 "first."), wins(measured)]
    return "\n".join(lines)


def wins(measured: Sequence[Measured]) -> str:
    """Under how many seeds the choice measured best of all: the noise check."""
    seeds = len(measured[0].per_seed()) if measured else 0
    if seeds < 2:
        return ("One replay seed: no estimate of the noise (`--verify-seeds N` replays each "
                "plan under N seeds).")
    best = choose(measured)
    won = sum(all(b <= o for o in (m.per_seed()[i] for m in measured if m is not best))
              for i, b in enumerate(best.per_seed()))
    return (f"The choice measured best under {won} of {seeds} seeds"
            + ("." if won == seeds else "; the plans are not separated beyond the seed-to-seed "
               "noise, so any of them is as good a choice as these replays can tell."))
