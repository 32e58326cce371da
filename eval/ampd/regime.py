"""`harness cluster bench --gpus N --itl-slo A,B,...`: AMPD's regime map. For each trace, load
and ITL SLO, AMPD's SLO attainment against the best tuned co-located deployment (vLLM) and the
best tuned disaggregated one (Dynamo-like `pd`), every strategy on the same N GPUs.

Why a map and why tuned: AMPD reports its gains (+67 % over Dynamo, +340 % over vLLM, on
average) where "disaggregated serving often outperforms co-located serving because its ITL
advantage dominates", with each baseline deployed as well as it can be on the paper's GPU
count. A comparison at one layout and one SLO (`eval.ampd.bench`'s table) cannot say whether
that regime exists here; the map says, per cell, who wins and by how much.

Tuning (the same for every strategy, chosen after the fact per cell): every deployment of the
N GPUs at a uniform tensor-parallel degree d in `--tp` (those the model fits at and that divide
N): co-located, N/d replicas; disaggregated, every split of the N/d replicas into p prefill
and N/d - p decode replicas (p >= 1 each); and every *mixed* P/D deployment, p prefill
replicas at one degree and q decode replicas at another that use all N GPUs (p * d_p + q * d_d
= N, e.g. the paper's DuReader plan TP4 2P + TP8 1D on 16). Each strategy's attainment in a
cell is its best over its deployments, and the map names that deployment. Degrees stay one per
role (the planner's plans are of that form, `cluster.planner`).

Cost: `vllm` and `pd` read neither SLO (FCFS queues, session / least-loaded routing), so each
runs once per deployment and its turns are scored against every ITL SLO (`run_one`'s
``itl_slos``). `ampd` routes against the ITL SLO (Algorithm 1 step 2) and is run once per
SLO. Rows, settings and the map are written to ``regime.json`` and ``regime.md``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cluster.plan_bounds import prefill_capacity
from common.atomic import write_text_atomic
from common.metrics import SLO
from eval.ampd.bench import (
    GPUS_PER_NODE,
    ITL_METRICS,
    STRATEGIES,
    AmpdBenchError,
    Fleet,
    Outputs,
    RunConfig,
    Workload,
    run_one,
    trace_slo,
)
from eval.workloads.registry import load_or_generate
from server.engine import NoProgress
from server.perf.registry import load_profile

DEFAULT_ITL_SLOS = "0.03,0.05,0.1"
DEFAULT_TP = "2,4,8"
#: AMPD's published average gains in SLO attainment (abstract and section 7): over Dynamo
#: (disaggregated) and over vLLM (co-located).
PAPER_GAIN = {"disaggregated": 0.67, "co-located": 3.40}
#: The kinds of the map and the strategy each runs (`dynamo`: every prefill remote and from
#: scratch, the paper's baseline; `disaggregated`: ours, which pulls the history's KV).
KINDS = {"co-located": "vllm", "disaggregated": "pd", "dynamo": "dynamo", "ampd": "ampd"}
#: The baselines AMPD has to beat in a cell.
BASELINES = ("co-located", "disaggregated", "dynamo")

_PROFILE = re.compile(r"^(?P<gpu>[a-z][a-z0-9]*?)(?:x\d+)?-(?P<model>.+)$")


@dataclass(frozen=True)
class Deployment:
    """N GPUs as replicas of one TP degree: co-located (`layout` None) or P/D; a mixed P/D
    deployment's decode replicas run `decode_profile` at `decode_tp`."""

    profile: str  # the (prefill) replicas' profile, `{gpu}x{tp}-{model}`
    tp: int
    replicas: int
    layout: tuple[int, int] | None
    decode_profile: str | None = None
    decode_tp: int | None = None

    @property
    def gpus(self) -> int:
        if self.layout is None or self.decode_tp is None:
            return self.tp * self.replicas
        return self.tp * self.layout[0] + self.decode_tp * self.layout[1]

    @property
    def label(self) -> str:
        if self.layout is None:
            return f"TP{self.tp} x{self.replicas}"
        if self.decode_tp is not None:
            return f"TP{self.tp} {self.layout[0]}P + TP{self.decode_tp} {self.layout[1]}D"
        return f"TP{self.tp} {self.layout[0]}P{self.layout[1]}D"


@dataclass(frozen=True)
class DeploymentSpace:
    """The deployments every strategy of the map is tried on: each of `gpus` GPUs of
    `profile`'s GPU and model at the TP `degrees` (`deployments`), or of those only the ones
    `only` names by label (``TP8 x1``, ``TP4 1P1D``)."""

    gpus: int
    profile: str
    degrees: Sequence[int]
    only: Sequence[str] | None = None


