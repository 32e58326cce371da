"""The sweep's two figures: JCT against load, and the JCT CDF at the highest load.

Why these two: the first shows where each policy's JCT starts to climb as load grows (mean
solid, P95 dashed, the isolated mean as the floor); the second shows, at the load that tells
policies apart most, whether a policy's gain is for every program or only the tail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.atomic import atomic_path
from eval.bench.occupancy import plot_occupancy
from eval.bench.runs import jps_label, load_text


def plot(summary: dict[str, Any], out: Path) -> None:
    import matplotlib  # matplotlib: start-up cost, only the plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["results"]
    policies = summary["policies"]
    colors = plt.get_cmap("tab20" if len(policies) > 10 else "tab10")  # one colour each
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, policy in enumerate(policies):
        mine = [r for r in rows if r["policy"] == policy]
        xs = [_load_value(r) for r in mine]
        line = ax.plot(xs, [r["jct_mean_s"] for r in mine], marker="o", label=policy,
                       color=colors(i))
        ax.plot(xs, [r["jct_p95_s"] for r in mine], marker="x", linestyle="--",
                color=line[0].get_color(), label="_nolegend_")
    ax.axhline(summary["isolated_jct_mean_s"], color="grey", linestyle=":",
               label="isolated mean")
    closed = bool(summary.get("concurrency"))
    _finish_plot(plt, fig, ax, "programs at once (closed loop)" if closed else "load (jobs/s)",
                 "JCT (s): mean solid, P95 dashed",
                 f"JCT against load: {summary['trace_name']}",
                 out / "jct_vs_load.png")

    top_row = max(rows, key=_load_value)
    top, top_closed = top_row["jps"], top_row.get("concurrency")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, policy in enumerate(policies):
        path = out / "runs" / f"{policy}-jps{jps_label(top, top_closed)}.json"
        jcts = sorted(p["jct_s"] for p in json.loads(path.read_text())["programs"]
                      if p.get("measured", True))
        ys = [(i + 1) / len(jcts) for i in range(len(jcts))]
        ax.step(jcts, ys, where="post", label=policy, color=colors(i))
    _finish_plot(plt, fig, ax, "JCT (s)", "fraction of programs",
                 f"JCT CDF at {load_text(top, top_closed)}", out / "jct_cdf.png")
    plot_occupancy(out)  # program schedulers' runs only


def _load_value(row: dict[str, Any]) -> float:
    """Where a row sits on the load axis: programs at once (closed loop) or jobs/s."""
    if row.get("concurrency"):
        return float(row["concurrency"])
    return row["jps"] if row["jps"] is not None else 0.0


def _finish_plot(plt: Any, fig: Any, ax: Any, xlabel: str, ylabel: str, title: str,
                 path: Path) -> None:
    """Labels, legend and grid as every plot here has them; then save atomically and close."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    # beside the axes, not on them: a sweep of ten policies would cover the lines
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png", bbox_inches="tight")
    plt.close(fig)
