"""The programs a `harness bench` run replays: a generated trace at each load, or a file.

Why here and not in the workload registry: the bench replays the same programs at every load
(only arrivals change) and must find, before any engine runs, the programs no engine of the run
can take, so that a sweep stops at once naming them instead of failing halfway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.trace import Trace, TraceFormatError
from eval.bench.runs import Workload
from eval.bench.specs import BenchError
from eval.replay.http_replay import scale_trace
from eval.workloads.registry import TRACES, load_or_generate, merge
from eval.workloads.warm_prefix import with_warm_prefix
from sim.conversation import too_long_turns

#: What `--trace` takes besides a file: the generated traces, and `merge` (SWE + BFCL).
TRACE_NAMES = (*sorted(TRACES), "merge")


def make_trace(name: str, programs: int | None, jps: float | None, seed: int) -> Trace:
    """The trace to replay at load ``jps``; same name, programs and seed give the same
    programs at every load (only arrivals change)."""
    if name in TRACES or name == "merge":
        n = programs if programs is not None else 100
        if n < 1:
            raise BenchError("--programs must be at least 1")
        assert jps is not None
        if name == "merge":  # half SWE-like, half BFCL-like, each at half the load
            n_swe = (n + 1) // 2
            parts = [load_or_generate("swe", n_swe, jps / 2, seed)]
            if n - n_swe:
                parts.append(load_or_generate("bfcl", n - n_swe, jps / 2, seed + 1))
            return merge(*parts, name=f"merge-{n}")
        return load_or_generate(name, n, jps, seed)
    path = Path(name)
    if not path.exists():
        raise BenchError(f"--trace {name!r} is neither a trace name ({', '.join(TRACE_NAMES)}) "
                         "nor an existing trace file")
    if programs is not None and programs < 1:
        raise BenchError("--programs must be at least 1")
    try:
        return load_or_generate(path, programs, jps, seed)
    except TraceFormatError as exc:
        raise BenchError(str(exc)) from None


def make_traces(workload: Workload) -> dict[float | None, Trace]:
    """The trace at each open-loop load of `workload`, scaled by its time scale, with its
    warm prefix (`eval.workloads.warm_prefix`); a closed loop's arrivals are not used, so any
    rate gives its programs in the same order."""
    closed = workload.concurrency is not None
    return {x: scale_trace(warmed(make_trace(workload.trace, workload.programs,
                                             1.0 if closed else x, workload.seed),
                                  workload.warm_prefix_pct), workload.time_scale)
            for x in workload.jps}


def warmed(trace: Trace, pct: float) -> Trace:
    """`trace` with kv-cache-tester's warm prefix of `pct` (0: as it is)."""
    try:
        return with_warm_prefix(trace, pct)
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def fit_context(traces: dict[Any, Trace], limit: int | None,
                too_long: str) -> tuple[dict[Any, Trace], list[str]]:
    """Find, before any engine runs, the programs with a turn longer than `limit` (every
    engine's context; None: not checked here); stop with their names (``too_long="error"``)
    or leave them out (``"skip"``, one line each)."""
    if limit is None:
        return traces, []
    first = next(iter(traces.values()))  # every load replays the same programs
    long = too_long_turns(first, limit)
    if not long:
        return traces, []
    lines = [f"{pid}: turn {turn} needs {tokens:,} tokens > max_model_len {limit:,}"
             for pid, turn, tokens in long]
    if too_long == "error":
        more = f" (and {len(lines) - 5} more)" if len(lines) > 5 else ""
        raise BenchError(
            f"{len(lines)} program(s) have a turn longer than the engine's context: "
            f"{'; '.join(lines[:5])}{more}. Raise --max-model-len (up to the model's context; "
            "a small --num-gpu-blocks also caps it) or pass --too-long skip to leave them out")
    drop = {pid for pid, _, _ in long}
    kept = {x: t.model_copy(update={"programs": [p for p in t.programs if p.id not in drop]})
            for x, t in traces.items()}
    if not next(iter(kept.values())).programs:
        raise BenchError(f"every program has a turn longer than max_model_len {limit:,}")
    return kept, lines

