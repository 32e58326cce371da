"""`harness cluster serve FILE`, `harness cluster check FILE` and `harness cluster bench`.

`serve` starts one `harness serve` per replica of a cluster file and the router in front of them
(`cluster.launcher`); `check` validates the file and prints what `serve` would start; `bench`
compares AMPD with its baselines in virtual time (`eval.ampd.bench`). Their options, and the
turning of ``--strategies a,b`` or ``--layouts 1p3d,2p2d`` into the values those libraries take,
live here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import sys
import time
from pathlib import Path

from rich.console import Console

from cli import options
from cli.paths import CLUSTER_FILE, PROFILE, add_path_argument, output_folder
from cluster.config import EXAMPLES_DIR, ClusterConfig, ClusterConfigError, load_cluster
from cluster.launcher import (
    DEFAULT_BASE_PORT,
    DEFAULT_ROUTER_PORT,
    DEFAULT_STARTUP_TIMEOUT_S,
    LauncherError,
    check_commands,
    replica_ports,
    serve_cluster,
)
from common.metrics import SLO
from eval.ampd import bench as ampd_bench
from eval.ampd import regime as ampd_regime
from eval.ampd.bench import (
    AMPD_WORKLOADS,
    DEFAULT_JPS,
    DEFAULT_LAYOUTS,
    DEFAULT_PROFILE,
    DEFAULT_TRACES,
    HISTORY,
    STRATEGIES,
    AmpdBenchError,
    Strategy,
)
from eval.workloads.registry import TRACES
from server.perf.registry import load_profile
from server.programs.state import STALE_AFTER_S


def register(parser: argparse.ArgumentParser) -> None:
    """`harness cluster`'s actions on the parser `cli.main` made for it."""
    parser.set_defaults(func=run)
    sub = parser.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    serve = sub.add_parser("serve", help="start every replica of a cluster file and the router")
    add_path_argument(serve, "file", spec=CLUSTER_FILE, metavar="FILE",
                      help="cluster file (YAML), or the name of a shipped example "
                      f"({EXAMPLES_DIR})")
    serve.add_argument("--host", default="127.0.0.1",
                       help="router bind address (default loopback; local replicas always "
                       "bind loopback, Ray replicas their node's address)")
    serve.add_argument("--port", type=int, default=DEFAULT_ROUTER_PORT,
                       help=f"router port, the cluster's one endpoint (default "
                       f"{DEFAULT_ROUTER_PORT})")
    serve.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                       help="replica i (in file order) listens on BASE_PORT + i unless the file "
                       f"gives its `port:` (default {DEFAULT_BASE_PORT})")
    add_path_argument(serve, "--log-dir", spec=output_folder("the replicas' logs"), default=None,
                      help="folder for the replicas' logs (default "
                      "runs/cluster/NAME-TIMESTAMP)")
    serve.add_argument("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT_S,
                       help="seconds to wait for every replica to answer (default "
                       f"{DEFAULT_STARTUP_TIMEOUT_S:.0f})")
    serve.add_argument("--ray", action="store_true",
                       help="run the replicas on Ray Serve (a local Ray started and stopped "
                       "here, unless --address names a running Ray cluster)")
    serve.add_argument("--address", default=None,
                       help="a running Ray cluster (HEAD:6379, from `ray start --head`); implies "
                       "--ray")
    serve.add_argument("--replica-cpus", type=float, default=1.0,
                       help="--ray: CPUs each replica asks Ray for (default 1)")
    serve.add_argument("--replica-gpus", type=float, default=0.0,
                       help="--ray: GPUs each replica asks Ray for (default 0: the emulated "
                       "GPU; 1 per replica on real GPUs)")
    serve.add_argument("--replica-resources", default=None, metavar="JSON",
                       help='--ray: custom Ray resources per replica, e.g. \'{"node_a": 0.5}\'')
    serve.add_argument("--transport", default=None, choices=("serve", "http"),
                       help="--ray: how the router reaches a replica's engine: straight over "
                       "HTTP to the engine on its node (default; Ray still places, restarts and "
                       "reports the replicas) or through Serve (a handle call to the replica's "
                       "actor, which relays to its engine: a Ray message per streamed token, "
                       "and requests that sometimes wait seconds; docs/cluster.md)")
    serve.add_argument("--api-key", default=None, metavar="KEY",
                       help="clients must send `Authorization: Bearer KEY` on /v1 (as `vllm "
                       "serve --api-key`), and every replica wants it too (VLLM_API_KEY), so "
                       "none is open beside the router (default: $HARNESS_CLUSTER_API_KEY; "
                       "none: open, a client's key is passed on to the replicas)")
    serve.add_argument("--stale-after-s", type=float, default=None, metavar="S",
                       help="every replica's program scheduler, and the `programs` router's "
                       "own books, forget a program silent this long (no turn, no event), as "
                       "`harness serve --stale-after-s`; shorter for a soak that must see the "
                       "tables drain (default: the file's `router.stale_after_s`, "
                       f"{STALE_AFTER_S:g})")
    check = sub.add_parser("check", help="validate a cluster file and print its replicas")
    add_path_argument(check, "file", spec=CLUSTER_FILE, metavar="FILE",
                      help="cluster file (YAML), or a shipped example's name")
    check.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                       help="as for `serve`, to show the ports")
    add_bench_arguments(sub.add_parser(
        "bench", help="AMPD vs co-located and P/D baselines on AMPD's workloads, virtual time"))


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `harness cluster bench`."""
    p.add_argument("--traces", default=DEFAULT_TRACES,
                   help=f"comma-separated generated traces (default {DEFAULT_TRACES}; AMPD's: "
                   f"{', '.join(AMPD_WORKLOADS)})")
    p.add_argument("--jps", default=DEFAULT_JPS,
                   help=f"comma-separated loads in jobs/s (default {DEFAULT_JPS})")
    p.add_argument("--programs", type=int, default=40,
                   help="programs per trace and load (default 40)")
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help=f"comma-separated, from {', '.join(STRATEGIES)} (default: all)")
    p.add_argument("--layouts", default=DEFAULT_LAYOUTS,
                   help=f"P/D layouts as NpMd, each adding up to --replicas (default "
                   f"{DEFAULT_LAYOUTS})")
    p.add_argument("--replicas", type=int, default=4,
                   help="replicas per strategy, co-located or P/D (default 4)")
    add_path_argument(p, "--profile", spec=PROFILE, default=DEFAULT_PROFILE,
                      help="emulated GPU-MODEL profile of every replica (default "
                      f"{DEFAULT_PROFILE}: AMPD's H20 and Llama-3.1-70B at TP4)")
    p.add_argument("--slo-ttft", type=float, default=SLO.ttft_s,
                   help=f"TTFT SLO per turn, seconds (default {SLO.ttft_s:g})")
    p.add_argument("--slo-ttft-x", type=float, default=None, metavar="K",
                   help="TTFT SLO per trace: K x the trace's idle TTFT (its Table 1 prefill "
                   "length from scratch on an idle --profile replica; hotpotqa 0.69 s at "
                   "TP4), instead of --slo-ttft (AMPD's traces only)")
    p.add_argument("--slo-itl", type=float, default=SLO.tpot_s,
                   help=f"mean inter-token latency SLO per turn, seconds (default "
                   f"{SLO.tpot_s:g})")
    p.add_argument("--num-gpu-blocks", type=int, default=None,
                   help="KV cache size per replica in 16-token blocks (default: the profile's)")
    p.add_argument("--history", choices=HISTORY, default="pull",
                   help="how a prefill replica gets the history it lacks: pull it from the "
                   "decode replica (vLLM's bidirectional_kv_xfer; default) or recompute it")
    p.add_argument("--gpus", type=int, default=None,
                   help="regime map (eval.ampd.regime): tune every strategy over the "
                   "deployments of this many GPUs (each TP in --tp, co-located and every P/D "
                   "split) and sweep --itl-slo; replaces --strategies, --layouts, --replicas "
                   "and the profile's TP")
    p.add_argument("--tp", default=ampd_regime.DEFAULT_TP,
                   help="with --gpus: TP degrees to deploy at (default %(default)s; those the "
                   "model does not fit at are skipped)")
    p.add_argument("--deployments", default=None,
                   help="with --gpus: comma-separated deployments to try (e.g. 'TP8 x1,TP4 "
                   "x2,TP4 1P1D'; default: all)")
    p.add_argument("--itl-slo", default=None,
                   help="with --gpus: comma-separated ITL SLOs, seconds (default "
                   f"{ampd_regime.DEFAULT_ITL_SLOS})")
    p.add_argument("--seed", type=int, default=0, help="trace and router seed (default 0)")
    add_path_argument(p, "--out", spec=output_folder("the sweep's results"),
                      default="runs/ampd-bench", help="output folder")
    p.add_argument("--no-plot", action="store_true", help="skip slo_vs_load.png")


def resolve(file: str) -> Path:
    """The file as given, else a shipped example of that name (with or without `.yaml`)."""
    path = Path(file)
    if path.is_file():
        return path
    for candidate in (EXAMPLES_DIR / file, EXAMPLES_DIR / f"{file}.yaml"):
        if candidate.is_file():
            return candidate
    return path  # load_cluster names the examples in its error


def describe(config: ClusterConfig, base_port: int) -> str:
    """What `check` prints: replicas, roles, GPUs, ports, KV sizes, links."""
    try:
        ports: dict[str, int | str] = dict(replica_ports(config, base_port))
    except LauncherError as exc:
        ports = {r.name: "?" for r in config.replicas}
        print(f"warning: {exc}", file=sys.stderr)
    nodes = sorted({r.node for r in config.replicas})
    lines = [f"cluster {config.name}: {len(config.replicas)} replica(s), {config.gpus()} GPU(s) "
             f"on {len(nodes)} node(s); router strategy {config.router.strategy}"]
    header = ("name", "role", "profile", "policy", "node", "GPUs", "port", "KV tokens",
              "offload")
    rows = [header]
    for r in config.replicas:
        profile = load_profile(r.profile)
        kv = (r.num_gpu_blocks * 16 if r.num_gpu_blocks is not None
              else profile.kv_capacity_tokens(0.9))
        rows.append((r.name, r.role, r.profile, str(r.policy), str(r.node), str(profile.tp),
                     str(ports[r.name]), f"{kv:,}" + ("" if r.num_gpu_blocks is None
                                                       else " (set)"),
                     "-" if r.offload_gib is None else f"{r.offload_gib:g} GiB"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    intra, inter = config.links.intra_node, config.links.inter_node
    lines.append(f"links: intra-node {intra.latency_us:g} us, {intra.bandwidth_gbs:g} GB/s; "
                 f"inter-node {inter.latency_us:g} us, {inter.bandwidth_gbs:g} GB/s")
    prefill = [r for r in config.replicas if r.role == "prefill"]
    decode = [r for r in config.replicas if r.role == "decode"]
    for p in prefill:
        per_token = load_profile(p.profile).kv_bytes_per_token
        for d in decode:
            link = config.link(p.name, d.name)
            where = "intra-node" if p.node == d.node else "inter-node"
            lines.append(f"  {p.name} -> {d.name}: {where}, KV of a 1k-token prompt "
                         f"({per_token * 1024 / 2**20:.0f} MiB) in "
                         f"{link.seconds(per_token * 1024) * 1e3:.2f} ms")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.cluster_command == "bench":
        return run_bench(args)
    config = load_cluster(resolve(args.file))  # a ClusterConfigError: printed by cli.main
    if args.cluster_command == "check":
        print(describe(config, args.base_port))
        try:
            check_commands(config, args.base_port)
        except LauncherError as exc:
            print(f"harness: error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.stale_after_s is not None:  # a ClusterConfigError: printed by cli.main
        config = config.with_stale_after(args.stale_after_s)
    log_dir = Path(args.log_dir) if args.log_dir else (
        Path("runs") / "cluster" / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        if args.ray or args.address:
            return serve_ray(args, config, log_dir)
        if args.transport is not None:
            raise ClusterConfigError("--transport chooses how the router reaches the replicas "
                                     "on Ray: give it with --ray or --address")
        return serve_cluster(config, host=args.host, port=args.port, base_port=args.base_port,
                             log_dir=log_dir, startup_timeout_s=args.startup_timeout,
                             api_key=cluster_api_key(args))
    except LauncherError as exc:  # the cluster did not start: exit 1
        print(f"harness: error: {exc}", file=sys.stderr)
        return 1


def serve_ray(args: argparse.Namespace, config: ClusterConfig, log_dir: Path) -> int:
    """`harness cluster serve --ray` / `--address`: the cluster on Ray Serve."""
    # ray (cluster.ray_app): start-up cost (~2 s), paid only when serving on Ray
    from cluster.ray_app import RayResources, RayServe, serve_on_ray

    custom: dict[str, float] = {}
    if args.replica_resources:
        try:
            custom = {str(k): float(v) for k, v in json.loads(args.replica_resources).items()}
        except (ValueError, AttributeError, TypeError):
            raise ClusterConfigError(
                f"--replica-resources {args.replica_resources!r}: give a JSON object of "
                'resource names and amounts, e.g. \'{"node_a": 0.5}\'') from None
    for flag, value in (("--replica-cpus", args.replica_cpus),
                        ("--replica-gpus", args.replica_gpus)):
        if not (value >= 0 and math.isfinite(value)):
            raise ClusterConfigError(f"{flag} must be 0 or more, not {value}")
    resources = RayResources(cpus=args.replica_cpus, gpus=args.replica_gpus, custom=custom)
    return serve_on_ray(config, RayServe(
        log_dir, address=args.address, host=args.host, port=args.port, resources=resources,
        startup_timeout_s=args.startup_timeout, transport=args.transport or "http",
        api_key=cluster_api_key(args)))


def cluster_api_key(args: argparse.Namespace) -> str | None:
    """`--api-key`, else $HARNESS_CLUSTER_API_KEY (a variable of its own: a client's
    HARNESS_API_KEY in the same shell must not turn a key check on by surprise)."""
    return args.api_key or os.environ.get("HARNESS_CLUSTER_API_KEY") or None


def run_bench(args: argparse.Namespace) -> int:
    """Validate, sweep, print the table. A user mistake raises `AmpdBenchError`."""
    for flag, value in (("--slo-ttft", args.slo_ttft), ("--slo-itl", args.slo_itl),
                        ("--slo-ttft-x", args.slo_ttft_x or 1.0)):
        if not (value > 0 and math.isfinite(value)):
            raise AmpdBenchError(f"{flag} must be a positive number of seconds, not {value}")
    if args.replicas < 2:
        raise AmpdBenchError("--replicas must be at least 2 (a P/D layout needs one of each)")
    if args.programs < 1:
        raise AmpdBenchError("--programs must be at least 1")
    try:
        load_profile(args.profile)
    except Exception as exc:  # noqa: BLE001 - any failure here is a bad profile name
        raise AmpdBenchError(f"--profile {args.profile!r}: {exc}") from None
    if args.gpus is not None:
        return run_regime(args)
    if args.itl_slo is not None:
        raise AmpdBenchError("--itl-slo sweeps the regime map: give --gpus too (or one "
                             "--slo-itl for the plain bench)")
    strategies = parse_strategies(args.strategies)
    layouts = (parse_layouts(args.layouts, args.replicas)
               if any(s.disaggregated for s in strategies) else [])
    traces = parse_traces(args.traces)
    loads = parse_loads(args.jps)
    console = Console(stderr=True)
    previous = os.environ.get("VLLM_LOGGING_LEVEL")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep the progress bars readable
    try:
        summary = ampd_bench.bench(
            ampd_bench.Workload(traces, args.programs, args.seed),
            ampd_bench.run_configs(strategies, layouts), loads,
            ampd_bench.Fleet(args.replicas, args.profile, num_gpu_blocks=args.num_gpu_blocks,
                             history=args.history),
            slo=SLO(args.slo_ttft, args.slo_itl), outputs=_outputs(args, console),
            plot=not args.no_plot, ttft_k=args.slo_ttft_x)
    finally:
        if previous is None:
            os.environ.pop("VLLM_LOGGING_LEVEL", None)
    ampd_bench.print_table(summary, console)
    written = ["rows.json", "report.md"] + ([] if args.no_plot else ["slo_vs_load.png"])
    console.print("wrote " + ", ".join(str(Path(args.out) / w) for w in written), soft_wrap=True)
    return 0


def run_regime(args: argparse.Namespace) -> int:
    """`--gpus N`: the regime map (`eval.ampd.regime`) over `--itl-slo`, printed."""
    if args.gpus < 2:
        raise AmpdBenchError("--gpus must be at least 2 (a P/D deployment needs two replicas)")
    degrees = [int(x) for x in _numbers(args.tp, "--tp")]
    itl_slos = _numbers(args.itl_slo or ampd_regime.DEFAULT_ITL_SLOS, "--itl-slo")
    traces = parse_traces(args.traces)
    loads = parse_loads(args.jps)
    console = Console(stderr=True)
    previous = os.environ.get("VLLM_LOGGING_LEVEL")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        summary = ampd_regime.regime(
            ampd_bench.Workload(traces, args.programs, args.seed),
            {t: loads for t in traces},
            ampd_regime.DeploymentSpace(
                args.gpus, args.profile, degrees,
                only=(None if args.deployments is None
                      else _names(args.deployments, "--deployments"))),
            ampd_regime.SloGrid(itl_slos, args.slo_ttft, ttft_k=args.slo_ttft_x),
            outputs=_outputs(args, console), history=args.history)
    finally:
        if previous is None:
            os.environ.pop("VLLM_LOGGING_LEVEL", None)
    text = ampd_regime.regime_markdown(summary)
    print(text[text.index("## ITL"):].rstrip())
    console.print(f"wall time {summary['wall_s']:.0f} s; wrote "
                  f"{Path(args.out) / 'regime.json'}, {Path(args.out) / 'regime.md'}",
                  soft_wrap=True)
    return 0


def _outputs(args: argparse.Namespace, console: Console) -> ampd_bench.Outputs:
    """`--out`, the progress console and the command line that asked, for a sweep's files."""
    return ampd_bench.Outputs(Path(args.out), console,
                              shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]))


