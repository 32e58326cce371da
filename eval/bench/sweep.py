"""The sweep: every policy at every load on the same programs, then the outputs.

Why one call (`bench`) for all of it: the command line (`cli.bench`) and the experiments built on
it (`eval.experiments.served_vs_virtual`) want the same sweep with the same outputs
(``summary.json``, ``report.md``, the plots, ``runs/``), so a served run and a virtual one can be
set side by side; they differ only in what they pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from common.atomic import write_text_atomic
from common.metrics import SLO
from common.trace import Trace, summarize
from eval.bench.backends import replay_once
from eval.bench.floor import add_bounds, throughput_floor
from eval.bench.isolated import IsolatedCost, isolated_timed, log_isolated
from eval.bench.parallel import parallel_rows
from eval.bench.plots import plot
from eval.bench.report import report_markdown
from eval.bench.rows import load_text, log_run, make_row, write_json
from eval.bench.specs import BenchError, ClusterRuns, EngineSettings, HttpTarget
from eval.bench.traces import fit_context, make_trace
from eval.replay.http_replay import isolated_jcts_over_http, scale_trace
from server.perf.registry import load_profile


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
    settings = settings or EngineSettings()
    try:
        load_profile(profile, offload_copy_model=settings.offload_copy_model)
    except Exception as exc:  # noqa: BLE001 - any failure is a bad profile name here
        raise BenchError(f"--profile {profile!r}: {exc}") from None
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
        traces, skipped = fit_context(traces, cluster, profile, settings.num_gpu_blocks,
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
            rows, isolated, iso_timing = parallel_rows(runs, traces, first, profile, seed,
                                                       settings, out, slo, cluster, steady,
                                                       jobs, progress, iso_task, console)
        elif http is not None and http.isolated_over_http:
            isolated = isolated_jcts_over_http(first, http.url, model=http.model,
                                               progress=iso_progress)
        else:
            isolated, iso_timing = isolated_timed(first, profile, seed, out, settings,
                                                  iso_progress)
            log_isolated(console, n, iso_timing)
        progress.update(iso_task, completed=n)
        for policy, x, closed in runs if not rows else ():
            trace = traces[x]
            label = f"{policy} @ {load_text(x, closed)}"
            task = progress.add_task(label, total=n)
            row = _one_run(trace, policy, x, profile, seed, settings, isolated, out,
                           lambda k, t=task: progress.update(t, completed=k), http, slo,
                           cluster, closed, steady)
            progress.update(task, completed=n)
            rows.append(row)
            log_run(console, label, row, n)
    floors = {}
    if http is None and cluster is None and not concurrency:  # arrivals at a rate: bounds
        floors = {x: throughput_floor(traces[x], profile, settings.offload_copy_model,
                                      settings.max_num_batched_tokens) for x in jps}
    isolated_mean = sum(isolated.values()) / len(isolated)
    add_bounds(rows, floors, isolated_mean)
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
        "isolated_jct_mean_s": isolated_mean,
        # the throughput bound per load (`eval.bench.floor`): mean JCT, makespan, work
        "floors": [{"jps": x, **floor} for x, floor in floors.items()],
        # measuring the isolated JCTs (None: read from this folder's cache)
        "isolated_wall_s": None if iso_timing is None else iso_timing.wall_s,
        "isolated_cpu_s": None if iso_timing is None else iso_timing.cpu_s,
        "isolated_engine_steps": None if iso_timing is None else iso_timing.engine_steps,
        "wall_s": time.perf_counter() - started,
        "results": rows,
    }
    write_json(out / "summary.json", summary)
    write_text_atomic(out / "report.md", report_markdown(summary))
    plot(summary, out)
    return summary


def _one_run(trace: Trace, policy: str, x: float | None, profile: str, seed: int,
             settings: EngineSettings, isolated: dict[str, float], out: Path,
             progress: Callable[[int], None] | None, http: HttpTarget | None = None,
             slo: SLO | None = None, cluster: ClusterRuns | None = None,
             concurrency: int | None = None, steady: float = 0.0) -> dict[str, Any]:
    """Replay one policy at one load and make its row (and its runs/ file)."""
    result, wall, cpu = replay_once(trace, policy, profile, seed, settings, progress, http,
                                    cluster, concurrency, steady)
    return make_row(result, wall, policy, x, isolated, out, slo, cluster is not None,
                    http is not None, concurrency, cpu)
