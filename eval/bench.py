"""`harness bench`: compare policies on a trace, in virtual time, over a sweep of loads.

For every policy and load (jobs/s) the trace's programs are replayed through one fresh
in-process engine (`eval.replay`), and the metrics of `common.metrics.replay_metrics` are
computed against each program's isolated JCT (alone on a `vllm`-policy engine, once per trace
contents and profile, cached in the output folder). Writes ``summary.json`` (``results``: one
row per policy and load), ``report.md``, ``jct_vs_load.png`` (mean and P95 JCT against load),
``jct_cdf.png`` (JCT CDF per policy at the highest load) and ``runs/<policy>-jps<x>.json``
(per-program and per-turn records). Same trace, seed and profile: identical results, apart from
the CPU-time figures (``common.metrics.MACHINE_DEPENDENT``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from cli.options import add_offload_copy_model_argument
from common.atomic import atomic_path, write_text_atomic
from common.metrics import SLO, cluster_metrics, replay_metrics
from common.trace import Trace, TraceFormatError, TraceStats, summarize
from eval.workloads.registry import TRACES, load_or_generate, merge
from server.max_model_len import context_limit
from server.perf.copy_model import DEFAULT_OFFLOAD_COPY_MODEL, check_offload_copy_model
from server.perf.registry import load_profile
from sim.engines import base_policy, make_engine

#: Default loads (jobs/s) per generated trace, if --jps is not given.
DEFAULT_JPS = {**dict.fromkeys(TRACES, "0.5,1,2"), "merge": "0.5,1,2"}
TRACE_NAMES = (*sorted(TRACES), "merge")


class BenchError(ValueError):
    """A user mistake in `harness bench` arguments (printed without a traceback)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True,
                   help=f"{', '.join(TRACE_NAMES)} (generated) or a trace file (JSONL)")
    p.add_argument("--policies", default=None,
                   help="comma-separated policies (default: vllm,continuum; with --cluster: each "
                   "replica's own from the file); NAME+offload turns "
                   "vLLM's CPU KV offloading on for a policy that does not need it, "
                   "NAME@online|oracle replays client tool-duration predictions")
    p.add_argument("--cluster", default=None, metavar="FILE",
                   help="replay on the replicas of this cluster file (cluster/examples/) behind "
                   "its router, in virtual time; --policies then replaces every replica's policy")
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
    p.add_argument("--profile", default="h100-llama-3.1-8b", help="emulated GPU-MODEL profile")
    p.add_argument("--seed", type=int, default=0, help="trace and engine seed (default 0)")
    p.add_argument("--num-gpu-blocks", type=int, default=None,
                   help="override the KV cache size in 16-token blocks (default: the profile's)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest conversation (prompt + output tokens) a replayed engine takes "
                   "(default: the model's context, 131,072 for Llama-3.1; a small "
                   "--num-gpu-blocks lowers it)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="N",
                   help="tokens one engine step may compute, for every policy of the run "
                   "(vLLM's chunked-prefill budget; default vLLM's, 8,192; Continuum's "
                   "evaluation used 2048)")
    p.add_argument("--offload-gib", type=float, default=None, metavar="GIB",
                   help="give every policy of the run vLLM's CPU KV offloading with this much "
                   "host memory (the equal-memory comparison); NAME+offload turns it on for "
                   "one policy only (at this size, or the default)")
    add_offload_copy_model_argument(p, "vLLM's CPU KV offloading copies, for every engine "
                                    "of the run")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="replays to run at once, one process each (default 1); the figures "
                   "do not change, only the wall time (each process takes a core)")
    p.add_argument("--too-long", choices=("error", "skip"), default="error",
                   help="a program with a turn longer than that: stop before replaying, naming "
                   "it (error, the default), or leave it out and say so (skip)")
    p.add_argument("--out", default=None, help="output folder (default runs/bench-TRACE)")
    p.add_argument("--url", default=None,
                   help="replay in wall-clock time over HTTP against this running `harness "
                   "serve` (emulated or a GPU) instead of in virtual time; --policies then "
                   "names the one policy the server runs (a label)")
    p.add_argument("--model", default=None, help="with --url: the served model name "
                   "(default: the server's first)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply arrival gaps and tool durations by this (e.g. 0.1 for short "
                   "wall-clock runs); it changes the workload, not only the run time")
    p.add_argument("--slo-ttft", type=float, default=SLO.ttft_s,
                   help=f"TTFT bound per turn for SLO attainment and goodput (default "
                   f"{SLO.ttft_s:g} s)")
    p.add_argument("--slo-tpot", type=float, default=SLO.tpot_s,
                   help=f"time-per-output-token bound (default {SLO.tpot_s:g} s)")
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
    from rich.console import Console

    console = Console(stderr=True)
    out = Path(args.out or f"runs/bench-{Path(args.trace).stem}")
    cluster = None
    if args.cluster:
        if args.url:
            raise BenchError("--cluster replays in virtual time; for a served cluster give "
                             "--url the router of `harness cluster serve` instead")
        cluster = ClusterRuns.from_args(args.cluster, args.routers, args.policies)
        policies = cluster.labels()
    else:
        if args.routers:
            raise BenchError("--routers compares routing strategies of a --cluster FILE")
        policies = _policies(args.policies or "vllm,continuum")
    http = None
    if args.url:
        if len(policies) != 1:
            raise BenchError("--url replays against one running server: give --policies the "
                             "one policy it runs (a label for the results)")
        http = HttpTarget(args.url, args.model, args.isolated_over_http)
    for flag, value in (("--slo-ttft", args.slo_ttft), ("--slo-tpot", args.slo_tpot)):
        if not (value > 0 and math.isfinite(value)):
            raise BenchError(f"{flag} must be a positive number of seconds, not {value}")
    if not (args.time_scale > 0 and math.isfinite(args.time_scale)):
        raise BenchError(f"--time-scale must be a positive number, not {args.time_scale}")
    concurrency = None
    if args.concurrency is not None:
        if args.jps is not None:
            raise BenchError("give either --jps (arrivals) or --concurrency (closed loop)")
        if http is not None:
            raise BenchError("--concurrency replays in virtual time; not with --url")
        concurrency = _concurrency(args.concurrency)
    if not (0.0 <= args.steady < 0.5):
        raise BenchError(f"--steady {args.steady:g}: give a fraction in [0, 0.5)")
    if args.jobs < 1:
        raise BenchError(f"--jobs {args.jobs}: give at least 1")
    if args.jobs > 1 and args.url:
        raise BenchError("--jobs: a --url replay runs against one server; give --jobs 1")
    settings = EngineSettings(args.num_gpu_blocks, args.max_model_len,
                              args.max_num_batched_tokens, args.offload_gib,
                              args.offload_copy_model)
    settings.check(cluster=cluster is not None, http=http is not None)
    summary = bench(args.trace, policies, programs=args.programs,
                    jps=[None] if concurrency else _loads(args.jps, args.trace),
                    concurrency=concurrency, steady=args.steady,
                    profile=args.profile, seed=args.seed,
                    out=out, settings=settings, console=console, http=http,
                    time_scale=args.time_scale, slo=SLO(args.slo_ttft, args.slo_tpot),
                    cluster=cluster, too_long=args.too_long, jobs=args.jobs)
    print_table(summary, console)
    console.print(f"wrote {out / 'summary.json'}, {out / 'report.md'}, "
                  f"{out / 'jct_vs_load.png'}, {out / 'jct_cdf.png'}")
    return 0


