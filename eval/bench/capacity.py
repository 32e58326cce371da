"""Sessions per GPU at a TTFT SLO: the most programs a policy runs at once (closed loop) while
its P95 TTFT per turn stays within a bound (`harness bench --capacity --slo-ttft-p95 2`).

Why a search over normal bench runs: kv-cache-tester's capacity criterion is the largest
number of concurrent sessions whose P95 TTFT stays <= 2 s; each probe is a closed loop of N
programs replayed exactly as `harness bench --concurrency N` replays it (the back end's
`replay`, `metrics` and `eval.bench.rows.make_row`, so its row and ``runs/`` records are the
bench's), and the virtual-time engine is deterministic, so a gallop (1, 2, 4, ...) then a
bisection finds the flip exactly in about 2 log2(N) probes. It assumes the P95 grows with N;
the table gives the P95 at N and at N + 1 so a reader sees the flip it found.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.table import Table

from common.atomic import write_text_atomic
from common.trace import Trace
from eval.bench.backends import Backend
from eval.bench.isolated import log_isolated
from eval.bench.parallel import executor
from eval.bench.rows import log_run, make_row, write_json
from eval.bench.runs import BenchSpec, Run
from eval.bench.specs import BenchError
from eval.bench.sweep import fitted_traces
from eval.workloads.warm_prefix import describe
from server.perf.registry import load_profile

#: kv-cache-tester's bound: a session's P95 TTFT per turn at most 2 s.
CAPACITY_TTFT_P95_S = 2.0


def largest_passing(passes: Callable[[int], bool], upper: int) -> int:
    """The largest n in [1, upper] with ``passes(n)`` whose n + 1 fails (or is past `upper`),
    0 when 1 fails: n = 1, 2, 4, ... until one fails, then bisection between the last that
    passed and the first that failed. For a `passes` that holds up to some n and fails after,
    that n; each n is asked at most once, and n + 1 is always asked when n < upper."""
    if upper < 1:
        raise ValueError(f"upper must be at least 1, not {upper}")
    low, high, n = 0, None, 1  # passes(low) (0 by convention), not passes(high)
    while high is None:
        if passes(n):
            low = n
            if n == upper:
                return upper
            n = min(2 * n, upper)
        else:
            high = n
    while high - low > 1:
        middle = (low + high) // 2
        if passes(middle):
            low = middle
        else:
            high = middle
    return low


@dataclass(frozen=True)
class CapacitySearch:
    """One policy's search: `spec`'s programs (`trace`) replayed in closed loops on `backend`
    until the largest N whose P95 TTFT is <= `ttft_p95_s`; rows to `out`."""

    spec: BenchSpec
    backend: Backend
    trace: Trace
    isolated: dict[str, float]
    out: Path
    ttft_p95_s: float

    def run(self, policy: str, console: Any = None) -> dict[str, Any]:
        """`policy`'s capacity: sessions at the SLO, per GPU, the P95 TTFT at N and N + 1,
        the mean JCT at N, and every probe's row."""
        rows: dict[int, dict[str, Any]] = {}

        def probe(n: int) -> bool:
            run = Run(policy, None, n, self.spec.steady)
            replayed = self.backend.replay(self.trace, run, None)
            rows[n] = make_row(run, replayed.result,
                               self.backend.metrics(replayed, self.isolated, self.spec.slo),
                               self.isolated, self.out)
            log_run(console, run.label(), rows[n], len(self.trace))
            return rows[n]["ttft_p95_s"] <= self.ttft_p95_s  # NaN (no turn) fails

        upper = len(self.trace)
        n = largest_passing(probe, upper)
        gpus = gpu_count(self.backend.engine.profile_name)
        at, above = rows.get(n, {}), rows.get(n + 1, {})
        return {"policy": policy, "sessions": n, "gpus": gpus, "sessions_per_gpu": n / gpus,
                "ttft_p95_s": at.get("ttft_p95_s", math.nan),
                "next_ttft_p95_s": above.get("ttft_p95_s", math.nan),
                "jct_mean_s": at.get("jct_mean_s", math.nan),
                "limited_by_programs": n == upper,
                "probes": [rows[k] for k in sorted(rows)]}


def gpu_count(profile: str) -> int:
    """The GPUs one engine of `profile` runs on (its tensor-parallel size)."""
    return int(load_profile(profile).tp)


