"""AMPD's deployment planner (section 5, appendix A): how many prefill and decode replicas, at
which tensor-parallel degree, for N GPUs serving a workload at a given rate.

Why a reformulation: Eq. 5 as printed is degenerate. Every indicator at 0 meets its
constraints (nothing forces a replica of each role to exist), and the latency term tau depends on
the parallel configuration only, not on the replica count, so adding replicas never pays and the
optimum never uses more than two GPU groups. What we solve instead:

* Candidates: one binary ``b[r, d, c]`` per role ``r`` in {prefill, decode}, TP degree ``d`` in
  {1, 2, 4, 8} (those the model can run at, see ``sim.planning``) and replica count ``c >= 1``.
* Exactly one candidate per role (so at least one replica of each role):
  ``sum_{d,c} b[r, d, c] = 1`` for each ``r``.
* GPUs: ``sum_{r,d,c} d * c * b[r, d, c] <= N``.
* Latency: ``tau[r, d, c] = tau_r(d, rate / c)``, the role's P95 latency on *one* replica of
  degree ``d`` at its share of the load (requests spread evenly over a role's replicas, as
  AMPD's router and binding aim to): P95 TTFT for prefill, P95 inter-token latency for decode.
  It is normalised by the role's SLO (``w = tau / slo_r``) so that seconds of TTFT and
  milliseconds of ITL are comparable.
* Objective ``max`` (default): minimise ``z + eps * sum(w * b)`` with ``z >= sum_{d,c} w * b``
  per role: the worse role's SLO-normalised P95, ties broken by the sum (``eps`` = 1e-3).
  Objective ``sum``: minimise ``sum(w * b)``.

Solved with ``scipy.optimize.milp`` (HiGHS, the solver AMPD cites), exact (``mip_rel_gap`` 0).
The next-best plans come from re-solving with a no-good cut on each plan found
(``b[p] + b[d] <= 1``). :func:`brute_force` scores every pair of candidates the same way, as the
check. Candidates whose tau is infinite (the replica cannot run the workload) are left out.

``tau`` comes from a :class:`TauProvider`: :class:`TableTau` (a table of measured or hand-made
points, interpolated) here, or ``sim.planning.SimulatedTau`` (the virtual-time cluster).
Pure Python and scipy: nothing here imports vLLM.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from common.errors import UserError

ROLES = ("prefill", "decode")
DEGREES = (1, 2, 4, 8)
OBJECTIVES = ("max", "sum")
TIE_BREAK = 1e-3  # weight of the sum under the `max` objective


class PlanError(UserError):
    """No deployment fits, or the input is wrong: the message says what to change."""


class TauProvider(Protocol):
    """P95 latency (seconds) of one replica of a role at a TP degree and a load (programs/s)."""

    def degrees(self, role: str) -> Sequence[int]:
        """The TP degrees this provider can answer for."""
        ...

    def tau(self, role: str, degree: int, load: float) -> float:
        """P95 latency; ``math.inf`` when such a replica cannot serve the workload."""
        ...


@dataclass
class Curve:
    """tau against load from a few points: linear between them, the lowest point's tau below
    them (less load never makes a replica slower), infinite above them (overload: unknown)."""

    points: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.points = sorted((float(x), float(y)) for x, y in self.points)
        for load, tau in self.points:
            if not (load > 0 and tau >= 0):
                raise PlanError(f"a tau point needs load > 0 and tau >= 0, got ({load}, {tau})")

    def __call__(self, load: float) -> float:
        if not self.points:
            return math.inf
        loads = [p[0] for p in self.points]
        i = bisect.bisect_left(loads, load)
        if i < len(loads) and math.isclose(loads[i], load, rel_tol=1e-9):
            return self.points[i][1]
        if i == 0:
            return self.points[0][1]
        if i == len(loads):
            return math.inf
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        return y0 + (y1 - y0) * (load - x0) / (x1 - x0)


class TableTau:
    """tau from a table: ``{role: {degree: {load: tau}}}`` (a JSON file of that shape, keys as
    strings, e.g. ``{"prefill": {"4": {"0.5": 0.3, "2": 1.1}}, "decode": {...}}``)."""

    def __init__(self, table: Mapping[str, Mapping[int | str, Mapping[float | str, float]]]):
        unknown = sorted(set(table) - set(ROLES))
        if unknown or not table:
            raise PlanError(f"a tau table has the roles {', '.join(ROLES)}; got {sorted(table)}")
        self.curves: dict[tuple[str, int], Curve] = {}
        for role, by_degree in table.items():
            for degree, points in by_degree.items():
                d = int(degree)
                if d not in DEGREES:
                    raise PlanError(f"tau table: TP degree {d} of {role}; use one of {DEGREES}")
                pts = [(float(x), float(y)) for x, y in points.items()]
                self.curves[(role, d)] = Curve(pts)

    @classmethod
    def load(cls, path: str | Path) -> TableTau:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise PlanError(f"no tau table {path}") from None
        except json.JSONDecodeError as exc:
            raise PlanError(f"tau table {path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise PlanError(f"tau table {path}: expected {{role: {{degree: {{load: tau}}}}}}")
        return cls(data)

    def degrees(self, role: str) -> list[int]:
        return sorted(d for r, d in self.curves if r == role)

    def tau(self, role: str, degree: int, load: float) -> float:
        curve = self.curves.get((role, degree))
        return math.inf if curve is None else curve(load)


@dataclass(frozen=True)
class Candidate:
    """``count`` replicas of ``role`` at TP ``degree``, each with P95 latency ``tau`` (s)."""

    role: str
    degree: int
    count: int
    tau: float

    @property
    def gpus(self) -> int:
        return self.degree * self.count

    def label(self) -> str:
        return f"TP{self.degree} x {self.count}"


@dataclass(frozen=True)
class Plan:
    prefill: Candidate
    decode: Candidate
    score: float

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus

    def key(self) -> tuple[int, int, int, int]:
        return (self.prefill.degree, self.prefill.count, self.decode.degree, self.decode.count)


@dataclass(frozen=True)
class Objective:
    """How a pair of candidates is scored (lower is better): see the module docstring."""

    slo: Mapping[str, float]  # seconds per role: prefill TTFT, decode ITL
    kind: str = "max"

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise PlanError(f"objective {self.kind!r}: choose {' or '.join(OBJECTIVES)}")
        if set(self.slo) != set(ROLES) or not all(v > 0 for v in self.slo.values()):
            raise PlanError(f"give a positive SLO per role ({', '.join(ROLES)}), got {self.slo}")

    def weight(self, c: Candidate) -> float:
        return c.tau / self.slo[c.role]

    def score(self, p: Candidate, d: Candidate) -> float:
        wp, wd = self.weight(p), self.weight(d)
        if self.kind == "sum":
            return wp + wd
        return max(wp, wd) + TIE_BREAK * (wp + wd)


def counts(provider: TauProvider, gpus: int, rate: float) -> dict[tuple[str, int], range]:
    """The replica counts each (role, degree) may take in ``gpus`` GPUs, leaving room for one
    replica of the other role: what :func:`candidates` asks tau for, at ``rate / count``
    (a simulating provider can run those chains ahead, ``SimulatedTau.prefetch``).
    Raises :class:`PlanError` when the input cannot make a plan."""
    if not (isinstance(gpus, int) and gpus >= 2):
        raise PlanError(f"--gpus must be an integer >= 2 (one prefill and one decode replica), "
                        f"got {gpus!r}")
    if not (rate > 0 and math.isfinite(rate)):
        raise PlanError(f"--rate must be a positive number of programs per second, got {rate!r}")
    degrees = {r: sorted(provider.degrees(r)) for r in ROLES}
    for role, ds in degrees.items():
        if not ds:
            raise PlanError(f"no TP degree is available for the {role} role")
    smallest = sum(min(ds) for ds in degrees.values())
    if gpus < smallest:
        raise PlanError(
            f"{gpus} GPUs cannot hold one prefill and one decode replica: the smallest TP "
            f"degrees available are {min(degrees['prefill'])} (prefill) and "
            f"{min(degrees['decode'])} (decode), so at least {smallest} GPUs are needed")
    out: dict[tuple[str, int], range] = {}
    for role in ROLES:
        other = min(degrees[ROLES[1 - ROLES.index(role)]])
        for d in degrees[role]:
            out[(role, d)] = range(1, (gpus - other) // d + 1)
    return out


def candidates(provider: TauProvider, gpus: int, rate: float) -> list[Candidate]:
    """Every (role, degree, count) of :func:`counts`, with its tau at ``rate / count``; counts
    ascend (the load falls), as a simulating provider prefers. Raises :class:`PlanError` when
    a role has no candidate at all."""
    out: list[Candidate] = []
    for (role, d), cs in counts(provider, gpus, rate).items():
        for c in cs:
            tau = provider.tau(role, d, rate / c)
            if math.isfinite(tau):
                out.append(Candidate(role, d, c, tau))
    for role in ROLES:
        if not any(c.role == role for c in out):
            raise PlanError(f"no {role} replica within {gpus} GPUs can serve this workload "
                            "(every candidate's latency is infinite: overloaded, or the "
                            "conversation does not fit its KV cache); add GPUs or lower --rate")
    return out


def _split(cands: Sequence[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
    return ([c for c in cands if c.role == "prefill"], [c for c in cands if c.role == "decode"])


def brute_force(cands: Sequence[Candidate], gpus: int, objective: Objective,
                top: int = 3) -> list[Plan]:
    """Every pair that fits, scored; the ``top`` best (ties: fewer GPUs, then the key)."""
    pre, dec = _split(cands)
    plans = [Plan(p, d, objective.score(p, d)) for p in pre for d in dec if p.gpus + d.gpus <= gpus]
    plans.sort(key=lambda x: (x.score, x.gpus, x.key()))
    if not plans:
        raise PlanError(f"no prefill + decode pair fits in {gpus} GPUs")
    return plans[:top]


def solve_ilp(cands: Sequence[Candidate], gpus: int, objective: Objective,
              top: int = 3) -> list[Plan]:
    """The ``top`` best plans by the ILP of the module docstring (HiGHS via scipy)."""
    cands = list(cands)
    n = len(cands)
    w = np.array([objective.weight(c) for c in cands])
    role = np.array([ROLES.index(c.role) for c in cands])
    use_z = objective.kind == "max"
    nvar = n + (1 if use_z else 0)
    cost = np.zeros(nvar)
    cost[:n] = TIE_BREAK * w if use_z else w
    rows: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(row: np.ndarray, low: float, high: float) -> None:
        rows.append(row)
        lo.append(low)
        hi.append(high)

    for r in range(len(ROLES)):
        row = np.zeros(nvar)
        row[:n] = role == r
        add(row, 1.0, 1.0)  # exactly one (degree, count) per role
    add(np.concatenate([[c.gpus for c in cands], [0.0] * (nvar - n)]), -np.inf, float(gpus))
    if use_z:
        cost[n] = 1.0
        for r in range(len(ROLES)):
            row = np.zeros(nvar)
            row[:n] = -w * (role == r)
            row[n] = 1.0
            add(row, 0.0, np.inf)  # z >= this role's normalised tau
    integrality = np.ones(nvar)
    upper = np.ones(nvar)
    if use_z:
        integrality[n] = 0
        upper[n] = np.inf
    plans: list[Plan] = []
    index = {id(c): i for i, c in enumerate(cands)}
    for _ in range(top):
        res = milp(cost, integrality=integrality, bounds=Bounds(np.zeros(nvar), upper),
                   constraints=LinearConstraint(np.array(rows), lo, hi),
                   options={"mip_rel_gap": 0.0, "disp": False})
        if res.x is None:
            if not plans:
                raise PlanError(f"no prefill + decode pair fits in {gpus} GPUs ({res.message})")
            break
        chosen = [cands[i] for i in np.flatnonzero(res.x[:n] > 0.5)]
        p = next(c for c in chosen if c.role == "prefill")
        d = next(c for c in chosen if c.role == "decode")
        plans.append(Plan(p, d, objective.score(p, d)))
        cut = np.zeros(nvar)
        cut[[index[id(p)], index[id(d)]]] = 1.0
        add(cut, -np.inf, 1.0)  # not this pair again
    return plans


SOLVERS = {"ilp": solve_ilp, "brute": brute_force}


def plan(provider: TauProvider, gpus: int, rate: float, objective: Objective, *, top: int = 3,
         solver: str = "ilp") -> list[Plan]:
    """The ``top`` best deployments of ``gpus`` GPUs for ``rate`` programs/s."""
    if solver not in SOLVERS:
        raise PlanError(f"solver {solver!r}: choose {' or '.join(SOLVERS)}")
    return SOLVERS[solver](candidates(provider, gpus, rate), gpus, objective, top)


def table(plans: Sequence[Plan], objective: Objective) -> str:
    """The plans as AMPD's Table 2 (markdown): configuration per role and predicted P95s."""
    lines = [
        "| rank | prefill (TP x count) | decode (TP x count) | GPUs | P95 TTFT (prefill) "
        "| P95 ITL (decode) | objective |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for i, p in enumerate(plans, 1):
        lines.append(
            f"| {i} | {p.prefill.label()} | {p.decode.label()} | {p.gpus} "
            f"| {p.prefill.tau:.3f} s | {1000 * p.decode.tau:.1f} ms | {p.score:.3f} |")
    lines.append("")
    lines.append(f"objective: {objective.kind} of P95 / SLO per role (SLO: TTFT "
                 f"{objective.slo['prefill']:g} s, ITL {1000 * objective.slo['decode']:g} ms)")
    return "\n".join(lines)
