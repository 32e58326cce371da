"""The sweep: every policy at every load on the same programs, then the outputs.

Why one call (`bench`) for all of it: the command line (`cli.bench`) and the experiments built on
it (`eval.experiments.served_vs_virtual`) want the same sweep with the same outputs
(``summary.json``, ``report.md``, the plots, ``runs/``), so a served run and a virtual one can be
set side by side; they differ only in the `BenchSpec` and the back end they pass
(`eval.bench.backends.Backend`), and the loop below is the same for all of them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from common.atomic import write_text_atomic
from common.trace import Trace, summarize
from eval.bench.backends import Backend
from eval.bench.floor import add_bounds
from eval.bench.isolated import IsolatedCost, log_isolated
from eval.bench.parallel import executor
from eval.bench.plots import plot
from eval.bench.report import report_markdown
from eval.bench.rows import log_run, make_row, write_json
from eval.bench.runs import BenchSpec
from eval.bench.specs import check_profile
from eval.bench.summary import BenchSummary
from eval.bench.traces import fit_context, make_traces


def bench(spec: BenchSpec, backend: Backend, out: Path, console: Any = None) -> BenchSummary:
    """Replay every run of `spec` on `backend`, write ``summary.json``, ``report.md``, the plots
    and ``runs/`` to `out`, and return the summary. A user's mistake raises `BenchError`
    before any engine starts."""
    workload = spec.workload
    traces, skipped = fitted_traces(spec, backend, console)
    first = next(iter(traces.values()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs").mkdir(exist_ok=True)
    started = time.perf_counter()
    rows, isolated, cost = _replay_all(spec, backend, traces, out, console)
    floors = {}
    if not workload.concurrency:  # arrivals at a rate: the throughput bound, where there is one
        floors = {x: f for x in workload.jps if (f := backend.floor(traces[x])) is not None}
    isolated_mean = sum(isolated.values()) / len(isolated)
    add_bounds(rows, floors, isolated_mean)
    summary = _summary(spec, backend, first, skipped, isolated_mean, floors, cost, rows)
    summary.wall_s = time.perf_counter() - started
    data = summary.to_json()
    write_json(out / "summary.json", data)
    write_text_atomic(out / "report.md", report_markdown(data))
    plot(data, out)
    return summary


def fitted_traces(spec: BenchSpec, backend: Backend,
                  console: Any) -> tuple[dict[Any, Trace], list[str]]:
    """The programs of `spec` at each load, checked before any engine starts: the profile
    loads, and no turn is longer than `backend`'s context (or it is left out with
    ``--too-long skip``, one line each on `console`, and named in the second list)."""
    check_profile(backend.engine)
    workload = spec.workload
    traces, skipped = fit_context(make_traces(workload), backend.context_limit(),
                                  workload.too_long)
    for line in skipped:
        if console is not None:
            console.print(f"[yellow]skipped[/yellow] {line}")
    return traces, skipped


def _replay_all(spec: BenchSpec, backend: Backend, traces: dict[Any, Trace], out: Path,
                console: Any
                ) -> tuple[list[dict[str, Any]], dict[str, float], IsolatedCost | None]:
    """The isolated JCTs and every run's row, in `spec.runs` order: submitted together, taken
    in order (in this process one after another, or `spec.jobs` worker processes at once)."""
    first = next(iter(traces.values()))
    n = len(first)
    runs = spec.runs()
    rows: list[dict[str, Any]] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as bars, \
            executor(spec.jobs if backend.parallel else 1) as pool:
        def follow(task: Any) -> Any:  # a bar's callback, where the call runs in this process
            return (lambda k: bars.update(task, completed=k)) if pool.live else None

        iso_task = bars.add_task("isolated JCTs", total=n)
        tasks = {run: bars.add_task(run.label(), total=n) for run in runs}
        iso = pool.submit(backend.isolated, first, out, follow(iso_task))
        pending = [(run, pool.submit(backend.replay, traces[run.jps], run, follow(tasks[run])))
                   for run in runs]
        isolated, cost = iso.result()
        bars.update(iso_task, completed=n)
        log_isolated(console, n, cost)
        for run, replay in pending:  # in order; in workers later ones may already be done
            replayed = replay.result()
            bars.update(tasks[run], completed=n)
            row = make_row(run, replayed.result, backend.metrics(replayed, isolated, spec.slo),
                           isolated, out)
            rows.append(row)
            log_run(console, run.label(), row, n)
    return rows, isolated, cost


def _summary(spec: BenchSpec, backend: Backend, first: Trace, skipped: list[str],
             isolated_mean: float, floors: dict[Any, dict[str, float]],
             cost: IsolatedCost | None, rows: list[dict[str, Any]]) -> BenchSummary:
    workload, engine = spec.workload, backend.engine
    tokens, seqs = (engine.max_num_batched_tokens, engine.max_num_seqs) \
        if backend.mode.startswith("http") else engine.emulated_batch_limits()
    return BenchSummary(
        trace=workload.trace, trace_name=first.name, programs=len(first),
        profile=engine.profile_name, seed=workload.seed,
        num_gpu_blocks=engine.num_gpu_blocks, max_model_len=engine.max_model_len,
        max_num_batched_tokens=tokens, max_num_seqs=seqs,
        long_prefill_token_threshold=engine.long_prefill_token_threshold,
        offload_gib=engine.offload_gib, offload_copy_model=engine.offload_copy_model,
        trace_stats=summarize(first).model_dump(), skipped_too_long=skipped,
        time_scale=workload.time_scale, warm_prefix_pct=workload.warm_prefix_pct,
        slo={"ttft_s": spec.slo.ttft_s, "tpot_s": spec.slo.tpot_s},
        mode=backend.mode, cluster=backend.cluster(), policies=list(spec.policies),
        jps=list(workload.jps),
        concurrency=list(workload.concurrency) if workload.concurrency else None,
        steady=spec.steady, jobs=spec.jobs, isolated_jct_mean_s=isolated_mean,
        floors=[{"jps": x, **floor} for x, floor in floors.items()],
        isolated_wall_s=None if cost is None else cost.wall_s,
        isolated_cpu_s=None if cost is None else cost.cpu_s,
        isolated_engine_steps=None if cost is None else cost.engine_steps,
        wall_s=0.0, results=rows)
