"""`harness cluster bench`: AMPD against its baselines on the paper's multi-round workloads, in
virtual time (issue 12's evaluation). Its options are `cli.cluster`'s.

Why a command of its own beside `harness bench --cluster`: AMPD's comparison is not "one
cluster file under several routers". Its strategies differ in layout (co-located replicas vs
prefill/decode replicas), router and queue policy at once, on an equal GPU count, and its
headline figures are SLO attainment split by TTFT and ITL, the TTFT of initial vs incremental
prefills, and *why* each prefill went where it did (the router's decision counts). This module
builds each strategy's cluster from one set of knobs (replicas, profile, SLO), replays the same
trace through each (`sim.loop`), and reports with the one metrics module
(`common.metrics`).

Strategies (every one on the same number of replicas of the same profile):

| name | layout | router | queue policy |
|---|---|---|---|
| `vllm` | co-located | `session` (a program stays on its replica) | `vllm` (FCFS) |
| `continuum` | co-located | `session` | `continuum` (pins the KV cache over tool calls) |
| `pd` | P/D | `pd` (every prefill remote, Dynamo-like) | `vllm` |
| `dynamo` | P/D | `pd`, every prefill from scratch (no history pull, no cache on P) | `vllm` |
| `ampd` | P/D | `ampd` (Algorithm 1: remote / local per prefill) | `ampd` (Algorithm 2) |
| `ampd-noroute` | P/D | `pd` | `ampd` (reordering only) |
| `ampd-noreorder` | P/D | `ampd` | `vllm` (routing only) |

P/D strategies run once per `--layouts` entry (`1p3d`, `2p2d`: prefill and decode replica
counts). One SLO (`--slo-ttft`, `--slo-itl`) is what AMPD's router keeps slack against, what its
reordering counts tasks against, and what attainment is measured against.

Defaults are our reading of AMPD's setting (section 7.1): Llama-3.1-70B on H20 GPUs, four
replicas at tensor-parallel degree 4 (16 GPUs, 8 per node), NVLink inside a node and
InfiniBand between nodes (the cluster file defaults). The SLO defaults are the project's
(`common.metrics.SLO`: TTFT 2 s, TPOT/ITL 0.1 s), not numbers fitted to any result.

Outputs in `--out`: ``rows.json`` (the settings and one row per trace, load and config),
``report.md`` (the tables) and, unless ``--no-plot``, ``slo_vs_load.png``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cluster.config import ClusterConfigError, parse_cluster
from common.atomic import write_text_atomic
from common.metrics import SLO, cluster_metrics, percentile, replay_metrics
from common.trace import Trace
from eval import ExperimentError
from eval.ampd.plot import plot_slo
from eval.workloads.ampd import idle_ttft_s
from eval.workloads.registry import load_or_generate
from server.engine import ContextTooLong
from server.perf.registry import load_profile
from sim.engines import pd_replica
from sim.loop import replay_cluster
from sim.virtual_cluster import VirtualCluster

#: `harness cluster bench`'s defaults (`cli.cluster`): our reading of AMPD's setting, above.
DEFAULT_PROFILE = "h20x4-llama-3.1-70b"
DEFAULT_TRACES = "hotpotqa,toolbench"
DEFAULT_JPS = "0.25,0.5,1"
DEFAULT_LAYOUTS = "1p3d,2p2d"
#: How a prefill replica gets the history it lacks (the program's last turns ran elsewhere, e.g.
#: locally under AMPD): ``pull`` reads it from the decode replica's export (vLLM's
#: `bidirectional_kv_xfer`, AMPD's remote path, priced by its Eq. 2), ``recompute`` prefills it
#: again (a P/D deployment without the export).
HISTORY = ("pull", "recompute")
GPUS_PER_NODE = 8  # a node of 8 GPUs (AMPD section 7.1), for which link a KV transfer takes


class AmpdBenchError(ExperimentError):
    """A user mistake in `harness cluster bench` arguments (printed without a traceback)."""


@dataclass(frozen=True)
class Strategy:
    """One serving strategy: how replicas are laid out, routed and ordered."""

    name: str
    disaggregated: bool  # prefill/decode replicas (one run per layout) or co-located ones
    router: str  # `cluster.routing` strategy
    policy: str  # `server.policies` name every replica runs
    about: str
    #: how a prefill replica gets history (`HISTORY`); None: the bench's `--history`
    history: str | None = None
    #: prefix caching on the prefill replicas (off: every prefill from scratch)
    prefill_cache: bool = True


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("vllm", False, "session", "vllm", "co-located, session-affine, vLLM's FCFS"),
    Strategy("continuum", False, "session", "continuum",
             "co-located, session-affine, Continuum's KV pinning over tool calls"),
    Strategy("pd", True, "pd", "vllm", "P/D, every prefill remote (Dynamo-like)"),
    Strategy("dynamo", True, "pd", "vllm", "P/D, every prefill remote and from scratch (the "
             "paper's Dynamo)", history="recompute", prefill_cache=False),
    Strategy("ampd", True, "ampd", "ampd", "P/D, adaptive routing + prefill reordering"),
    Strategy("ampd-noroute", True, "pd", "ampd", "P/D, every prefill remote + reordering"),
    Strategy("ampd-noreorder", True, "ampd", "vllm", "P/D, adaptive routing, FCFS queues"),
)}


@dataclass(frozen=True)
class RunConfig:
    """A strategy on a layout: (prefill, decode) replica counts, or None for co-located."""

    strategy: Strategy
    layout: tuple[int, int] | None

    @property
    def label(self) -> str:
        if self.layout is None:
            return self.strategy.name
        return f"{self.strategy.name} {self.layout[0]}P{self.layout[1]}D"


#: AMPD's own workloads; the registry's other traces are ours.
AMPD_WORKLOADS = ("toolbench", "gaia", "hotpotqa", "dureader")


@dataclass(frozen=True)
class Fleet:
    """The replicas a run's cluster is built of, whatever its strategy: `replicas` of
    `profile` (its decode replicas of `decode_profile` where that differs: mixed TP across
    roles, `cluster_config`), each with `num_gpu_blocks` KV blocks when given (else what the
    profile holds), and how a prefill replica gets the part of a program's history it lacks
    (`history`, one of `HISTORY`)."""

    replicas: int
    profile: str
    num_gpu_blocks: int | None = None
    decode_profile: str | None = None
    history: str = "pull"


@dataclass(frozen=True)
class Workload:
    """The programs a sweep replays: each of `traces` (registry names or trace files), its
    first `programs` drawn with `seed` (which seeds the routers and engines too), the same
    programs at every load and for every config."""

    traces: Sequence[str]
    programs: int
    seed: int


@dataclass(frozen=True)
class Outputs:
    """Where a sweep reports: the folder its files go to, the console its progress goes to
    (None: nothing shown) and the command line that asked for it, kept in its JSON."""

    out: Path
    console: Any = None
    command: str = ""


def run_configs(strategies: Sequence[Strategy],
                layouts: Sequence[tuple[int, int]]) -> list[RunConfig]:
    out: list[RunConfig] = []
    for s in strategies:
        out += [RunConfig(s, lay) for lay in layouts] if s.disaggregated else [RunConfig(s, None)]
    return out


# -- one run -----------------------------------------------------------------------------------
def cluster_config(run: RunConfig, *, replicas: int, profile: str, slo: SLO, seed: int,
                   num_gpu_blocks: int | None = None, decode_profile: str | None = None) -> Any:
    """The `ClusterConfig` a strategy runs on. `decode_profile`: the decode replicas' profile
    when it differs from the prefill replicas' `profile` (mixed TP across roles, e.g. the
    paper's DuReader plan P TP4 x2 + D TP8 x1); co-located replicas take `profile`.

    Replicas fill nodes of `GPUS_PER_NODE` GPUs in order (`node_of`); P/D replicas are
    interleaved (p0, d0, p1, d1, ...) so a node holds both roles where it can, as
    `cluster/examples/2p2d.yaml` does."""
    if run.layout is None:
        roles = [("r", "colocated", i) for i in range(replicas)]
    else:
        prefill = [("p", "prefill", i) for i in range(run.layout[0])]
        decode = [("d", "decode", i) for i in range(run.layout[1])]
        roles = [x for pair in zip(prefill, decode, strict=False) for x in pair]
        roles += prefill[len(decode):] + decode[len(prefill):]
    profiles = [decode_profile if role == "decode" and decode_profile else profile
                for _, role, _ in roles]
    nodes = node_of([load_profile(name).model.tp for name in profiles])
    specs = []
    for (prefix, role, i), name, node in zip(roles, profiles, nodes, strict=True):
        spec: dict[str, Any] = {"name": f"{prefix}{i}", "role": role, "profile": name,
                                "policy": run.strategy.policy, "node": node}
        if num_gpu_blocks is not None:
            spec["num_gpu_blocks"] = num_gpu_blocks
        specs.append(spec)
    data = {"name": run.label.replace(" ", "-"),
            "router": {"strategy": run.strategy.router, "seed": seed,
                       "ttft_slo_s": slo.ttft_s, "itl_slo_s": slo.tpot_s},
            "replicas": specs}
    try:
        return parse_cluster(data, run.label)
    except ClusterConfigError as exc:
        raise AmpdBenchError(str(exc)) from None


def node_of(degrees: Sequence[int]) -> list[int]:
    """The node of each replica of TP `degrees`, in order: the first node with that many free
    GPUs (first fit), so a TP group stays inside one node's NVLink as a real deployment keeps
    it. With one degree this is ``k * tp // 8``, the placement before mixed TP."""
    free: list[int] = []
    nodes = []
    for tp in degrees:
        node = next((i for i, f in enumerate(free) if f >= tp), None)
        if node is None:
            free.append(GPUS_PER_NODE)
            node = len(free) - 1
        free[node] -= tp
        nodes.append(node)
    return nodes


