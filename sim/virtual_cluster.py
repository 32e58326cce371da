"""The replicas of a cluster file as in-process engines on virtual clocks, and the router's view
of them (`VirtualCluster`); `sim.loop` replays a trace on it.

Why: routing and disaggregation policies are compared on thousands of programs, exactly and
repeatably, on a laptop, as single-engine policies are (`sim.replay`: one engine is a cluster of
one replica, `VirtualCluster.around`). Each replica is a `server.engine.VirtualEngine` (the real
vLLM `EngineCore`, our scheduler, the emulated GPU) with its own `VirtualClock`; the router is
the same `cluster.routing` object the served cluster uses.

Only one engine runs at a time, so the process-wide clock (`server.clock`) is switched to the
engine's own before every call into it (`Replica.active`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cluster.config import ClusterConfig, ReplicaSpec, parse_cluster
from cluster.routers import make_router
from cluster.routing import ReplicaLoad, Router
from server.clock import clock, use_clock
from server.engine_spec import EngineSpec
from sim.engines import make_engine as engine_for


@dataclass
class ReplicaStats:
    """What one replica did in a replay (summed over its engine steps)."""

    name: str
    role: str
    engine_steps: int = 0
    busy_s: float = 0.0  # clock time spent in steps that computed something or waited on KV
    turns_decoded: int = 0
    prefills: int = 0  # turns whose prompt this replica computed (local or for a decode replica)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    kv_bytes_in: int = 0  # KV pulled from other replicas
    kv_seconds_in: float = 0.0


class Replica:
    """One engine of the cluster and the router's view of it."""

    def __init__(self, spec: ReplicaSpec, engine: Any) -> None:
        self.spec = spec
        self.name = spec.name
        self.engine = engine
        self.stats = ReplicaStats(spec.name, spec.role)

    @contextmanager
    def active(self):
        """The engine's clock is the process clock while we call into it."""
        previous = use_clock(self.engine.clock)
        try:
            yield self.engine
        finally:
            use_clock(previous)

    def now(self) -> float:
        return self.engine.clock.now()

    def has_work(self) -> bool:
        return self.engine.has_work()

    def load(self) -> ReplicaLoad:
        """The router's view: KV usage, queue lengths, and the prefill queue task by task
        (AMPD's Eq. 1-2 queue term: what each task has cached is not priced again)."""
        scheduler = self.engine.scheduler
        pool = scheduler.kv_cache_manager.block_pool
        usage = 1.0 - pool.get_num_free_blocks() / max(1, pool.num_gpu_blocks)
        tasks: list[tuple[int, int]] = []
        decode_tokens = 0
        for r in scheduler.running:
            left = r.num_prompt_tokens - r.num_computed_tokens
            if left > 0:
                tasks.append((r.num_computed_tokens, left))
            else:
                decode_tokens += r.num_tokens
        holding = getattr(scheduler, "kv_holding_waiting", ())
        for queue in (holding, scheduler.waiting):
            for r in queue:
                cached = min(r.num_prompt_tokens, self._cached(r))
                if r.num_prompt_tokens > cached:
                    tasks.append((cached, r.num_prompt_tokens - cached))
        return ReplicaLoad(self.name, self.spec.role, kv_usage=usage,
                           in_flight=len(scheduler.running) + len(scheduler.waiting)
                           + len(holding),
                           running=len(scheduler.running),
                           waiting=len(scheduler.waiting) + len(holding),
                           queued_prefill_tokens=sum(new for _, new in tasks),
                           queued_prefills=tuple(tasks), decode_tokens=decode_tokens,
                           kv_capacity_tokens=pool.num_gpu_blocks * scheduler.block_size)

    def _cached(self, request: Any) -> int:
        """Tokens of a waiting request that need no compute here: computed already, a hit in
        this replica's prefix cache, or KV read from a peer (a decode replica's request whose
        prompt a prefill replica computed: all of it; a prefill replica's request that reads
        the program's history from its decode replica: that history)."""
        params = request.kv_transfer_params or {}
        if params.get("do_remote_prefill"):
            return request.num_prompt_tokens
        external = int(params.get("remote_num_tokens") or 0) if params.get(
            "remote_block_ids") else 0
        manager = self.engine.scheduler.kv_cache_manager
        hit = 0
        if manager.enable_caching and request.block_hashes:
            hit = manager.coordinator.find_longest_cache_hit(
                request.block_hashes, request.num_tokens - 1)[1]
        return max(request.num_computed_tokens, hit, external)


class VirtualCluster:
    """The replicas of a cluster file as in-process engines (see the module docstring).

    `make_engine(spec)` builds one replica's `VirtualEngine`; by default `sim.engines.make_engine`,
    so every engine option stays in one place.
    """

    def __init__(self, config: ClusterConfig, *, seed: int = 0,
                 make_engine: Callable[[ReplicaSpec], Any] | None = None,
                 router: Router | None = None) -> None:
        self.config = config
        self.router = router or make_router(config.router, config)
        self._owns_engines = True
        self._outer_clock = clock()
        if make_engine is None:
            def make_engine(spec: ReplicaSpec) -> Any:
                return engine_for(spec.policy, config.engine_spec(spec, EngineSpec(seed=seed)),
                                  replica=spec, cluster=config)
        build = make_engine
        self.replicas: list[Replica] = []
        try:
            for spec in config.replicas:
                self.replicas.append(Replica(spec, build(spec)))
        except BaseException:
            self.close()
            raise
        use_clock(self._outer_clock)
        self.by_name = {r.name: r for r in self.replicas}

    @classmethod
    def around(cls, engine: Any) -> VirtualCluster:
        """One engine as a cluster of one replica (left open by `close`: the caller owns it)."""
        config = parse_cluster({"replicas": [{"name": "engine",
                                              "profile": engine.spec.profile_name,
                                              "policy": engine.policy.engine_name}]})
        cluster = cls(config, make_engine=lambda spec: engine)
        cluster._owns_engines = False
        return cluster

    def loads(self) -> list[ReplicaLoad]:
        return [r.load() for r in self.replicas]

    def close(self) -> None:
        if not self._owns_engines:
            return
        for replica in self.replicas:
            with replica.active() as engine:
                engine.close()
        use_clock(self._outer_clock)
