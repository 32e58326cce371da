"""The planner's latency oracle: one replica of a role simulated on the virtual-time cluster.

Why simulate one replica: the ILP (``cluster.planner``) needs tau per (role, TP degree, load),
separable by role, so each role is measured alone at its per-replica share of the load, with a
partner of the other role at the largest degree, meant not to be the bottleneck (at very high
per-replica loads two prefill partners can be, which throttles what the decode replica sees):

* prefill at degree ``d``: a 1P1D cluster (prefill ``{gpu}x{d}-{model}``, one decode replica at
  the largest degree) replays the workload's *prefill view*: every turn decodes one token and
  the tokens it would have decoded join the next turn's input, so every prompt has its real
  length while the partner does almost nothing. tau = P95 TTFT (prefill queue + compute + the
  KV hand-off).
* decode at degree ``d``: ``partner_prefill`` prefill replicas at the largest degree hand every
  turn to one decode replica of degree ``d``, which decodes the real outputs. tau = P95
  inter-token latency (``common.metrics.tpot_of``).

Cost control (2 cores): a simulation replays ``STEADY_LIFETIMES x load x T`` programs, ``T`` a
program's duration alone (its tool time plus its decoding at one sequence per step on the
partner): ``load x T`` is the concurrency of the steady state (Little's law), but a run of only
that many programs is a burst that ends before the queue has built, so arrivals span four
lifetimes (the 16-GPU DuReader check in docs/planner.md: 16 programs at 2 programs/s gave a
P95 TTFT of 0.54 s, 48-60 programs 0.77-0.85 s); at least ``programs`` (16: P95 over ~50-180
turns) and at most ``max_programs`` (48); a few seconds to a minute each. Loads
are simulated only on a geometric grid ``rate / ratio^k`` (default ratio 1.5) and interpolated
between (``cluster.planner.Curve``); once tau changes by less than ``flat`` (2 %) between two
grid points, lower loads reuse it (the replica is unloaded); every simulation is cached per
(role, degree, grid load), in memory and in ``cache_path``
(JSON) when given. Degrees the model cannot run at (``server.perf.registry.load_profile`` refuses
them, e.g. Llama-3.1-70B on one H100) are skipped and listed in ``skipped``; a degree whose KV
cache cannot hold the workload's longest conversation gets tau = inf.

Routing (``router``): ``pd`` (every prefill remote) as before, or ``ampd``: every simulation,
per role and whole-deployment, routes with AMPD's Algorithm 1 and queues with its Algorithm 2
(appendix A.1(ii): the simulator decides per prefill whether it runs remote or locally on the
decode replica, by the policy of section 4), against the SLO the plan is scored by; the
replicas are built as the bench builds them (`sim.engines.pd_replica`: history pulled, AMPD's
prefill replicas one prefill at a time). Under ``ampd`` the roles are coupled (a decode replica
takes the prefills the prefill side has no slack for), which the per-role simulations see only
against their fixed partner: stage two (`deployment`) replays the plan whole.

Predicted SLO attainment (``attainment``): each simulation also keeps the share of its turns
within the role's SLO (TTFT for prefill, mean ITL for decode), interpolated over the grid as
tau is; a plan's prediction is the product of its two roles' shares (the two taken as
independent), and a whole-deployment replay's is the share of its turns within both.

Not simulated at all: loads at or above a replica's capacity (``CAPACITY``: analytic bounds
from the perf model, tau = inf, listed in ``overloaded``), and, when ``prefetch`` runs the
(role, degree) chains ahead (in parallel with ``jobs`` > 1), chains whose idle-replica lower
bound cannot beat the top plans already found (listed in ``pruned``).
"""

from __future__ import annotations

import copy
import json
import math
import multiprocessing
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.config import parse_cluster
from cluster.plan_bounds import CAPACITY, bound_score, idle_p95
from cluster.planner import (
    DEGREES,
    ROLES,
    Candidate,
    Curve,
    Objective,
    PlanError,
    brute_force,
    counts,
)
from common.atomic import write_text_atomic
from common.metrics import SLO, percentile, tpot_of
from common.trace import Trace
from server.engine import ContextTooLong
from server.perf.hardware import GPUS
from server.perf.model_shapes import available_models
from server.perf.registry import load_profile
from sim.engines import pd_replica
from sim.loop import replay_cluster
from sim.virtual_cluster import VirtualCluster

