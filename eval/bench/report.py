"""What a sweep's numbers mean, in words: ``report.md`` and the table on the terminal.

Why prose beside the table: a reader of a policy comparison wants which policy was fastest at
each load and why (cache hits, recomputation, queueing, preemptions, pinned memory), and what
was replayed (the trace's statistics, the engine settings every policy shared), without
reading the 24 columns; the report says it from ``summary.json`` alone, so an old summary can
be reported again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from common.trace import TraceStats
from eval.bench.runs import load_text
from eval.workloads.warm_prefix import describe

#: One cell for the TTFT per turn, its mean and tail: a row key of several keys (``a/b/c``)
#: shows their values as ``a / b / c``, so the tail sits beside the mean without three more
#: columns in a table already 26 wide.
_TTFT = "ttft_mean_s/ttft_p95_s/ttft_p99_s"

#: The report's table: (row key, header, format); the terminal shows a few of them.
_COLUMNS = [("policy", "policy", "{}"), ("jps", "jobs/s", "{}"),
            ("jct_mean_s", "JCT mean s", "{:.2f}"), ("jct_p50_s", "P50", "{:.2f}"),
            ("jct_p95_s", "P95", "{:.2f}"), ("jct_p99_s", "P99", "{:.2f}"),
            ("normalised_latency_mean", "JCT/isolated", "{:.2f}"),
            ("gap_closed", "gap closed", "{:.2f}"),
            ("floor_jct_mean_s", "floor s", "{:.2f}"),
            ("makespan_s", "makespan s", "{:.1f}"),
            ("throughput_programs_per_min", "programs/min", "{:.2f}"),
            (_TTFT, "TTFT s mean / P95 / P99", "{:.3f}"),
            ("tpot_mean_s", "TPOT mean s", "{:.4f}"),
            ("queue_mean_s", "queue mean s", "{:.3f}"),
            ("slo_attainment", "SLO attainment", "{:.3f}"),
            ("goodput_turns_per_s", "goodput turns/s", "{:.2f}"),
            ("prefix_hit_rate", "hit rate", "{:.3f}"),
            ("pin_hit_rate", "pin hit rate", "{:.2f}"),
            ("recomputed_tokens", "recomputed tok", "{}"),
            ("preemptions", "preemptions", "{}"), ("pin_memory_share", "pin mem share", "{:.4f}"),
            ("sched_cpu_ms_per_step", "sched ms/step", "{:.3f}"),
            ("engine_steps", "engine steps", "{:,}"),
            ("wall_s", "wall s", "{:.1f}"), ("cpu_s", "CPU s", "{:.1f}"),
            ("engine_steps_per_s", "replay steps/s", "{:.0f}")]


#: What a --cluster run adds (`common.metrics.cluster_metrics`), as a second table.
_CLUSTER_COLUMNS = [("policy", "strategy", "{}"), ("jps", "jobs/s", "{}"),
                    ("ttft_initial_mean_s/ttft_initial_p95_s/ttft_initial_p99_s",
                     "TTFT initial s mean / P95 / P99", "{:.3f}"),
                    ("ttft_incremental_mean_s/ttft_incremental_p95_s/ttft_incremental_p99_s",
                     "TTFT incremental s mean / P95 / P99", "{:.3f}"),
                    ("itl_mean_s", "ITL mean s", "{:.4f}"),
                    ("slo_attainment_initial", "SLO initial", "{:.3f}"),
                    ("slo_attainment_incremental", "SLO incremental", "{:.3f}"),
                    ("local_prefill_share", "local prefills", "{:.3f}"),
                    ("kv_bytes_moved", "KV moved B", "{:.3g}"),
                    ("kv_seconds_moved", "KV moved s", "{:.3f}"),
                    ("programs_split_across_replicas", "programs split", "{}"),
                    ("load_balance_colocated", "balance colocated", "{:.2f}"),
                    ("load_balance_prefill", "balance prefill", "{:.2f}"),
                    ("load_balance_decode", "balance decode", "{:.2f}")]


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    if "/" in key:  # a mean and its tail in one cell (`_TTFT`)
        return " / ".join(_cell(row, part, fmt) for part in key.split("/"))
    value = row.get(key)
    if key == "jps" and row.get("concurrency"):
        return f"closed {row['concurrency']}"
    if value is None:
        return "trace" if key == "jps" else "-"
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return fmt.format(value)


def report_markdown(summary: dict[str, Any]) -> str:
    lines = [f"# Policy benchmark: {summary['trace_name']}", "",
             f"{summary['programs']} programs, profile `{summary['profile']}`, seed "
             f"{summary['seed']}; isolated JCT mean {summary['isolated_jct_mean_s']:.2f} s "
             "(each program alone on the engine: the lower bound). "
             f"{_mode_text(summary)}; wall time {summary['wall_s']:.1f} s"
             f"{_isolated_cost_text(summary)}. SLO per turn: "
             f"TTFT <= {summary['slo']['ttft_s']:g} s and TPOT <= {summary['slo']['tpot_s']:g} "
             "s.", "",
             "| " + " | ".join(h for _, h, _ in _COLUMNS) + " |",
             "|" + "---|" * len(_COLUMNS)]
    for row in summary["results"]:
        lines.append("| " + " | ".join(_cell(row, k, f) for k, _, f in _COLUMNS) + " |")
    if summary.get("cluster"):
        lines += ["", *_cluster_section(summary)]
    lines += ["", *bounds_section(summary)]
    lines += ["", "## Which is fastest, and why", "", *reading(summary["results"]), ""]
    lines += _replayed_section(summary)
    lines += ["![JCT against load](jct_vs_load.png)", "", "![JCT CDF](jct_cdf.png)", ""]
    return "\n".join(lines)


def bounds_section(summary: dict[str, Any]) -> list[str]:
    """The floor and the clairvoyant schedule, in words (`eval.bench.floor`)."""
    lines = ["## Bounds: the floor and the clairvoyant schedule", "",
             "`oracle` is oracle-SRPT, a clairvoyant schedule: it is told every program's "
             "future (turns, their lengths and tool times) and runs shortest remaining work "
             "first at the program level, pinning exactly the KV cache that will be reused; "
             "it is not a proven optimum (a batching engine is not one machine), so a policy "
             "may beat it (gap closed > 1). *gap closed*: a policy's share of the gap from "
             "`vllm` to `oracle` in mean JCT at the same load. *floor*: the larger of the "
             f"isolated JCT mean ({summary['isolated_jct_mean_s']:.2f} s) and the throughput "
             "bound (every program's work at the engine's most efficient batching, or at "
             "the batches its KV cache holds, released at its arrival, served "
             "shortest-remaining-first on one machine: no schedule's mean JCT is below it)."]
    floors = summary.get("floors") or []
    if not floors:
        return lines + ["", "No throughput bound for this run (a cluster, a served engine or a "
                        "closed loop): the floor is the isolated JCT mean.", ""]
    lines += ["", "| jobs/s | work per program s | offered load | throughput bound: mean JCT "
              "s | priced by | makespan s | floor: mean JCT s |",
              "|---|---:|---:|---:|---|---:|---:|"]
    n = max(1, summary.get("programs") or 1)
    for floor in floors:
        by = "memory" if floor.get("memory_bound") else "batch"
        lines.append(f"| {load_text(floor['jps'], None)} | {floor['work_s'] / n:.2f} | "
                     f"{floor['offered_load']:.2f} | {floor['throughput_jct_mean_s']:.2f} | "
                     f"{by} | {floor['throughput_makespan_s']:.1f} | "
                     f"{max(floor['throughput_jct_mean_s'], summary['isolated_jct_mean_s']):.2f} |")
    steady = (" The throughput bound counts every program, also those `--steady` leaves out "
              "of the policies' means." if summary.get("steady") else "")
    return lines + ["", "Offered load: the work over the arrival window (above 1 the engine "
                    f"cannot keep up even at its most efficient batching).{steady}", ""]


def _isolated_cost_text(summary: dict[str, Any]) -> str:
    """What measuring the isolated JCTs cost, for the report's first paragraph."""
    wall, steps = summary.get("isolated_wall_s"), summary.get("isolated_engine_steps")
    if wall is None or steps is None:
        return ""
    cpu = summary.get("isolated_cpu_s")
    spent = f"{wall:.1f} s" + ("" if cpu is None else f", {cpu:.1f} s of CPU")
    return (f" (the isolated JCTs: {spent}, {steps:,} engine steps, "
            f"{steps / max(wall, 1e-9):.0f} steps/s)")


