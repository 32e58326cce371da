"""`harness bench`: its options, and their translation into one `eval.bench.sweep.bench` call.

Why the parsing lives here: the sweep (`eval.bench.sweep.bench`) takes a `BenchSpec` (the
workload, the policies, how they are measured) and a back end (one engine, a cluster file or a
server), so experiments call it from Python; turning ``--policies a,b``, ``--jps 0.5,1`` or
``--concurrency 16,64`` into those, refusing flags that do not go together (a `BenchError`,
which `cli.main` prints as one line), and the defaults that depend on the trace are the command
line's job. Each value checks its own fields when made.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console

from cli.options import add_offload_copy_model_argument, parse_loads
from cli.paths import CLUSTER_FILE, PROFILE, TRACE, add_path_argument, output_folder
from common.metrics import SLO
from eval.bench.backends import Backend
from eval.bench.capacity import CAPACITY_TTFT_P95_S, capacity, print_capacity
from eval.bench.report import print_table
from eval.bench.runs import BenchSpec, Workload
from eval.bench.served import Served
from eval.bench.specs import (
    BenchError,
    ClusterRuns,
    HttpTarget,
    check_engine,
    check_policies,
    with_references,
)
from eval.bench.sweep import bench
from eval.bench.traces import TRACE_NAMES
from eval.bench.virtual import Cluster, SingleEngine
from eval.workloads.registry import TRACES
from server.engine_spec import EngineSpec

#: Default loads (jobs/s) per generated trace, if --jps is not given.
DEFAULT_JPS = {**dict.fromkeys(TRACES, "0.5,1,2"), "merge": "0.5,1,2"}


def register(parser: argparse.ArgumentParser) -> None:
    """`harness bench`'s options on the parser `cli.main` made for it."""
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_path_argument(p, "--trace", spec=TRACE, required=True,
                      help=f"{', '.join(TRACE_NAMES)} (generated), a trace file (JSONL) or a "
                      "folder of recorded runs")
    p.add_argument("--policies", default=None,
                   help="comma-separated policies (default: vllm,continuum; with --cluster: each "
                   "replica's own from the file); NAME+offload turns "
                   "vLLM's CPU KV offloading on for a policy that does not need it, "
                   "NAME@online|oracle|gaps replays client tool-duration predictions; "
                   "lookahead-oracle:E is told program lengths with a lognormal error E")
    add_path_argument(p, "--cluster", spec=CLUSTER_FILE, default=None, metavar="FILE",
                      help="replay on the replicas of this cluster file (cluster/examples/) "
                      "behind its router, in virtual time; --policies then replaces every "
                      "replica's policy")
    p.add_argument("--routers", default=None,
                   help="with --cluster: comma-separated routing strategies to compare "
                   "(default: the file's)")
    p.add_argument("--programs", type=int, default=None,
                   help="programs to replay (default: 100 generated; all of a file)")
    p.add_argument("--jps", default=None,
                   help="comma-separated loads in jobs/s (default: 0.5,1,2; a file keeps its "
                   "own arrivals unless given)")
    p.add_argument("--concurrency", default=None,
                   help="closed loop instead of arrivals: comma-separated numbers of programs "
                   "running at once (a new one starts when one ends), e.g. 16,64")
    p.add_argument("--steady", type=float, default=0.0, metavar="FRAC",
                   help="leave the first and the last FRAC of programs (by start) out of the "
                   "metrics: warm-up and cool-down (e.g. 0.1; default 0, all)")
    add_path_argument(p, "--profile", spec=PROFILE, default="h100-llama-3.1-8b",
                      help="emulated GPU-MODEL profile, or a step-time table (.json)")
    p.add_argument("--seed", type=int, default=0, help="trace and engine seed (default 0)")
    p.add_argument("--num-gpu-blocks", type=int, default=None,
                   help="override the KV cache size in 16-token blocks (default: the profile's)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest conversation (prompt + output tokens) a replayed engine takes "
                   "(default: the model's context, 131,072 for Llama-3.1; a small "
                   "--num-gpu-blocks lowers it)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="N",
                   help="tokens one engine step may compute, for every policy of the run "
                   "(vLLM's chunked-prefill budget; default: what `vllm serve` takes on the "
                   "profile's GPU, 8,192 on an H100 or H200; Continuum's evaluation used 2048)")
    p.add_argument("--max-num-seqs", type=int, default=None, metavar="N",
                   help="requests one engine step may run, for every policy of the run (vLLM's "
                   "max_num_seqs; default: `vllm serve`'s on the profile's GPU, 1,024 on an "
                   "H100 or H200). Figures measured before the emulated GPU took these defaults "
                   "ran at --max-num-batched-tokens 2048 --max-num-seqs 128")
    p.add_argument("--long-prefill-token-threshold", type=int, default=None, metavar="N",
                   help="vLLM's long-prefill cap for every policy of the run: while two or "
                   "more requests are scheduled, no prompt computes more than N tokens of a "
                   "step (default: vLLM's, no cap; `lookahead` sets it at every step itself)")
    p.add_argument("--offload-gib", type=float, default=None, metavar="GIB",
                   help="give every policy of the run vLLM's CPU KV offloading with this much "
                   "host memory (the equal-memory comparison); NAME+offload turns it on for "
                   "one policy only (at this size, or the default)")
    p.add_argument("--disk-gib", type=float, default=None, metavar="GIB",
                   help="give every policy that has a host KV tier (--offload-gib, NAME+offload "
                   "or one that swaps) a disk tier of this many GiB behind it (vLLM's "
                   "file-system tier, its reads and writes timed from NVMe figures; nothing "
                   "is written); the report then counts what went to and came from disk")
    add_offload_copy_model_argument(p, "vLLM's CPU KV offloading copies, for every engine "
                                    "of the run")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="replays to run at once, one process each (default 1); the figures "
                   "do not change, only the wall time (each process takes a core)")
    p.add_argument("--too-long", choices=("error", "skip"), default="error",
                   help="a program with a turn longer than that: stop before replaying, naming "
                   "it (error, the default), or leave it out and say so (skip)")
    add_path_argument(p, "--out", spec=output_folder("the bench's results"), default=None,
                      help="output folder (default runs/bench-TRACE)")
    p.add_argument("--url", default=None,
                   help="replay in wall-clock time over HTTP against this running `harness "
                   "serve` (emulated or a GPU) instead of in virtual time; --policies then "
                   "names the one policy the server runs (a label)")
    p.add_argument("--model", default=None, help="with --url: the served model name "
                   "(default: the server's first)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply arrival gaps and tool durations by this (e.g. 0.1 for short "
                   "wall-clock runs); it changes the workload, not only the run time")
    p.add_argument("--warm-prefix-pct", type=float, default=0.0, metavar="P",
                   help="kv-cache-tester's warm prefix (its default 0.5): this fraction of the "
                   "largest tool + system prompt among Claude Code sessions opens every "
                   "program's first prompt, one prefix shared by all (the sessions share "
                   "nothing as recorded); default 0")
    p.add_argument("--slo-ttft", type=float, default=SLO.ttft_s,
                   help=f"TTFT bound per turn for SLO attainment and goodput (default "
                   f"{SLO.ttft_s:g} s)")
    p.add_argument("--slo-tpot", type=float, default=SLO.tpot_s,
                   help=f"time-per-output-token bound (default {SLO.tpot_s:g} s)")
    p.add_argument("--no-bounds", action="store_true",
                   help="leave out the reference runs every virtual single-engine report has "
                   "beside the policies: `vllm` and `oracle` (oracle-SRPT, a clairvoyant "
                   "schedule) for the share of the gap each policy closes")
    p.add_argument("--capacity", action="store_true",
                   help="instead of a sweep: per policy, the most programs at once (closed "
                   "loop) whose P95 TTFT per turn stays within --slo-ttft-p95, and that per GPU "
                   "of the profile (a search over --concurrency N runs; capacity.md)")
    p.add_argument("--slo-ttft-p95", type=float, default=None, metavar="S",
                   help="with --capacity: the P95 TTFT bound in seconds (default 2, "
                   "kv-cache-tester's)")
    p.add_argument("--isolated-over-http", action="store_true",
                   help="with --url: measure isolated JCTs on the server (costs their sum in "
                   "wall time) instead of on the emulated profile")


