"""`mori`: MORI's program scheduler with a CPU tier, re-derived from its paper (arXiv 2606.00866).

What it does (the paper's rules as the issue and DESIGN.md state them; our code):

* It builds on ThunderAgent's accounting (active programs' contexts plus 100 tokens each, less
  the tokens they share, against the KV capacity, decided on the same 5 s tick; a new program
  waits behind the queued ones: `server.programs.capacity`) and adds the host tier: programs
  are ranked by *idleness*, the share of their last `IDLENESS_CYCLES` = 5 cycles (a turn and
  its tool call) spent in tool calls.
* A program on the GPU tier keeps its KV resident through its tool calls (the engine pins it).
* Above capacity the most idle acting programs are demoted GPU -> CPU (paused, KV released to
  the host tier) and, when the host tier is full, the most idle go on to dropped: to make room
  for a demoted context, the paused programs in the tier more idle than it are dropped, most
  idle first; if even that leaves no room, the demoted context itself is dropped. The tier's
  size is the engine's host tier in tokens (`configure`); a dropped context is recomputed when
  its program returns, even where the tier's own LRU still holds a copy (`reloads`).
* The least idle are promoted first: returning programs (a turn already waiting) before new
  ones; a program resumes on the replica that holds its KV when it fits there (sticky
  placement, `place`).
"""

from __future__ import annotations

from server.costs import CostModel
from server.programs.capacity import CapacityScheduler, resume_class
from server.programs.state import Kv, ProgramState


class Mori(CapacityScheduler):
    """The loop is `CapacityScheduler`'s at the paper's thresholds (1.0); the order most idle
    first (least idle first back), the KV kept on the GPU through tool calls and, at a pause,
    sent to the host tier, or dropped down the idleness ladder when the tier is full."""

    name = "mori"

    def __init__(self, capacity_tokens: int = 0, cost_model: CostModel | None = None,
                 host_tier: bool = True, *, host_tier_tokens: int | None = None) -> None:
        super().__init__(capacity_tokens, cost_model, host_tier)
        self.host_tier_tokens = host_tier_tokens

    def pause_order(self, st: ProgramState) -> tuple[float, ...]:
        return (-st.idleness, st.arrival)

    def resume_order(self, st: ProgramState) -> tuple[float, ...]:
        return (resume_class(st), st.idleness, st.arrival)

    def paused_kv(self, st: ProgramState) -> Kv | None:
        """The host tier when the context fits there, making room by dropping the paused
        programs more idle than `st`, most idle first; else dropped."""
        if not self.host_tier:
            return Kv.NONE
        cap = self.host_tier_tokens
        if cap is None:
            return Kv.CPU
        over = self._host_used(st) + st.context_tokens - cap
        if over <= 0:
            return Kv.CPU
        idler = sorted((o for o in self.table.inactive() if o.kv is Kv.CPU and o is not st
                        and o.idleness > st.idleness), key=self.pause_order)
        if sum(o.context_tokens for o in idler) < over:
            return Kv.NONE
        for o in idler:
            if over <= 0:
                break
            o.kv = Kv.NONE
            over -= o.context_tokens
        return Kv.CPU

    def on_turn_end(self, st: ProgramState, now: float) -> Kv:
        return Kv.GPU

    def reloads(self, program_id: str | None) -> bool:
        """A context this scheduler dropped is recomputed, not reloaded: paused once, its KV
        neither on the GPU nor in the tier by the books."""
        st = self.table.get(program_id)
        return st is None or not (st.kv is Kv.NONE and st.pauses > 0)

    def _host_used(self, excluding: ProgramState) -> int:
        """What the programs in the host tier hold, `excluding` (the one being demoted: its
        earlier copy there is the one it replaces)."""
        return sum(st.context_tokens for st in self.table
                   if st.kv is Kv.CPU and st is not excluding)