CAPACITY_SAMPLE = 256  # programs whose mean work bounds a replica's capacity (`plan_bounds`)
GRID_RATIO = 1.5
FLAT = 0.02
PROGRAMS = 16
MAX_PROGRAMS = 48
STEADY_LIFETIMES = 4  # program lifetimes of arrivals a simulation replays (module docstring)
PARTNER_PREFILL = 2
ROUTERS = ("pd", "ampd")  # how the simulated clusters route (module docstring)


class Unfit(Exception):
    """A simulated cluster's engines cannot hold the workload (the reason is the message)."""


def split_profile(name: str) -> tuple[str, str]:
    """``GPU-MODEL`` -> (gpu, model); a TP size in the name is refused (the planner picks it)."""
    m = re.match(r"^([a-z][a-z0-9]*?)(x\d+)?-(.+)$", name.lower())
    if not m or m[1] not in GPUS or m[3] not in available_models():
        raise PlanError(f"--profile {name!r}: give GPU-MODEL with GPU in {', '.join(GPUS)} and "
                        f"MODEL in {', '.join(available_models())}, e.g. h100-llama-3.1-70b")
    if m[2]:
        raise PlanError(f"--profile {name!r}: leave the TP size out ({m[1]}-{m[3]}); the planner "
                        f"tries TP {', '.join(map(str, DEGREES))}")
    return m[1], m[3]


def prefill_view(trace: Any) -> Any:
    """The same conversations with one decoded token per turn; the rest of each turn's output
    becomes input of the next turn, so prompt lengths are unchanged."""
    programs = []
    for p in trace.programs:
        turns = []
        carry = 0
        for t in p.turns:
            turns.append(t.model_copy(update={"input_tokens": t.input_tokens + carry,
                                              "output_tokens": 1}))
            carry = t.output_tokens - 1
        programs.append(p.model_copy(update={"turns": turns}))
    return Trace(name=f"{trace.name}-prefill-view", description=trace.description,
                 params=trace.params, seed=trace.seed, programs=programs)


@dataclass
class _ChainResult:
    """What a worker of `SimulatedTau.prefetch` sends back for one (role, degree) chain."""

    cache: dict[str, float]
    att: dict[str, float]
    unfit: dict[tuple[str, int], str]
    overloaded: set[tuple[str, int, int]]
    simulations: int
    sim_seconds: float
    lines: list[str]


def _walk_chain(sim: SimulatedTau, role: str, degree: int, loads: list[float]) -> _ChainResult:
    """A worker: ask ``sim`` for tau at each load, in order; return what it simulated."""
    lines: list[str] = []
    sim.progress = lines.append
    before = set(sim._cache)
    for load in loads:
        sim.tau(role, degree, load)
    return _ChainResult({k: v for k, v in sim._cache.items() if k not in before},
                        {k: v for k, v in sim._att.items() if k not in before}, sim.unfit,
                        sim.overloaded, sim.simulations, sim.sim_seconds, lines)


@dataclass(frozen=True)
class SimOptions:
    """How the planner simulates (see the module docstring): programs per simulation (at least
    `programs`, at most `max_programs`), the seed of the traces and engines, the load grid's
    `ratio` and where it is taken as `flat`, the prefill partners of a decode replica, how the
    simulated clusters route (`router`, `ROUTERS`) against which SLO (TTFT s, ITL s; AMPD
    needs one), and how a prefill replica gets the history it lacks (`history`; None:
    ``recompute`` under ``pd``, ``pull`` under ``ampd``)."""

    programs: int = PROGRAMS
    max_programs: int = MAX_PROGRAMS
    seed: int = 0
    ratio: float = GRID_RATIO
    flat: float = FLAT
    partner_prefill: int = PARTNER_PREFILL
    router: str = "pd"
    slo: tuple[float, float] | None = None
    history: str | None = None


