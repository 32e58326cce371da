"""`autellix`: program-level least attained service, PLAS (Luo et al., Autellix, 2025, section 4).

A program's attained service is the engine time its turns have spent in the running batch
(first admission to finish), summed over the program, counting the turns still running up to
now. Turns are ranked by discretised service: level k holds programs with service in
[Q0 * R^(k-1), Q0 * R^k), level 0 those below Q0, so short programs (and new ones) go first
while long ones share the rest in FCFS order by program arrival. A starvation guard lifts a
waiting turn to level 0 once it has waited longer than max(STARVE_MIN_S, STARVE_RATIO x its
program's service). KV caches are freed as in vLLM.

Demotion happens while a turn runs, not only at admission: the running batch is re-ranked every
step by the same levels (`running_key`), so a program whose service crosses a queue boundary
mid-turn drops behind the programs of higher queues, gets the step's token budget after them
and is the first vLLM preempts when memory runs out (it resumes, a preempted turn, ahead of the
waiting queue, as vLLM's recompute preemption does). Reading: with continuous batching every
running turn advances each step, so the levels order who is served and who is preempted first;
nothing is preempted for priority alone (the paper's engine preempts on memory as vLLM does).

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
    orders_running = True

    def __init__(self, cost_model=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(cost_model)
        self.service: dict[str, float] = {}  # program -> service of its finished turns
        self._admitted: dict[str, float] = {}  # running request -> first admission
        self._running: dict[str, dict[str, float]] = {}  # program -> its running turns

    def on_scheduled(self, req: RequestView, now: float) -> None:
        admitted = self._admitted.setdefault(req.request_id, now)
        if req.program_id is not None:
            self._running.setdefault(req.program_id, {})[req.request_id] = admitted

    def on_finish(self, req: RequestView, now: float) -> bool:
        admitted = self._admitted.pop(req.request_id, None)
        program = req.program_id
        if program is not None:
            turns = self._running.get(program, {})
            turns.pop(req.request_id, None)
            if not turns:
                self._running.pop(program, None)
            if admitted is not None:
                self.service[program] = self.service.get(program, 0.0) + now - admitted
            if req.hints.last:
                self.service.pop(program, None)
        return False

    def attained(self, program_id: str | None, now: float) -> float:
        """Service of the program's finished turns plus its running turns' time so far."""
        if program_id is None:
            return 0.0
        running = self._running.get(program_id, {})
        return self.service.get(program_id, 0.0) + sum(now - t for t in running.values())

    def on_event(self, event: AgentEvent, now: float) -> None:
        super().on_event(event, now)
        if event.kind == "program_end":
            self.service.pop(event.program_id, None)
            for rid in self._running.pop(event.program_id, {}):
                self._admitted.pop(rid, None)

    def level(self, service_s: float) -> int:
        if service_s < Q0_S:
            return 0
        return min(LEVELS - 1, 1 + int(math.log(service_s / Q0_S, RATIO)))

    def running_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        """The running turn's current level: crossing a boundary demotes it mid-turn."""
        return (self.level(self.attained(req.program_id, now)), self.program_rank(req),
                req.arrival_time)

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        if req.num_preemptions > 0:
            return (PREEMPTED, 0, self.program_rank(req), req.arrival_time)
        service = self.attained(req.program_id, now)
        waited = now - req.arrival_time
        starving = waited > max(STARVE_MIN_S, STARVE_RATIO * service)
        level = 0 if starving else self.level(service)
        return (1, level, self.program_rank(req), req.arrival_time)
