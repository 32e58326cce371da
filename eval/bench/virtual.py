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

from common.metrics import SLO, cluster_metrics, replay_metrics
from common.trace import Trace
from eval.bench.backends import Progress, Replayed, timed, timing
from eval.bench.floor import throughput_floor
from eval.bench.isolated import IsolatedCost, isolated_timed
from eval.bench.runs import Run
from eval.bench.specs import BenchError, ClusterRuns, Engines
from server.max_model_len import BLOCK_SIZE, context_limit
from server.policies.spec import PolicySpec
from sim.engines import make_engine
from sim.loop import replay_cluster
from sim.records import steady_programs
from sim.replay import replay
from sim.virtual_cluster import VirtualCluster


@dataclass(frozen=True)
class SingleEngine:
    """Each replay on one fresh in-process engine of `engines` (`harness bench`), running the
    one of `policies` its run names (a run's label is its policy's text)."""

    engines: Engines
    policies: tuple[PolicySpec, ...] = ()
    mode: str = "virtual"
    parallel: bool = True

    def cluster(self) -> dict[str, Any] | None:
        return None

    def context_limit(self) -> int | None:
        return self.engines.context_limit()

    def isolated(self, trace: Trace, out: Path,
                 progress: Progress) -> tuple[dict[str, float], IsolatedCost | None]:
        return isolated_timed(trace, self.engines, out, progress)

    def replay(self, trace: Trace, run: Run, progress: Progress) -> Replayed:
        policy = next(p for p in self.policies if str(p) == run.policy)

        def one() -> Any:
            engine = self.engines.make(policy, trace)
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
        settings = self.engines.settings
        blocks = settings.num_gpu_blocks
        return throughput_floor(trace, self.engines.profile, settings.offload_copy_model,
                                settings.max_num_batched_tokens,
                                None if blocks is None else blocks * BLOCK_SIZE)


@dataclass(frozen=True)
class Cluster:
    """Each replay on the replicas of a cluster file behind its router, in virtual time
    (`harness bench --cluster`): `runs` says which router and policy each label means."""

    runs: ClusterRuns
    engines: Engines
    mode: str = "virtual"
    parallel: bool = True

    @classmethod
    def of(cls, runs: ClusterRuns, engines: Engines) -> Cluster:
        """The cluster of `runs` with `engines`' seed and settings; the isolated JCTs are
        measured on its first decoding replica (`ClusterRuns.isolated_profile`)."""
        profile, blocks = runs.isolated_profile()
        settings = replace(engines.settings, num_gpu_blocks=blocks)
        return cls(runs, Engines(profile, engines.seed, settings))

    def cluster(self) -> dict[str, Any] | None:
        return self.runs.config.model_dump()

    def context_limit(self) -> int | None:
        """The smallest replica's: a program may land anywhere."""
        try:
            return min(context_limit(r.profile, r.num_gpu_blocks,
                                     self.engines.settings.max_model_len)
                       for r in self.runs.config.replicas)
        except ValueError as exc:
            raise BenchError(str(exc)) from None

    def isolated(self, trace: Trace, out: Path,
                 progress: Progress) -> tuple[dict[str, float], IsolatedCost | None]:
        return isolated_timed(trace, self.engines, out, progress)

    def replay(self, trace: Trace, run: Run, progress: Progress) -> Replayed:
        config = self.runs.config_for(run.policy)
        seed, settings = self.engines.seed, self.engines.settings

        def engine(spec: Any) -> Any:
            return make_engine(spec.policy, spec.profile, seed, spec.num_gpu_blocks,
                               spec.offload_gib, spec, config, settings.max_model_len,
                               settings.max_num_batched_tokens,
                               offload_copy_model=settings.offload_copy_model, trace=trace)

        def one() -> Any:
            engines = VirtualCluster(config, seed=seed, make_engine=engine)
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
