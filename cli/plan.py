"""`harness plan`: AMPD's deployment planner (`cluster.planner`) from the command line.

    harness plan --gpus 16 --profile h100-llama-3.1-70b --trace dureader --rate 2

prints the three best (prefill TP x count, decode TP x count) deployments as AMPD's Table 2,
with the predicted P95 TTFT and ITL, and how long planning took. Latencies are simulated on the
virtual-time cluster (`sim.planning`), or read from `--table FILE` (JSON
``{role: {degree: {load: tau_seconds}}}``).

Planning is two-stage when simulating: the ILP shortlists the top `--verify` plans (default 3),
and those within `--tie-tolerance` of the first's predicted objective are replayed as whole
deployments; the choice is the best measured (`cluster.plan_verify` says why). `--verify 0`
keeps the ILP's first plan.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial

from cluster import plan_verify
from cluster.planner import (
    OBJECTIVES,
    SOLVERS,
    Objective,
    PlanError,
    TableTau,
    plan,
    table,
)
from common.metrics import SLO
from eval.bench.traces import make_trace
from sim import planning as plan_sim


def register(parser: argparse.ArgumentParser) -> None:
    """`harness plan`'s options on the parser `cli.main` made for it."""
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, required=True, help="GPUs to deploy on")
    p.add_argument("--profile", required=True,
                   help="GPU-MODEL without a TP size, e.g. h100-llama-3.1-70b (TP 1, 2, 4, 8 "
                   "are tried: {gpu}x{tp}-{model})")
    p.add_argument("--trace", required=True,
                   help="workload: a generated trace name (toolbench, gaia, hotpotqa, dureader, "
                   "swe, ...) or a trace file")
    p.add_argument("--rate", type=float, required=True, help="programs per second, all replicas")
    p.add_argument("--table", default=None, metavar="FILE",
                   help="read tau from this JSON table instead of simulating")
    p.add_argument("--slo-ttft", type=float, default=SLO.ttft_s,
                   help=f"TTFT SLO (s) that normalises the prefill P95 (default {SLO.ttft_s:g})")
    p.add_argument("--slo-itl", type=float, default=SLO.tpot_s,
                   help=f"ITL SLO (s) that normalises the decode P95 (default {SLO.tpot_s:g})")
    p.add_argument("--objective", choices=OBJECTIVES, default="max",
                   help="minimise the max (default) or the sum of the SLO-normalised P95s")
    p.add_argument("--solver", choices=sorted(SOLVERS), default="ilp",
                   help="ilp (scipy HiGHS, default) or brute (every pair, the check)")
    p.add_argument("--top", type=int, default=3, help="plans to print (default 3)")
    p.add_argument("--sim-programs", type=int, default=None,
                   help="fewest programs per simulation (default 16)")
    p.add_argument("--sim-max-programs", type=int, default=None,
                   help="most programs per simulation (default 48)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="simulate up to N (role, TP degree) chains at once in worker processes "
                   "(the same plans as serial; default 1)")
    p.add_argument("--cache", default=None, metavar="FILE",
                   help="keep simulated latencies in this JSON file and reuse them")
    p.add_argument("--seed", type=int, default=0, help="trace and engine seed (default 0)")
    p.add_argument("--verify", type=int, default=None, metavar="K",
                   help="stage two: of the top K plans, replay those within --tie-tolerance of "
                   "the first as whole deployments at --rate (virtual time, `pd` routing) and "
                   f"choose the best measured (default {plan_verify.SHORTLIST} when simulating, "
                   "0 with --table; 0: the ILP's first plan)")
    p.add_argument("--tie-tolerance", type=float, default=plan_verify.TIE_TOLERANCE,
                   metavar="R", help="plans within this share of the first's predicted "
                   f"objective count as tied and are replayed (default "
                   f"{plan_verify.TIE_TOLERANCE:g}: the per-role model's error; inf: all K)")
    p.add_argument("--verify-seeds", type=int, default=1, metavar="N",
                   help="replay each near-tied plan under N seeds (--seed, --seed + 1, ...) and "
                   "choose by the mean; the report says under how many the choice won "
                   "(default 1)")
    p.add_argument("--verify-programs", type=int, default=60,
                   help="programs each --verify replay runs (default 60)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    """`harness plan`; a `PlanError` (a `UserError`) is printed by `cli.main`."""
    if args.top < 1:
        raise PlanError("--top must be at least 1")
    if args.verify is None:
        args.verify = 0 if args.table else plan_verify.SHORTLIST
    if args.verify < 0 or args.verify_programs < 2 or args.verify_seeds < 1:
        raise PlanError("--verify must be >= 0, --verify-programs >= 2 and --verify-seeds >= 1")
    if args.verify and args.table:
        raise PlanError("--verify replays deployments on the emulated GPUs: drop --table "
                        "(or give --verify 0)")
    if args.jobs < 1:
        raise PlanError("--jobs must be at least 1")
    objective = Objective({"prefill": args.slo_ttft, "decode": args.slo_itl}, args.objective)
    started = time.perf_counter()
    sim = None
    if args.table:
        provider = TableTau.load(args.table)
    else:
        def say(line: str) -> None:
            if not args.quiet:
                print(line, file=sys.stderr, flush=True)

        sim = plan_sim.SimulatedTau(
            args.profile, args.trace, args.rate, workload=partial(make_trace, args.trace),
            seed=args.seed, cache_path=args.cache,
            programs=args.sim_programs or plan_sim.PROGRAMS,
            max_programs=args.sim_max_programs or plan_sim.MAX_PROGRAMS, progress=say)
        provider = sim
    shortlist = max(args.top, args.verify)
    if sim is not None:
        sim.prefetch(args.gpus, objective, shortlist, args.jobs)
    plans = plan(provider, args.gpus, args.rate, objective, top=shortlist, solver=args.solver)
    elapsed = time.perf_counter() - started
    print(f"# {args.trace} at {args.rate:g} programs/s on {args.gpus} GPUs ({args.profile})\n")
    print(table(plans[:args.top], objective))
    if sim is not None:
        for degree, why in sim.skipped.items():
            print(f"TP{degree} skipped: {why}")
        for (role, degree), why in sim.unfit.items():
            print(f"{role} TP{degree} left out: {why}")
        for (role, degree), bound in sim.pruned.items():
            print(f"{role} TP{degree} not simulated: no plan with it can score below "
                  f"{bound:.3f} (idle-replica bound), worse than the plans found")
        if sim.overloaded:
            print(f"candidates above a replica's capacity (not simulated): "
                  f"{len(sim.overloaded)}")
        print(f"simulations: {sim.simulations} run ({sim.sim_seconds:.1f} s of simulating, "
              f"--jobs {args.jobs}), the rest from the cache")
    print(f"planning took {elapsed:.2f} s ({args.solver})")
    tied = plan_verify.near_ties(plans[:args.verify], args.tie_tolerance) if args.verify else []
    chosen, why = plans[0], "the ILP's first plan (--verify 0)"
    if len(tied) >= 2:
        assert sim is not None
        started = time.perf_counter()
        seeds = [args.seed + i for i in range(args.verify_seeds)]
        measured = plan_verify.measure(sim.deployment, tied, objective, args.verify_programs,
                                       seeds, sim.progress)
        print()
        print(plan_verify.report(measured, args.verify_programs))
        best = plan_verify.choose(measured)
        chosen = best.plan
        why = (f"the best measured of {len(tied)} plans within {args.tie_tolerance:g} of the "
               f"first's objective (replays took {time.perf_counter() - started:.1f} s)")
    elif args.verify:
        why = (f"the ILP's first plan: no other of the top {args.verify} is within "
               f"{args.tie_tolerance:g} of its objective")
    print(f"\nchoice: prefill {chosen.prefill.label()}, decode {chosen.decode.label()} "
          f"({chosen.gpus} GPUs): {why}")
    return 0