def _replayed_section(summary: dict[str, Any]) -> list[str]:
    """What was replayed (the trace's statistics, so a reader sees which regime the table is
    about) and the engine settings every policy shared."""
    settings = [f"{key} {summary[key]:,}" if isinstance(summary.get(key), int)
                else f"{key} {summary[key]:g}"
                for key in ("num_gpu_blocks", "max_model_len", "max_num_batched_tokens",
                            "max_num_seqs", "long_prefill_token_threshold", "offload_gib")
                if summary.get(key) is not None]
    lines = ["## What was replayed", ""]
    if summary.get("trace_stats"):
        lines += [TraceStats(**summary["trace_stats"]).markdown(), ""]
    lines += ["Engine settings for every policy: "
              + ("; ".join(settings) if settings else "the profile's and vLLM's defaults")
              + ".", ""]
    if summary.get("offload_copy_model"):  # summaries written before the option lack it
        lines += [f"KV offloading copies priced by the `{summary['offload_copy_model']}` copy "
                  "model (docs/emulated-gpu.md).", ""]
    if summary.get("skipped_too_long"):
        lines += [f"Left out ({len(summary['skipped_too_long'])} programs longer than the "
                  "context): " + "; ".join(summary["skipped_too_long"][:10]), ""]
    return lines