def _engine_factory(config: Any, seed: int, history: str = "pull",
                    strategy: Strategy | None = None) -> Callable[[Any], Any]:
    """`sim.engines.pd_replica` (P/D replicas `bidirectional` when the history is pulled).
    The AMPD queue policy gets the run's TTFT SLO from the cluster (`cluster_config` puts it in
    `router.ttft_slo_s`), as a served replica does. A prefill replica running the `ampd` policy
    runs one prefill at a time (Eq. 3 assumes so); `strategy` may turn its prefix cache off."""
    history = (strategy.history if strategy is not None and strategy.history else history)
    cache = strategy.prefill_cache if strategy is not None else True

    def build(spec: Any) -> Any:
        return pd_replica(spec, config, seed, history=history, prefill_cache=cache)

    return build


def trace_slo(trace: str, slo: SLO, profile: str, ttft_k: float | None) -> SLO:
    """`slo`, or with `ttft_k` its TTFT bound set to k x the trace's idle TTFT on `profile`
    (`eval.workloads.ampd.idle_ttft_s`): one TTFT SLO per trace, as long rounds need."""
    if ttft_k is None:
        return slo
    try:
        return SLO(ttft_k * idle_ttft_s(trace, profile), slo.tpot_s)
    except ValueError as exc:
        raise AmpdBenchError(f"--slo-ttft-x: {exc}") from None


