"""The programs a `harness bench` run replays: a generated trace at each load, or a file.

Why here and not in the workload registry: the bench replays the same programs at every load
(only arrivals change) and must find, before any engine runs, the programs no engine of the run
can take, so that a sweep stops at once naming them instead of failing halfway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.trace import Trace, TraceFormatError
from eval.bench.specs import BenchError, ClusterRuns
from eval.workloads.registry import TRACES, load_or_generate, merge
from server.max_model_len import context_limit
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


def fit_context(traces: dict[Any, Trace], cluster: ClusterRuns | None, profile: str,
                num_gpu_blocks: int | None, max_model_len: int | None,
                too_long: str) -> tuple[dict[Any, Trace], list[str]]:
    """Find, before any engine runs, the programs with a turn longer than the engines take
    (on a cluster: the smallest replica's limit, as a program may land anywhere); stop with
    their names (``too_long="error"``) or leave them out (``"skip"``, one line each)."""
    try:
        if cluster is None:
            limit = context_limit(profile, num_gpu_blocks, max_model_len)
        else:
            limit = min(context_limit(r.profile, r.num_gpu_blocks, max_model_len)
                        for r in cluster.config.replicas)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
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

