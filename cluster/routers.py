"""Every routing strategy by name, built from a cluster file's router section.

Why a module of its own: the strategies are small classes in `cluster.routing` (session
affinity, round robin, least loaded, P/D) and `cluster.ampd` (AMPD's adaptive prefill routing,
which builds on the P/D router); the one place that knows all of them sits above both, so
neither has to import the other's users.
"""

from __future__ import annotations

from typing import Any

from cluster.ampd import AMPDRouter
from cluster.program_queue import ProgramQueueRouter
from cluster.program_router import ProgramRouter
from cluster.routing import (
    LeastLoadedRouter,
    PDRouter,
    RoundRobinRouter,
    Router,
    SessionRouter,
)

ROUTERS: dict[str, type[Router]] = {
    cls.name: cls for cls in (SessionRouter, RoundRobinRouter, LeastLoadedRouter, PDRouter,
                              ProgramRouter, ProgramQueueRouter)
}


def make_router(spec: Any, cluster: Any = None) -> Router:
    """A router from a `cluster.config.RouterSpec`; `ampd` also needs the `ClusterConfig`
    (`cluster`), whose replica profiles and links price its estimates."""
    strategy = spec.strategy
    if strategy == "ampd":
        if cluster is None:
            raise ValueError("router strategy 'ampd' prices prefills with the replicas' "
                             "profiles and links: build it with make_router(spec, cluster)")
        return AMPDRouter.from_spec(spec, cluster)
    if strategy not in ROUTERS:
        raise ValueError(f"unknown router strategy {strategy!r}; choose one of "
                         f"{', '.join([*ROUTERS, 'ampd'])}")
    if strategy == "session":
        return SessionRouter(kv_guard=spec.kv_guard,
                             hash_points=spec.hash_points)
    if strategy == "programs":
        return ProgramRouter(carry_kv=spec.carry_kv, stale_after_s=spec.stale_after_s)
    return ROUTERS[strategy]()