def program_attainment(programs: Sequence[Any], slo: SLO) -> float:
    """Share of finished programs whose every turn meets `slo`."""
    met = [all(slo.met(t) for t in p.turns) for p in programs]
    return sum(met) / len(met) if met else math.nan


def attainment(programs: Sequence[Any], slo: SLO) -> float:
    """Share of finished turns meeting `slo` (`common.metrics.SLO.met`)."""
    met = [slo.met(t) for p in programs for t in p.turns]
    return sum(met) / len(met) if met else math.nan


#: How a turn's inter-token latency is measured against the ITL SLO: ``mean`` (the project's
#: SLO, `common.metrics.tpot_of`), or per token: ``p90`` / ``max`` of the turn's token gaps
#: (`sim.records.TurnRecord.itl_p90` / ``itl_max``), which a prefill sharing a decode's step
#: inflates where the mean averages it away.
ITL_METRICS = ("mean", "p90", "max")


def gap_attainment(programs: Sequence[Any], slo: SLO, metric: str) -> float:
    """As `attainment`, the ITL bound checked on the turn's `metric` token gap (a turn without
    gaps, one output token, meets it as `SLO.met` has it)."""
    if metric == "mean":
        return attainment(programs, slo)
    turns = [t for p in programs for t in p.turns]
    met = [SLO(slo.ttft_s, math.inf).met(t)
           and (getattr(t, f"itl_{metric}") or 0.0) <= slo.tpot_s for t in turns]
    return sum(met) / len(met) if met else math.nan