def capacity(spec: BenchSpec, backend: Backend, ttft_p95_s: float, out: Path,
             console: Any = None) -> dict[str, Any]:
    """Every policy of `spec`'s largest closed loop at P95 TTFT <= `ttft_p95_s`; writes
    ``capacity.json``, ``capacity.md`` and each probe's ``runs/`` record to `out`, and returns
    what ``capacity.json`` holds. Policies search side by side with `spec.jobs` > 1."""
    if not (ttft_p95_s > 0 and math.isfinite(ttft_p95_s)):
        raise BenchError(f"--slo-ttft-p95 must be a positive number of seconds, not "
                         f"{ttft_p95_s}")
    if spec.workload.concurrency or spec.workload.jps != (None,):
        raise BenchError("--capacity searches the number of programs at once itself: leave "
                         "out --jps and --concurrency")
    # a closed loop: the trace's programs in order, their arrival times unused
    spec = replace(spec, workload=replace(spec.workload, concurrency=(1,)))
    workload = spec.workload
    traces, skipped = fitted_traces(spec, backend, console)
    trace = next(iter(traces.values()))
    (out / "runs").mkdir(parents=True, exist_ok=True)
    isolated, cost = backend.isolated(trace, out, None)
    log_isolated(console, len(trace), cost)
    search = CapacitySearch(spec, backend, trace, isolated, out, ttft_p95_s)
    with executor(spec.jobs if backend.parallel else 1) as pool:  # a worker logs nowhere
        pending = [pool.submit(search.run, p, console if pool.live else None)
                   for p in spec.policies]
        results = [p.result() for p in pending]
    engine = backend.engine
    data = {"trace": workload.trace, "trace_name": trace.name, "programs": len(trace),
            "profile": engine.profile_name, "offload_gib": engine.offload_gib,
            "disk_gib": engine.disk_gib, "seed": workload.seed, "steady": spec.steady,
            "warm_prefix_pct": workload.warm_prefix_pct,
            "slo_ttft_p95_s": ttft_p95_s, "skipped_too_long": skipped, "results": results}
    write_json(out / "capacity.json", data)
    write_text_atomic(out / "capacity.md", capacity_markdown(data))
    return data


#: The table's columns: (header, text of a result)
_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("policy", lambda r: r["policy"]),
    ("sessions at SLO", lambda r: f"{r['sessions']}{'+' if r['limited_by_programs'] else ''}"),
    ("sessions per GPU", lambda r: f"{r['sessions_per_gpu']:.2f}"),
    ("P95 TTFT at N s", lambda r: _seconds(r["ttft_p95_s"])),
    ("P95 TTFT at N+1 s", lambda r: _seconds(r["next_ttft_p95_s"])),
    ("mean JCT at N s", lambda r: _seconds(r["jct_mean_s"], 2)),
    ("probes", lambda r: str(len(r["probes"]))),
]


def _seconds(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def capacity_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The table's headers and one row of cells per policy (the terminal's and the report's)."""
    return [h for h, _ in _COLUMNS], [[cell(r) for _, cell in _COLUMNS]
                                      for r in data["results"]]


def capacity_markdown(data: dict[str, Any]) -> str:
    """``capacity.md``: what was searched, and the table."""
    headers, rows = capacity_rows(data)
    gpus = data["results"][0]["gpus"] if data["results"] else 1
    tiers = "".join(f", {name} {data[key]:g} GiB" for key, name in
                    (("offload_gib", "host KV tier"), ("disk_gib", "disk KV tier"))
                    if data.get(key))
    if data.get("warm_prefix_pct"):
        tiers += ", " + describe(data["warm_prefix_pct"])
    lines = [f"# Sessions per GPU at P95 TTFT <= {data['slo_ttft_p95_s']:g} s: "
             f"{data['trace_name']}", "",
             f"{data['programs']} programs, profile `{data['profile']}` ({gpus} GPU"
             f"{'s' if gpus != 1 else ''} per engine){tiers}, seed {data['seed']}. For each "
             "policy, the largest number of programs running at once (closed loop: a new one "
             "starts when one ends) whose P95 TTFT per turn stays within the bound, found by "
             "doubling N until the bound fails and bisecting; each probe is a `harness bench "
             "--concurrency N` run (its row in `runs/`). N+ : every program at once still "
             "meets the bound (the trace, not the engine, limits N; replay more programs).", "",
             "| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def print_capacity(data: dict[str, Any], console: Any) -> None:
    """The table on the terminal."""
    headers, rows = capacity_rows(data)
    table = Table(title=f"{data['trace_name']} on {data['profile']}: sessions at P95 TTFT <= "
                  f"{data['slo_ttft_p95_s']:g} s")
    for header in headers:
        table.add_column(header, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
