"""`harness eval NAME`: the experiments that print figures, one subcommand each.

Each experiment lives in `eval/experiments/` as a function taking its parameters (a small
options dataclass where there are many); here are their options, help texts and exit statuses.
A user's mistake raises `eval.ExperimentError` (a `common.errors.UserError`) there and reaches
the user as `harness: error: MSG`, exit 2, through `cli.main`. The AMPD benchmark is
`harness cluster bench`, the policy benchmark `harness bench`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
from functools import partial
from pathlib import Path
from typing import Any

from eval.experiments import (
    bash_overhead,
    event_overhead,
    fidelity,
    load_bench,
    perf_table,
    real_model,
    router_baseline,
    router_overhead,
    sched_overhead,
    served_comparison,
    served_vs_virtual,
    step_interference,
)
from eval.experiments.fidelity import DEFAULT_TABLE, FidelityOptions
from eval.experiments.load_bench import DEFAULT_MIX
from eval.experiments.real_model import RealModelOptions
from eval.experiments.router_baseline import DEFAULT_MODES, MODES, RouterBaselineOptions
from eval.experiments.router_overhead import RouterOverheadOptions
from eval.experiments.served_comparison import (
    DEFAULT_SYSTEMS,
    VLLM_ROUTER_SYSTEMS,
    ServedComparisonOptions,
)
from eval.experiments.served_vs_virtual import ServedVsVirtualOptions
from harness.tools.sandbox_image import DEFAULT_IMAGE

# the module imports langchain-core (about 1 s): only its docstring is read to build the parser
LANGCHAIN_EXAMPLE = "eval.examples.langchain_agent"


def register(parser: argparse.ArgumentParser) -> None:
    """The `eval` group's experiments on the parser `cli.main` made for it."""
    parser.description = __doc__.split("\n\n")[0]
    experiments = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    _add_load(experiments)
    _add_fidelity(experiments)
    _add_served_vs_virtual(experiments)
    _add_sched_overhead(experiments)
    _add_event_overhead(experiments)
    _add_bash_overhead(experiments)
    _add_router_baseline(experiments)
    _add_served_comparison(experiments)
    _add_router_overhead(experiments)
    _add_langchain_example(experiments)
    _add_perf_table(experiments)
    _add_real_model(experiments)
    _add_step_interference(experiments)


