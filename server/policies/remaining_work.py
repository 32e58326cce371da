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
          (`server.policies.work.WorkModel`: GPU seconds from the engine's cost model)

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

Constants: `LENGTH_WINDOW = 1000` ended programs; `MIN_PROGRAMS = 10`; `GROWTH_WINDOW` and
`OUTPUT_WINDOW` = 1000 turns for the sliding means of context growth and output length.

Per-event cost: O(1) per queue key (a table look-up and a cached per-context step cost); the
table of E[N - k | N > k] is rebuilt, O(window + longest program), when a program ends.
"""

from __future__ import annotations

from collections import deque

from server.policies.base import AgentEvent, CostModel, RequestView
from server.policies.continuum import ContinuumPolicy
from server.policies.memory import RecentIds, SlidingMean
from server.policies.work import WorkModel

LENGTH_WINDOW = 1000
MIN_PROGRAMS = 10
GROWTH_WINDOW = 1000
OUTPUT_WINDOW = 1000

_PREEMPTED, _OTHER = 0.0, 1.0


class RemainingTurns:
    """E[N - k | N > k] from the turn counts N of ended programs (a sliding window)."""

    def __init__(self, window: int = LENGTH_WINDOW, min_programs: int = MIN_PROGRAMS) -> None:
        self.lengths: deque[int] = deque(maxlen=window)
        self.min_programs = min_programs
        self._table: list[float] | None = None

    def add(self, n: int) -> None:
        if n >= 1:
            self.lengths.append(n)
            self._table = None

    def known(self) -> bool:
        return len(self.lengths) >= self.min_programs

    def expected(self, k: int) -> float | None:
        """Turns left, turn k (0-based) included, for a program that reached turn k; None
        before `min_programs` lengths are known."""
        if not self.known():
            return None
        if self._table is None:
            self._table = self._build()
        return self._table[k] if k < len(self._table) else 1.0

    def _build(self) -> list[float]:
        longest = max(self.lengths)
        count = [0] * (longest + 1)
        for n in self.lengths:
            count[n] += 1
        table = [1.0] * longest  # k = 0 .. longest - 1
        above, total = 0, 0  # programs with N > k, and the sum of their N
        for k in range(longest - 1, -1, -1):
            above += count[k + 1]
            total += count[k + 1] * (k + 1)
            table[k] = total / above - k if above else 1.0
        return table


class RemainingWorkPolicy(ContinuumPolicy):
    name = "remaining-work"
    orders_running = True

    def __init__(self, cost_model: CostModel | None = None, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(cost_model, **kwargs)
        self.work = WorkModel(cost_model)
        self.turns_left = RemainingTurns()
        self._growth = SlidingMean(GROWTH_WINDOW)
        self._output = SlidingMean(OUTPUT_WINDOW)
        self._last_prompt: dict[str, int] = {}  # program -> its latest turn's prompt
        self._turn_of: dict[str, int] = {}  # program -> its latest turn index
        self._lengths_taken = RecentIds()  # programs whose length was learnt

    # -- what is learnt --------------------------------------------------------------------
    def _program_ended(self, program_id: str, turns: int) -> None:
        if program_id in self._lengths_taken:
            return
        self._lengths_taken.add(program_id)
        self.turns_left.add(turns)
        self._last_prompt.pop(program_id, None)
        self._turn_of.pop(program_id, None)

    def on_arrival(self, req: RequestView, now: float) -> None:
        super().on_arrival(req, now)
        pid = req.program_id
        if pid is None:
            return
        self._lengths_taken.discard(pid)  # a reused id is a new program
        previous = self._last_prompt.get(pid)
        if previous is not None and req.prompt_tokens > previous:
            self._growth.add(req.prompt_tokens - previous)
        self._last_prompt[pid] = req.prompt_tokens
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