class SimulatedTau:
    """tau by simulation (see the module docstring). ``trace``: the workload's name (a trace
    name or file, as for ``harness bench --trace``; it keys the cache); ``workload(n, load,
    seed)``: its programs (picklable, for ``jobs`` > 1), e.g. `eval.bench.traces.make_trace`
    bound to the name; ``rate``: the whole deployment's load (the top of the grid);
    ``options``: how it simulates; ``cache_path``: the JSON file of simulations kept across
    runs; ``progress``: told a line per simulation."""

    def __init__(self, profile: str, trace: str, rate: float, *,
                 workload: Callable[[int, float, int], Trace],
                 options: SimOptions = SimOptions(), cache_path: str | Path | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        programs, max_programs, seed = options.programs, options.max_programs, options.seed
        ratio, flat, partner_prefill = options.ratio, options.flat, options.partner_prefill
        router, slo, history = options.router, options.slo, options.history
        if not (rate > 0 and math.isfinite(rate)):
            raise PlanError(f"--rate must be a positive number of programs per second, "
                            f"got {rate!r}")
        if not 2 <= programs <= max_programs or ratio <= 1 or partner_prefill < 1:
            raise PlanError("need 2 <= programs <= max_programs, ratio > 1 and "
                            "partner_prefill >= 1")
        if router not in ROUTERS:
            raise PlanError(f"--router {router!r}: choose {' or '.join(ROUTERS)}")
        if router == "ampd" and slo is None:
            raise PlanError("AMPD routes against the SLO: give (TTFT, ITL) seconds")
        #: the SLO (TTFT s, ITL s) AMPD routes against and `attainment` counts against
        self.router, self.slo = router, slo
        #: how a prefill replica gets the history it lacks: ``recompute`` under ``pd`` (the
        #: planner's old default), ``pull`` under ``ampd`` (the bench's), unless given
        self.history = history or ("pull" if router == "ampd" else "recompute")
        self.gpu, self.model = split_profile(profile)
        self.trace, self.rate, self.programs, self.seed = trace, rate, programs, seed
        self.workload = workload
        self.max_programs = max_programs
        self.ratio, self.flat, self.partner_prefill = ratio, flat, partner_prefill
        self.progress = progress
        self.skipped: dict[int, str] = {}  # TP degrees the model cannot run at, and why
        self.unfit: dict[tuple[str, int], str] = {}  # (role, degree) that cannot hold the work
        self.valid: list[int] = []
        for d in DEGREES:
            try:
                load_profile(self.profile(d))
            except ValueError as exc:
                self.skipped[d] = str(exc).split(";")[0]
            else:
                self.valid.append(d)
        if not self.valid:
            raise PlanError(f"{self.model} runs on {self.gpu} at none of TP {DEGREES}")
        self.partner = self.profile(max(self.valid))
        sample = self._workload(32, rate)  # a bad --trace fails now, not after minutes
        self.program_seconds = self._program_seconds(sample, load_profile(self.partner))
        many = self._workload(CAPACITY_SAMPLE, rate).programs
        #: programs/s a replica of each role and degree cannot sustain (`CAPACITY`)
        self.capacity = {(role, d): CAPACITY[role](many, load_profile(self.profile(d)))
                         for role in ROLES for d in self.valid}
        self.overloaded: set[tuple[str, int, int]] = set()  # (role, degree, count) pruned
        self.pruned: dict[tuple[str, int], float] = {}  # chains bounded out, and their bound
        self._idle_traces: dict[int, Any] = {}  # grid index -> its trace (`_idle_p95`)
        self.simulations = 0  # run in this process (not read from the cache)
        self.sim_seconds = 0.0
        self.cache_path = Path(cache_path) if cache_path else None
        self._att: dict[str, float] = {}  # key -> share of turns within the role's SLO
        self._last_att = math.nan
        self._cache: dict[str, float] = self._read_cache()
        #: (prefill, decode, seed) -> share of turns within both SLOs, whole-plan replays
        self.replayed: dict[tuple[tuple[int, int], tuple[int, int], int], float] = {}

    def profile(self, degree: int) -> str:
        return f"{self.gpu}x{degree}-{self.model}"

    def degrees(self, role: str) -> list[int]:
        return list(self.valid)

    # -- the grid ---------------------------------------------------------------------------
    def _grid(self, k: int) -> float:
        return self.rate / self.ratio ** k

    def tau(self, role: str, degree: int, load: float) -> float:
        if role not in ROLES or degree not in self.valid:
            return math.inf
        if (role, degree) in self.pruned:
            return math.inf  # cannot be among the top plans (`prefetch`)
        if load >= self.capacity[(role, degree)]:
            self.overloaded.add((role, degree, round(self.rate / load)))
            return math.inf  # no steady state: not simulated (`CAPACITY`)
        k_float = math.log(self.rate / load, self.ratio)
        k = max(0, math.floor(k_float + 1e-9))  # grid[k] >= load > grid[k + 1]
        flat_at = self._flat_from(role, degree, k)
        if flat_at is not None:
            return self._at(role, degree, flat_at)
        hi = self._at(role, degree, k)
        if load > self._grid(k):  # above the top of the grid: the whole rate, or more
            return math.inf if load > self.rate * (1 + 1e-9) else hi
        if math.isclose(load, self._grid(k), rel_tol=1e-9) or not math.isfinite(hi):
            return hi
        if (flat_at := self._flat_from(role, degree, k)) is not None:
            # `hi` just completed a flat pair: loads below grid[k] reuse it, so the grid
            # point under this load is not needed (one simulation fewer per flat chain)
            return self._at(role, degree, flat_at)
        lo = self._at(role, degree, k + 1)
        return Curve([(self._grid(k + 1), lo), (self._grid(k), hi)])(load)

    def _flat_from(self, role: str, degree: int, k: int) -> int | None:
        """The first grid index j < k from which tau stopped falling (``flat``), if known."""
        for j in range(1, k + 1):
            a, b = self._known(role, degree, j - 1), self._known(role, degree, j)
            if a is None or b is None:
                continue
            if math.isfinite(a) and abs(a - b) <= self.flat * max(a, 1e-12):
                return j
        return None

    def _key(self, role: str, degree: int, k: int) -> str:
        return f"{role}/{degree}/{self._grid(k):.6g}"

    def _known(self, role: str, degree: int, k: int) -> float | None:
        return self._cache.get(self._key(role, degree, k))

    def _at(self, role: str, degree: int, k: int) -> float:
        key = self._key(role, degree, k)
        if key not in self._cache:
            self._last_att = math.nan
            self._cache[key] = self.simulate(role, degree, self._grid(k))
            self._att[key] = self._last_att  # what that simulation counted (`simulate`)
            self._write_cache()
        return self._cache[key]

    # -- predicted attainment -------------------------------------------------------------
    def attainment(self, role: str, degree: int, load: float) -> float:
        """Share of one replica's turns within its role's SLO at ``load`` (module docstring),
        on the grid as `tau` reads it: 0 where tau is infinite (overloaded, unfit), linear
        between grid points, the flat floor's below it; nan when never simulated."""
        if self.slo is None:
            return math.nan
        tau = self.tau(role, degree, load)  # simulates the grid points this load needs
        if not math.isfinite(tau):
            return 0.0 if (role, degree) not in self.pruned else math.nan
        k = max(0, math.floor(math.log(self.rate / load, self.ratio) + 1e-9))
        flat_at = self._flat_from(role, degree, k)  # the grid points `tau` read, in its order
        if flat_at is not None:
            return self._att_at(role, degree, flat_at)
        if load >= self._grid(k) * (1 - 1e-9):
            return self._att_at(role, degree, k)
        lo, hi = self._att_at(role, degree, k + 1), self._att_at(role, degree, k)
        if math.isnan(lo):
            return hi
        x0, x1 = self._grid(k + 1), self._grid(k)
        return lo + (hi - lo) * (load - x0) / (x1 - x0)

    def _att_at(self, role: str, degree: int, k: int) -> float:
        return self._att.get(self._key(role, degree, k), math.nan)

    def predicted_attainment(self, plan: Any) -> float:
        """A plan's predicted SLO attainment per turn: its prefill replicas' share within the
        TTFT SLO times its decode replicas' share within the ITL SLO, each at its share of
        the load (independent roles, as the ILP takes them)."""
        p, d = plan.prefill, plan.decode
        return (self.attainment("prefill", p.degree, self.rate / p.count)
                * self.attainment("decode", d.degree, self.rate / d.count))

    # -- running the chains ahead: bounded, in parallel -----------------------------------
    def prefetch(self, gpus: int, objective: Objective, top: int = 3, jobs: int = 1) -> None:
        """Simulate what the planner will ask for, a (role, degree) chain at a time
        (``cluster.planner.counts``: the replica counts, asked at ``rate / count`` in that
        order), most promising chain first, ``jobs`` chains at once in worker processes; the
        results land in the cache. A chain whose lower bound (`chain_bound`) cannot make a
        plan better than the ``top``-th best plan already simulated is not simulated at all:
        it is listed in ``pruned`` and its tau is inf, which leaves the top plans unchanged.

        Why chains: which grid loads a chain simulates depends only on that chain's own values
        (the grid, the flat floor, the capacity bound) and each simulation only on its inputs
        (seeded), so a chain walked in a worker simulates what the serial walk would, with the
        same values. With ``jobs`` > 1 the pruning can see fewer finished chains when it
        decides (they run at the same time), so it may simulate a chain the serial walk prunes;
        the plans are the same either way."""
        todo = {(role, d): [self.rate / c for c in cs]
                for (role, d), cs in counts(self, gpus, self.rate).items() if cs}
        bound = {key: bound_score(objective, key[0], self.chain_bound(*key, loads))
                 for key, loads in todo.items()}
        pending = sorted(todo, key=lambda key: (bound[key], key))
        finished: list[tuple[str, int]] = []
        pool = None
        if jobs > 1:
            # fork: the workers start with this process's imports (no vLLM yet) and classes
            pool = ProcessPoolExecutor(max_workers=jobs,
                                       mp_context=multiprocessing.get_context("fork"))
        running: dict[Any, tuple[str, int]] = {}
        try:
            while pending or running:
                incumbent = self._kth_best(finished, gpus, objective, top)
                for key in [k for k in pending if bound[k] > incumbent]:
                    pending.remove(key)
                    self.pruned[key] = bound[key]
                while pending and (pool is None or len(running) < jobs):
                    key = pending.pop(0)
                    if pool is None:
                        for load in todo[key]:
                            self.tau(*key, load)
                        finished.append(key)
                        break
                    running[pool.submit(_walk_chain, self._worker(), *key, todo[key])] = key
                if pool is None or not running:
                    continue
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    self._merge(future.result())
                    finished.append(running.pop(future))
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)

    def chain_bound(self, role: str, degree: int, loads: Sequence[float]) -> float:
        """A lower bound on every tau this chain can report: the least, over the grid points
        its loads may need, of the P95 the same trace would show on an idle replica (each
        turn alone, its history cached: prefill time of its new tokens for prefill, one
        decode step at its context for decode). Queueing, batching and the KV hand-off only
        add to a turn's time, and a P95 of larger values is no smaller."""
        if degree not in self.valid:
            return math.inf
        ks = [max(0, math.floor(math.log(self.rate / x, self.ratio) + 1e-9)) for x in loads
              if x < self.capacity[(role, degree)]]
        if not ks:
            return math.inf
        return min(self._idle_p95(role, degree, k) for k in range(min(ks), max(ks) + 2))

    def _idle_p95(self, role: str, degree: int, k: int) -> float:
        if k not in self._idle_traces:  # the same trace for every (role, degree) chain
            self._idle_traces[k] = self._workload(self.programs_at(self._grid(k)), self._grid(k))
        return idle_p95(self._idle_traces[k].programs, load_profile(self.profile(degree)), role)

    def _kth_best(self, finished: Sequence[tuple[str, int]], gpus: int, objective: Objective,
                  top: int) -> float:
        """The ``top``-th best plan's score among the finished chains' candidates (inf when
        they make fewer plans): a plan must beat it to be among the top ones."""
        cands = [Candidate(role, d, c, tau) for (role, d), cs in
                 counts(self, gpus, self.rate).items() if (role, d) in finished for c in cs
                 if math.isfinite(tau := self.tau(role, d, self.rate / c))]
        try:
            plans = brute_force(cands, gpus, objective, top)
        except PlanError:
            return math.inf
        return plans[-1].score if len(plans) == top else math.inf

    def _worker(self) -> SimulatedTau:
        """A copy for a worker process: no cache file, nothing counted yet."""
        worker = copy.copy(self)
        worker.progress, worker.cache_path = None, None
        worker.simulations, worker.sim_seconds = 0, 0.0
        worker.unfit, worker.overloaded = {}, set()
        worker._att = dict(self._att)
        return worker

    def _merge(self, done: _ChainResult) -> None:
        self._cache.update(done.cache)
        self._att.update(done.att)
        self.unfit.update(done.unfit)
        self.overloaded |= done.overloaded
        self.simulations += done.simulations
        self.sim_seconds += done.sim_seconds
        if self.progress is not None:
            for line in done.lines:
                self.progress(line)
        self._write_cache()

    # -- one simulation --------------------------------------------------------------------
    def simulate(self, role: str, degree: int, load: float) -> float:
        """P95 of the role's latency on one replica of ``degree`` at ``load`` programs/s; the
        share of its turns within the role's SLO is left in ``_last_att`` for the cache."""
        tau, self._last_att = self.simulate_both(role, degree, load)
        return tau

    def simulate_both(self, role: str, degree: int, load: float) -> tuple[float, float]:
        """(P95 of the role's latency, share of its turns within the role's SLO; nan without
        an SLO) on one replica of ``degree`` at ``load`` programs/s."""
        started = time.perf_counter()
        trace = self._workload(self.programs_at(load), load)
        if role == "prefill":
            trace = prefill_view(trace)
            replicas = [{"name": "p", "role": "prefill", "profile": self.profile(degree)},
                        {"name": "d", "role": "decode", "profile": self.partner}]
        else:
            replicas = [{"name": "p", "role": "prefill", "profile": self.partner,
                         "count": self.partner_prefill},
                        {"name": "d", "role": "decode", "profile": self.profile(degree)}]
        try:
            turns = self._turns(f"plan-{role}-{degree}", replicas, trace)
        except Unfit as exc:
            self.unfit[(role, degree)] = str(exc)
            return math.inf, 0.0
        ttft, itl = _p95s(turns)
        tau = ttft if role == "prefill" else itl
        att = math.nan
        if self.slo is not None:
            att = _share(turns, self.slo[0] if role == "prefill" else math.inf,
                         self.slo[1] if role == "decode" else math.inf)
        self.simulations += 1
        elapsed = time.perf_counter() - started
        self.sim_seconds += elapsed
        if self.progress is not None:
            self.progress(f"simulated {role} TP{degree} at {load:.4g} programs/s "
                          f"({len(trace.programs)} programs, {self.router}): P95 {tau:.4g} s"
                          + ("" if math.isnan(att) else f", within SLO {att:.3f}")
                          + f" ({elapsed:.1f} s)")
        return tau, att

    def deployment(self, prefill: tuple[int, int], decode: tuple[int, int],
                   programs: int, seed: int | None = None) -> tuple[float, float]:
        """The whole deployment (``(degree, count)`` per role) replayed at the full rate on
        the virtual-time cluster, routed by ``router``: (P95 TTFT over every turn, P95 ITL).
        What the plan's per-replica simulations predict, measured without their
        simplifications (a partner per role, one replica at its share of the load). ``seed``
        (default: the planner's) draws the trace and the engines. The share of turns within
        both SLOs is kept in ``replayed``."""
        replicas = [{"name": "p", "role": "prefill", "profile": self.profile(prefill[0]),
                     "count": prefill[1]},
                    {"name": "d", "role": "decode", "profile": self.profile(decode[0]),
                     "count": decode[1]}]
        seed = self.seed if seed is None else seed
        turns = self._turns("plan-check", replicas, self._workload(programs, self.rate, seed),
                            seed)
        if self.slo is not None:
            self.replayed[(prefill, decode, seed)] = _share(turns, *self.slo)
        return _p95s(turns)

    def _turns(self, name: str, replicas: list[dict[str, Any]], trace: Any,
               seed: int | None = None) -> list[Any]:
        """Replay `trace` on a cluster of `replicas` routed by ``router``, built as the bench
        builds them (`sim.engines.pd_replica`: a replica whose KV cache is smaller than the
        model's context, 70B on two GPUs, is started with what it holds): the turns of every
        program. Raises `Unfit` when an engine cannot hold the workload."""
        seed = self.seed if seed is None else seed
        router: dict[str, Any] = {"strategy": self.router, "seed": seed}
        policy = "ampd" if self.router == "ampd" else "vllm"
        if self.slo is not None:
            router.update(ttft_slo_s=self.slo[0], itl_slo_s=self.slo[1])
        config = parse_cluster({"name": name, "router": router,
                                "replicas": [dict(r, policy=policy) for r in replicas]})

        def build(spec: Any) -> Any:
            return pd_replica(spec, config, seed, history=self.history)

        try:
            cluster = VirtualCluster(config, seed=seed, make_engine=build)
        except ValueError as exc:  # vLLM: the KV cache cannot hold `longest` tokens
            raise Unfit(str(exc).split(".")[0]) from None
        try:
            result = replay_cluster(trace, cluster)
        except ContextTooLong as exc:
            raise Unfit(str(exc).split(":")[0]) from None
        finally:
            cluster.close()
        return [t for p in result.programs.values() for t in p.turns]

    @staticmethod
    def _program_seconds(trace: Any, profile: Any) -> float:
        """Mean duration of a program alone: tools plus one decode step per output token."""
        total = 0.0
        for p in trace.programs:
            for i, t in enumerate(p.turns):
                step = profile.step_seconds([], [p.context_before(i)])
                total += t.tool_seconds + t.output_tokens * step
        return total / len(trace.programs)

    def programs_at(self, load: float) -> int:
        """Programs a simulation at ``load`` replays (see the module docstring)."""
        wanted = math.ceil(STEADY_LIFETIMES * load * self.program_seconds)
        return min(self.max_programs, max(self.programs, wanted))

    def _workload(self, n: int, load: float, seed: int | None = None) -> Trace:
        try:
            return self.workload(n, load, self.seed if seed is None else seed)
        except ValueError as exc:  # a bad trace name or file
            raise PlanError(f"--trace {self.trace!r}: {exc}") from None

    # -- the cache file --------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.router != "pd" or self.slo is not None or self.history != "recompute":
            extra = {"router": self.router, "slo": self.slo, "history": self.history}
        return {**extra, "gpu": self.gpu, "model": self.model, "trace": self.trace,
                "rate": self.rate,
                "programs": [self.programs, self.max_programs], "seed": self.seed,
                "ratio": self.ratio,
                "partner": self.partner, "partner_prefill": self.partner_prefill}

    def _read_cache(self) -> dict[str, float]:
        if self.cache_path is None or not self.cache_path.is_file():
            return {}
        try:
            data = json.loads(self.cache_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):  # not a cache: made again
            return {}
        if not isinstance(data, dict) or data.get("identity") != self._identity():
            return {}  # made for other inputs
        self._att.update({k: float(v) for k, v in data.get("attainment", {}).items()})
        return {k: float(v) for k, v in data.get("tau", {}).items()}

    def _write_cache(self) -> None:
        if self.cache_path is None:
            return
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        body = {"identity": self._identity(), "tau": self._cache, "attainment": self._att}
        write_text_atomic(self.cache_path, json.dumps(body, indent=1, sort_keys=True) + "\n")


def _p95s(turns: Sequence[Any]) -> tuple[float, float]:
    """(P95 TTFT, P95 per-turn mean ITL) of `turns`; inf for none."""
    ttft = [t.first_token - t.arrival for t in turns if t.first_token is not None]
    itl = [x for x in (tpot_of(t) for t in turns) if x is not None]
    return (percentile(ttft, 95) if ttft else math.inf,
            percentile(itl, 95) if itl else math.inf)


def _share(turns: Sequence[Any], ttft_s: float, itl_s: float) -> float:
    """Share of `turns` within both bounds (`common.metrics.SLO.met`)."""
    slo = SLO(ttft_s, itl_s)
    met = [slo.met(t) for t in turns]
    return sum(met) / len(met) if met else math.nan
