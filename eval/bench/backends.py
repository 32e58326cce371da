"""One replay of one policy at one load, on whichever back end the run names.

Why three back ends behind one call: the same trace and the same metrics are wanted from a
single in-process engine (`sim.replay`), from a virtual-time cluster of replicas behind a router
(`sim.virtual_cluster`), and from a running server over HTTP on the wall clock
(`eval.replay.http_replay`); the sweep and its worker processes call only `replay_once`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from common.trace import Trace
from eval.bench.specs import (
    BenchError,
    ClusterRuns,
    EngineSettings,
    HttpTarget,
    settings_engine,
    split_policy,
)
from eval.replay.http_replay import HttpReplayError, replay_over_http
from sim.engines import make_engine
from sim.loop import replay_cluster
from sim.records import steady_programs
from sim.replay import replay
from sim.virtual_cluster import VirtualCluster


def replay_once(trace: Trace, policy: str, profile: str, seed: int, settings: EngineSettings,
                progress: Callable[[int], None] | None, http: HttpTarget | None,
                cluster: ClusterRuns | None, concurrency: int | None,
                steady: float) -> tuple[Any, float, float]:
    """The replay alone (what a `--jobs` worker runs): its result, wall seconds and this
    process's CPU seconds (on a shared machine the wall time also counts others' work)."""
    wall, cpu = time.perf_counter(), time.process_time()
    name, hints = split_policy(policy)
    if cluster is not None:
        config = cluster.config_for(policy)
        engines = VirtualCluster(config, seed=seed, make_engine=lambda spec: make_engine(
            spec.policy, spec.profile, seed, spec.num_gpu_blocks, spec.offload_gib, spec, config,
            settings.max_model_len, settings.max_num_batched_tokens,
            offload_copy_model=settings.offload_copy_model, trace=trace))
        try:
            result = replay_cluster(trace, engines, progress=progress, concurrency=concurrency)
        finally:
            engines.close()
        result.measured = steady_programs(result, steady)
    elif http is not None:
        if hints != "none":
            raise BenchError("--url: client hints (@...) are only replayed in virtual time")
        try:
            result = replay_over_http(trace, http.url, model=http.model, progress=progress)
        except HttpReplayError as exc:
            raise BenchError(str(exc)) from None
    else:
        engine = settings_engine(name, profile, seed, settings, trace)
        try:
            result = replay(trace, engine, progress=progress, hints=hints,
                            concurrency=concurrency)
        finally:
            engine.close()
        result.measured = steady_programs(result, steady)
    return result, time.perf_counter() - wall, time.process_time() - cpu

