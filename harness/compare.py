"""`harness compare BENCH --policies vllm,continuum`: the same tasks under each policy.

Each policy gets its own co-located `harness serve` and its own run folder (`OUT/<policy>`,
a full `harness run`, resumable with `--resume`); pass rate and job completion time are then
printed side by side and written to `OUT/compare.json`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from common.atomic import write_json_atomic
from harness.run import RunError, RunSpec, run_benchmark

ROWS = ("tasks", "passed", "resolved", "pass_rate", "jct_mean_s", "jct_p95_s", "wall_s",
        "events_sent", "events_dropped")


def compare_policies(spec: RunSpec, policies: Sequence[str]) -> int:
    """`harness run` of `spec` once per policy (its `policy` is ignored), then the table; 1
    when a run left tasks unfinished (a server or Docker failure), else 0."""
    if len(policies) < 1 or len(set(policies)) != len(policies):
        raise RunError("--policies needs distinct policy names, e.g. vllm,continuum")
    if spec.server:
        raise RunError("harness compare starts one co-located server per policy; --server "
                       "would run every policy on the same server")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(spec.out or f"runs/compare-{spec.benchmark}-{stamp}")
    console = Console()
    summaries: dict[str, dict[str, Any]] = {}
    status = 0  # 1 when a run left tasks unfinished (a server or Docker failure)
    for policy in policies:
        console.rule(f"{spec.benchmark} --policy {policy}")
        one = dataclasses.replace(spec, policy=policy, out=str(out / policy))
        status = max(status, run_benchmark(one))
        summaries[policy] = json.loads((out / policy / "summary.json").read_text())
    table = Table(title=f"harness compare {spec.benchmark}")
    table.add_column("metric")
    for policy in policies:
        table.add_column(policy, justify="right")
    for key in ROWS:
        if not any(key in s for s in summaries.values()):
            continue
        cells = []
        for policy in policies:
            value = summaries[policy].get(key)
            cells.append(f"{value:.3f}" if isinstance(value, float) else str(value))
        table.add_row(key, *cells)
    console.print(table)
    base = summaries[policies[0]].get("jct_mean_s") or 0.0
    result = {"benchmark": spec.benchmark, "policies": list(policies), "summaries": summaries,
              "jct_mean_vs_first": {p: (s["jct_mean_s"] / base if base else None)
                                    for p, s in summaries.items()}}
    write_json_atomic(out / "compare.json", result)
    console.print(f"comparison: {out / 'compare.json'}")
    return status
