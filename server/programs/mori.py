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

from server.costs import CostModel
from server.programs.capacity import CapacityScheduler, resume_class
from server.programs.state import Kv, ProgramState


class Mori(CapacityScheduler):
    """The loop is `CapacityScheduler`'s at the paper's thresholds (1.0); the order most idle
    first (least idle first back), the KV kept on the GPU through tool calls and, at a pause,
    sent to the host tier while it has room."""

    name = "mori"

    def __init__(self, capacity_tokens: int = 0, cost_model: CostModel | None = None,
                 host_tier: bool = True, *, host_capacity_tokens: int | None = None) -> None:
        super().__init__(capacity_tokens, cost_model, host_tier)
        #: what the host tier holds (None: unbounded, the engine's own LRU evicts)
        self.host_capacity_tokens = host_capacity_tokens

    def pause_order(self, st: ProgramState) -> tuple[float, ...]:
        return (-st.idleness, st.arrival)

    def resume_order(self, st: ProgramState) -> tuple[float, ...]:
        return (resume_class(st), st.idleness, st.arrival)

    def paused_kv(self, st: ProgramState) -> Kv | None:
        """The host tier while it has room for the context, else dropped."""
        fits = (self.host_tier and (self.host_capacity_tokens is None or
                self._host_used() + st.context_tokens <= self.host_capacity_tokens))
        return Kv.CPU if fits else Kv.NONE

    def on_turn_end(self, st: ProgramState, now: float) -> Kv:
        return Kv.GPU

    def _host_used(self) -> int:
        return sum(st.context_tokens for st in self.table if st.kv is Kv.CPU)