def _options(cls: Any, args: argparse.Namespace, **given: Any) -> Any:
    """The options dataclass `cls` from the parsed arguments of the same names."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
                  if f.name not in given}, **given)


# -- load ---------------------------------------------------------------------------------------
def _add_load(experiments: Any) -> None:
    p = experiments.add_parser(
        "load", help="many agent programs at once against one `harness serve`, real tools",
        description=load_bench.__doc__.split("\n\n", 1)[0])
    p.add_argument("--programs", type=int, default=200, help="programs in all (200)")
    p.add_argument("--mix", default=DEFAULT_MIX,
                   help="benchmarks and weights, e.g. gsm8k,swe-bench=2 (default: "
                   f"{DEFAULT_MIX}, equal shares)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="programs at once (default: all of them)")
    p.add_argument("--policy", default="continuum")
    p.add_argument("--profile", default=None, help="emulated GPU-MODEL for the server")
    p.add_argument("--server", default=None, help="a running harness serve (emulated)")
    p.add_argument("--out", default=None, help="output folder (default runs/load-TIME)")
    p.set_defaults(func=_load)


def _load(args: argparse.Namespace) -> int:
    return load_bench.run_load_bench(
        programs=args.programs, mix=args.mix, concurrency=args.concurrency, policy=args.policy,
        profile=args.profile, server=args.server, out=args.out)


# -- fidelity -----------------------------------------------------------------------------------
def _add_fidelity(experiments: Any) -> None:
    p = experiments.add_parser(
        "fidelity", help="the emulated GPU against the real CPU engine on one small trace",
        description=fidelity.__doc__)
    d = FidelityOptions
    p.add_argument("--table", type=Path, default=d.table,
                   help=f"CPU step-time table (default {DEFAULT_TABLE}; make it with "
                   "`harness profile --device cpu`)")
    p.add_argument("--policies", default=d.policies)
    p.add_argument("--programs", type=int, default=d.programs)
    p.add_argument("--jps", type=float, default=d.jps, help="program arrivals per second")
    p.add_argument("--scale", type=float, default=d.scale,
                   help=f"token counts of the BFCL-like trace times this (default {d.scale})")
    p.add_argument("--tool-scale", type=float, default=d.tool_scale,
                   help="tool-call durations times this (default 1; below 1 the trace is "
                   "compute-bound, where policies can differ)")
    p.add_argument("--kv-tokens", type=int, default=d.kv_tokens,
                   help=f"KV cache size in tokens on both sides (default {d.kv_tokens})")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--tie", type=float, default=d.tie,
                   help=f"mean JCTs within this fraction are tied when rankings are compared "
                   f"(default {d.tie}: two policies the emulator shows deciding alike differed "
                   "by up to 0.75%% on the real engine, quiet machine)")
    p.add_argument("--real-runs", type=int, default=d.real_runs, metavar="N",
                   help="replay each policy N times on the real engine (default 1); with N > "
                   "1 two policies are ranked on the real side only when every run of one "
                   "beat every run of the other, so run-to-run noise is not taken for a "
                   "ranking (per-program errors are those of the first run)")
    p.add_argument("--no-served-path", dest="served_path", action="store_false",
                   help="replay in virtual time without the per-request HTTP/API-server "
                   "latency the served profile measured (table key served_path)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--served-emulator", action="store_true",
                   help="also replay over HTTP on the emulator (`harness serve --profile "
                   "TABLE`), which tells the step model's error from the HTTP path's")
    p.add_argument("--out", type=Path, default=d.out)
    p.set_defaults(func=partial(_fidelity, p))


def _fidelity(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.real_runs < 1:
        parser.error("--real-runs: give 1 or more")
    fidelity.run_fidelity(_options(FidelityOptions, args))
    return 0


# -- served against virtual ---------------------------------------------------------------------
def _add_served_vs_virtual(experiments: Any) -> None:
    p = experiments.add_parser(
        "served-vs-virtual", help="does a served cluster rank routing strategies as the "
        "virtual-time cluster does?", description=served_vs_virtual.__doc__.split("\n\n")[0])
    d = ServedVsVirtualOptions
    p.add_argument("--cluster", required=True, help="cluster file or shipped example name")
    p.add_argument("--strategies", default=d.strategies, help="router strategies to rank")
    p.add_argument("--trace", default=d.trace)
    p.add_argument("--programs", type=int, default=d.programs)
    p.add_argument("--jps", type=float, default=d.jps)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--time-scale", type=float, default=d.time_scale,
                   help="multiply arrival gaps and tool times (both modes alike)")
    p.add_argument("--tie", type=float, default=d.tie,
                   help=f"relative difference under which two strategies tie (default {d.tie}: "
                   "wall-clock runs on shared cores vary by several percent)")
    p.add_argument("--port", type=int, default=d.port, help="the served router's port")
    p.add_argument("--base-port", type=int, default=d.base_port,
                   help="the replicas' first port")
    p.add_argument("--startup-timeout", type=float, default=d.startup_timeout)
    p.add_argument("--out", default=d.out)
    p.add_argument("--ray", action="store_true",
                   help="serve the cluster on Ray Serve (a local Ray), not local processes")
    p.add_argument("--ray-address", default=None,
                   help="serve the cluster on the running Ray cluster at this address")
    p.add_argument("--ray-transport", default=d.ray_transport, choices=("serve", "http"),
                   help="on Ray, how the router reaches the engines (`harness cluster serve "
                   "--transport`; default %(default)s)")
    p.set_defaults(func=_served_vs_virtual)


def _served_vs_virtual(args: argparse.Namespace) -> int:
    return served_vs_virtual.run_served_vs_virtual(_options(ServedVsVirtualOptions, args))


# -- scheduler overhead -------------------------------------------------------------------------
def _add_sched_overhead(experiments: Any) -> None:
    p = experiments.add_parser(
        "sched-overhead", help="the scheduler's CPU time per step, per policy, at large batches",
        description=sched_overhead.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--programs", type=int, default=320)
    p.add_argument("--min-running", type=int, default=128)
    p.add_argument("--policies", default=",".join(sched_overhead.DEFAULT_POLICIES),
                   help="policies; vllm+offload is stock vLLM with KV offloading on")
    p.add_argument("--profile", default="h100-llama-3.1-8b")
    p.add_argument("--repeat", type=int, default=2,
                   help="rounds over the policies; each policy's least CPU per step is "
                   "kept (other load on the machine only ever adds time)")
    p.add_argument("--out", default=None, help="also write the rows to this JSON file")
    p.set_defaults(func=_sched_overhead)


def _sched_overhead(args: argparse.Namespace) -> int:
    sched_overhead.run_sched_overhead(
        programs=args.programs, min_running=args.min_running,
        policies=args.policies.split(","), profile=args.profile, repeat=args.repeat,
        out=args.out)
    return 0


# -- event overhead -----------------------------------------------------------------------------
def _add_event_overhead(experiments: Any) -> None:
    p = experiments.add_parser("event-overhead",
                               help="what interception events cost an agent per tool call",
                               description=event_overhead.__doc__)
    p.add_argument("--server", default=None)
    p.add_argument("--calls", type=int, default=2000)
    p.set_defaults(func=_event_overhead)


def _event_overhead(args: argparse.Namespace) -> int:
    event_overhead.run_event_overhead(args.server, args.calls)
    return 0


# -- bash overhead ------------------------------------------------------------------------------
def _add_bash_overhead(experiments: Any) -> None:
    p = experiments.add_parser("bash-overhead",
                               help="one BashTool.run against a bare `docker exec`",
                               description=bash_overhead.__doc__)
    p.add_argument("-n", type=int, default=30, help="measured runs of each (default 30)")
    p.add_argument("--image", default=DEFAULT_IMAGE, help="sandbox image")
    p.set_defaults(func=_bash_overhead)


def _bash_overhead(args: argparse.Namespace) -> int:
    return bash_overhead.run_bash_overhead(args.n, args.image)


# -- router baseline ----------------------------------------------------------------------------
def _add_router_baseline(experiments: Any) -> None:
    p = experiments.add_parser(
        "router-baseline", help="vllm-router in front of emulated replicas, per routing mode",
        description=router_baseline.__doc__.split("\n\n")[0])
    d = RouterBaselineOptions
    p.add_argument("--trace", default=d.trace,
                   help="trace name (swe, bfcl, mix, merge) or file")
    p.add_argument("--programs", type=int, default=d.programs)
    p.add_argument("--jps", type=float, default=d.jps, help="arrival rate, jobs/s")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--time-scale", type=float, default=d.time_scale,
                   help=f"multiply arrival gaps and tool durations (default {d.time_scale})")
    p.add_argument("--modes", default=DEFAULT_MODES,
                   help=f"comma-separated, from {', '.join(MODES)} (default {DEFAULT_MODES})")
    p.add_argument("--repeats", type=int, default=d.repeats,
                   help="run every mode this many times (program ids, hence hash placement, "
                   "differ per run)")
    p.add_argument("--replicas", type=int, default=d.replicas)
    p.add_argument("--policy", default=d.policy,
                   help=f"the replicas' policy (default {d.policy})")
    p.add_argument("--profile", default=d.profile)
    p.add_argument("--num-gpu-blocks", type=int, default=d.num_gpu_blocks,
                   help=f"KV cache per replica in 16-token blocks (default {d.num_gpu_blocks}: "
                   "16k tokens)")
    p.add_argument("--out", default=d.out,
                   help="folder for summary.json and the replicas' and routers' logs")
    p.set_defaults(func=partial(_router_baseline, p))


def _router_baseline(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"--modes: unknown {', '.join(unknown) or '(none given)'}; "
                     f"choose from {', '.join(MODES)}")
    if args.replicas < 1 or args.repeats < 1 or args.num_gpu_blocks < 16:
        parser.error("--replicas and --repeats must be >= 1, --num-gpu-blocks >= 16")
    return router_baseline.run_router_baseline(
        _options(RouterBaselineOptions, args, modes=tuple(modes)))


# -- served comparison ----------------------------------------------------------------------
def _add_served_comparison(experiments: Any) -> None:
    p = experiments.add_parser(
        "served-comparison",
        help="vllm-router program scheduling vs session-routed vllm vs our policies, served",
        description=served_comparison.__doc__.split("\n\n")[0])
    d = ServedComparisonOptions
    p.add_argument("--trace", default=d.trace,
                   help="trace name (swe, swe-long, bfcl, mix, merge) or file")
    p.add_argument("--programs", type=int, default=d.programs)
    p.add_argument("--jps", type=float, default=d.jps, help="arrival rate, jobs/s")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--time-scale", type=float, default=d.time_scale,
                   help=f"multiply arrival gaps and tool durations (default {d.time_scale})")
    p.add_argument("--systems", default=d.systems,
                   help=f"comma-separated rows: {', '.join(VLLM_ROUTER_SYSTEMS)} or "
                   f"session:POLICY (our router in front of POLICY replicas); default "
                   f"{DEFAULT_SYSTEMS}")
    p.add_argument("--repeats", type=int, default=d.repeats,
                   help="run every system this many times (program ids, hence placement, "
                   "differ per run) and print the means too")
    p.add_argument("--replicas", type=int, default=d.replicas)
    p.add_argument("--profile", default=d.profile, help="the replicas' emulated GPU-MODEL "
                   "(vllm-router's cost models are calibrated on it)")
    p.add_argument("--num-gpu-blocks", type=int, default=d.num_gpu_blocks,
                   help=f"KV cache per replica in 16-token blocks, for every system (default "
                   f"{d.num_gpu_blocks}: 16k tokens)")
    p.add_argument("--vr-stats-window", type=int, default=d.vr_stats_window,
                   help="vllm-router's stats_window_size: observed requests before its growth "
                   "reserve and Progress-TTL turn on (its own default, 100, is more than a "
                   f"short run makes, so its TTLs stay 0; default here {d.vr_stats_window})")
    p.add_argument("--out", default=d.out,
                   help="folder for summary.json and the replicas' and routers' logs")
    p.set_defaults(func=_served_comparison)


def _served_comparison(args: argparse.Namespace) -> int:
    return served_comparison.run_served_comparison(_options(ServedComparisonOptions, args))


# -- router-overhead ----------------------------------------------------------------------------
def _add_router_overhead(experiments: Any) -> None:
    p = experiments.add_parser(
        "router-overhead", help="what a served cluster's router adds per request",
        description=router_overhead.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    d = RouterOverheadOptions
    p.add_argument("--url", required=True, help="the running `harness cluster serve` router")
    p.add_argument("--programs", type=int, default=d.programs, help="programs at once")
    p.add_argument("--turns", type=int, default=d.turns, help="one-token turns per program")
    p.add_argument("--prompt-words", type=int, default=d.prompt_words)
    p.set_defaults(func=lambda args: router_overhead.run_router_overhead(
        _options(RouterOverheadOptions, args)))


# -- the LangChain example ----------------------------------------------------------------------
def _add_langchain_example(experiments: Any) -> None:
    p = experiments.add_parser(
        "langchain-example", help="a small tool-using langchain-core agent against "
        "`harness serve`", description=_docstring(LANGCHAIN_EXAMPLE),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default=None, help="a running server (default: start one)")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--free", action="store_true", help="no recorded replies")
    p.add_argument("--device", default=None, choices=("cpu", "gpu"),
                   help="start the server on this device with --model (e.g. --device cpu "
                   "--model smollm2-135m-instruct --free); default: the emulated GPU")
    p.set_defaults(func=_langchain_example)


def _langchain_example(args: argparse.Namespace) -> int:
    from eval.examples import langchain_agent  # langchain-core: start-up cost (about 1 s)

    langchain_agent.run_example(args.server, args.model, args.free, args.device)
    return 0


def _docstring(module: str) -> str | None:
    """A module's docstring read from its source, without importing the module."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    return ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8")))


