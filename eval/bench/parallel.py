"""A sweep's replays as separate processes (`harness bench --jobs N`).

Why processes, and why the figures do not change: every replay is deterministic and alone on
its own engine, so running them side by side changes only the wall and CPU times; the engines
are Python under one interpreter lock, so only processes use more than one core. Workers are
spawned, not forked: the parent runs the live progress bar's thread, and a fork of a process
with threads may deadlock.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from common.metrics import SLO
from common.trace import Trace
from eval.bench.backends import replay_once
from eval.bench.isolated import IsolatedCost, isolated_timed, log_isolated
from eval.bench.rows import load_text, log_run, make_row
from eval.bench.specs import ClusterRuns, EngineSettings


def parallel_rows(runs: list[tuple[str, float | None, int | None]], traces: dict[Any, Trace],
                  first: Trace, profile: str, seed: int, settings: EngineSettings, out: Path,
                  slo: SLO, cluster: ClusterRuns | None, steady: float, jobs: int,
                  progress: Any, iso_task: Any,
                  console: Any
                  ) -> tuple[list[dict[str, Any]], dict[str, float], IsolatedCost | None]:
    """The isolated JCTs and every replay as separate processes, `jobs` at a time; rows are
    made once all are in (they need the isolated JCTs), in the serial order. Also returns
    the isolated JCTs and what they cost (None if they were cached)."""
    n = len(first)
    tasks = {run: progress.add_task(f"{run[0]} @ {load_text(run[1], run[2])}", total=n)
             for run in runs}
    with ProcessPoolExecutor(max_workers=jobs,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        iso = pool.submit(isolated_timed, first, profile, seed, out, settings, None)
        futures = {run: pool.submit(replay_once, traces[run[1]], run[0], profile, seed,
                                    settings, None, None, cluster, run[2], steady)
                   for run in runs}
        isolated, iso_timing = iso.result()
        progress.update(iso_task, completed=n)
        log_isolated(console, n, iso_timing)
        done: dict[Any, tuple[Any, float]] = {}
        for run, future in futures.items():  # in order; later ones may already be done
            done[run] = future.result()
            progress.update(tasks[run], completed=n)
    rows = []
    for run in runs:
        result, wall, cpu = done[run]
        row = make_row(result, wall, run[0], run[1], isolated, out, slo, cluster is not None,
                       False, run[2], cpu)
        rows.append(row)
        log_run(console, f"{run[0]} @ {load_text(run[1], run[2])}", row, n)
    return rows, isolated, iso_timing
