"""Does a served cluster agree with the virtual-time cluster on which routing strategy wins?

Why: every routing figure the project publishes comes from the virtual-time cluster
(`harness bench --cluster`). This check replays the same small trace twice per strategy: over
HTTP in wall-clock time against a real `harness cluster serve` (emulated replicas, the served
router with its own observations, `cluster.served_turns`), and in virtual time on the same
cluster file; it prints both tables side by side and says whether the ranking by mean JCT and
by SLO attainment is the same. The served run shares 2 cores between the harness client, the
router and every replica, so its absolute figures carry that overhead; the ranking is what is
compared.

    python -m eval.served_vs_virtual --cluster cluster/examples/1p3d.yaml \
        --strategies pd,ampd --trace hotpotqa --programs 24 --jps 4 --out runs/served-vs-virtual
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from cluster.config import ClusterConfigError, load_cluster
from common.atomic import write_text_atomic
from eval.bench.specs import BenchError, ClusterRuns, EngineSettings, HttpTarget
from eval.bench.sweep import bench

KEYS = ("jct_mean_s", "jct_p95_s", "ttft_mean_s", "slo_attainment")


def _served_file(config: Any, strategy: str, out: Path) -> Path:
    """The cluster file with `strategy` as its router (JSON is YAML)."""
    data = config.model_dump(mode="json")
    data["router"]["strategy"] = strategy
    path = out / f"cluster-{strategy}.json"
    write_text_atomic(path, json.dumps(data, indent=1))
    return path


def _serve(path: Path, port: int, base_port: int, logs: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "cluster", "serve", str(path), "--port", str(port),
         "--base-port", str(base_port), "--log-dir", str(logs)],
        stdout=(logs.parent / f"{logs.name}.out").open("w"), stderr=subprocess.STDOUT,
        start_new_session=True)


def _wait(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"`harness cluster serve` exited with {process.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise BenchError(f"the served cluster did not answer in {timeout_s:.0f} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM: the launcher stops its replicas; SIGKILL the group if it does not."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def ranking(rows: dict[str, dict[str, Any]], key: str, higher_better: bool,
            tie: float) -> list[list[str]]:
    """Strategies best first by `key`, as groups: a strategy within `tie` (relative) of its
    group's best is tied with it (NaN last)."""
    def value(name: str) -> float:
        v = rows[name].get(key, math.nan)
        return math.nan if v is None else float(v)

    def score(name: str) -> float:
        v = value(name)
        return math.inf if math.isnan(v) else (-v if higher_better else v)

    groups: list[list[str]] = []
    for name in sorted(rows, key=score):
        if groups:
            head = value(groups[-1][0])
            v = value(name)
            if head == v or (head and abs(v - head) <= tie * abs(head)):
                groups[-1].append(name)
                continue
        groups.append([name])
    return groups


def _order(groups: list[list[str]]) -> str:
    return " > ".join(" = ".join(g) for g in groups)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        config = load_cluster(args.cluster)
    except ClusterConfigError as exc:
        raise BenchError(str(exc)) from None
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if len(strategies) < 2:
        raise BenchError("--strategies: give at least two to rank")
    common = dict(programs=args.programs, jps=[args.jps], profile=config.replicas[0].profile,
                  seed=args.seed, settings=EngineSettings(), time_scale=args.time_scale)
    runs = ClusterRuns.load(args.cluster, strategies)
    virtual = bench(args.trace, runs.labels(), out=out / "virtual", cluster=runs, **common)
    rows_virtual = {r["policy"]: r for r in virtual["results"]}
    rows_served: dict[str, dict[str, Any]] = {}
    for strategy in strategies:
        path = _served_file(config, strategy, out)
        url = f"http://127.0.0.1:{args.port}"
        process = _serve(path, args.port, args.base_port, out / f"logs-{strategy}")
        try:
            _wait(url, process, args.startup_timeout)
            served = bench(args.trace, [strategy], out=out / f"served-{strategy}", **common,
                           http=HttpTarget(url))
            rows_served[strategy] = served["results"][0]
            rows_served[strategy]["router"] = httpx.get(url + "/v1/cluster", timeout=10).json()
        finally:
            _stop(process)
    lines = [f"# Served against virtual: {config.name}, {args.trace}, {args.programs} programs "
             f"at {args.jps:g} jobs/s (time x{args.time_scale:g})", "",
             "| strategy | mode | " + " | ".join(KEYS) + " |", "|---|---|" + "---:|" * len(KEYS)]
    for strategy in strategies:
        for mode, rows in (("virtual", rows_virtual), ("served", rows_served)):
            row = rows[strategy]
            lines.append(f"| {strategy} | {mode} | "
                         + " | ".join(f"{row.get(k, math.nan):.3f}" for k in KEYS) + " |")
    agree = {}
    for key, higher in (("jct_mean_s", False), ("slo_attainment", True)):
        v = ranking(rows_virtual, key, higher, args.tie)
        s = ranking(rows_served, key, higher, args.tie)
        agree[key] = [sorted(g) for g in v] == [sorted(g) for g in s]
        lines.append(f"\nBy {key} (within {args.tie:.0%} is a tie): virtual {_order(v)}; "
                     f"served {_order(s)}: {'the same' if agree[key] else 'different'}.")
    for strategy in strategies:
        decisions = rows_served[strategy]["router"].get("decisions")
        if decisions:
            lines.append(f"\nServed `{strategy}` router decisions: {decisions}.")
    text = "\n".join(lines) + "\n"
    write_text_atomic(out / "report.md", text)
    write_text_atomic(out / "summary.json", json.dumps(
        {"virtual": rows_virtual, "served": rows_served, "agree": agree}, indent=1,
        default=str))
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.served_vs_virtual",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", required=True, help="cluster file or shipped example name")
    p.add_argument("--strategies", default="pd,ampd", help="router strategies to rank")
    p.add_argument("--trace", default="hotpotqa")
    p.add_argument("--programs", type=int, default=24)
    p.add_argument("--jps", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply arrival gaps and tool times (both modes alike)")
    p.add_argument("--tie", type=float, default=0.1,
                   help="relative difference under which two strategies tie (default 0.1: "
                   "wall-clock runs on shared cores vary by several percent)")
    p.add_argument("--port", type=int, default=8390, help="the served router's port")
    p.add_argument("--base-port", type=int, default=8400, help="the replicas' first port")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--out", default="runs/served-vs-virtual")
    args = p.parse_args(argv)
    try:
        return run(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