# -- the emulator's step-time tables ------------------------------------------------------------
def _add_perf_table(experiments: Any) -> None:
    p = experiments.add_parser(
        "perf-table", help="the emulated GPU's step times for standard batch shapes, markdown",
        description=perf_table.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profiles", nargs="*", metavar="PROFILE",
                   help="profile names or table paths (default: "
                   f"{' '.join(perf_table.DEFAULT_PROFILES)})")
    p.set_defaults(func=_perf_table)


def _perf_table(args: argparse.Namespace) -> int:
    perf_table.print_perf_tables(args.profiles or perf_table.DEFAULT_PROFILES)
    return 0


# -- real-model ---------------------------------------------------------------------------------
def _add_real_model(experiments: Any) -> None:
    d = RealModelOptions()
    p = experiments.add_parser(
        "real-model", help="a real model on the CPU engine under each policy: identical "
        "replies turn by turn, JCT, and the emulator replaying the same runs",
        description=real_model.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", default=d.bench, help=f"benchmark ({d.bench})")
    p.add_argument("--model", default=d.model, help=f"NAME|DIR|FILE.gguf ({d.model})")
    p.add_argument("--policies", default=d.policies,
                   help=f"comma-separated; the first runs twice ({d.policies})")
    p.add_argument("--limit", type=int, default=d.limit, help=f"tasks ({d.limit})")
    p.add_argument("--concurrency", type=int, default=d.concurrency)
    p.add_argument("--kv-tokens", type=int, default=d.kv_tokens,
                   help=f"KV cache in tokens, small for memory pressure ({d.kv_tokens})")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="output cap per reply")
    p.add_argument("--max-steps", type=int, default=d.max_steps)
    p.add_argument("--no-repeat", dest="repeat", action="store_false",
                   help="run the first policy once (no float-noise yardstick)")
    p.add_argument("--table", type=Path, default=None,
                   help="a CPU profile of the model (`harness profile --device cpu --served "
                   "--model M`): also replay each run on the emulator")
    p.add_argument("--out", type=Path, default=d.out)
    p.set_defaults(func=_real_model)