def run_one(trace: Trace, run: RunConfig, fleet: Fleet, *, slo: SLO, seed: int,
            progress: Callable[[int], None] | None = None,
            itl_slos: Sequence[float] = ()) -> dict[str, Any]:
    """Replay `trace` on `run`'s cluster of `fleet`; one row of metrics (see `ROW_KEYS`).
    `itl_slos`: ITL SLOs to score the same turns against as well (``slo_by_itl``, SLO
    attainment with `slo`'s TTFT bound and each ITL bound): a strategy whose router and
    queues never read the ITL SLO runs once for a whole SLO sweep (`eval.ampd.regime`)."""
    if fleet.history not in HISTORY:
        raise AmpdBenchError(f"--history {fleet.history!r}: choose {' or '.join(HISTORY)}")
    config = cluster_config(run, replicas=fleet.replicas, profile=fleet.profile, slo=slo,
                            seed=seed, num_gpu_blocks=fleet.num_gpu_blocks,
                            decode_profile=fleet.decode_profile)
    wall = time.perf_counter()
    cluster = VirtualCluster(config, seed=seed, make_engine=_engine_factory(
        config, seed, fleet.history, run.strategy))
    try:
        result = replay_cluster(trace, cluster, progress=progress)
        decisions = dict(getattr(cluster.router, "decisions", {}))
    except ContextTooLong as exc:
        raise AmpdBenchError(f"{trace.name} on {run.label}: {exc}") from None
    finally:
        cluster.close()
    metrics = replay_metrics(result, None, slo)
    metrics.update(cluster_metrics(result, slo))
    programs = [p for p in result.programs.values() if p.finished is not None]
    row: dict[str, Any] = {
        "trace": trace.name, "jps": None, "config": run.label, "strategy": run.strategy.name,
        "layout": None if run.layout is None else f"{run.layout[0]}p{run.layout[1]}d",
        "router": run.strategy.router, "policy": run.strategy.policy,
    }
    row.update({k: metrics[k] for k in ROW_KEYS if k in metrics})
    row["jct_p90_s"] = percentile([p.jct for p in programs], 90)
    row["ttft_slo_attainment"] = attainment(programs, SLO(slo.ttft_s, math.inf))
    row["itl_slo_attainment"] = attainment(programs, SLO(math.inf, slo.tpot_s))
    for metric in ITL_METRICS:  # slo_by_itl (mean), slo_by_itl_p90, slo_by_itl_max
        key = "slo_by_itl" if metric == "mean" else f"slo_by_itl_{metric}"
        row[key] = {f"{x:g}": gap_attainment(programs, SLO(slo.ttft_s, x), metric)
                    for x in itl_slos}
    row["slo_by_itl_program"] = {f"{x:g}": program_attainment(programs, SLO(slo.ttft_s, x))
                                 for x in itl_slos}
    row["ttft_slo_s"] = slo.ttft_s
    row["kv_bytes_to_prefill"] = sum(r["kv_bytes_in"] for r in metrics["replicas"]
                                     if r["role"] == "prefill")
    row["decisions"] = decisions
    row["wall_s"] = time.perf_counter() - wall
    return row


#: What a row keeps of `common.metrics.replay_metrics` and `cluster_metrics`.
ROW_KEYS = ("programs", "turns", "jct_mean_s", "jct_p95_s", "makespan_s", "ttft_mean_s",
            "ttft_p95_s", "ttft_initial_mean_s", "ttft_incremental_mean_s", "itl_mean_s",
            "itl_p95_s", "slo_attainment", "program_slo_attainment", "slo_attainment_initial",
            "slo_attainment_incremental", "goodput_turns_per_s", "prefix_hit_rate",
            "recomputed_tokens", "local_prefill_share", "local_prefills", "remote_prefills",
            "kv_bytes_moved",
            "kv_seconds_moved", "preemptions", "load_balance_colocated", "load_balance_prefill",
            "load_balance_decode", "engine_steps", "ttft_p50_s", "ttft_p99_s",
            "ttft_initial_p95_s", "ttft_initial_p99_s", "ttft_incremental_p95_s",
            "ttft_incremental_p99_s")