def _numbers(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in _names(text, flag)]
    except ValueError:
        raise AmpdBenchError(f"{flag} {text!r}: give numbers separated by commas") from None
    if any(not (v > 0 and math.isfinite(v)) for v in values):
        raise AmpdBenchError(f"{flag} {text!r}: every value must be positive")
    return values


def _names(text: str, flag: str) -> list[str]:
    names = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not names:
        raise AmpdBenchError(f"{flag} is empty")
    return names


def parse_strategies(text: str) -> list[Strategy]:
    names = _names(text, "--strategies")
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        raise AmpdBenchError(f"--strategies: unknown {', '.join(map(repr, unknown))}; choose "
                             f"from {', '.join(STRATEGIES)}")
    return [STRATEGIES[n] for n in names]


def parse_layouts(text: str, replicas: int) -> list[tuple[int, int]]:
    """``1p3d,2p2d`` -> [(1, 3), (2, 2)]; each must use exactly `replicas` replicas, so every
    strategy runs on the same GPUs."""
    out = []
    for name in _names(text, "--layouts"):
        m = re.fullmatch(r"(\d+)p(\d+)d", name.lower())
        if not m or int(m[1]) < 1 or int(m[2]) < 1:
            raise AmpdBenchError(f"--layouts: {name!r} is not a layout; write prefill and "
                                 "decode replica counts as e.g. 1p3d or 2p2d (each at least 1)")
        layout = (int(m[1]), int(m[2]))
        if sum(layout) != replicas:
            raise AmpdBenchError(
                f"--layouts: {name} has {sum(layout)} replicas but --replicas is {replicas}; "
                "strategies are compared on equal GPUs: give layouts that add up to "
                f"--replicas, or change --replicas")
        out.append(layout)
    return list(dict.fromkeys(out))


def parse_loads(text: str) -> list[float]:
    return options.parse_loads(text, AmpdBenchError, "0.25,0.5,1")


def parse_traces(text: str) -> list[str]:
    names = _names(text, "--traces")
    unknown = [n for n in names if n not in TRACES]
    if unknown:
        raise AmpdBenchError(f"--traces: unknown {', '.join(map(repr, unknown))}; AMPD's "
                             "workloads are toolbench, gaia, hotpotqa, dureader (also: "
                             f"{', '.join(n for n in TRACES if n not in AMPD_WORKLOADS)})")
    return names
