"""The two virtual-time back ends: one in-process engine, and a cluster behind its router.

Why both here: they measure the isolated JCTs the same way (each program alone on one engine
of the run's settings, cached, `eval.bench.isolated`), time a replay the same way, and may run
in worker processes; they differ in what replays (`sim.replay` on one engine, or
`sim.loop.replay_cluster` on `sim.virtual_cluster.VirtualCluster`), in the context limit
(a cluster's smallest replica's) and in what they add (the throughput bound on one engine,
the cluster metrics on a cluster).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cluster.config import ReplicaSpec
from common.metrics import SLO, cluster_metrics, replay_metrics
from common.trace import Trace
from eval.bench.backends import Progress, Replayed, timed, timing
from eval.bench.floor import throughput_floor
from eval.bench.isolated import IsolatedCost, isolated_timed
from eval.bench.runs import Run
from eval.bench.specs import ClusterRuns, engine_context_limit
from server.engine_spec import EngineSpec
from server.max_model_len import BLOCK_SIZE
from server.policies.spec import PolicySpec
from sim.engines import make_engine
from sim.loop import replay_cluster
from sim.records import steady_programs
from sim.replay import replay
from sim.virtual_cluster import VirtualCluster


@dataclass(frozen=True)
class SingleEngine:
    """Each replay on one fresh in-process `engine` (`harness bench`), running the one of
    `policies` its run names (a run's label is its policy's text)."""

    engine: EngineSpec
    policies: tuple[PolicySpec, ...] = ()
    mode: str = "virtual"
    parallel: bool = True

    def cluster(self) -> dict[str, Any] | None:
        return None

    def context_limit(self) -> int | None:
        return engine_context_limit(self.engine)

    def isolated(self, trace: Trace, out: Path,
                 progress: Progress) -> tuple[dict[str, float], IsolatedCost | None]:
        return isolated_timed(trace, self.engine, out, progress)

    def replay(self, trace: Trace, run: Run, progress: Progress) -> Replayed:
        policy = next(p for p in self.policies if str(p) == run.policy)

        def one() -> Any:
            engine = make_engine(policy, self.engine, trace=trace)
            try:
                result = replay(trace, engine, progress=progress, hints=policy.hint_mode,
                                concurrency=run.concurrency)
            finally:
                engine.close()
            result.measured = steady_programs(result, run.steady)
            return result

        return timed(one)

    def metrics(self, replayed: Replayed, isolated: dict[str, float],
                slo: SLO) -> dict[str, Any]:
        return timing(replayed, replay_metrics(replayed.result, isolated, slo), steps=True)

    def floor(self, trace: Trace) -> dict[str, float] | None:
        engine = self.engine
        blocks = engine.num_gpu_blocks
        return throughput_floor(trace, engine.profile_name, engine.offload_copy_model,
                                engine.max_num_batched_tokens,
                                None if blocks is None else blocks * BLOCK_SIZE)


@dataclass(frozen=True)
class Cluster:
    """Each replay on the replicas of a cluster file behind its router, in virtual time
    (`harness bench --cluster`): `runs` says which router and policy each label means;
    `engine`, what every replica shares (the file says the rest of each, `engine_spec`)."""

    runs: ClusterRuns
    engine: EngineSpec
    mode: str = "virtual"
    parallel: bool = True

    @classmethod
    def of(cls, runs: ClusterRuns, engine: EngineSpec) -> Cluster:
        """The cluster of `runs` with `engine`'s seed and settings; the isolated JCTs are
        measured on its first decoding replica (`ClusterRuns.isolated_profile`)."""
        profile, blocks = runs.isolated_profile()
        return cls(runs, replace(engine, profile=profile, num_gpu_blocks=blocks))

    def cluster(self) -> dict[str, Any] | None:
        return self.runs.config.model_dump()

    def context_limit(self) -> int | None:
        """The smallest replica's: a program may land anywhere."""
        config = self.runs.config
        return min(engine_context_limit(config.engine_spec(r, self.engine))
                   for r in config.replicas)

    def isolated(self, trace: Trace, out: Path,
                 progress: Progress) -> tuple[dict[str, float], IsolatedCost | None]:
        return isolated_timed(trace, self.engine, out, progress)

    def replay(self, trace: Trace, run: Run, progress: Progress) -> Replayed:
        config = self.runs.config_for(run.policy)
        base = self.engine

        def engine(spec: ReplicaSpec) -> Any:
            return make_engine(spec.policy, config.engine_spec(spec, base), trace=trace,
                               replica=spec, cluster=config)

        def one() -> Any:
            engines = VirtualCluster(config, seed=base.seed, make_engine=engine)
            try:
                result = replay_cluster(trace, engines, progress=progress,
                                        concurrency=run.concurrency)
            finally:
                engines.close()
            result.measured = steady_programs(result, run.steady)
            return result

        return timed(one)

    def metrics(self, replayed: Replayed, isolated: dict[str, float],
                slo: SLO) -> dict[str, Any]:
        result = replayed.result
        return timing(replayed, {**replay_metrics(result, isolated, slo),
                                 **cluster_metrics(result, slo)}, steps=True)

    def floor(self, trace: Trace) -> dict[str, float] | None:
        return None  # the bound is one machine's; a cluster's would need its placement