def run(args: argparse.Namespace) -> int:
    # keep the progress bar readable; restored after, so a caller's later servers still log
    previous = os.environ.get("VLLM_LOGGING_LEVEL")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        return _run(args)
    finally:
        if previous is None:
            os.environ.pop("VLLM_LOGGING_LEVEL", None)


def _run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    out = Path(args.out or f"runs/bench-{Path(args.trace).stem}")
    spec, backend = plan(args)
    if args.capacity:
        out = Path(args.out or f"runs/capacity-{Path(args.trace).stem}")
        bound = CAPACITY_TTFT_P95_S if args.slo_ttft_p95 is None else args.slo_ttft_p95
        data = capacity(spec, backend, bound, out, console)
        print_capacity(data, console)
        console.print(f"wrote {out / 'capacity.json'}, {out / 'capacity.md'}")
        return 0
    summary = bench(spec, backend, out, console)
    print_table(summary.to_json(), console)
    console.print(f"wrote {out / 'summary.json'}, {out / 'report.md'}, "
                  f"{out / 'jct_vs_load.png'}, {out / 'jct_cdf.png'}")
    return 0


def plan(args: argparse.Namespace) -> tuple[BenchSpec, Backend]:
    """The sweep the options ask for and the back end it runs on; a mistake in them raises
    `BenchError` (here for what is about flags together, in the values' own checks for the
    rest)."""
    engine = EngineSpec(profile=args.profile, seed=args.seed,
                        num_gpu_blocks=args.num_gpu_blocks, max_model_len=args.max_model_len,
                        max_num_batched_tokens=args.max_num_batched_tokens,
                        max_num_seqs=args.max_num_seqs,
                        long_prefill_token_threshold=args.long_prefill_token_threshold,
                        offload_gib=args.offload_gib, disk_gib=args.disk_gib,
                        offload_copy_model=args.offload_copy_model)
    check_engine(engine, cluster=args.cluster is not None, http=args.url is not None)
    _check_capacity(args)
    policies, backend = _backend(args, engine)
    concurrency = None
    if args.concurrency is not None:
        if args.url:
            raise BenchError("--concurrency replays in virtual time; not with --url")
        concurrency = _concurrency(args.concurrency)
    if args.jobs > 1 and args.url:
        raise BenchError("--jobs: a --url replay runs against one server; give --jobs 1")
    jps = ([None] if (concurrency or args.capacity) and args.jps is None
           else _loads(args.jps, args.trace))
    workload = Workload(args.trace, args.programs, tuple(jps), concurrency and tuple(concurrency),
                        args.seed, args.time_scale, args.too_long, args.warm_prefix_pct)
    spec = BenchSpec(workload, tuple(policies), args.steady, SLO(args.slo_ttft, args.slo_tpot),
                     args.jobs)
    return spec, backend


