"""The Serve request router of a cluster's replicas deployment (see `cluster.ray_router` for
the design): each request goes to the replica the cluster's router chose, and the running
replicas Serve reports feed the cluster's `ReplicaView`.

Why a module of its own: Serve ships a request router class to each process that routes by
pickling its module by value (`RequestRouterConfig`), globals included; the shared view must
therefore live in another module (`cluster.ray_router`), which is imported, not copied.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from cluster.ray_router import ReplicaGoneError, view_for


class HarnessRequestRouter(RequestRouter):
    """The replicas deployment's Serve request router: sends each request to the replica the
    cluster's router chose (`HttpCall.target`), and keeps `ReplicaView` up to date."""

    def initialize_state(self, **kwargs: Any) -> None:
        self.view = view_for(self._deployment_id.app_name, self._deployment_id.name)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self.view.update(replicas)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if pending_request is None:
            return [candidate_replicas]
        if pending_request.future.done():  # failed below: let Serve's loop see it and stop
            return [candidate_replicas[:1]]
        call = pending_request.args[0] if pending_request.args else None
        target = getattr(call, "target", None)
        if target is None:
            return [candidate_replicas]
        chosen = [r for r in candidate_replicas if r.replica_metadata.get("name") == target]
        if not chosen:
            pending_request.future.set_exception(ReplicaGoneError(self.view.gone_message(target)))
            return [candidate_replicas[:1]]
        return [chosen]
