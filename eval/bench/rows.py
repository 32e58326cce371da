"""A replay's row of metrics, its per-program records, and its line in the log.

Why one place: the serial sweep and the parallel one (`eval.bench.parallel`) must make the
same row from the same replay, write the same ``runs/<policy>-jps<x>.json`` and log the same
line, so that `--jobs` changes the wall time and nothing else.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common.atomic import write_text_atomic
from common.metrics import SLO, cluster_metrics, replay_metrics
from eval.replay.http_replay import http_replay_metrics


def make_row(result: Any, wall: float, policy: str, x: float | None,
             isolated: dict[str, float], out: Path, slo: SLO | None, cluster: bool, http: bool,
             concurrency: int | None, cpu: float | None = None) -> dict[str, Any]:
    """A replay's metrics row; its per-program records go to ``out/runs/``."""
    row: dict[str, Any] = {"policy": policy, "jps": x, "concurrency": concurrency}
    if http:
        row.update(http_replay_metrics(result, isolated, slo))
    else:
        row.update(replay_metrics(result, isolated, slo))
    if cluster:
        row.update(cluster_metrics(result, slo))
    row["wall_s"] = wall
    row["cpu_s"] = cpu
    if not http:  # the replay's own speed: engine steps (all replicas) per wall second
        row["engine_steps_per_s"] = row.get("engine_steps", 0) / max(row["wall_s"], 1e-9)
    measured = getattr(result, "measured", None)
    records = {
        "policy": policy, "jps": x, "concurrency": concurrency,
        "programs": [
            {"id": p.program_id, "arrival_s": p.arrival, "finished_s": p.finished,
             "jct_s": p.jct, "isolated_jct_s": isolated.get(p.program_id),
             "measured": measured is None or p.program_id in measured,
             "turns": [asdict(t) for t in p.turns]}
            for p in result.programs.values()
        ],
    }
    write_json(out / "runs" / f"{policy}-jps{jps_label(x, concurrency)}.json", records)
    return row


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


def jps_label(x: float | None, closed: int | None = None) -> str:
    """A load as it appears in file names: jobs/s, ``trace`` (its own arrivals) or
    ``closedN`` (closed loop, N at once)."""
    if closed is not None:
        return f"closed{closed}"
    return "trace" if x is None else f"{x:g}"


def load_text(x: float | None, closed: int | None) -> str:
    return f"{closed} at once" if closed is not None else f"{jps_label(x)} jobs/s"


def write_json(path: Path, obj: Any) -> None:
    """The bench's JSON files: indented, NaN kept (a metric with no sample), atomic."""
    write_text_atomic(path, json.dumps(obj, indent=1, allow_nan=True) + "\n")
