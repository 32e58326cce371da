"""`harness cluster serve FILE`, `harness cluster check FILE` and `harness cluster bench`.

`serve` starts one `harness serve` per replica of a cluster file and the router in front of them
(`cluster.launcher`); `check` validates the file and prints what `serve` would start; `bench`
compares AMPD with its baselines in virtual time (`eval.ampd_bench`). Also runnable as
`python -m cli.cluster serve FILE`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cluster.config import EXAMPLES_DIR, ClusterConfig, ClusterConfigError, load_cluster
from server.perf.registry import load_profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from cluster.launcher import DEFAULT_BASE_PORT, DEFAULT_ROUTER_PORT, DEFAULT_STARTUP_TIMEOUT_S

    parser.set_defaults(func=run)
    sub = parser.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    serve = sub.add_parser("serve", help="start every replica of a cluster file and the router")
    serve.add_argument("file", help="cluster file (YAML), or the name of a shipped example "
                       f"({EXAMPLES_DIR})")
    serve.add_argument("--host", default="127.0.0.1",
                       help="router bind address (default loopback; replicas always bind "
                       "loopback)")
    serve.add_argument("--port", type=int, default=DEFAULT_ROUTER_PORT,
                       help=f"router port, the cluster's one endpoint (default "
                       f"{DEFAULT_ROUTER_PORT})")
    serve.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                       help="replica i (in file order) listens on BASE_PORT + i unless the file "
                       f"gives its `port:` (default {DEFAULT_BASE_PORT})")
    serve.add_argument("--log-dir", default=None,
                       help="folder for the replicas' logs (default "
                       "runs/cluster/NAME-TIMESTAMP)")
    serve.add_argument("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT_S,
                       help="seconds to wait for every replica to answer (default "
                       f"{DEFAULT_STARTUP_TIMEOUT_S:.0f})")
    check = sub.add_parser("check", help="validate a cluster file and print its replicas")
    check.add_argument("file", help="cluster file (YAML), or a shipped example's name")
    check.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                       help="as for `serve`, to show the ports")
    from eval import ampd_bench

    ampd_bench.add_arguments(sub.add_parser(
        "bench", help="AMPD vs co-located and P/D baselines on AMPD's workloads, virtual time"))


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
    from cluster.launcher import LauncherError, replica_ports

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
        rows.append((r.name, r.role, r.profile, r.policy, str(r.node), str(profile.tp),
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
        from eval import ampd_bench

        return ampd_bench.run(args)  # its user mistakes: BenchError, printed by cli.main
    try:
        config = load_cluster(resolve(args.file))
    except ClusterConfigError as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return 2
    from cluster.launcher import LauncherError, check_commands, serve_cluster

    if args.cluster_command == "check":
        print(describe(config, args.base_port))
        try:
            check_commands(config, args.base_port)
        except LauncherError as exc:
            print(f"harness: error: {exc}", file=sys.stderr)
            return 2
        return 0

    log_dir = Path(args.log_dir) if args.log_dir else (
        Path("runs") / "cluster" / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        return serve_cluster(config, host=args.host, port=args.port, base_port=args.base_port,
                             log_dir=log_dir, startup_timeout_s=args.startup_timeout)
    except LauncherError as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness cluster", description=__doc__)
    add_arguments(parser)
    from eval.bench import BenchError

    try:
        return run(parser.parse_args(argv))
    except BenchError as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