def _real_model(args: argparse.Namespace) -> int:
    real_model.run_real_model(_options(RealModelOptions, args))
    return 0


# -- prefill-decode interference of the emulated step ------------------------------------------
def _add_step_interference(experiments: Any) -> None:
    p = experiments.add_parser(
        "step-interference",
        help="a prefill chunk's inflation of a decode step, emulated beside published figures",
        description=step_interference.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profiles", nargs="*", metavar="PROFILE",
                   help="profiles of the chunk-size sweep (default: "
                   f"{' '.join(step_interference.DEFAULT_PROFILES)})")
    p.add_argument("--chunks", default=",".join(map(str, step_interference.DEFAULT_CHUNKS)),
                   help="comma-separated prefill chunk sizes, tokens (default %(default)s)")
    p.add_argument("--decodes", type=int, default=step_interference.DEFAULT_DECODES,
                   help="decoding sequences in the step (default %(default)s)")
    p.add_argument("--context", type=int, default=step_interference.DEFAULT_DECODE_CONTEXT,
                   help="each decode's context, tokens (default %(default)s)")
    p.set_defaults(func=_step_interference)


def _step_interference(args: argparse.Namespace) -> int:
    try:
        chunks = [int(x) for x in args.chunks.split(",") if x.strip()]
    except ValueError:
        raise step_interference.StepInterferenceError(
            f"--chunks {args.chunks!r}: give comma-separated token counts, e.g. 512,2048"
        ) from None
    print(step_interference.report(args.profiles or step_interference.DEFAULT_PROFILES,
                                   chunks, args.decodes, args.context))
    return 0
