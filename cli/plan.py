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

`--router ampd` plans for AMPD: every simulation routes with Algorithm 1 and queues with
Algorithm 2 (appendix A.1(ii)), against the SLO given. Each plan's predicted SLO attainment is
printed; `--bench N` replays the printed plans as `harness cluster bench` builds them (N
programs, a fresh seed) and prints the replayed attainment beside the predicted one
(`eval.ampd.plan_check`).
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from typing import Any

from cli.paths import TRACE, Kind, PathSpec, about, add_path_argument, output_file
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
from eval.ampd import plan_check
from eval.ampd.bench import trace_slo
from eval.bench.traces import make_trace
from sim import planning as plan_sim

#: `--table`: measured latencies, ``{role: {degree: {load: tau_seconds}}}``.
TAU_TABLE = PathSpec(Kind.FILE, "a JSON tau table {role: {degree: {load: tau_seconds}}}")


def register(parser: argparse.ArgumentParser) -> None:
    """`harness plan`'s options on the parser `cli.main` made for it."""
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, required=True, help="GPUs to deploy on")
    p.add_argument("--profile", required=True,
                   help="GPU-MODEL without a TP size, e.g. h100-llama-3.1-70b (TP 1, 2, 4, 8 "
                   "are tried: {gpu}x{tp}-{model})")
    add_path_argument(p, "--trace", spec=TRACE, required=True,
                      help="workload: a generated trace name (toolbench, gaia, hotpotqa, "
                      "dureader, swe, ...) or a trace file")
    p.add_argument("--rate", type=float, required=True, help="programs per second, all replicas")
    add_path_argument(p, "--table", spec=TAU_TABLE, default=None, metavar="FILE",
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
    add_path_argument(p, "--cache", spec=output_file("a JSON file to keep latencies in"),
                      default=None, metavar="FILE",
                      help="keep simulated latencies in this JSON file and reuse them")
    p.add_argument("--seed", type=int, default=0, help="trace and engine seed (default 0)")
    p.add_argument("--verify", type=int, default=None, metavar="K",
                   help="stage two: of the top K plans, replay those within --tie-tolerance of "
                   "the first as whole deployments at --rate (virtual time, --router's routing) "
                   "and "
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
    p.add_argument("--router", choices=plan_sim.ROUTERS, default="pd",
                   help="how the simulated deployments route: pd (every prefill remote; "
                   "default) or ampd (AMPD's Algorithms 1 and 2, against the SLO)")
    p.add_argument("--history", choices=("pull", "recompute"), default=None,
                   help="how a prefill replica gets the history it lacks (default: recompute "
                   "under pd, as before; pull under ampd, as the bench)")
    p.add_argument("--slo-ttft-x", type=float, default=None, metavar="K",
                   help="TTFT SLO = K x the trace's idle TTFT on a TP4 replica (as `harness "
                   "cluster bench --slo-ttft-x`), instead of --slo-ttft")
    p.add_argument("--bench", type=int, default=0, metavar="N",
                   help="replay the printed plans as `harness cluster bench` builds them, N "
                   "programs each, and print their attainment beside the predicted (default 0: "
                   "no replay)")
    p.add_argument("--bench-seed", type=int, default=None,
                   help="first seed of the --bench replays (default: the first after the "
                   "--verify-seeds, programs the prediction was not made on)")
    p.add_argument("--bench-seeds", type=int, default=1, metavar="N",
                   help="replay each plan under N bench seeds and compare the mean with the "
                   "prediction (default 1)")
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
    if args.bench < 0 or args.bench_seeds < 1:
        raise PlanError("--bench must be >= 0 and --bench-seeds >= 1")
    if args.bench and args.table:
        raise PlanError("--bench replays the plans on the emulated GPUs: drop --table")
    if args.slo_ttft_x is not None:
        gpu, model = plan_sim.split_profile(args.profile)
        try:
            args.slo_ttft = trace_slo(args.trace, SLO(args.slo_ttft, args.slo_itl),
                                      f"{gpu}x4-{model}", args.slo_ttft_x).ttft_s
        except Exception as exc:  # noqa: BLE001 - an AmpdBenchError or a profile error
            raise PlanError(str(exc)) from None
    objective = Objective({"prefill": args.slo_ttft, "decode": args.slo_itl}, args.objective)
    started = time.perf_counter()
    sim = None
    if args.table:
        with about("--table", args.table):
            provider = TableTau.load(args.table)
    else:
        def say(line: str) -> None:
            if not args.quiet:
                print(line, file=sys.stderr, flush=True)

        options = plan_sim.SimOptions(
            programs=args.sim_programs or plan_sim.PROGRAMS,
            max_programs=args.sim_max_programs or plan_sim.MAX_PROGRAMS, seed=args.seed,
            router=args.router, slo=(args.slo_ttft, args.slo_itl), history=args.history)
        sim = plan_sim.SimulatedTau(
            args.profile, args.trace, args.rate, workload=partial(make_trace, args.trace),
            options=options, cache_path=args.cache, progress=say)
        provider = sim
    shortlist = max(args.top, args.verify)
    if sim is not None:
        sim.prefetch(args.gpus, objective, shortlist, args.jobs)
    plans = plan(provider, args.gpus, args.rate, objective, top=shortlist, solver=args.solver)
    elapsed = time.perf_counter() - started
    print(f"# {args.trace} at {args.rate:g} programs/s on {args.gpus} GPUs ({args.profile}"
          f", {args.router} routing)\n")
    print(table(plans[:args.top], objective))
    if sim is not None:
        print("\npredicted SLO attainment per turn (per-role model: prefill share within TTFT "
              f"{args.slo_ttft:.3g} s x decode share within ITL {args.slo_itl:g} s): "
              + "; ".join(f"{i} {sim.predicted_attainment(p):.3f}"
                          for i, p in enumerate(plans[:args.top], 1)))
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
        print(plan_verify.report(measured, args.verify_programs, args.router))
        best = plan_verify.choose(measured)
        chosen = best.plan
        why = (f"the best measured of {len(tied)} plans within {args.tie_tolerance:g} of the "
               f"first's objective (replays took {time.perf_counter() - started:.1f} s)")
    elif args.verify:
        why = (f"the ILP's first plan: no other of the top {args.verify} is within "
               f"{args.tie_tolerance:g} of its objective")
    print(f"\nchoice: prefill {chosen.prefill.label()}, decode {chosen.decode.label()} "
          f"({chosen.gpus} GPUs): {why}")
    if args.bench:
        assert sim is not None
        bench_plans(args, sim, plans[:args.top])
    return 0


def bench_plans(args: argparse.Namespace, sim: Any, plans: Any) -> None:
    """`--bench N`: each printed plan replayed by the bench, beside its predictions."""
    seeds = plan_check.bench_seeds(args.seed, args.verify_seeds if args.verify else 0,
                                   args.bench_seed, args.bench_seeds)
    checked = []
    for p in plans:
        pre, dec = (p.prefill.degree, p.prefill.count), (p.decode.degree, p.decode.count)
        label = plan_check.plan_label(pre, dec)
        planned = plan_check.PlannedDeployment(sim.gpu, sim.model, pre, dec)
        rows = []
        for seed in seeds:
            row = plan_check.replay_plan(planned, trace=args.trace,
                                         rate=args.rate, programs=args.bench, seed=seed,
                                         slo=SLO(args.slo_ttft, args.slo_itl),
                                         router=args.router, history=sim.history)
            rows.append(row)
            if not args.quiet:
                print(f"bench replayed {label} (seed {seed}): SLO {row['slo_attainment']:.3f} "
                      f"({row['wall_s']:.1f} s)", file=sys.stderr, flush=True)
        whole = [v for (a, b, _), v in sim.replayed.items() if (a, b) == (pre, dec)]
        replays = tuple(float(r["slo_attainment"]) for r in rows)
        checked.append(plan_check.Checked(
            label, sim.predicted_attainment(p),
            sum(whole) / len(whole) if whole else float("nan"),
            sum(replays) / len(replays), rows[0], replays))
    print()
    print(plan_check.report(checked, programs=args.bench, seeds=seeds))
