"""`infercept`: min-waste interception handling (Abhyankar et al., InferCept, ICML 2024, §4).

Each scheduler step the policy assigns every program that is away on a tool call one of
preserve, (chunked) discard and swap by InferCept's budgeted assignment (Eq. 5, in
`least_waste`): the interceptions are sorted by the GPU-memory waste they would cause unless
swapped, ``min(Waste_preserve (Eq. 2), Waste_discard (Eq. 4, chunked recompute))``, the most
wasteful are swapped while their contexts fit the step's swap budget (what PCIe moves while the
step computes, so swapping overlaps with compute, §4.3), and the rest take the smaller of the
two. The choice is revisited every step while the program is away, because the waste of
preserving grows with the time spent:

* A turn that ends in a tool call is held (pinned) until the next step's assignment, so all
  interceptions of one iteration compete for its budget together, as Eq. 5 sorts them.
* The interception's duration is the client's prediction when one was sent (hint
  `predicted_s` or the `tool_start` event's), else the time elapsed since the call,
  ``t_now - t_call`` (§4.2: the runtime cannot know the duration, so it bounds it by what it
  has already seen); a prediction that has been overrun is replaced by the elapsed time.
* Preserve keeps the pin. Discard and swap end it: the blocks go back to the pool, where vLLM's
  prefix cache still finds them if nobody reuses them first. With discard the resumed turn
  recomputes the rest, in chunks interleaved with other requests' decodes (vLLM's chunked
  prefill, InferCept's chunked recomputation §4.3). With swap the resumed turn reloads it from
  the host copy kept by vLLM's native KV offloading (`reload_from_cpu`), which the engine turns
  on for this policy (`needs_offload`).
* Queue order: program-level FCFS by original arrival, preempted turns first (§4.4).

Readings where the paper leaves a choice to the implementation: the recomputation chunk is the
engine's per-step token budget (`max_batch_tokens`, what vLLM's chunked prefill runs per step);
C_batch in Eq. 3 is the prompt tokens of the admitted, unfinished turns; the swap budget covers
swap-outs only (swap-ins are vLLM's connector loads, which it schedules itself).
Constants: the swap budget's step interval bounds (`least_waste.MIN_STEP_S` / `MAX_STEP_S`).
Without a cost model (no GPU profile) every interception is preserved.
"""

from __future__ import annotations

from dataclasses import dataclass

from server.policies.base import AgentEvent, RequestView, UnpinReason
from server.policies.least_waste import Strategy, SwapBudget, Wastes, assign, wastes
from server.policies.program_fcfs import ProgramFCFSPolicy


@dataclass(slots=True)
class Interception:
    context_tokens: int
    called_at: float
    tool: str | None = None
    predicted_s: float | None = None


class InferCeptPolicy(ProgramFCFSPolicy):
    name = "infercept"
    needs_offload = True

    def __init__(self, cost_model=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(cost_model)
        self.away: dict[str, Interception] = {}
        self.choice: dict[str, Strategy] = {}  # the last decision per program (for reloads)
        self.running_tokens = 0  # prompt tokens of admitted, unfinished turns (C_batch)
        self._admitted: dict[str, int] = {}
        self.swap_budget = SwapBudget(cost_model) if cost_model is not None else None
        self._assigned_at: float | None = None  # the step of the last Eq. 5 assignment

    # -- what the engine tells us ------------------------------------------------------
    def on_arrival(self, req: RequestView, now: float) -> None:
        super().on_arrival(req, now)
        if req.program_id is not None:
            self.away.pop(req.program_id, None)  # it is back; `choice` says how to reload

    def on_scheduled(self, req: RequestView, now: float) -> None:
        self._admitted[req.request_id] = req.prompt_tokens
        self.running_tokens += req.prompt_tokens
        if req.program_id is not None:
            self.away.pop(req.program_id, None)
            self.choice.pop(req.program_id, None)  # the reload (if any) has been looked up

    def on_event(self, event: AgentEvent, now: float) -> None:
        super().on_event(event, now)
        away = self.away.get(event.program_id)
        if event.kind == "tool_start" and away is not None:
            away.tool = event.tool or away.tool
            if event.predicted_s is not None:
                away.predicted_s = event.predicted_s
        elif event.kind == "program_end":
            self.away.pop(event.program_id, None)
            self.choice.pop(event.program_id, None)

    def on_finish(self, req: RequestView, now: float) -> bool:
        self.running_tokens -= self._admitted.pop(req.request_id, 0)
        program = req.program_id
        if program is None or req.hints.last or program in self.ended:
            return False
        self.away[program] = Interception(req.context_tokens, now, req.hints.tool,
                                          req.hints.predicted_s)
        # held until the next step's assignment, where it competes for that step's budget
        self.choice[program] = "preserve"
        return True

    def pin_expired(self, program_id: str, now: float, has_waiting: bool) -> bool:
        if program_id in self.ended:
            return True
        if has_waiting or program_id not in self.away:
            return False  # it is back: the pin hands off when its turn is admitted
        self._assign(now)
        return self.choice.get(program_id, "preserve") != "preserve"

    def on_unpin(self, program_id: str, reason: UnpinReason, now: float) -> None:
        if reason == "pressure" and program_id in self.away:
            # the scheduler took the memory back: a host copy is what is left to reload from
            self.choice[program_id] = "swap"

    def reload_from_cpu(self, req: RequestView) -> bool:
        return self.choice.get(req.program_id or "") == "swap"

    # -- the decision ------------------------------------------------------------------
    def interception_seconds(self, away: Interception, now: float) -> float:
        """How long the interception is taken to last (see the module docstring)."""
        elapsed = max(0.0, now - away.called_at)
        if away.predicted_s is None:
            return elapsed
        return max(away.predicted_s, elapsed)

    def wastes_of(self, away: Interception, now: float) -> Wastes:
        """Eq. 2-4 for one interception as it stands at `now`."""
        assert self.cost_model is not None
        return wastes(self.cost_model, away.context_tokens, self.interception_seconds(away, now),
                      max(0, self.running_tokens), self.max_batch_tokens)

    def _assign(self, now: float) -> None:
        """Eq. 5 over the interceptions still held, once per step (one clock reading)."""
        if self.cost_model is None or self.swap_budget is None or now == self._assigned_at:
            return
        self._assigned_at = now
        held = [(p, a.context_tokens, self.wastes_of(a, now)) for p, a in self.away.items()
                if self.choice.get(p) == "preserve"]
        if not held:
            return
        for program, strategy in assign(held, self.swap_budget.available(now)).items():
            self.choice[program] = strategy
            if strategy == "swap":
                self.swap_budget.take(self.away[program].context_tokens, now)

    def pin_victim(self, pinned_program_ids: list[str]) -> str:
        return max(pinned_program_ids, key=lambda p: self.program_arrival.get(p, float("inf")))
