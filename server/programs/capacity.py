"""The skeleton ThunderAgent and MORI share: on a tick, the active programs' contexts (plus the
per-program allowance, less the tokens they share) against the KV capacity; above it, acting
programs are paused, and if that is not enough reasoning ones are marked to pause when their
turn ends; below it, paused and new programs resume in order while they fit.

Why one skeleton: the two papers' schedulers are the same loop and differ only in the order
programs give way and come back (ThunderAgent: smallest context first; MORI: most idle first),
the thresholds (ThunderAgent's are configurable, Dynamo's port uses a band) and where a paused
program's KV goes (ThunderAgent: nowhere it controls; MORI: the host tier while it has room,
and kept on the GPU through tool calls). A subclass states only those.

Two rules are ThunderAgent's released code rather than its paper (MORI builds on ThunderAgent,
so it keeps them):

* **Shared tokens.** The books count each program's context in full, but the engine holds a
  prefix that programs share once. At each decision the books take the engine's count of what
  it holds (`observe_engine`: vLLM's KV usage times the capacity) and subtract the *shared
  tokens*: the contexts of the reasoning programs whose turn the engine has taken, less that
  count, when positive. Until a decision
  has heard the engine, nothing is subtracted. The value is kept until the next decision, as
  the released code caches it between its checks.
* **No admission ahead of the queue.** A new program is admitted at once only while no
  program waits inactive (paused, or new and queued); otherwise it joins them and the next
  decision resumes in order, returning programs first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from server.costs import CostModel
from server.programs.base import ProgramScheduler
from server.programs.state import Kv, Phase, ProgramState

#: seconds between decisions (both papers decide on a 5 s tick)
TICK_S = 5.0


def resume_class(st: ProgramState) -> int:
    """Who comes back first: a paused program whose next turn already waits (0), then a new
    program (1), then a paused program still in its tool call (2)."""
    if st.phase is Phase.NEW:
        return 1
    return 0 if st.turn_waiting else 2


class CapacityScheduler(ProgramScheduler):
    """Pause above `pause_above` x capacity down to `pause_to` x capacity; resume up to
    `resume_to` x capacity (all 1.0 unless given). Subclasses set `pause_order`,
    `resume_order` and, where a pause puts the KV somewhere of its own, `paused_kv`."""

    tick_s = TICK_S

    def __init__(self, capacity_tokens: int = 0, cost_model: CostModel | None = None,
                 host_tier: bool = False, *, pause_above: float = 1.0, pause_to: float = 1.0,
                 resume_to: float = 1.0) -> None:
        super().__init__(capacity_tokens, cost_model, host_tier)
        if not 0 < pause_to <= pause_above or not 0 < resume_to <= pause_above:
            raise ValueError(f"{self.name} thresholds: need 0 < pause_to <= pause_above and "
                             f"0 < resume_to <= pause_above, got {pause_to}, {pause_above}, "
                             f"{resume_to}")
        self.pause_above = pause_above
        self.pause_to = pause_to
        self.resume_to = resume_to
        #: the engine's latest count of the tokens it holds (None: not heard yet)
        self.engine_tokens: int | None = None
        #: the tokens the active programs share, as of the latest decision
        self.shared_tokens = 0

    # -- what a subclass states ------------------------------------------------------------
    def pause_order(self, st: ProgramState) -> tuple[float, ...]:
        """Which active program gives way first, smallest first."""
        raise NotImplementedError

    def resume_order(self, st: ProgramState) -> tuple[float, ...]:
        """Which inactive program comes back first, smallest first."""
        raise NotImplementedError

    def paused_kv(self, st: ProgramState) -> Kv | None:
        """Where a paused program's KV goes (None: `pause`'s default, the host tier if there
        is one, else dropped)."""
        return None

    # -- facts -------------------------------------------------------------------------------
    def observe_engine(self, in_use_tokens: int,
                       ahead: Callable[[], Mapping[str, int]]) -> None:
        """The engine's count of what it holds: the next decision's shared-token term."""
        self.engine_tokens = in_use_tokens

    # -- the accounts ------------------------------------------------------------------------
    def active_usage(self) -> int:
        """ThunderAgent's used capacity: the active programs' charges less the shared tokens."""
        return super().active_usage() - self.shared_tokens

    def _count_shared(self) -> None:
        """The reasoning programs' contexts less what the engine holds, when positive (0 until
        the engine is heard): a prefix the engine holds once and the books once per program.
        Reasoning: a turn the engine has taken (in a router, forwarded), as the released code
        counts the programs whose request it has sent; a turn still held here is not in the
        engine's count, and taken for shared it would let the books admit twice the cache."""
        if self.engine_tokens is None:
            self.shared_tokens = 0
            return
        reasoning = sum(st.context_tokens for st in self.table.active()
                        if st.phase is Phase.REASONING and not st.turn_waiting)
        self.shared_tokens = max(0, reasoning - self.engine_tokens)

    # -- the skeleton ------------------------------------------------------------------------
    def on_new(self, st: ProgramState, now: float) -> None:
        """A new program is admitted at once when nothing else waits inactive and it fits (a
        router forwards a request it has no reason to hold); otherwise it waits for a
        decision, behind the programs already queued."""
        queued = any(other is not st for other in self.table.inactive())
        if (not queued and self.active_usage() + st.held_tokens()
                <= self.resume_to * self.capacity_tokens):
            self.resume(st, now)

    def pause(self, st: ProgramState, now: float, kv: Kv | None = None) -> None:
        """Every pause, at a decision or at the end of a marked turn, puts the KV where
        `paused_kv` says."""
        super().pause(st, now, kv if kv is not None else self.paused_kv(st))

    def rebalance(self, now: float) -> None:
        self._count_shared()
        cap = self.capacity_tokens
        usage = self.active_usage()
        if usage > self.pause_above * cap:
            acting = sorted((st for st in self.table.active() if st.phase is Phase.ACTING),
                            key=self.pause_order)
            for st in acting:
                if usage <= self.pause_to * cap:
                    break
                usage -= st.held_tokens()
                self.pause(st, now)
            if usage > self.pause_to * cap:
                reasoning = sorted((st for st in self.table.active()
                                    if st.phase is not Phase.ACTING and not st.pause_on_finish),
                                   key=self.pause_order)
                for st in reasoning:
                    if usage <= self.pause_to * cap:
                        break
                    usage -= st.held_tokens()
                    st.pause_on_finish = True
            return
        for st in sorted(self.table.inactive(), key=self.resume_order):
            need = st.held_tokens()
            if usage + need > self.resume_to * cap and usage > 0:
                continue  # a smaller one later in the order may still fit
            self.resume(st, now)
            usage += need