@dataclass(frozen=True)
class SloGrid:
    """The SLOs of the map: each ITL bound in `itl` with one TTFT bound, `ttft_s`, or with
    `ttft_k` k x each trace's idle TTFT on `ttft_profile` (default: the deployments'
    profile)."""

    itl: Sequence[float]
    ttft_s: float
    ttft_k: float | None = None
    ttft_profile: str | None = None


def same_label(a: str, b: str) -> bool:
    """Labels compared as `--deployments` gives them: case and spaces do not matter."""
    return a.replace(" ", "").lower() == b.replace(" ", "").lower()


def deployments(profile: str, gpus: int, degrees: Sequence[int],
                mixed: bool = True) -> list[Deployment]:
    """Every deployment of `gpus` GPUs of `profile`'s GPU and model (its own TP is ignored) at
    each degree in `degrees` that the model fits at: uniform ones (the degree divides `gpus`)
    and, with `mixed`, P/D ones with one degree per role that use every GPU."""
    m = _PROFILE.match(profile.lower())
    if not m:
        raise AmpdBenchError(f"--profile {profile!r}: expected GPU[xN]-MODEL")
    fits: dict[int, str] = {}
    for tp in sorted(set(degrees)):
        name = f"{m['gpu']}x{tp}-{m['model']}"
        try:
            load_profile(name).kv_capacity_tokens(0.9)
        except ValueError:  # the model does not fit on tp GPUs
            continue
        if tp >= 1:
            fits[tp] = name
    out: list[Deployment] = []
    for tp, name in fits.items():
        if gpus % tp:
            continue
        n = gpus // tp
        out.append(Deployment(name, tp, n, None))
        out += [Deployment(name, tp, n, (p, n - p)) for p in range(1, n)]
    if mixed:
        for tp_p, name_p in fits.items():
            for tp_d, name_d in fits.items():
                if tp_p == tp_d:
                    continue
                for p in range(1, gpus // tp_p + 1):
                    rest = gpus - p * tp_p
                    if rest >= tp_d and rest % tp_d == 0:
                        q = rest // tp_d
                        out.append(Deployment(name_p, tp_p, p + q, (p, q), name_d, tp_d))
    if not out:
        raise AmpdBenchError(f"no deployment of {gpus} GPUs at TP {sorted(set(degrees))} fits "
                             f"{m['model']} on {m['gpu']}; give more GPUs or other --tp")
    return out


def prefill_overload(trace: Any, dep: Deployment, load: float) -> float | None:
    """`load` over what the deployment's prefill replicas sustain (`cluster.plan_bounds`, the
    planner's capacity bound): above 1 the prefill queue has no steady state. Kept with a run
    that could not finish, the measured setting of issue 28's TP2 `NoProgress`."""
    if dep.layout is None:
        return None
    return load / (dep.layout[0] * prefill_capacity(trace.programs, load_profile(dep.profile)))


def _runs(deps: Sequence[Deployment], itl_slos: Sequence[float],
          kinds: Sequence[str] = tuple(KINDS)) -> list[tuple[str, Deployment, float | None]]:
    """(kind, deployment, the ITL SLO it runs against or None for all) of one cell group."""
    runs: list[tuple[str, Deployment, float | None]] = []
    for d in deps:
        if d.layout is None:
            if "co-located" in kinds:
                runs.append(("co-located", d, None))
        else:
            runs += [(k, d, None) for k in kinds if k in ("disaggregated", "dynamo")]
            if "ampd" in kinds:
                runs += [("ampd", d, x) for x in itl_slos]
    return runs


def regime(workload: Workload, loads: dict[str, Sequence[float]], space: DeploymentSpace,
           slos: SloGrid, *, outputs: Outputs, history: str = "pull") -> dict[str, Any]:
    """Run the sweep; write ``regime.json`` and ``regime.md`` to `outputs`. `loads`: jobs/s
    per trace. `history`: how a P/D deployment's prefill replicas get the history they lack
    (`eval.ampd.bench.HISTORY`)."""
    traces, programs, seed = workload.traces, workload.programs, workload.seed
    itl_slos, console = slos.itl, outputs.console
    if not itl_slos or any(not (x > 0 and math.isfinite(x)) for x in itl_slos):
        raise AmpdBenchError("--itl-slo: give positive seconds, e.g. 0.03,0.05,0.1")
    deps = _deployments_of(space)
    runs = _runs(deps, itl_slos)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    total = sum(len(loads[t]) for t in traces) * len(runs)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, disable=console is None) as bar:
        overall = bar.add_task("runs", total=total)
        for name in traces:
            for x in loads[name]:
                trace = load_or_generate(name, programs, x, seed)
                ttft = trace_slo(name, SLO(slos.ttft_s, max(itl_slos)),
                                 slos.ttft_profile or space.profile, slos.ttft_k).ttft_s
                for kind, dep, slo_itl in runs:
                    slo = SLO(ttft, slo_itl if slo_itl is not None else max(itl_slos))
                    fleet = Fleet(dep.replicas, dep.profile, decode_profile=dep.decode_profile,
                                  history=history)
                    try:
                        row = run_one(trace, RunConfig(STRATEGIES[KINDS[kind]], dep.layout),
                                      fleet, slo=slo, seed=seed,
                                      itl_slos=itl_slos if slo_itl is None else (slo_itl,))
                    except (NoProgress, AmpdBenchError) as exc:
                        # the deployment cannot run the trace (a conversation longer than
                        # its KV cache; admission starved): not a candidate, said in the map
                        row = {"slo_by_itl": {}, "wall_s": math.nan,
                               "failed": f"{type(exc).__name__}: {str(exc)[:300]}",
                               "prefill_load_x": prefill_overload(trace, dep, x)}
                    row.update(trace=name, jps=x, kind=kind, deployment=dep.label,
                               itl_slo=slo_itl)
                    rows.append(row)
                    bar.advance(overall)
                    if console is not None and not console.is_terminal:
                        console.print(f"{name} @ {x:g} jobs/s: {kind} {dep.label}"
                                      + ("" if slo_itl is None else f" (ITL {slo_itl:g} s)")
                                      + f": wall {row['wall_s']:.1f} s"
                                      + (f", FAILED {row['failed']}" if "failed" in row
                                         else ""), soft_wrap=True)
    summary = {
        "what": "AMPD's regime map (eval.ampd.regime), virtual time",
        "command": outputs.command,
        "traces": list(traces), "loads": {t: list(loads[t]) for t in traces},
        "programs": programs, "gpus": space.gpus, "gpus_per_node": GPUS_PER_NODE,
        "deployments": [d.label for d in deps], "ttft_slo_s": slos.ttft_s,
        "itl_slos": list(itl_slos), "seed": seed, "history": history, "ttft_k": slos.ttft_k,
        "wall_s": time.perf_counter() - started, "rows": rows,
    }
    summary["maps"] = {m: regime_map(rows, itl_slos, m) for m in (*ITL_METRICS, "program")}
    out = outputs.out
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "regime.json",
                      json.dumps(summary, indent=1, allow_nan=True, default=str) + "\n")
    write_text_atomic(out / "regime.md", regime_markdown(summary))
    return summary