# -- arguments ---------------------------------------------------------------------------------
def _policies(text: str) -> list[str]:
    """Policy names, each optionally ``NAME@HINTS`` (``sim.replay.HINT_MODES``: what the
    replayed client predicts about tool calls), e.g. ``continuum,continuum@oracle``."""
    from server.policies import POLICIES
    from sim.client import HINT_MODES

    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise BenchError("--policies is empty; give e.g. vllm,continuum")
    try:
        unknown = [p for p in names if base_policy(split_policy(p)[0])[0] not in POLICIES]
    except ValueError as exc:  # a suffix other than +offload
        raise BenchError(str(exc)) from None
    if unknown:
        raise BenchError(f"unknown policy {', '.join(map(repr, unknown))}; choose from: "
                         f"{', '.join(sorted(POLICIES))}")
    bad = [p for p in names if split_policy(p)[1] not in HINT_MODES]
    if bad:
        raise BenchError(f"unknown hints in {', '.join(map(repr, bad))}; after @ give one of: "
                         f"{', '.join(HINT_MODES)}")
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class ClusterRuns:
    """What `--cluster FILE --routers A,B --policies P,Q` compares: the file's replicas under
    each router, with every replica running each policy (or its own, if none are given)."""

    config: Any  # cluster.config.ClusterConfig
    runs: tuple[tuple[str, str, str | None], ...]  # (label, router, policy or None)

    @classmethod
    def from_args(cls, path: str, routers: str | None, policies: str | None) -> ClusterRuns:
        from cluster.config import ClusterConfigError, load_cluster, parse_cluster

        try:
            config = load_cluster(path)
        except ClusterConfigError as exc:
            raise BenchError(str(exc)) from None
        names = [r.strip() for r in (routers or config.router.strategy).split(",") if r.strip()]
        for name in names:  # the file must make sense under every router asked for
            data = config.model_dump()
            data["router"]["strategy"] = name
            try:
                parse_cluster(data, f"{path} with router {name!r}")
            except ClusterConfigError as exc:
                raise BenchError(str(exc)) from None
        wanted: list[str | None] = [None]
        if policies:
            wanted = list(_policies(policies))
            if any(split_policy(p)[1] != "none" or base_policy(p)[1] for p in wanted):
                raise BenchError("--cluster: give plain policy names (set `offload_gib` per "
                                 "replica in the cluster file; client hints are not replayed)")
        runs = tuple((name if p is None else f"{name}:{p}", name, p)
                     for name in dict.fromkeys(names) for p in wanted)
        return cls(config, runs)

    def labels(self) -> list[str]:
        return [label for label, _, _ in self.runs]

    def config_for(self, label: str) -> Any:
        """The cluster file as run under `label` (its router, and the policy if replaced)."""
        _, router, policy = next(r for r in self.runs if r[0] == label)
        config = self.config.model_copy(deep=True)
        config.router.strategy = router
        if policy is not None:
            for replica in config.replicas:
                replica.policy = policy
        return config

    def isolated_profile(self) -> tuple[str, int | None]:
        """Isolated JCTs are measured on the first replica that decodes (a program alone
        there is the bound for any placement on a homogeneous cluster)."""
        spec = next(r for r in self.config.replicas if r.role != "prefill")
        return spec.profile, spec.num_gpu_blocks


def split_policy(spec: str) -> tuple[str, str]:
    """``continuum+offload@online`` -> (``continuum+offload``, ``online``); no @ -> hints
    ``none``. The name keeps ``+offload`` (see `make_engine`)."""
    name, _, hints = spec.partition("@")
    return name, hints or "none"


def _loads(text: str | None, trace: str) -> list[float | None]:
    if text is None:
        text = DEFAULT_JPS.get(trace)
        if text is None:
            return [None]  # a file, replayed with its own arrivals
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BenchError(f"--jps {text!r}: give numbers separated by commas, e.g. 0.5,1,2") \
            from None
    if not loads or any(not (x > 0 and math.isfinite(x)) for x in loads):
        raise BenchError(f"--jps {text!r}: loads must be positive numbers of jobs/s")
    return sorted(set(loads))