def _backend(args: argparse.Namespace, engine: EngineSpec) -> tuple[list[str], Backend]:
    """The policies (or cluster labels) to compare, and where they replay: a cluster file's
    replicas, a running server, or one in-process engine each (with the reference runs)."""
    if args.cluster:
        if args.url:
            raise BenchError("--cluster replays in virtual time; for a served cluster give "
                             "--url the router of `harness cluster serve` instead")
        runs = ClusterRuns.load(args.cluster, _names(args.routers) if args.routers else None,
                                _names(args.policies) if args.policies else None)
        return runs.labels(), Cluster.of(runs, engine)
    if args.routers:
        raise BenchError("--routers compares routing strategies of a --cluster FILE")
    policies = check_policies(_names(args.policies or "vllm,continuum"))
    if args.url:
        if len(policies) != 1:
            raise BenchError("--url replays against one running server: give --policies the "
                             "one policy it runs (a label for the results)")
        if policies[0].hint_mode != "none":
            raise BenchError("--url: client hints (@...) are only replayed in virtual time")
        return [str(policies[0])], Served(HttpTarget(args.url, args.model,
                                                     args.isolated_over_http), engine)
    if not args.no_bounds and not args.capacity:  # a capacity search: the policies named
        policies = with_references(policies)
    return [str(p) for p in policies], SingleEngine(engine, tuple(policies))


def _check_capacity(args: argparse.Namespace) -> None:
    """`--capacity` searches closed loops on one in-process engine: refuse what does not go
    with it, and its bound without it."""
    if not args.capacity:
        if args.slo_ttft_p95 is not None:
            raise BenchError("--slo-ttft-p95 is the bound of a --capacity search; add "
                             "--capacity")
        return
    for flag, given in (("--url", args.url), ("--cluster", args.cluster)):
        if given is not None:  # the rest is `eval.bench.capacity.capacity`'s to check
            raise BenchError(f"--capacity searches closed loops on one virtual-time engine; "
                             f"leave out {flag}")


def _names(text: str) -> list[str]:
    """``a, b,,c`` -> [a, b, c]: a comma-separated option's items."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _loads(text: str | None, trace: str) -> list[float | None]:
    if text is None:
        text = DEFAULT_JPS.get(trace)
        if text is None:
            return [None]  # a file, replayed with its own arrivals
    return parse_loads(text, BenchError, "0.5,1,2")


def _concurrency(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BenchError(f"--concurrency {text!r}: give whole numbers separated by commas, "
                         "e.g. 16,64") from None
    if not values or min(values) < 1:
        raise BenchError(f"--concurrency {text!r}: at least one program must run at once")
    return values

