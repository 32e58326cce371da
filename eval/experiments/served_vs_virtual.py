"""Does a served cluster agree with the virtual-time cluster on which routing strategy wins?

Why: every routing figure the project publishes comes from the virtual-time cluster
(`harness bench --cluster`). This check replays the same small trace twice per strategy: over
HTTP in wall-clock time against a real `harness cluster serve` (emulated replicas, the served
router with its own observations, `cluster.served_turns`), and in virtual time on the same
cluster file; it prints both tables side by side and says whether the ranking by mean JCT and
by SLO attainment is the same. The served run shares 2 cores between the harness client, the
router and every replica, so its absolute figures carry that overhead; the ranking is what is
compared.

    harness eval served-vs-virtual --cluster cluster/examples/1p3d.yaml \
        --strategies pd,ampd --trace hotpotqa --programs 24 --jps 4 --out runs/served-vs-virtual
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cluster.config import ClusterConfigError, load_cluster
from common.atomic import write_text_atomic
from common.processes import stop_process_group
from eval import ExperimentError
from eval.bench.runs import BenchSpec, Workload
from eval.bench.served import Served
from eval.bench.specs import ClusterRuns, HttpTarget
from eval.bench.sweep import bench
from eval.bench.virtual import Cluster
from server.engine_spec import EngineSpec

KEYS = ("jct_mean_s", "jct_p95_s", "ttft_mean_s", "slo_attainment")


@dataclass(frozen=True)
class ServedVsVirtualOptions:
    """One comparison: the cluster file, the strategies to rank, the trace, how close is a
    tie, and where the served cluster listens (each field is an option of
    `harness eval served-vs-virtual`, its help the metadata's)."""

    cluster: str = field(metadata={"help": "cluster file or shipped example name"})
    strategies: str = field(default="pd,ampd", metadata={
        "help": "router strategies to rank, comma-separated (at least two)"})
    trace: str = field(default="hotpotqa", metadata={"help": "trace name or file"})
    programs: int = field(default=24, metadata={"help": "programs to replay"})
    jps: float = field(default=4.0, metadata={"help": "arrival rate, jobs/s"})
    seed: int = field(default=0, metadata={"help": "trace and engine seed"})
    time_scale: float = field(default=1.0, metadata={
        "help": "multiply arrival gaps and tool times (both modes alike)"})
    tie: float = field(default=0.1, metadata={
        "help": "relative difference under which two strategies tie (wall-clock runs on "
        "shared cores vary by several percent)"})
    port: int = field(default=8390, metadata={"help": "the served router's port"})
    base_port: int = field(default=8400, metadata={"help": "the replicas' first port"})
    startup_timeout: float = field(default=600.0, metadata={
        "help": "seconds to wait for the served cluster"})
    out: str = field(default="runs/served-vs-virtual", metadata={"help": "output folder"})
    ray: bool = field(default=False, metadata={
        "help": "serve the cluster on Ray Serve (a local Ray), not local processes"})
    ray_address: str | None = field(default=None, metadata={
        "help": "serve the cluster on the running Ray cluster at this address"})
    ray_transport: str = field(default="http", metadata={
        "choices": ("serve", "http"),
        "help": "on Ray, how the router reaches the engines (`harness cluster serve "
        "--transport`)"})

    def __post_init__(self) -> None:
        if len(self.strategy_names()) < 2:
            raise ExperimentError("--strategies: give at least two to rank")

    def strategy_names(self) -> list[str]:
        return [s.strip() for s in self.strategies.split(",") if s.strip()]


def _served_file(config: Any, strategy: str, out: Path) -> Path:
    """The cluster file with `strategy` as its router (JSON is YAML)."""
    data = config.model_dump(mode="json")
    data["router"]["strategy"] = strategy
    path = out / f"cluster-{strategy}.json"
    write_text_atomic(path, json.dumps(data, indent=1))
    return path


def _serve(path: Path, port: int, base_port: int, logs: Path,
           ray: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "cluster", "serve", str(path), "--port", str(port),
         "--base-port", str(base_port), "--log-dir", str(logs), *ray],
        stdout=(logs.parent / f"{logs.name}.out").open("w"), stderr=subprocess.STDOUT,
        start_new_session=True)


def _wait(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ExperimentError(f"`harness cluster serve` exited with {process.returncode}")
        try:  # every replica up (on Ray the router answers before its replicas do)
            state = httpx.get(url + "/v1/cluster", timeout=2).json()
            if all(r["alive"] for r in state["replicas"]):
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(1)
    raise ExperimentError(f"the served cluster did not answer in {timeout_s:.0f} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the launcher alone: it stops its replicas; SIGKILL the group if it does
    not."""
    stop_process_group(process, grace_s=60, first=signal.SIGTERM, whole_group_first=False,
                       reap_s=None)


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


def run_served_vs_virtual(options: ServedVsVirtualOptions) -> int:
    """Both replays per strategy, the report printed and written to `options.out`; exit
    status 0. A bad cluster file or fewer than two strategies raise `ExperimentError`."""
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        config = load_cluster(options.cluster)
    except ClusterConfigError as exc:
        raise ExperimentError(str(exc)) from None
    strategies = options.strategy_names()
    workload = Workload(options.trace, options.programs, (options.jps,), seed=options.seed,
                        time_scale=options.time_scale)
    engine = EngineSpec(profile=config.replicas[0].profile, seed=options.seed)
    runs = ClusterRuns.load(options.cluster, strategies)
    virtual = bench(BenchSpec(workload, tuple(runs.labels())), Cluster.of(runs, engine),
                    out / "virtual")
    rows_virtual = {r["policy"]: r for r in virtual.results}
    rows_served: dict[str, dict[str, Any]] = {}
    for strategy in strategies:
        path = _served_file(config, strategy, out)
        url = f"http://127.0.0.1:{options.port}"
        ray = (["--address", options.ray_address] if options.ray_address
               else ["--ray"] if options.ray else [])
        ray += ["--transport", options.ray_transport] if ray else []
        process = _serve(path, options.port, options.base_port, out / f"logs-{strategy}", ray)
        try:
            _wait(url, process, options.startup_timeout)
            served = bench(BenchSpec(workload, (strategy,)), Served(HttpTarget(url), engine),
                           out / f"served-{strategy}")
            rows_served[strategy] = served.results[0]
            rows_served[strategy]["router"] = httpx.get(url + "/v1/cluster", timeout=10).json()
        finally:
            _stop(process)
    lines = [f"# Served against virtual: {config.name}, {options.trace}, {options.programs} "
             f"programs at {options.jps:g} jobs/s (time x{options.time_scale:g})", "",
             "| strategy | mode | " + " | ".join(KEYS) + " |", "|---|---|" + "---:|" * len(KEYS)]
    for strategy in strategies:
        for mode, rows in (("virtual", rows_virtual), ("served", rows_served)):
            row = rows[strategy]
            lines.append(f"| {strategy} | {mode} | "
                         + " | ".join(f"{row.get(k, math.nan):.3f}" for k in KEYS) + " |")
    agree = {}
    for key, higher in (("jct_mean_s", False), ("slo_attainment", True)):
        v = ranking(rows_virtual, key, higher, options.tie)
        s = ranking(rows_served, key, higher, options.tie)
        agree[key] = [sorted(g) for g in v] == [sorted(g) for g in s]
        lines.append(f"\nBy {key} (within {options.tie:.0%} is a tie): virtual {_order(v)}; "
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
