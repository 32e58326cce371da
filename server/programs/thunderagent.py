"""`thunderagent`: ThunderAgent's program scheduler, re-derived from its paper (arXiv 2602.13692).

What it does (the paper's rules; our code):

* Every program is reasoning (a turn queued or in flight) or acting (in a tool call), and active
  or paused. Every `TICK_S` = 5 s it counts the backend's usage: the context tokens of every
  active program, reasoning or acting, plus `PER_PROGRAM_TOKENS` = 100 per program, against the
  backend's KV capacity.
* Above capacity (`pause_above` x capacity; 1.0 in the paper, 0.95 in NVIDIA Dynamo's port) it
  pauses acting programs, smallest context first, until usage is down to `pause_to` x capacity
  (1.0; Dynamo 0.80); if pausing every acting program is not enough, it marks reasoning
  programs, smallest first, to pause when their turn ends. Smallest first because the cost of a
  pause is a re-prefill, which grows with the square of the context.
* A paused program's KV is assumed lost (the engine's LRU reclaims it; the next turn
  re-prefills wherever it resumes): ThunderAgent runs in front of unmodified engines and holds
  no pins.
* Below capacity it resumes, up to `resume_to` x capacity (1.0; Dynamo 0.85), in this order:
  paused programs whose next turn is already waiting, then new programs, then paused acting
  programs; smallest context first within each class; each placed on the backend with the most
  free room (`ProgramScheduler.place`).
* A new program is admitted at once when it fits (a router forwards a request it has no reason
  to hold); otherwise it waits for a tick. When the engine has nothing to run, the caller asks
  at once instead of waiting for the tick (`decide(idle=True)`): a tick would only idle it.
"""

from __future__ import annotations

from server.programs.base import PER_PROGRAM_TOKENS, ProgramScheduler
from server.programs.state import Kv, Phase, ProgramState

TICK_S = 5.0


class ThunderAgent(ProgramScheduler):
    name = "thunderagent"
    tick_s = TICK_S

    def __init__(self, capacity_tokens: int = 0, cost_model: object | None = None,
                 host_tier: bool = False, *, pause_above: float = 1.0, pause_to: float = 1.0,
                 resume_to: float = 1.0) -> None:
        super().__init__(capacity_tokens, cost_model, host_tier)
        if not 0 < pause_to <= pause_above or not 0 < resume_to <= pause_above:
            raise ValueError("thunderagent thresholds: need 0 < pause_to <= pause_above and "
                             f"0 < resume_to <= pause_above, got {pause_to}, {pause_above}, "
                             f"{resume_to}")
        self.pause_above = pause_above
        self.pause_to = pause_to
        self.resume_to = resume_to

    def on_new(self, st: ProgramState, now: float) -> None:
        need = st.context_tokens + PER_PROGRAM_TOKENS
        if self.active_usage() + need <= self.resume_to * self.capacity_tokens:
            self.resume(st, now)

    def on_turn_end(self, st: ProgramState, now: float) -> Kv:
        return Kv.CPU if self.host_tier else Kv.NONE  # no pins: the engine's LRU decides

    def pause(self, st: ProgramState, now: float, kv: Kv | None = None) -> None:
        super().pause(st, now, Kv.CPU if self.host_tier else Kv.NONE)

    def rebalance(self, now: float) -> None:
        cap = self.capacity_tokens
        usage = self.active_usage()
        if usage > self.pause_above * cap:
            acting = sorted((st for st in self.table.active() if st.phase is Phase.ACTING),
                            key=lambda st: (st.context_tokens, st.arrival))
            for st in acting:
                if usage <= self.pause_to * cap:
                    break
                usage -= self.held_tokens(st)
                self.pause(st, now)
            if usage > self.pause_to * cap:
                reasoning = sorted((st for st in self.table.active()
                                    if st.phase is not Phase.ACTING and not st.pause_on_finish),
                                   key=lambda st: (st.context_tokens, st.arrival))
                for st in reasoning:
                    if usage <= self.pause_to * cap:
                        break
                    usage -= self.held_tokens(st)
                    st.pause_on_finish = True
            return
        for st in sorted(self.table.inactive(), key=_resume_order):
            need = self.held_tokens(st)
            if usage + need > self.resume_to * cap and usage > 0:
                continue  # a smaller one later in the order may still fit
            self.resume(st, now)
            usage += need


def _resume_order(st: ProgramState) -> tuple[int, int, float]:
    if st.phase is Phase.NEW:
        cls = 1
    elif st.turn_waiting:
        cls = 0
    else:
        cls = 2
    return (cls, st.context_tokens, st.arrival)
