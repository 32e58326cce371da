"""`mori`: MORI's program scheduler with a CPU tier, re-derived from its paper (arXiv 2606.00866).

What it does (the paper's rules as the issue and DESIGN.md state them; our code):

* It builds on ThunderAgent's accounting (active programs' contexts plus 100 tokens each
  against the KV capacity, decided on the same 5 s tick) and adds the host tier: programs are
  ranked by *idleness*, the share of their last `IDLENESS_CYCLES` = 5 cycles (a turn and its
  tool call) spent in tool calls.
* A program on the GPU tier keeps its KV resident through its tool calls (the engine pins it).
  Above capacity the most idle acting programs are demoted GPU -> CPU (paused, KV released to
  the host tier) and, when the host tier is full, to dropped; the least idle are promoted first.
* Returning programs (a turn already waiting) are promoted before new ones; a program resumes
  on the replica that holds its KV when it fits there (sticky placement, `place`).
"""

from __future__ import annotations

from server.programs.base import PER_PROGRAM_TOKENS, ProgramScheduler
from server.programs.state import Kv, Phase, ProgramState

TICK_S = 5.0


class Mori(ProgramScheduler):
    name = "mori"
    tick_s = TICK_S

    def __init__(self, capacity_tokens: int = 0, cost_model: object | None = None,
                 host_tier: bool = True, *, host_capacity_tokens: int | None = None) -> None:
        super().__init__(capacity_tokens, cost_model, host_tier)
        #: what the host tier holds (None: unbounded, the engine's own LRU evicts)
        self.host_capacity_tokens = host_capacity_tokens

    def on_new(self, st: ProgramState, now: float) -> None:
        if self.active_usage() + st.context_tokens + PER_PROGRAM_TOKENS <= self.capacity_tokens:
            self.resume(st, now)

    def on_turn_end(self, st: ProgramState, now: float) -> Kv:
        return Kv.GPU

    def _host_used(self) -> int:
        return sum(st.context_tokens for st in self.table if st.kv is Kv.CPU)

    def rebalance(self, now: float) -> None:
        cap = self.capacity_tokens
        usage = self.active_usage()
        if usage > cap:
            acting = sorted((st for st in self.table.active() if st.phase is Phase.ACTING),
                            key=lambda st: (-st.idleness, st.arrival))
            for st in acting:
                if usage <= cap:
                    break
                usage -= self.held_tokens(st)
                fits = (self.host_tier and (self.host_capacity_tokens is None or
                        self._host_used() + st.context_tokens <= self.host_capacity_tokens))
                self.pause(st, now, Kv.CPU if fits else Kv.NONE)
            if usage > cap:
                reasoning = sorted((st for st in self.table.active()
                                    if st.phase is not Phase.ACTING and not st.pause_on_finish),
                                   key=lambda st: (-st.idleness, st.arrival))
                for st in reasoning:
                    if usage <= cap:
                        break
                    usage -= self.held_tokens(st)
                    st.pause_on_finish = True
            return
        order = sorted(self.table.inactive(), key=lambda st: (
            0 if st.turn_waiting and st.phase is not Phase.NEW else
            1 if st.phase is Phase.NEW else 2, st.idleness, st.arrival))
        for st in order:
            need = self.held_tokens(st)
            if usage + need > cap and usage > 0:
                continue
            self.resume(st, now)
            usage += need
