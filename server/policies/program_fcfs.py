"""Program-level FCFS bookkeeping shared by the policies that order by program arrival.

InferCept's improved discard, preserve and Autellix all rank a resumed turn by when its
*program* arrived, not when the turn did: an agent that comes back from a tool call does not go
to the back of the queue. This base tracks each program's first arrival (a `program_start`
event or its first request, whichever comes first) and forgets it at `program_end` or after
the program's last turn, so memory stays bounded on long runs.
"""

from __future__ import annotations

from server.policies.base import AgentEvent, Policy, RequestView
from server.policies.memory import RecentIds

PREEMPTED, OTHER = 0, 1


class ProgramFCFSPolicy(Policy):
    reorders_queue = True

    def __init__(self, cost_model=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(cost_model)
        self.program_arrival: dict[str, float] = {}
        self.ended = RecentIds()

    def _seen(self, program_id: str | None, t: float) -> float:
        if program_id is None:
            return t
        return self.program_arrival.setdefault(program_id, t)

    def on_arrival(self, req: RequestView, now: float) -> None:
        self._seen(req.program_id, req.arrival_time)

    def on_event(self, event: AgentEvent, now: float) -> None:
        if event.kind == "program_start":
            self._seen(event.program_id, now)
            self.ended.discard(event.program_id)
        elif event.kind == "program_end":
            self.program_arrival.pop(event.program_id, None)
            self.ended.add(event.program_id)

    def program_rank(self, req: RequestView) -> float:
        if req.program_id is None:
            return req.arrival_time
        return self.program_arrival.get(req.program_id, req.arrival_time)

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        cls = PREEMPTED if req.num_preemptions > 0 else OTHER
        return (cls, self.program_rank(req), req.arrival_time)
