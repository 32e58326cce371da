"""A replay's row of metrics, its per-program records, and its line in the log.

Why one place: every back end's replay, in this process or a worker's (`--jobs`), must make
its row the same way, write the same ``runs/<policy>-jps<x>.json`` and log the same line, so
that neither the back end nor `--jobs` changes the shape of the outputs.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common.atomic import write_text_atomic
from eval.bench.runs import Run, jps_label


def make_row(run: Run, result: Any, metrics: dict[str, Any], isolated: dict[str, float],
             out: Path) -> dict[str, Any]:
    """A replay's row: which run, then the back end's `metrics` of its `result`
    (`eval.bench.backends.Backend.metrics`); its per-program records go to ``out/runs/``."""
    row: dict[str, Any] = {"policy": run.policy, "jps": run.jps,
                           "concurrency": run.concurrency, **metrics,
                           **tier_columns(getattr(result, "tier_traffic", None) or {})}
    measured = getattr(result, "measured", None)
    records = {
        "policy": run.policy, "jps": run.jps, "concurrency": run.concurrency,
        "programs": [
            {"id": p.program_id, "arrival_s": p.arrival, "finished_s": p.finished,
             "jct_s": p.jct, "isolated_jct_s": isolated.get(p.program_id),
             "measured": measured is None or p.program_id in measured,
             "turns": [asdict(t) for t in p.turns]}
            for p in result.programs.values()
        ],
    }
    occupancy = getattr(result, "program_occupancy", None)
    if occupancy:  # a program scheduler: KV tokens by program state over time
        records["occupancy"] = [{"t": t, **held} for t, held in occupancy]
    write_json(out / "runs" / f"{run.policy}-jps{jps_label(run.jps, run.concurrency)}.json",
               records)
    return row


def tier_columns(traffic: dict[str, dict[str, int]]) -> dict[str, int]:
    """A run's KV tier traffic as row columns (``host_stored_blocks``, ``disk_loaded_bytes``,
    ...: `sim.records.ReplayResult.tier_traffic`), only for a run with a disk tier (the
    replay leaves it empty otherwise), so other rows keep their columns."""
    return {f"{tier}_{name}": value for tier, figures in traffic.items()
            for name, value in figures.items()}


def log_run(console: Any, label: str, row: dict[str, Any], n: int) -> None:
    """One line per finished run: its figures and how fast it replayed (wall time, engine
    steps per second), in a terminal above the live bars, in a log file instead of them."""
    if console is not None:
        console.print(f"{label}: {row.get('programs', n)} programs, mean JCT "
                      f"{row.get('jct_mean_s', math.nan):.2f} s, wall {row['wall_s']:.1f} s"
                      f"{_cpu_text(row.get('cpu_s'))}, "
                      f"{row.get('engine_steps', 0):,} engine steps, "
                      f"{row.get('engine_steps_per_s', math.nan):.0f} steps/s")


def _cpu_text(cpu: float | None) -> str:
    return "" if cpu is None else f" (CPU {cpu:.1f} s)"


def write_json(path: Path, obj: Any) -> None:
    """The bench's JSON files: indented, NaN kept (a metric with no sample), atomic."""
    write_text_atomic(path, json.dumps(obj, indent=1, allow_nan=True) + "\n")
