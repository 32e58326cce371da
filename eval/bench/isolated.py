"""The lower bound every JCT is set against: each program alone on an engine, cached.

Why cached, and by what: measuring the isolated JCTs replays every program alone, which costs
about as much as one run of the sweep; they depend only on the programs' contents (not their
arrivals), the profile, the seed and the engine settings, so a fingerprint of those names the
cache file in the output folder, and a second sweep over other loads or policies reuses it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from common.trace import Trace
from eval.bench.rows import write_json
from server.engine_spec import EngineSpec
from server.perf.copy_model import DEFAULT_OFFLOAD_COPY_MODEL
from server.policies.spec import PolicySpec
from sim.engines import make_engine
from sim.replay import isolated_jcts


class IsolatedCost(NamedTuple):
    """What measuring the isolated JCTs took (`summary.json`'s ``isolated_*``)."""

    wall_s: float
    cpu_s: float  # of the process that measured them
    engine_steps: int


#: what a fingerprint names of an engine, besides its profile, seed and batch limits
FINGERPRINTED = ("num_gpu_blocks", "max_model_len", "offload_gib", "offload_copy_model",
                 "long_prefill_token_threshold")


def fingerprint(trace: Trace, engine: EngineSpec) -> str:
    """Identifies the programs' contents (not their arrivals) and the engine, with the batch
    limits it runs with (`EngineSpec.emulated_batch_limits`: a cache measured before the
    emulated GPU took the GPU's `vllm serve` limits, at the CPU platform's, never matches)."""
    body = [p.model_dump(exclude={"arrival_s"}) for p in trace.programs]
    settings = {name: getattr(engine, name) for name in FINGERPRINTED}
    text = json.dumps({"programs": body, "profile": engine.profile_name, "seed": engine.seed,
                       "batch": list(engine.emulated_batch_limits()), "engine": settings},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def isolated_timed(trace: Trace, engine: EngineSpec, out: Path,
                   progress: Callable[[int], None] | None
                   ) -> tuple[dict[str, float], IsolatedCost | None]:
    """Each program's JCT alone on a `vllm` engine of the run's settings (no offloading:
    alone, nothing is evicted), cached in `out` by the programs' contents and the settings;
    and what measuring them cost, or None when they came from the cache."""
    # no copy to price either: the isolated bound is the same whatever the copy model
    plain = replace(engine, offload_gib=None, offload_copy_model=DEFAULT_OFFLOAD_COPY_MODEL)
    profile = plain.profile_name
    path = out / f"isolated-{profile}-{fingerprint(trace, plain)}.json"
    if path.exists():
        cached = json.loads(path.read_text())
        if set(cached) == {p.id for p in trace.programs}:
            return {k: float(v) for k, v in cached.items()}, None
    wall, cpu = time.perf_counter(), time.process_time()
    engine = make_engine(PolicySpec.named("vllm"), plain)
    try:
        isolated = isolated_jcts(trace, engine, progress=progress)
        steps = int(engine.scheduler.sched_steps)
    finally:
        engine.close()
    write_json(path, isolated)
    return isolated, IsolatedCost(time.perf_counter() - wall, time.process_time() - cpu, steps)


def log_isolated(console: Any, n: int, timing: IsolatedCost | None) -> None:
    """The isolated JCTs' line, as `eval.bench.rows.log_run`'s (or that they came from the
    cache)."""
    if console is None:
        return
    if timing is None:
        console.print(f"isolated JCTs: {n} programs, not measured here (the output folder's "
                      "cache, or the server)")
        return
    wall, cpu, steps = timing
    console.print(f"isolated JCTs: {n} programs alone, wall {wall:.1f} s (CPU {cpu:.1f} s), "
                  f"{steps:,} engine steps, {steps / max(wall, 1e-9):.0f} steps/s")
