"""The KV occupancy plot of program schedulers: tokens held by program state over time.

Why a figure of its own: a program scheduler's whole effect is on who holds memory when —
reasoning programs (a turn queued or running), acting ones whose KV is kept through their tool
call, paused ones — and the mean JCT alone does not show whether it got there by pausing many
programs briefly or a few for long. One panel per program-scheduling run of the sweep
(`runs/*.json` with an ``occupancy`` series), stacked areas, the capacity as a line, and
the engine's own count of the KV it held (running turns, pins: what cannot be evicted) as a
line over them: where it runs above the areas, the scheduler's account from contexts
undercounts (docs/results-programs.md traces thrashing to that gap).
"""

from __future__ import annotations

import json
from pathlib import Path

from common.atomic import atomic_path

STATES = ("reasoning", "acting", "paused")


def plot_occupancy(out: Path) -> Path | None:
    """``kv_occupancy.png`` in `out` from its runs that have an occupancy series; None when
    none has one (no program scheduler in the sweep)."""
    runs = []
    for path in sorted((out / "runs").glob("*.json")):
        series = json.loads(path.read_text()).get("occupancy")
        if series:
            runs.append((path.stem, series))
    if not runs:
        return None
    import matplotlib  # matplotlib: start-up cost, only the plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.6 * len(runs)), squeeze=False)
    for ax, (name, series) in zip(axes[:, 0], runs, strict=True):
        ts = [s["t"] for s in series]
        ax.stackplot(ts, *[[s.get(k, 0) / 1000 for s in series] for k in STATES],
                     labels=[f"{k} (kept on GPU)" if k != "reasoning" else k for k in STATES],
                     alpha=0.8)
        if any("in_use" in s for s in series):
            ax.plot(ts, [s.get("in_use", 0) / 1000 for s in series], color="black",
                    linewidth=0.8, label="held by the engine (not evictable)")
        capacity = series[-1].get("capacity")
        if capacity:
            ax.axhline(capacity / 1000, color="black", linestyle=":", label="KV capacity")
        ax.set_title(name, fontsize="small")
        ax.set_ylabel("k tokens")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("time since the start (s)")
    axes[0, 0].legend(fontsize="x-small", loc="upper right")
    fig.tight_layout()
    path = out / "kv_occupancy.png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight")
    plt.close(fig)
    return path

