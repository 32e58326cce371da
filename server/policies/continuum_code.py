"""`continuum-code`: Continuum with the memory-pressure rule of its authors' public code.

The paper (see `continuum`) gives up the latest-arrived program's pin whenever an allocation
would fail, which is also what our `continuum` does. The authors' public implementation
behaves differently under pressure, and the two readings can change results, so both are
measured:

* Pins are released under pressure only when nothing else is running
  (`unpin_under_pressure`): while other requests run, a failed allocation leaves the pins in
  place, so a waiting turn waits and a running turn that needs a block makes vLLM preempt.
* The running request preempted first is one of the latest-arrived program, sparing last
  steps: the running batch is ordered so that turns hinted as their program's last LLM call
  come first, then by program arrival, and vLLM preempts from the end (`running_key`). A
  program about to finish is spared because preempting it throws away the work that would
  free all its memory.

Everything else (the TTL, cold start, eta, queue order, expiry, the pin victim once nothing
runs) is the paper's, inherited unchanged, so a difference between `continuum` and
`continuum-code` is the pressure rule's alone. Not adopted here: the public code's fixed 2 s
TTL (the paper's utility TTL is kept; a fixed TTL is a separate question). Reading: "last
steps" are the turns the client marks `last` (the program's final LLM call); ordering the
running batch also serves the earliest programs' running turns first within a step's token
budget, which program-level FCFS already intends. No constants.
"""

from __future__ import annotations

from server.policies.base import RequestView
from server.policies.continuum import ContinuumPolicy


class ContinuumCodePolicy(ContinuumPolicy):
    name = "continuum-code"
    orders_running = True

    def unpin_under_pressure(self, others_running: bool) -> bool:
        return not others_running

    def running_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        """Last steps first (spared), then program arrival: the end is preempted first."""
        st = self._programs.get(req.program_id) if req.program_id is not None else None
        arrival = st.arrival if st is not None else req.arrival_time
        return (0.0 if req.hints.last else 1.0, arrival, req.arrival_time)
