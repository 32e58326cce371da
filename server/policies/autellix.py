"""`autellix`: program-level least attained service, PLAS (Luo et al., Autellix, 2025, section 4).

A program's attained service is the engine time its finished turns spent in the running batch
(first admission to finish), summed over the program. Waiting turns are ranked by discretised
service: level k holds programs with service in [Q0 * R^(k-1), Q0 * R^k), level 0 those below
Q0, so short programs (and new ones) go first while long ones share the rest in FCFS order by
program arrival. A starvation guard lifts a turn to level 0 once it has waited longer than
max(STARVE_MIN_S, STARVE_RATIO x its program's service). KV caches are freed as in vLLM.

Constants: Q0 = 0.5 s, R = 2 (levels double, as in the paper's multi-level queues),
LEVELS = 10, STARVE_MIN_S = 10 s, STARVE_RATIO = 2.
"""

from __future__ import annotations

import math

from server.policies.base import AgentEvent, RequestView
from server.policies.program_fcfs import PREEMPTED, ProgramFCFSPolicy

Q0_S = 0.5
RATIO = 2.0
LEVELS = 10
STARVE_MIN_S = 10.0
STARVE_RATIO = 2.0


class AutellixPolicy(ProgramFCFSPolicy):
    name = "autellix"

    def __init__(self, cost_model=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(cost_model)
        self.service: dict[str, float] = {}
        self._admitted: dict[str, float] = {}

    def on_scheduled(self, req: RequestView, now: float) -> None:
        self._admitted.setdefault(req.request_id, now)

    def on_finish(self, req: RequestView, now: float) -> bool:
        admitted = self._admitted.pop(req.request_id, None)
        if req.program_id is not None and admitted is not None:
            self.service[req.program_id] = self.service.get(req.program_id, 0.0) + now - admitted
        if req.hints.last and req.program_id is not None:
            self.service.pop(req.program_id, None)
        return False

    def on_event(self, event: AgentEvent, now: float) -> None:
        super().on_event(event, now)
        if event.kind == "program_end":
            self.service.pop(event.program_id, None)

    def level(self, service_s: float) -> int:
        if service_s < Q0_S:
            return 0
        return min(LEVELS - 1, 1 + int(math.log(service_s / Q0_S, RATIO)))

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        if req.num_preemptions > 0:
            return (PREEMPTED, 0, self.program_rank(req), req.arrival_time)
        service = self.service.get(req.program_id, 0.0) if req.program_id else 0.0
        waited = now - req.arrival_time
        starving = waited > max(STARVE_MIN_S, STARVE_RATIO * service)
        level = 0 if starving else self.level(service)
        return (1, level, self.program_rank(req), req.arrival_time)
