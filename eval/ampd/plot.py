"""The plot of `eval.ampd.bench`: SLO attainment and mean JCT against load, one column per trace,
one line per config (the paper's Fig. 4 top row, with JCT under it to show what a lost SLO
costs end to end). Kept apart so the benchmark imports matplotlib only when it plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.atomic import atomic_path


def plot_slo(summary: dict[str, Any], path: Path) -> None:
    # matplotlib: start-up cost (~1 s); only writing a plot needs it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["rows"]
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(2, len(traces), figsize=(5 * len(traces), 7), squeeze=False)
    for col, trace in enumerate(traces):
        top, bottom = axes[0][col], axes[1][col]
        for k, config in enumerate(configs):
            mine = sorted((r for r in rows if r["trace"] == trace and r["config"] == config),
                          key=lambda r: r["jps"])
            if not mine:
                continue
            xs = [r["jps"] for r in mine]
            style = {"marker": "os^vD<>p*h"[k % 10],
                     "linestyle": "-" if config.startswith("ampd ") else "--"}
            top.plot(xs, [r["slo_attainment"] for r in mine], label=config, **style)
            bottom.plot(xs, [r["jct_mean_s"] for r in mine], label=config, **style)
        top.set_title(f"{trace}: SLO attainment")
        top.set_ylim(-0.02, 1.02)
        bottom.set_title(f"{trace}: mean JCT")
        bottom.set_ylabel("JCT (s)")
        top.set_ylabel("share of turns meeting the SLO")
        for ax in (top, bottom):
            ax.set_xlabel("load (jobs/s)")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    # below the panels, so no curve is hidden behind it
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize="small")
    slo = summary["slo"]
    fig.suptitle(f"{summary['profile']} x {summary['replicas']}, SLO TTFT <= {slo['ttft_s']:g} s"
                 f", ITL <= {slo['itl_s']:g} s")
    rows_of_legend = -(-len(labels) // 5)
    fig.tight_layout(rect=(0, 0.03 + 0.03 * rows_of_legend, 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
