"""`oracle`: oracle-SRPT, a clairvoyant schedule: every program's future is known.

Why it exists: a policy comparison says how much better one policy is than another, not how
much better any could be. This policy is given, at construction of its engine, what only the
trace knows (`foresee`: each program's turns, their prompt and output lengths and the tool
time after each), and schedules with it, on the same memory, CPU tier and engine settings as
every other policy of the run (`sim.engines.make_engine` hands the lookup over; no other policy
has the method, so the future cannot leak into them). `harness bench` runs it beside every
policy, and the report gives each policy's share of the gap from `vllm` to it.

It is not a proof of optimality (so it is called oracle-SRPT, not "optimal"): shortest
remaining processing time minimises mean completion time on one preemptive machine, but a
batching engine is not one machine (every running turn advances each step, at a step time
that grows with the batch), turns are not preempted for priority, and pins trade memory
against reloads. It is the best clairvoyant schedule we know how to state, and a measured
policy can beat it.

Decisions:

* Order: program-level shortest remaining work first. A program's remaining work is the GPU
  seconds (`server.costs.WorkModel`, from the engine's cost model) of its turns from
  the current one to the last: each turn's prefill of what is not cached (the previous turn's
  tool return and new input) and its decode at its context; a running turn counts only the
  tokens it has still to answer. The waiting queue is sorted by it (ties: program arrival,
  then request arrival), and so is the running batch, so under memory pressure vLLM preempts
  the turn of the program with the most work left.
* Retention: a finished turn's KV cache is pinned when the program has another turn (it will
  be reused, as the next prompt extends it), until that turn is admitted; the pin expires
  `RETURN_SLACK_S` after the tool's known return if the turn has not come (it always does in
  a replay). Under memory pressure the pin given up is Belady's: the one whose next use is
  furthest away (the latest return of a tool still running; a program whose turn already
  waits is used soonest, and among those the one with most work left goes first).
* With a host tier (vLLM's native offloading) a context not found on the GPU is loaded from
  host memory, as every policy does.

A request of a program the future does not name (or a turn past its end) is an error: the
oracle must know everything, or its figures mean nothing.

Constants: `RETURN_SLACK_S = 0.5` s (a pin outlives its tool's return by the few engine steps
the returning turn needs to arrive and be looked at).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from server.costs import WorkModel
from server.policies.base import AgentEvent, CostModel, Policy, RequestView, UnpinReason

RETURN_SLACK_S = 0.5


class FutureUnknown(KeyError):
    """The oracle was asked about a program or turn its future does not name."""


@dataclass(frozen=True, slots=True)
class TurnFuture:
    """One turn of a program, as the trace says it will be."""

    prompt_tokens: int  # the request's prompt
    new_tokens: int  # of the prompt, what a kept previous turn leaves to compute
    output_tokens: int
    tool_seconds: float  # the tool call after this turn (0 after the last)


class OraclePolicy(Policy):
    name = "oracle"
    reorders_queue = True
    orders_running = True
    #: `server.engine.VirtualEngine` calls `foresee` on policies that declare this, with the
    #: futures `sim.engines.make_engine` reads from the trace
    clairvoyant = True

    def __init__(self, cost_model: CostModel | None = None) -> None:
        super().__init__(cost_model)
        self.work = WorkModel(cost_model)
        self._turns: dict[str, tuple[TurnFuture, ...]] = {}
        self._suffix: dict[str, list[float]] = {}  # program -> work of turns i.., per i
        self._arrival: dict[str, float] = {}
        self._current: dict[str, int] = {}  # program -> its latest turn seen
        self._returns: dict[str, float] = {}  # pinned program -> when its tool returns
        self._waiting: set[str] = set()  # programs with a turn in the queue
        self.pins_made = 0

    def foresee(self, futures: Mapping[str, Sequence[TurnFuture]]) -> None:
        """Every program's turns, from the trace (called once, before any request)."""
        for pid, turns in futures.items():
            turns = tuple(turns)
            costs = [self.work.turn_seconds(t.prompt_tokens, t.new_tokens, t.output_tokens)
                     for t in turns]
            suffix = [0.0] * (len(costs) + 1)
            for i in range(len(costs) - 1, -1, -1):
                suffix[i] = suffix[i + 1] + costs[i]
            self._turns[pid] = turns
            self._suffix[pid] = suffix

    # -- the future ------------------------------------------------------------------------
    def _turn(self, req: RequestView) -> tuple[str, int]:
        pid = req.program_id
        if pid is None or pid not in self._turns:
            raise FutureUnknown(f"oracle: no future for program {pid!r}")
        i = req.hints.turn if req.hints.turn is not None else self._current.get(pid, 0)
        if not 0 <= i < len(self._turns[pid]):
            raise FutureUnknown(f"oracle: program {pid!r} has no turn {i}")
        return pid, i

    def remaining_work(self, req: RequestView) -> float:
        """GPU seconds the request's program has left: this turn's unanswered tokens and
        every later turn."""
        pid, i = self._turn(req)
        turn = self._turns[pid][i]
        left = max(0, turn.output_tokens - req.output_tokens)
        if req.output_tokens == 0:
            this = self.work.turn_seconds(turn.prompt_tokens, turn.new_tokens, left)
        else:
            ctx = turn.prompt_tokens + req.output_tokens + left // 2
            this = left * self.work.decode_seconds_per_token(ctx)
        return this + self._suffix[pid][i + 1]

    # -- lifecycle -------------------------------------------------------------------------
    def on_arrival(self, req: RequestView, now: float) -> None:
        pid, i = self._turn(req)
        self._arrival.setdefault(pid, req.arrival_time)
        self._current[pid] = i
        self._waiting.add(pid)

    def on_scheduled(self, req: RequestView, now: float) -> None:
        if req.program_id is not None:
            self._waiting.discard(req.program_id)

    def on_event(self, event: AgentEvent, now: float) -> None:
        if event.kind == "program_end":
            for book in (self._arrival, self._current, self._returns):
                book.pop(event.program_id, None)
            self._waiting.discard(event.program_id)

    # -- retention -------------------------------------------------------------------------
    def on_finish(self, req: RequestView, now: float) -> bool:
        pid, i = self._turn(req)
        if i + 1 >= len(self._turns[pid]):
            return False  # the last turn: nothing will reuse it
        self._returns[pid] = now + self._turns[pid][i].tool_seconds
        self.pins_made += 1
        return True

    def pin_expired(self, program_id: str, now: float, has_waiting: bool) -> bool:
        if has_waiting:
            return False
        back = self._returns.get(program_id)
        return back is None or now >= back + RETURN_SLACK_S

    def on_unpin(self, program_id: str, reason: UnpinReason, now: float) -> None:
        if reason != "replaced":
            self._returns.pop(program_id, None)

    def next_use(self, program_id: str) -> tuple[float, float]:
        """When a pinned program's KV is next read (Belady's key, larger = later): a program
        whose turn waits is read soonest, the one with most work left last among those."""
        if program_id in self._waiting:
            i = self._current.get(program_id, 0)
            suffix = self._suffix.get(program_id)
            return (-math.inf, suffix[i] if suffix is not None else 0.0)
        return (self._returns.get(program_id, math.inf), 0.0)

    def pin_victim(self, pinned_program_ids: list[str]) -> str:
        return max(reversed(pinned_program_ids), key=self.next_use)

    # -- ordering --------------------------------------------------------------------------
    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        pid = req.program_id
        return (self.remaining_work(req), self._arrival.get(pid or "", req.arrival_time),
                req.arrival_time)

    def running_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        return self.queue_key(req, now)