def _deployments_of(space: DeploymentSpace) -> list[Deployment]:
    """The space's deployments (`deployments`), those `space.only` names if it names any."""
    deps = deployments(space.profile, space.gpus, space.degrees)
    if space.only:
        deps = [d for d in deps if any(same_label(d.label, w) for w in space.only)]
        if not deps:
            every = deployments(space.profile, space.gpus, space.degrees)
            raise AmpdBenchError(f"--deployments {', '.join(space.only)}: none of them "
                                 f"is a deployment of {space.gpus} GPUs at TP "
                                 f"{sorted(set(space.degrees))}"
                                 f" (those are: {', '.join(d.label for d in every)})")
    return deps


def _best(rows: Sequence[dict[str, Any]], itl: float, metric: str) -> tuple[float, str]:
    key, field = f"{itl:g}", "slo_by_itl" if metric == "mean" else f"slo_by_itl_{metric}"
    scored = [(r[field][key], r["deployment"]) for r in rows if key in r.get(field, {})]
    return max(scored, key=lambda s: s[0]) if scored else (math.nan, "-")


def regime_map(rows: Sequence[dict[str, Any]], itl_slos: Sequence[float],
               metric: str = "mean") -> list[dict[str, Any]]:
    """One cell per (trace, load, ITL SLO): each kind's best attainment and deployment, the
    winner, and AMPD's relative gain over the best of each baseline kind. `metric`
    (`ITL_METRICS`): which of a turn's inter-token latencies the ITL SLO bounds."""
    cells = []
    for trace, x in dict.fromkeys((r["trace"], r["jps"]) for r in rows):
        mine = [r for r in rows if r["trace"] == trace and r["jps"] == x]
        for itl in itl_slos:
            cell: dict[str, Any] = {"trace": trace, "jps": x, "itl_slo": itl}
            for kind in KINDS:
                value, where = _best([r for r in mine if r["kind"] == kind], itl, metric)
                cell[kind] = value
                cell[f"{kind}_deployment"] = where
            baselines = {k: cell[k] for k in BASELINES if not math.isnan(cell[k])}
            # a tie goes to a baseline: AMPD has to beat it
            cell["winner"] = max(KINDS, key=lambda k: (
                -1.0 if math.isnan(cell[k]) else cell[k], k != "ampd"))
            for k, v in baselines.items():
                cell[f"gain_over_{k}"] = (cell["ampd"] / v - 1) if v > 0 else math.inf
            cell["margin"] = cell["ampd"] - max(baselines.values(), default=math.nan)
            cells.append(cell)
    return cells