# -- the sweep ---------------------------------------------------------------------------------
def bench(workload: Workload, configs: Sequence[RunConfig], loads: Sequence[float],
          fleet: Fleet, *, slo: SLO, outputs: Outputs, plot: bool = True,
          ttft_k: float | None = None) -> dict[str, Any]:
    """Every trace x load x config; writes ``rows.json``, ``report.md`` (and the plot) to
    `outputs`. The same programs (`workload`) are replayed at every load and by every config.
    `ttft_k`: each trace's TTFT SLO is k x its idle TTFT on the fleet's profile (`trace_slo`)
    instead of `slo`'s."""
    traces, programs, seed = workload.traces, workload.programs, workload.seed
    console = outputs.console
    if programs < 1:
        raise AmpdBenchError("--programs must be at least 1")
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    total = len(traces) * len(loads) * len(configs)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False,
                  disable=console is None) as bar:
        overall = bar.add_task("runs", total=total)
        for name in traces:
            for x in loads:
                trace = load_or_generate(name, programs, x, seed)
                for run in configs:
                    label = f"{name} @ {x:g} jobs/s: {run.label}"
                    task = bar.add_task(label, total=len(trace))
                    row = run_one(trace, run, fleet,
                                  slo=trace_slo(name, slo, fleet.profile, ttft_k), seed=seed,
                                  progress=lambda k, t=task: bar.update(t, completed=k))
                    row.update(trace=name, jps=x)
                    bar.update(task, completed=len(trace), visible=False)
                    bar.advance(overall)
                    rows.append(row)
                    if console is not None and not console.is_terminal:  # a log: one line a run
                        console.print(f"{label}: SLO {row['slo_attainment']:.3f}, mean JCT "
                                      f"{row['jct_mean_s']:.2f} s, wall {row['wall_s']:.1f} s",
                                      soft_wrap=True)
    summary = {
        "what": "AMPD vs baselines (eval.ampd.bench), virtual time",
        "command": outputs.command,
        "traces": list(traces), "jps": list(loads), "programs": programs,
        "replicas": fleet.replicas, "profile": fleet.profile, "gpus_per_node": GPUS_PER_NODE,
        "num_gpu_blocks": fleet.num_gpu_blocks, "seed": seed, "history": fleet.history,
        "slo": {"ttft_s": slo.ttft_s, "itl_s": slo.tpot_s}, "ttft_k": ttft_k,
        "configs": [{"config": c.label, "router": c.strategy.router,
                     "policy": c.strategy.policy, "about": c.strategy.about} for c in configs],
        "wall_s": time.perf_counter() - started,
        "rows": rows,
    }
    out = outputs.out
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "rows.json", json.dumps(summary, indent=1, allow_nan=True) + "\n")
    write_text_atomic(out / "report.md", report_markdown(summary))
    if plot:
        plot_slo(summary, out / "slo_vs_load.png")
    return summary


# -- outputs -----------------------------------------------------------------------------------
#: (row key, header, format) of the report's table
COLUMNS = [("trace", "trace", "{}"), ("jps", "jobs/s", "{:g}"), ("config", "config", "{}"),
           ("slo_attainment", "SLO", "{:.3f}"), ("ttft_slo_attainment", "TTFT SLO", "{:.3f}"),
           ("itl_slo_attainment", "ITL SLO", "{:.3f}"),
           ("jct_mean_s", "JCT mean s", "{:.2f}"), ("jct_p90_s", "JCT P90 s", "{:.2f}"),
           ("ttft_initial_mean_s/ttft_initial_p95_s/ttft_initial_p99_s",
            "TTFT initial s mean / P95 / P99", "{:.3f}"),
           ("ttft_incremental_mean_s/ttft_incremental_p95_s/ttft_incremental_p99_s",
            "TTFT incr. s mean / P95 / P99", "{:.3f}"),
           ("itl_mean_s", "ITL mean ms", "ms"),
           ("local_prefill_share", "local prefills", "{:.3f}"),
           ("recomputed_tokens", "recomputed tok", "{}"),
           ("decisions", "AMPD decisions", "decisions")]

