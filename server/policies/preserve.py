"""`preserve`: keep a program's KV cache for the whole interception (InferCept section 4.1).

Every finished turn that is not the program's last is pinned with no time limit. The pin ends
when the program's next turn is admitted (hand-off), when the program ends, or when an
allocation would otherwise fail (the scheduler's memory-pressure release, latest-arrived
program first). Ordering is program-level FCFS like InferCept's. No constants.
"""

from __future__ import annotations

from server.policies.base import RequestView
from server.policies.program_fcfs import ProgramFCFSPolicy


class PreservePolicy(ProgramFCFSPolicy):
    name = "preserve"

    def on_finish(self, req: RequestView, now: float) -> bool:
        return (req.program_id is not None and not req.hints.last
                and req.program_id not in self.ended)

    def pin_expired(self, program_id: str, now: float, has_waiting: bool) -> bool:
        return program_id in self.ended

    def pin_victim(self, pinned_program_ids: list[str]) -> str:
        return max(pinned_program_ids, key=lambda p: self.program_arrival.get(p, float("inf")))
