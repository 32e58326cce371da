"""`remaining-work`: least expected remaining work first, from what a deployment knows, with
Continuum's retention.

Why: the clairvoyant schedule (`oracle`) orders programs by the GPU work they have left, which
a real server cannot know. What it does know is enough to estimate it: the turn a request
belongs to (the client's `turn` hint), the request's context (its prompt), the lengths of the
programs that already ended (a `last` hint or a `program_end` event), the output lengths and
context growth of the turns it has served, and the client's predicted output length when it
sends one (`predicted_output_tokens`). The estimate of a program's remaining work at turn k:

    R   = E[N - k | N > k]   over the last `LENGTH_WINDOW` ended programs' turn counts N
          (the turns left, this one included: expected remaining service given attained
          service, the quantity SRPT needs; Autellix's PLAS ranks by attained service alone,
          which is this rule's answer when program lengths are heavy-tailed, where the
          expected remainder grows with age; on light-tailed lengths it ranks the other way)
    W   = this turn's decode of o tokens at its context c, plus (R - 1) later turns, each
          decoding o tokens, at the context they will have on average, c + R/2 * g
          (`server.costs.WorkModel`: GPU seconds from the engine's cost model)

with o the client's predicted output length of this turn (else the mean output per turn seen)
and g the mean growth of a program's prompt from one turn to the next. A running turn counts
only the tokens it has still to answer (at least one). The waiting queue is ordered
preempted > least W > program arrival > request arrival, and the running batch by W (vLLM
preempts the turn of most expected work first under memory pressure).

Cold start: until `MIN_PROGRAMS` programs have ended there is no length distribution, and the
order is Continuum's (preempted > pinned > program-level FCFS). A program already past every
length seen is given one turn left (this one).

Retention is Continuum's, inherited unchanged (`continuum.ContinuumPolicy`: the TTL utility,
its cold-start chain, hints, pin expiry, its pressure victim), so a difference between the two
policies is the order's alone.

Constants: `LENGTH_WINDOW = 1000` ended programs and `MIN_PROGRAMS = 10` (`predictor.programs`,
whose estimators `lookahead` shares); `GROWTH_WINDOW` and `OUTPUT_WINDOW` = 1000 turns for the
sliding means of context growth and output length.

Per-event cost: O(1) per queue key (a table look-up and a cached per-context step cost); the
table of E[N - k | N > k] is rebuilt, O(window + longest program), when a program ends.
"""

from __future__ import annotations

from predictor.means import SlidingMean
from predictor.programs import PromptGrowth, RemainingTurns
from server.costs import CostModel, WorkModel
from server.policies.base import AgentEvent, RequestView
from server.policies.continuum import ContinuumPolicy
from server.policies.memory import RecentIds

GROWTH_WINDOW = 1000
OUTPUT_WINDOW = 1000

_PREEMPTED, _OTHER = 0.0, 1.0


class RemainingWorkPolicy(ContinuumPolicy):
    name = "remaining-work"
    orders_running = True

    def __init__(self, cost_model: CostModel | None = None, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(cost_model, **kwargs)
        self.work = WorkModel(cost_model)
        self.turns_left = RemainingTurns()
        self._growth = PromptGrowth(GROWTH_WINDOW)  # and each program's latest prompt
        self._output = SlidingMean(OUTPUT_WINDOW)
        self._turn_of: dict[str, int] = {}  # program -> its latest turn index
        self._lengths_taken = RecentIds()  # programs whose length was learnt

    # -- what is learnt --------------------------------------------------------------------
    def _program_ended(self, program_id: str, turns: int) -> None:
        if program_id in self._lengths_taken:
            return
        self._lengths_taken.add(program_id)
        self.turns_left.add(turns)
        self._growth.forget(program_id)
        self._turn_of.pop(program_id, None)

    def on_arrival(self, req: RequestView, now: float) -> None:
        super().on_arrival(req, now)
        pid = req.program_id
        if pid is None:
            return
        self._lengths_taken.discard(pid)  # a reused id is a new program
        self._growth.prompt(pid, req.prompt_tokens)
        st = self._programs.get(pid)
        hinted = req.hints.turn
        self._turn_of[pid] = hinted if hinted is not None else (st.turns - 1 if st else 0)

    def on_finish(self, req: RequestView, now: float) -> bool:
        self._output.add(req.output_tokens)
        if req.hints.last and req.program_id is not None:
            self._program_ended(req.program_id, (req.hints.turn or 0) + 1)
        return super().on_finish(req, now)

    def on_event(self, event: AgentEvent, now: float) -> None:
        if event.kind == "program_end":
            st = self._programs.get(event.program_id)
            if st is not None and st.turns > 0:
                self._program_ended(event.program_id, st.turns)
        super().on_event(event, now)

    # -- the estimate ----------------------------------------------------------------------
    def expected_work(self, req: RequestView) -> float | None:
        """The program's expected remaining GPU seconds (None: no length distribution yet)."""
        pid = req.program_id
        k = req.hints.turn
        if k is None:
            k = self._turn_of.get(pid, 0) if pid is not None else 0
        left = self.turns_left.expected(k)
        if left is None:
            return None
        mean_out = self._output.mean(1.0)
        out = req.hints.predicted_output_tokens or mean_out
        this_left = max(1.0, out - req.output_tokens)
        ctx = req.prompt_tokens + req.output_tokens
        work = this_left * self.work.decode_seconds_per_token(int(ctx + this_left / 2))
        later = left - 1.0
        if later > 0:
            growth = self._growth.mean(0.0)
            at = int(ctx + this_left + later / 2 * growth)
            work += later * mean_out * self.work.decode_seconds_per_token(at)
        return work

    # -- ordering --------------------------------------------------------------------------
    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        work = self.expected_work(req)
        if work is None:
            return super().queue_key(req, now)  # cold start: Continuum's order
        st = self._programs.get(req.program_id) if req.program_id is not None else None
        cls = _PREEMPTED if req.num_preemptions > 0 else _OTHER
        return (cls, work, st.arrival if st is not None else req.arrival_time,
                req.arrival_time)

    def running_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        work = self.expected_work(req)
        st = self._programs.get(req.program_id) if req.program_id is not None else None
        arrival = st.arrival if st is not None else req.arrival_time
        return (0.0 if work is None else work, arrival, req.arrival_time)