#: short names of `cluster.ampd.AMPDRouter.decisions` for the table
_DECISION_ABBREV = {"initial": "init", "remote_slack": "R-slack", "local_slack": "L-slack",
                    "local_cost": "L-cost", "remote_cost": "R-cost",
                    "initial_remote_slack": "init R-slack", "initial_local_slack": "init L-slack",
                    "initial_local_cost": "init L-cost", "initial_remote_cost": "init R-cost"}


def cell(row: dict[str, Any], key: str, fmt: str) -> str:
    if "/" in key:  # a mean and its tail in one cell
        return " / ".join(cell(row, part, fmt) for part in key.split("/"))
    value = row.get(key)
    if fmt == "decisions":
        if not value:
            return "-"
        return " ".join(f"{_DECISION_ABBREV.get(k, k)} {v}" for k, v in value.items())
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if fmt == "ms":
        return f"{1000 * value:.1f}"
    return fmt.format(value)


def verdicts(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Per trace and load: the best config by SLO attainment, and AMPD's margin over the best
    baseline (a config whose strategy is not an AMPD variant)."""
    lines = []
    for trace, x in dict.fromkeys((r["trace"], r["jps"]) for r in rows):
        at = [r for r in rows if (r["trace"], r["jps"]) == (trace, x)]
        best = max(at, key=lambda r: r["slo_attainment"])
        line = (f"- {trace} @ {x:g} jobs/s: best `{best['config']}` "
                f"(SLO {best['slo_attainment']:.3f})")
        ampd = [r for r in at if r["strategy"] == "ampd"]
        base = [r for r in at if not r["strategy"].startswith("ampd")]
        if ampd and base:
            a = max(ampd, key=lambda r: r["slo_attainment"])
            b = max(base, key=lambda r: r["slo_attainment"])
            diff = a["slo_attainment"] - b["slo_attainment"]
            word = "beats" if diff > 0 else ("ties" if diff == 0 else "trails")
            line += (f"; `{a['config']}` {word} the best baseline `{b['config']}` by "
                     f"{diff:+.3f}")
        lines.append(line)
    return lines


def report_markdown(summary: dict[str, Any]) -> str:
    slo = summary["slo"]
    lines = [
        "# AMPD vs baselines (virtual time)", "",
        f"{summary['programs']} programs per trace and load, {summary['replicas']} replicas "
        f"of `{summary['profile']}` ({summary['gpus_per_node']} GPUs per node), seed "
        f"{summary['seed']}. SLO per turn: TTFT <= {slo['ttft_s']:g} s and mean ITL <= "
        f"{slo['itl_s']:g} s (SLO: both). History a prefill replica lacks: "
        f"{summary.get('history', 'pull')}. Wall time {summary['wall_s']:.0f} s.", "",
        "Configs: " + "; ".join(f"`{c['config']}` = {c['about']}"
                                for c in summary["configs"]) + ".", "",
        "AMPD decisions (initial prefills prefixed init): R-slack / L-slack = remote / local "
        "by slack (Algorithm 1 steps 1-2); R-cost / L-cost = by the Eq. 1-2 estimate (step "
        "3).", "",
        "| " + " | ".join(h for _, h, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r, k, f) for k, _, f in COLUMNS) + " |"
              for r in summary["rows"]]
    lines += ["", "## Who wins", "", *verdicts(summary["rows"]), ""]
    return "\n".join(lines)


def print_table(summary: dict[str, Any], console: Any) -> None:
    """The report's table and verdicts on stdout, as markdown: readable in a log or a terminal
    of any width (a boxed table of 13 columns is not), and pasteable into docs."""
    text = report_markdown(summary)
    print(text[text.index("| trace"):].rstrip())
    console.print(f"wall time {summary['wall_s']:.0f} s")