def _cluster_section(summary: dict[str, Any]) -> list[str]:
    """The cluster file's replicas and the per-strategy cluster metrics."""
    cluster = summary["cluster"]
    replicas = ", ".join(f"`{r['name']}` ({r['role']}, {r['profile']}, node {r['node']})"
                         for r in cluster["replicas"])
    links = cluster["links"]
    lines = [f"## Cluster `{cluster['name']}`", "",
             f"Replicas: {replicas}. Links: intra-node "
             f"{links['intra_node']['bandwidth_gbs']:g} GB/s + "
             f"{links['intra_node']['latency_us']:g} us, inter-node "
             f"{links['inter_node']['bandwidth_gbs']:g} GB/s + "
             f"{links['inter_node']['latency_us']:g} us. Strategy = router (and the policy "
             "every replica runs, if replaced). TTFT initial: a program's first turn; "
             "incremental: its later turns. Balance: the busiest replica's busy time over its "
             "role's mean (1.00 = even).", "",
             "| " + " | ".join(h for _, h, _ in _CLUSTER_COLUMNS) + " |",
             "|" + "---|" * len(_CLUSTER_COLUMNS)]
    for row in summary["results"]:
        lines.append("| " + " | ".join(_cell(row, k, f) for k, _, f in _CLUSTER_COLUMNS)
                     + " |")
    return lines


def _mode_text(summary: dict[str, Any]) -> str:
    mode = summary.get("mode", "virtual")
    text = "Virtual time" if mode == "virtual" else f"Wall-clock replay over HTTP ({mode[5:]})"
    scale = summary.get("time_scale", 1.0)
    if scale != 1.0:
        text += f", arrivals and tool times x{scale:g}"
    if summary.get("warm_prefix_pct"):
        text += ", " + describe(summary["warm_prefix_pct"])
    if summary.get("concurrency"):
        text += (", closed loop (a new program starts when one ends; the trace's arrival "
                 "times are not used)")
    if summary.get("steady"):
        text += (f"; the first and last {summary['steady']:.0%} of programs (by start) are "
                 "warm-up and cool-down, left out of the metrics (not of the load)")
    return text


def reading(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Per load, the fastest policy by mean JCT, its ratios to `vllm`, and the mechanisms
    that explain the gap (cache hits, recomputation, queueing, preemptions, pinned memory)."""
    out = []
    for x, closed in dict.fromkeys((r["jps"], r.get("concurrency")) for r in rows):
        at = [r for r in rows if (r["jps"], r.get("concurrency")) == (x, closed)]
        best = min(at, key=lambda r: r.get("jct_mean_s", math.inf))
        base = next((r for r in at if r["policy"] == "vllm"), None)
        line = (f"- **{load_text(x, closed)}**: fastest `{best['policy']}`, mean JCT "
                f"{best['jct_mean_s']:.1f} s")
        if base is not None and best is not base and base.get("jct_mean_s"):
            line += (f" ({best['jct_mean_s'] / base['jct_mean_s']:.2f}x `vllm`'s mean, "
                     f"{best['jct_p95_s'] / base['jct_p95_s']:.2f}x its P95). Against `vllm`: "
                     f"prefix hit rate {best['prefix_hit_rate']:.2f} vs "
                     f"{base['prefix_hit_rate']:.2f}, recomputed tokens "
                     f"{best['recomputed_tokens']:,} vs {base['recomputed_tokens']:,}, mean "
                     f"queueing {best['queue_mean_s']:.2f} vs {base['queue_mean_s']:.2f} s, "
                     f"preemptions {best['preemptions']} vs {base['preemptions']}, pins held "
                     f"{best['pin_memory_share']:.1%} of KV memory")
        elif base is not None:
            line += (f"; the policies differ by at most "
                     f"{max(r['jct_mean_s'] for r in at) / best['jct_mean_s'] - 1:.1%} in mean "
                     f"JCT (JCT / isolated {best.get('normalised_latency_mean', math.nan):.2f})")
        out.append(line + ".")
    return out


def print_table(summary: dict[str, Any], console: Any) -> None:
    table = Table(title=f"{summary['trace_name']} on {summary['profile']}")
    wanted = ("policy", "jps", "jct_mean_s", "jct_p95_s", _TTFT, "normalised_latency_mean",
              "gap_closed", "floor_jct_mean_s",
              "throughput_programs_per_min", "prefix_hit_rate", "preemptions",
              "pin_memory_share", "wall_s", "engine_steps_per_s")
    keys = [c for c in _COLUMNS if c[0] in wanted]
    for _, header, _ in keys:
        table.add_column(header, justify="right", overflow="fold")
    for row in summary["results"]:
        table.add_row(*[_cell(row, k, f) for k, _, f in keys])
    console.print(table)