def _concurrency(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BenchError(f"--concurrency {text!r}: give whole numbers separated by commas, "
                         "e.g. 16,64") from None
    if not values or min(values) < 1:
        raise BenchError(f"--concurrency {text!r}: at least one program must run at once")
    return values


def make_trace(name: str, programs: int | None, jps: float | None, seed: int) -> Trace:
    """The trace to replay at load ``jps``; same name, programs and seed give the same
    programs at every load (only arrivals change)."""
    if name in TRACES or name == "merge":
        n = programs if programs is not None else 100
        if n < 1:
            raise BenchError("--programs must be at least 1")
        assert jps is not None
        if name == "merge":  # half SWE-like, half BFCL-like, each at half the load
            n_swe = (n + 1) // 2
            parts = [load_or_generate("swe", n_swe, jps / 2, seed)]
            if n - n_swe:
                parts.append(load_or_generate("bfcl", n - n_swe, jps / 2, seed + 1))
            return merge(*parts, name=f"merge-{n}")
        return load_or_generate(name, n, jps, seed)
    path = Path(name)
    if not path.exists():
        raise BenchError(f"--trace {name!r} is neither a trace name ({', '.join(TRACE_NAMES)}) "
                         "nor an existing trace file")
    if programs is not None and programs < 1:
        raise BenchError("--programs must be at least 1")
    try:
        return load_or_generate(path, programs, jps, seed)
    except TraceFormatError as exc:
        raise BenchError(str(exc)) from None


def _fingerprint(trace: Trace, profile: str, seed: int,
                 settings: EngineSettings | None = None) -> str:
    """Identifies the programs' contents (not their arrivals) and the engine."""
    body = [p.model_dump(exclude={"arrival_s"}) for p in trace.programs]
    engine = None
    if settings is not None and settings != EngineSettings():
        engine = asdict(settings)
        if engine["offload_copy_model"] == DEFAULT_OFFLOAD_COPY_MODEL:
            del engine["offload_copy_model"]  # as before the option existed: caches stay valid
    text = json.dumps({"programs": body, "profile": profile, "seed": seed,
                       **({"engine": engine} if engine else {})}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- the sweep ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineSettings:
    """What every engine of a run shares, whatever its policy, set in one place: a comparison
    between policies is only fair when these are equal (the isolated bound uses them too)."""

    num_gpu_blocks: int | None = None
    max_model_len: int | None = None
    #: vLLM's per-step token budget (chunked prefill); None: vLLM's default
    max_num_batched_tokens: int | None = None
    #: host memory for vLLM's CPU KV offloading, for every policy; None: only for the
    #: policies that need it or are named NAME+offload
    offload_gib: float | None = None
    #: how the offloading connector's copies are priced (`server.perf.copy_model`
    #: OFFLOAD_COPY_MODELS), by the emulated worker and the policies' cost model
    offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL

    def check(self, *, cluster: bool = False, http: bool = False) -> None:
        """Refuse values no engine takes, naming the flag."""
        try:
            check_offload_copy_model(self.offload_copy_model)
        except ValueError as exc:
            raise BenchError(f"--offload-copy-model: {exc}") from None
        if http and self.offload_copy_model != DEFAULT_OFFLOAD_COPY_MODEL:
            raise BenchError("--url: the running server has its own copy model; start "
                             "`harness serve --offload-copy-model` instead")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 2:
            raise BenchError(f"--num-gpu-blocks {self.num_gpu_blocks}: give at least 2")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 16:
            raise BenchError(f"--max-num-batched-tokens {self.max_num_batched_tokens}: give at "
                             "least 16 tokens (one block)")
        if self.offload_gib is not None and not (self.offload_gib > 0
                                                 and math.isfinite(self.offload_gib)):
            raise BenchError(f"--offload-gib {self.offload_gib}: give a positive size in GiB")
        if http and (self.max_num_batched_tokens is not None or self.offload_gib is not None):
            raise BenchError("--url: the running server has its own engine settings; start "
                             "`harness serve` with them instead")
        if cluster and self.offload_gib is not None:
            raise BenchError("--cluster: set `offload_gib` per replica in the cluster file")


class IsolatedCost(NamedTuple):
    """What measuring the isolated JCTs took (`summary.json`'s ``isolated_*``)."""

    wall_s: float
    cpu_s: float  # of the process that measured them
    engine_steps: int


@dataclass(frozen=True)
class HttpTarget:
    """Where a wall-clock replay goes (`eval.http_replay`)."""

    url: str
    model: str | None = None
    isolated_over_http: bool = False


def bench(trace_name: str, policies: Sequence[str], *, programs: int | None,
          jps: Sequence[float | None], profile: str, seed: int, out: Path,
          settings: EngineSettings | None = None, console: Any = None,
          http: HttpTarget | None = None, time_scale: float = 1.0,
          slo: SLO | None = None, cluster: ClusterRuns | None = None,
          too_long: str = "error", concurrency: Sequence[int] | None = None,
          steady: float = 0.0, jobs: int = 1) -> dict[str, Any]:
    """`settings`: every engine's (`EngineSettings`). `concurrency`: closed-loop runs, one per
    value (then `jps` is ``[None]`` and only the trace's programs and their order matter).
    `steady`: the share of programs left out of the metrics at each end (by start time).
    `jobs`: replays run at once, each in its own process (the isolated JCTs are one of them);
    every replay is deterministic and alone on its engine, so the figures are the same as with
    one job (only wall and CPU times differ)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    settings = settings or EngineSettings()
    try:
        load_profile(profile, offload_copy_model=settings.offload_copy_model)
    except Exception as exc:  # noqa: BLE001 - any failure is a bad profile name here
        raise BenchError(f"--profile {profile!r}: {exc}") from None
    from eval.http_replay import scale_trace

    slo = slo or SLO()
    if cluster is not None:
        profile, blocks = cluster.isolated_profile()
        settings = replace(settings, num_gpu_blocks=blocks)
    # closed loop: arrivals are not used, any rate gives the same programs in the same order
    traces = {x: scale_trace(make_trace(trace_name, programs, 1.0 if concurrency else x, seed),
                             time_scale) for x in jps}
    loads: list[tuple[float | None, int | None]] = (
        [(None, c) for c in concurrency] if concurrency else [(x, None) for x in jps])
    skipped: list[str] = []
    if http is None:  # a served engine answers a too-long request itself (HTTP 400)
        traces, skipped = _fit_context(traces, cluster, profile, settings.num_gpu_blocks,
                                       settings.max_model_len, too_long)
        for line in skipped:
            if console is not None:
                console.print(f"[yellow]skipped[/yellow] {line}")
    first = next(iter(traces.values()))
    n = len(first)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs").mkdir(exist_ok=True)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        iso_task = progress.add_task("isolated JCTs", total=n)
        iso_progress = lambda k: progress.update(iso_task, completed=k)  # noqa: E731
        runs = [(policy, x, closed) for policy in policies for x, closed in loads]
        iso_timing: IsolatedCost | None = None  # None: read from the cache
        if jobs > 1 and http is None:
            rows, isolated, iso_timing = _parallel(runs, traces, first, profile, seed, settings,
                                                   out, slo, cluster, steady, jobs, progress,
                                                   iso_task, console)
        elif http is not None and http.isolated_over_http:
            from eval.http_replay import isolated_jcts_over_http

            isolated = isolated_jcts_over_http(first, http.url, model=http.model,
                                               progress=iso_progress)
        else:
            isolated, iso_timing = _isolated_timed(first, profile, seed, out, settings,
                                                   iso_progress)
            _log_isolated(console, n, iso_timing)
        progress.update(iso_task, completed=n)
        for policy, x, closed in runs if not rows else ():
            trace = traces[x]
            label = f"{policy} @ {_load_text(x, closed)}"
            task = progress.add_task(label, total=n)
            row = _one_run(trace, policy, x, profile, seed, settings, isolated, out,
                           lambda k, t=task: progress.update(t, completed=k), http, slo,
                           cluster, closed, steady)
            progress.update(task, completed=n)
            rows.append(row)
            _log_run(console, label, row, n)
    summary = {
        "trace": trace_name,
        "trace_name": first.name,
        "programs": n,
        "profile": profile,
        "seed": seed,
        "num_gpu_blocks": settings.num_gpu_blocks,
        "max_model_len": settings.max_model_len,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "offload_gib": settings.offload_gib,
        "offload_copy_model": settings.offload_copy_model,
        "trace_stats": summarize(first).model_dump(),
        "skipped_too_long": skipped,
        "time_scale": time_scale,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "mode": "virtual" if http is None else f"http {http.url}",
        "cluster": None if cluster is None else cluster.config.model_dump(),
        "policies": list(policies),
        "jps": [x for x in jps],
        "concurrency": list(concurrency) if concurrency else None,
        "steady": steady,
        "jobs": jobs,
        "isolated_jct_mean_s": sum(isolated.values()) / len(isolated),
        # measuring the isolated JCTs (None: read from this folder's cache)
        "isolated_wall_s": None if iso_timing is None else iso_timing.wall_s,
        "isolated_cpu_s": None if iso_timing is None else iso_timing.cpu_s,
        "isolated_engine_steps": None if iso_timing is None else iso_timing.engine_steps,
        "wall_s": time.perf_counter() - started,
        "results": rows,
    }
    _write_json(out / "summary.json", summary)
    _write_text(out / "report.md", report_markdown(summary))
    plot(summary, out)
    return summary


def _log_run(console: Any, label: str, row: dict[str, Any], n: int) -> None:
    """One line per finished run: its figures and how fast it replayed (wall time, engine
    steps per second), in a terminal above the live bars, in a log file instead of them."""
    if console is not None:
        console.print(f"{label}: {row.get('programs', n)} programs, mean JCT "
                      f"{row.get('jct_mean_s', math.nan):.2f} s, wall {row['wall_s']:.1f} s"
                      f"{_cpu_text(row.get('cpu_s'))}, "
                      f"{row.get('engine_steps', 0):,} engine steps, "
                      f"{row.get('engine_steps_per_s', math.nan):.0f} steps/s")


def _cpu_text(cpu: float | None) -> str:
    return "" if cpu is None else f" (CPU {cpu:.1f} s)"


def _log_isolated(console: Any, n: int, timing: IsolatedCost | None) -> None:
    """The isolated JCTs' line, as `_log_run`'s (or that they came from the cache)."""
    if console is None:
        return
    if timing is None:
        console.print(f"isolated JCTs: {n} programs, read from the output folder's cache")
        return
    wall, cpu, steps = timing
    console.print(f"isolated JCTs: {n} programs alone, wall {wall:.1f} s (CPU {cpu:.1f} s), "
                  f"{steps:,} engine steps, {steps / max(wall, 1e-9):.0f} steps/s")


def _parallel(runs: list[tuple[str, float | None, int | None]], traces: dict[Any, Trace],
              first: Trace, profile: str, seed: int, settings: EngineSettings, out: Path,
              slo: SLO, cluster: ClusterRuns | None, steady: float, jobs: int,
              progress: Any, iso_task: Any,
              console: Any
              ) -> tuple[list[dict[str, Any]], dict[str, float], IsolatedCost | None]:
    """The isolated JCTs and every replay as separate processes, `jobs` at a time; rows are
    made once all are in (they need the isolated JCTs), in the serial order. Also returns
    the isolated JCTs and what they cost (None if they were cached)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    n = len(first)
    tasks = {run: progress.add_task(f"{run[0]} @ {_load_text(run[1], run[2])}", total=n)
             for run in runs}
    with ProcessPoolExecutor(max_workers=jobs,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        iso = pool.submit(_isolated_timed, first, profile, seed, out, settings, None)
        futures = {run: pool.submit(_replay_once, traces[run[1]], run[0], profile, seed,
                                    settings, None, None, cluster, run[2], steady)
                   for run in runs}
        isolated, iso_timing = iso.result()
        progress.update(iso_task, completed=n)
        _log_isolated(console, n, iso_timing)
        done: dict[Any, tuple[Any, float]] = {}
        for run, future in futures.items():  # in order; later ones may already be done
            done[run] = future.result()
            progress.update(tasks[run], completed=n)
    rows = []
    for run in runs:
        result, wall, cpu = done[run]
        row = _row(result, wall, run[0], run[1], isolated, out, slo, cluster is not None,
                   False, run[2], cpu)
        rows.append(row)
        _log_run(console, f"{run[0]} @ {_load_text(run[1], run[2])}", row, n)
    return rows, isolated, iso_timing


def _jps_label(x: float | None, closed: int | None = None) -> str:
    """A load as it appears in file names: jobs/s, ``trace`` (its own arrivals) or
    ``closedN`` (closed loop, N at once)."""
    if closed is not None:
        return f"closed{closed}"
    return "trace" if x is None else f"{x:g}"


def _load_text(x: float | None, closed: int | None) -> str:
    return f"{closed} at once" if closed is not None else f"{_jps_label(x)} jobs/s"


def _fit_context(traces: dict[Any, Trace], cluster: ClusterRuns | None, profile: str,
                 num_gpu_blocks: int | None, max_model_len: int | None,
                 too_long: str) -> tuple[dict[Any, Trace], list[str]]:
    """Find, before any engine runs, the programs with a turn longer than the engines take
    (on a cluster: the smallest replica's limit, as a program may land anywhere); stop with
    their names (``too_long="error"``) or leave them out (``"skip"``, one line each)."""
    from sim.conversation import too_long_turns

    try:
        if cluster is None:
            limit = context_limit(profile, num_gpu_blocks, max_model_len)
        else:
            limit = min(context_limit(r.profile, r.num_gpu_blocks, max_model_len)
                        for r in cluster.config.replicas)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    first = next(iter(traces.values()))  # every load replays the same programs
    long = too_long_turns(first, limit)
    if not long:
        return traces, []
    lines = [f"{pid}: turn {turn} needs {tokens:,} tokens > max_model_len {limit:,}"
             for pid, turn, tokens in long]
    if too_long == "error":
        more = f" (and {len(lines) - 5} more)" if len(lines) > 5 else ""
        raise BenchError(
            f"{len(lines)} program(s) have a turn longer than the engine's context: "
            f"{'; '.join(lines[:5])}{more}. Raise --max-model-len (up to the model's context; "
            "a small --num-gpu-blocks also caps it) or pass --too-long skip to leave them out")
    drop = {pid for pid, _, _ in long}
    kept = {x: t.model_copy(update={"programs": [p for p in t.programs if p.id not in drop]})
            for x, t in traces.items()}
    if not next(iter(kept.values())).programs:
        raise BenchError(f"every program has a turn longer than max_model_len {limit:,}")
    return kept, lines


def settings_engine(policy: str, profile: str, seed: int, settings: EngineSettings) -> Any:
    """`make_engine` for a single-engine run under the run's `EngineSettings`."""
    return make_engine(policy, profile, seed, settings.num_gpu_blocks, settings.offload_gib,
                       max_model_len=settings.max_model_len,
                       max_num_batched_tokens=settings.max_num_batched_tokens,
                       offload_copy_model=settings.offload_copy_model)


def _isolated_timed(trace: Trace, profile: str, seed: int, out: Path, settings: EngineSettings,
                    progress: Callable[[int], None] | None
                    ) -> tuple[dict[str, float], IsolatedCost | None]:
    """Each program's JCT alone on an engine of the run's settings (no offloading: alone,
    nothing is evicted), cached in `out` by the programs' contents and the settings; and what
    measuring them cost, or None when they came from the cache."""
    from sim.replay import isolated_jcts

    # no copy to price either: the isolated bound is the same whatever the copy model
    plain = replace(settings, offload_gib=None, offload_copy_model=DEFAULT_OFFLOAD_COPY_MODEL)
    path = out / f"isolated-{profile}-{_fingerprint(trace, profile, seed, plain)}.json"
    if path.exists():
        cached = json.loads(path.read_text())
        if set(cached) == {p.id for p in trace.programs}:
            return {k: float(v) for k, v in cached.items()}, None
    wall, cpu = time.perf_counter(), time.process_time()
    engine = settings_engine("vllm", profile, seed, plain)
    try:
        isolated = isolated_jcts(trace, engine, progress=progress)
        steps = int(engine.scheduler.sched_steps)
    finally:
        engine.close()
    _write_json(path, isolated)
    return isolated, IsolatedCost(time.perf_counter() - wall, time.process_time() - cpu, steps)


def _one_run(trace: Trace, policy: str, x: float | None, profile: str, seed: int,
             settings: EngineSettings, isolated: dict[str, float], out: Path,
             progress: Callable[[int], None] | None, http: HttpTarget | None = None,
             slo: SLO | None = None, cluster: ClusterRuns | None = None,
             concurrency: int | None = None, steady: float = 0.0) -> dict[str, Any]:
    """Replay one policy at one load and make its row (and its runs/ file)."""
    result, wall, cpu = _replay_once(trace, policy, profile, seed, settings, progress, http,
                                     cluster, concurrency, steady)
    return _row(result, wall, policy, x, isolated, out, slo, cluster is not None,
                http is not None, concurrency, cpu)


def _replay_once(trace: Trace, policy: str, profile: str, seed: int, settings: EngineSettings,
                 progress: Callable[[int], None] | None, http: HttpTarget | None,
                 cluster: ClusterRuns | None, concurrency: int | None,
                 steady: float) -> tuple[Any, float, float]:
    """The replay alone (what a `--jobs` worker runs): its result, wall seconds and this
    process's CPU seconds (on a shared machine the wall time also counts others' work)."""
    from sim.records import steady_programs
    from sim.replay import replay

    wall, cpu = time.perf_counter(), time.process_time()
    name, hints = split_policy(policy)
    if cluster is not None:
        from sim.loop import replay_cluster
        from sim.virtual_cluster import VirtualCluster

        config = cluster.config_for(policy)
        engines = VirtualCluster(config, seed=seed, make_engine=lambda spec: make_engine(
            spec.policy, spec.profile, seed, spec.num_gpu_blocks, spec.offload_gib, spec, config,
            settings.max_model_len, settings.max_num_batched_tokens,
            offload_copy_model=settings.offload_copy_model))
        try:
            result = replay_cluster(trace, engines, progress=progress, concurrency=concurrency)
        finally:
            engines.close()
        result.measured = steady_programs(result, steady)
    elif http is not None:
        from eval.http_replay import HttpReplayError, replay_over_http

        if hints != "none":
            raise BenchError("--url: client hints (@...) are only replayed in virtual time")
        try:
            result = replay_over_http(trace, http.url, model=http.model, progress=progress)
        except HttpReplayError as exc:
            raise BenchError(str(exc)) from None
    else:
        engine = settings_engine(name, profile, seed, settings)
        try:
            result = replay(trace, engine, progress=progress, hints=hints,
                            concurrency=concurrency)
        finally:
            engine.close()
        result.measured = steady_programs(result, steady)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _row(result: Any, wall: float, policy: str, x: float | None, isolated: dict[str, float],
         out: Path, slo: SLO | None, cluster: bool, http: bool,
         concurrency: int | None, cpu: float | None = None) -> dict[str, Any]:
    """A replay's metrics row; its per-program records go to ``out/runs/``."""
    row: dict[str, Any] = {"policy": policy, "jps": x, "concurrency": concurrency}
    if http:
        from eval.http_replay import http_replay_metrics

        row.update(http_replay_metrics(result, isolated, slo))
    else:
        row.update(replay_metrics(result, isolated, slo))
    if cluster:
        row.update(cluster_metrics(result, slo))
    row["wall_s"] = wall
    row["cpu_s"] = cpu
    if not http:  # the replay's own speed: engine steps (all replicas) per wall second
        row["engine_steps_per_s"] = row.get("engine_steps", 0) / max(row["wall_s"], 1e-9)
    measured = getattr(result, "measured", None)
    records = {
        "policy": policy, "jps": x, "concurrency": concurrency,
        "programs": [
            {"id": p.program_id, "arrival_s": p.arrival, "finished_s": p.finished,
             "jct_s": p.jct, "isolated_jct_s": isolated.get(p.program_id),
             "measured": measured is None or p.program_id in measured,
             "turns": [asdict(t) for t in p.turns]}
            for p in result.programs.values()
        ],
    }
    _write_json(out / "runs" / f"{policy}-jps{_jps_label(x, concurrency)}.json", records)
    return row


# -- outputs -----------------------------------------------------------------------------------
_COLUMNS = [("policy", "policy", "{}"), ("jps", "jobs/s", "{}"),
            ("jct_mean_s", "JCT mean s", "{:.2f}"), ("jct_p50_s", "P50", "{:.2f}"),
            ("jct_p95_s", "P95", "{:.2f}"), ("jct_p99_s", "P99", "{:.2f}"),
            ("normalised_latency_mean", "JCT/isolated", "{:.2f}"),
            ("makespan_s", "makespan s", "{:.1f}"),
            ("throughput_programs_per_min", "programs/min", "{:.2f}"),
            ("ttft_mean_s", "TTFT mean s", "{:.3f}"), ("tpot_mean_s", "TPOT mean s", "{:.4f}"),
            ("queue_mean_s", "queue mean s", "{:.3f}"),
            ("slo_attainment", "SLO attainment", "{:.3f}"),
            ("goodput_turns_per_s", "goodput turns/s", "{:.2f}"),
            ("prefix_hit_rate", "hit rate", "{:.3f}"),
            ("pin_hit_rate", "pin hit rate", "{:.2f}"),
            ("recomputed_tokens", "recomputed tok", "{}"),
            ("preemptions", "preemptions", "{}"), ("pin_memory_share", "pin mem share", "{:.4f}"),
            ("sched_cpu_ms_per_step", "sched ms/step", "{:.3f}"),
            ("engine_steps", "engine steps", "{:,}"),
            ("wall_s", "wall s", "{:.1f}"), ("cpu_s", "CPU s", "{:.1f}"),
            ("engine_steps_per_s", "replay steps/s", "{:.0f}")]


#: What a --cluster run adds (`common.metrics.cluster_metrics`), as a second table.
_CLUSTER_COLUMNS = [("policy", "strategy", "{}"), ("jps", "jobs/s", "{}"),
                    ("ttft_initial_mean_s", "TTFT initial s", "{:.3f}"),
                    ("ttft_incremental_mean_s", "TTFT incremental s", "{:.3f}"),
                    ("itl_mean_s", "ITL mean s", "{:.4f}"),
                    ("slo_attainment_initial", "SLO initial", "{:.3f}"),
                    ("slo_attainment_incremental", "SLO incremental", "{:.3f}"),
                    ("local_prefill_share", "local prefills", "{:.3f}"),
                    ("kv_bytes_moved", "KV moved B", "{:.3g}"),
                    ("kv_seconds_moved", "KV moved s", "{:.3f}"),
                    ("programs_split_across_replicas", "programs split", "{}"),
                    ("load_balance_colocated", "balance colocated", "{:.2f}"),
                    ("load_balance_prefill", "balance prefill", "{:.2f}"),
                    ("load_balance_decode", "balance decode", "{:.2f}")]


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    if key == "jps" and row.get("concurrency"):
        return f"closed {row['concurrency']}"
    if value is None:
        return "trace" if key == "jps" else "-"
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return fmt.format(value)


def report_markdown(summary: dict[str, Any]) -> str:
    lines = [f"# Policy benchmark: {summary['trace_name']}", "",
             f"{summary['programs']} programs, profile `{summary['profile']}`, seed "
             f"{summary['seed']}; isolated JCT mean {summary['isolated_jct_mean_s']:.2f} s "
             "(each program alone on the engine: the lower bound). "
             f"{_mode_text(summary)}; wall time {summary['wall_s']:.1f} s"
             f"{_isolated_cost_text(summary)}. SLO per turn: "
             f"TTFT <= {summary['slo']['ttft_s']:g} s and TPOT <= {summary['slo']['tpot_s']:g} "
             "s.", "",
             "| " + " | ".join(h for _, h, _ in _COLUMNS) + " |",
             "|" + "---|" * len(_COLUMNS)]
    for row in summary["results"]:
        lines.append("| " + " | ".join(_cell(row, k, f) for k, _, f in _COLUMNS) + " |")
    if summary.get("cluster"):
        lines += ["", *_cluster_section(summary)]
    lines += ["", "## Which is fastest, and why", "", *reading(summary["results"]), ""]
    lines += _replayed_section(summary)
    lines += ["![JCT against load](jct_vs_load.png)", "", "![JCT CDF](jct_cdf.png)", ""]
    return "\n".join(lines)


def _isolated_cost_text(summary: dict[str, Any]) -> str:
    """What measuring the isolated JCTs cost, for the report's first paragraph."""
    wall, steps = summary.get("isolated_wall_s"), summary.get("isolated_engine_steps")
    if wall is None or steps is None:
        return ""
    cpu = summary.get("isolated_cpu_s")
    spent = f"{wall:.1f} s" + ("" if cpu is None else f", {cpu:.1f} s of CPU")
    return (f" (the isolated JCTs: {spent}, {steps:,} engine steps, "
            f"{steps / max(wall, 1e-9):.0f} steps/s)")


def _replayed_section(summary: dict[str, Any]) -> list[str]:
    """What was replayed (the trace's statistics, so a reader sees which regime the table is
    about) and the engine settings every policy shared."""
    settings = [f"{key} {summary[key]:,}" if isinstance(summary.get(key), int)
                else f"{key} {summary[key]:g}"
                for key in ("num_gpu_blocks", "max_model_len", "max_num_batched_tokens",
                            "offload_gib") if summary.get(key) is not None]
    lines = ["## What was replayed", ""]
    if summary.get("trace_stats"):
        lines += [TraceStats(**summary["trace_stats"]).markdown(), ""]
    lines += ["Engine settings for every policy: "
              + ("; ".join(settings) if settings else "the profile's and vLLM's defaults")
              + ".", ""]
    if summary.get("offload_copy_model"):  # summaries written before the option lack it
        lines += [f"KV offloading copies priced by the `{summary['offload_copy_model']}` copy "
                  "model (docs/emulated-gpu.md).", ""]
    if summary.get("skipped_too_long"):
        lines += [f"Left out ({len(summary['skipped_too_long'])} programs longer than the "
                  "context): " + "; ".join(summary["skipped_too_long"][:10]), ""]
    return lines


def _cluster_section(summary: dict[str, Any]) -> list[str]:
    """The cluster file's replicas and the per-strategy cluster metrics."""
    cluster = summary["cluster"]
    replicas = ", ".join(f"`{r['name']}` ({r['role']}, {r['profile']}, node {r['node']})"
                         for r in cluster["replicas"])
    links = cluster["links"]
    lines = [f"## Cluster `{cluster['name']}`", "",
             f"Replicas: {replicas}. Links: intra-node "
             f"{links['intra_node']['bandwidth_gbs']:g} GB/s + "
             f"{links['intra_node']['latency_us']:g} us, inter-node "
             f"{links['inter_node']['bandwidth_gbs']:g} GB/s + "
             f"{links['inter_node']['latency_us']:g} us. Strategy = router (and the policy "
             "every replica runs, if replaced). TTFT initial: a program's first turn; "
             "incremental: its later turns. Balance: the busiest replica's busy time over its "
             "role's mean (1.00 = even).", "",
             "| " + " | ".join(h for _, h, _ in _CLUSTER_COLUMNS) + " |",
             "|" + "---|" * len(_CLUSTER_COLUMNS)]
    for row in summary["results"]:
        lines.append("| " + " | ".join(_cell(row, k, f) for k, _, f in _CLUSTER_COLUMNS)
                     + " |")
    return lines


def _mode_text(summary: dict[str, Any]) -> str:
    mode = summary.get("mode", "virtual")
    text = "Virtual time" if mode == "virtual" else f"Wall-clock replay over HTTP ({mode[5:]})"
    scale = summary.get("time_scale", 1.0)
    if scale != 1.0:
        text += f", arrivals and tool times x{scale:g}"
    if summary.get("concurrency"):
        text += (", closed loop (a new program starts when one ends; the trace's arrival "
                 "times are not used)")
    if summary.get("steady"):
        text += (f"; the first and last {summary['steady']:.0%} of programs (by start) are "
                 "warm-up and cool-down, left out of the metrics (not of the load)")
    return text


def reading(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Per load, the fastest policy by mean JCT, its ratios to `vllm`, and the mechanisms
    that explain the gap (cache hits, recomputation, queueing, preemptions, pinned memory)."""
    out = []
    for x, closed in dict.fromkeys((r["jps"], r.get("concurrency")) for r in rows):
        at = [r for r in rows if (r["jps"], r.get("concurrency")) == (x, closed)]
        best = min(at, key=lambda r: r.get("jct_mean_s", math.inf))
        base = next((r for r in at if r["policy"] == "vllm"), None)
        line = (f"- **{_load_text(x, closed)}**: fastest `{best['policy']}`, mean JCT "
                f"{best['jct_mean_s']:.1f} s")
        if base is not None and best is not base and base.get("jct_mean_s"):
            line += (f" ({best['jct_mean_s'] / base['jct_mean_s']:.2f}x `vllm`'s mean, "
                     f"{best['jct_p95_s'] / base['jct_p95_s']:.2f}x its P95). Against `vllm`: "
                     f"prefix hit rate {best['prefix_hit_rate']:.2f} vs "
                     f"{base['prefix_hit_rate']:.2f}, recomputed tokens "
                     f"{best['recomputed_tokens']:,} vs {base['recomputed_tokens']:,}, mean "
                     f"queueing {best['queue_mean_s']:.2f} vs {base['queue_mean_s']:.2f} s, "
                     f"preemptions {best['preemptions']} vs {base['preemptions']}, pins held "
                     f"{best['pin_memory_share']:.1%} of KV memory")
        elif base is not None:
            line += (f"; the policies differ by at most "
                     f"{max(r['jct_mean_s'] for r in at) / best['jct_mean_s'] - 1:.1%} in mean "
                     f"JCT (JCT / isolated {best.get('normalised_latency_mean', math.nan):.2f})")
        out.append(line + ".")
    return out


def print_table(summary: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"{summary['trace_name']} on {summary['profile']}")
    wanted = ("policy", "jps", "jct_mean_s", "jct_p95_s", "normalised_latency_mean",
              "throughput_programs_per_min", "prefix_hit_rate", "preemptions",
              "pin_memory_share", "wall_s", "engine_steps_per_s")
    keys = [c for c in _COLUMNS if c[0] in wanted]
    for _, header, _ in keys:
        table.add_column(header, justify="right", overflow="fold")
    for row in summary["results"]:
        table.add_row(*[_cell(row, k, f) for k, _, f in keys])
    console.print(table)


def plot(summary: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["results"]
    policies = summary["policies"]
    colors = plt.get_cmap("tab20" if len(policies) > 10 else "tab10")  # one colour each
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, policy in enumerate(policies):
        mine = [r for r in rows if r["policy"] == policy]
        xs = [_load_value(r) for r in mine]
        line = ax.plot(xs, [r["jct_mean_s"] for r in mine], marker="o", label=policy,
                       color=colors(i))
        ax.plot(xs, [r["jct_p95_s"] for r in mine], marker="x", linestyle="--",
                color=line[0].get_color(), label="_nolegend_")
    ax.axhline(summary["isolated_jct_mean_s"], color="grey", linestyle=":",
               label="isolated mean")
    closed = bool(summary.get("concurrency"))
    _finish_plot(plt, fig, ax, "programs at once (closed loop)" if closed else "load (jobs/s)",
                 "JCT (s): mean solid, P95 dashed",
                 f"JCT against load: {summary['trace_name']}",
                 out / "jct_vs_load.png")

    top_row = max(rows, key=_load_value)
    top, top_closed = top_row["jps"], top_row.get("concurrency")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, policy in enumerate(policies):
        path = out / "runs" / f"{policy}-jps{_jps_label(top, top_closed)}.json"
        jcts = sorted(p["jct_s"] for p in json.loads(path.read_text())["programs"]
                      if p.get("measured", True))
        ys = [(i + 1) / len(jcts) for i in range(len(jcts))]
        ax.step(jcts, ys, where="post", label=policy, color=colors(i))
    _finish_plot(plt, fig, ax, "JCT (s)", "fraction of programs",
                 f"JCT CDF at {_load_text(top, top_closed)}", out / "jct_cdf.png")


def _load_value(row: dict[str, Any]) -> float:
    """Where a row sits on the load axis: programs at once (closed loop) or jobs/s."""
    if row.get("concurrency"):
        return float(row["concurrency"])
    return row["jps"] if row["jps"] is not None else 0.0


def _finish_plot(plt: Any, fig: Any, ax: Any, xlabel: str, ylabel: str, title: str,
                 path: Path) -> None:
    """Labels, legend and grid as every plot here has them; then save atomically and close."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    # beside the axes, not on them: a sweep of ten policies would cover the lines
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png", bbox_inches="tight")
    plt.close(fig)


def _write_text(path: Path, text: str) -> None:
    write_text_atomic(path, text)


def _write_json(path: Path, obj: Any) -> None:
    _write_text(path, json.dumps(obj, indent=1, allow_nan=True) + "\n")