def _pct(x: float) -> str:
    if math.isnan(x):
        return "-"
    return "inf" if math.isinf(x) else f"{100 * x:+.0f}%"


#: What each ITL metric's table says the SLO bounds.
METRIC_WORDS = {"mean": "the turn's mean inter-token latency (the project's SLO)",
                "program": "the turn's mean inter-token latency, attainment per program (every "
                           "turn of it within both SLOs)",
                "p90": "the P90 of the turn's token gaps",
                "max": "every token gap of the turn (its longest)"}


def regime_markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"# AMPD's regime map: {summary['gpus']} GPUs, TTFT SLO "
        + (f"{summary['ttft_k']:g} x each trace's idle TTFT" if summary.get("ttft_k")
           else f"{summary['ttft_slo_s']:g} s"),
        "", f"`{summary['command']}`" if summary.get("command") else "",
        "", f"{summary['programs']} programs per trace and load, seed {summary['seed']}; "
        f"deployments tried by every strategy: {', '.join(summary['deployments'])}. SLO "
        "attainment = share of turns with TTFT and ITL within the SLO; each kind's best "
        f"deployment per cell. Wall time {summary['wall_s']:.0f} s."]
    for metric, cells in summary["maps"].items():
        lines += ["", f"## ITL SLO on {METRIC_WORDS[metric]}", ""]
        lines += map_table(cells)
    failed = [r for r in summary.get("rows", []) if r.get("failed")]
    if failed:
        lines += ["", "Runs that could not finish (not candidates for their kind's best):"]
        lines += [f"- {r['trace']} {r['jps']:g} jobs/s, {r['kind']} {r['deployment']}"
                  + ("" if r["itl_slo"] is None else f" (ITL {r['itl_slo']:g} s)")
                  + f": {r['failed'].split(' with ')[0]}"
                  + (f" (load {r['prefill_load_x']:.1f} x the prefill side's capacity)"
                     if r.get("prefill_load_x") else "") for r in failed]
    return "\n".join(lines) + "\n"


def _best_cell(c: dict[str, Any], kind: str) -> str:
    return "-" if math.isnan(c[kind]) else f"{c[kind]:.3f} ({c[f'{kind}_deployment']})"


def map_table(cells: Sequence[dict[str, Any]]) -> list[str]:
    """One map as markdown lines: the table and the cells where AMPD wins."""
    lines = ["| trace | jobs/s | ITL SLO | AMPD (best) | co-located vLLM (best) | P/D, history "
             "pulled (best) | Dynamo, from scratch (best) | winner | AMPD vs co-located | "
             "AMPD vs P/D | AMPD vs Dynamo |",
             "|---|---:|---:|---|---|---|---|---|---:|---:|---:|"]
    for c in cells:
        lines.append(
            f"| {c['trace']} | {c['jps']:g} | {c['itl_slo']:g} | {_best_cell(c, 'ampd')} | "
            f"{_best_cell(c, 'co-located')} | {_best_cell(c, 'disaggregated')} | "
            f"{_best_cell(c, 'dynamo')} | {c['winner']} | "
            + " | ".join(_pct(c.get(f"gain_over_{k}", math.nan)) for k in BASELINES) + " |")
    wins = [c for c in cells if c["margin"] > 0]
    lines += ["", f"AMPD beats every tuned baseline in {len(wins)} of {len(cells)} cells"
              + (": " + "; ".join(f"{c['trace']} {c['jps']:g} jobs/s ITL {c['itl_slo']:g} s "
                                   f"(+{c['margin']:.3f})" for c in wins) if wins else "")
              + ". The paper's average gains: "
              f"{_pct(PAPER_GAIN['disaggregated'])} over Dynamo, "
              f"{_pct(PAPER_GAIN['co-located'])} over vLLM."]
    return lines
