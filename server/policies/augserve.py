"""`augserve`: two-stage adaptive scheduling with a dynamic token budget (Wang et al., AugServe,
arXiv:2512.04013, section 3).

* Stage I (§3.2, on arrival, Eq. 13-15): each turn gets the system cost it is expected to incur,
  in token-seconds of KV memory so the phases add up: prefill ``T_fwd(new) * C``, decode
  ``O * TPOT_S * (C + O / 2)`` (O predicted output tokens, the context growing from C to
  C + O), and the cost of the tool call that follows *under the handling it will get*: the
  strategy InferCept's rule assigns to that interception (`least_waste.assign` with one step's
  swap budget, as if it were its step's only interception) valued by that strategy's own
  equation, preserve ``T_api * (C + O)``, chunked discard (Eq. 4 of InferCept) or swap
  ``2 T_swap(C + O) C_batch``. How the previous call was handled enters too: context kept on
  the GPU or in host memory (preserve, swap) is not prefilled again. The predictions are the
  client's hints when sent (`predicted_output_tokens`, `predicted_s`; made by
  `predictor.lengths` and `predictor.durations`), else the server's own: the program's last
  output length and the per-tool duration distribution learnt from `tool_end` events.
  Cheapest first: short, light turns are not stuck behind heavy ones (head-of-line blocking).
* Stage II (§3.3, at runtime): when a program returns from its API call the observed duration
  and return size replace the predictions, and the ratio of its actual to predicted output
  length corrects its next output prediction (clamped to [1/4, 4]).
* Anti-starvation (§3.3, Eq. 26): the scheduling priority is ``P = V + alpha * wait``, where the
  value V is the negated stage-I/II cost (a cheaper turn has a higher value) and ``wait`` the
  seconds the turn has waited; the highest P runs first, so every second in the queue buys
  alpha token-seconds of cost and no turn waits for ever behind a stream of cheaper ones.
* Retention: InferCept's budgeted min-waste assignment per interception (inherited from
  `infercept`), with the duration estimate from stage I/II rather than the elapsed time alone.
* Token budget (§3.4, Eq. 27-32): each step's batch token limit follows the KV memory that is
  available to new work, the free blocks plus the blocks held by paused (intercepted)
  programs, which can be reclaimed: ``B = clamp(B_max * (free + paused) / total, LOW * B_max,
  B_max)``. It rises as programs pause or memory frees and falls as running work fills memory,
  over the whole range: the nominal budget (half the memory available) is B_max / 2, and
  paused memory lifts it above that. B_max is the configured limit (it sizes the model
  runner's buffers, so nothing may exceed it).

Readings where the paper's constants are not restated here: alpha = ALPHA_BATCHES * B_max
token-seconds per second waited (a second of waiting is worth one full batch of KV held for a
second, so alpha scales with the engine); the budget is linear in the available share, reaching
B_max only with all memory available; a predicted interception is assigned as the only one of
its step (the others of that step are not known at arrival).

Constants: TPOT_S = 0.02 s (a mid-size decode step of an 8B model on one H100),
DEFAULT_OUTPUT_TOKENS = 256, ALPHA_BATCHES = 1 per second, LOW = 0.25, CORRECTION bounds
[0.25, 4].
"""

from __future__ import annotations

from predictor.durations import ToolDurationModel
from server.policies.base import AgentEvent, RequestView
from server.policies.infercept import InferCeptPolicy, Interception
from server.policies.least_waste import MAX_STEP_S, Strategy, assign, wastes
from server.policies.program_fcfs import PREEMPTED

TPOT_S = 0.02
DEFAULT_OUTPUT_TOKENS = 256
ALPHA_BATCHES = 1.0
LOW = 0.25
CORRECTION_MIN, CORRECTION_MAX = 0.25, 4.0


class AugServePolicy(InferCeptPolicy):
    name = "augserve"
    adapts_token_budget = True

    def __init__(self, cost_model=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(cost_model)
        self.durations = ToolDurationModel()
        self.last_output: dict[str, int] = {}  # program -> output tokens of its last turn
        self.correction: dict[str, float] = {}  # program -> actual / predicted output length
        self.value: dict[str, float] = {}  # request id -> stage I/II value
        self.kept: dict[str, int] = {}  # program -> context tokens it gets back on return

    # -- predictions -------------------------------------------------------------------
    def predicted_output(self, req: RequestView) -> float:
        program = req.program_id or ""
        if req.hints.predicted_output_tokens is not None:
            return req.hints.predicted_output_tokens * self.correction.get(program, 1.0)
        return float(self.last_output.get(program, DEFAULT_OUTPUT_TOKENS))

    def predicted_api_seconds(self, tool: str | None, hinted: float | None) -> float:
        if hinted is not None:
            return hinted
        return self.durations.mean(tool or "unknown")

    def interception_seconds(self, away: Interception, now: float) -> float:
        estimate = self.predicted_api_seconds(away.tool, away.predicted_s)
        return max(estimate, now - away.called_at)  # stage II: an overrun corrects it

    def handling(self, req: RequestView) -> tuple[Strategy, float]:
        """The strategy the tool call after this turn is expected to get (Eq. 5 applied to it
        alone in its step, with a full step's swap budget) and that strategy's waste."""
        assert self.cost_model is not None and self.swap_budget is not None
        ctx = int(req.prompt_tokens + self.predicted_output(req))
        t_api = self.predicted_api_seconds(req.hints.tool, req.hints.predicted_s)
        w = wastes(self.cost_model, ctx, t_api, self.running_tokens, self.max_batch_tokens)
        strategy = assign([("", ctx, w)], self.swap_budget.tokens_in(MAX_STEP_S))[""]
        return strategy, getattr(w, strategy)

    def stage_value(self, req: RequestView) -> float:
        """Expected system cost of this turn in token-seconds (smaller runs first)."""
        c = req.prompt_tokens
        o = self.predicted_output(req)
        value = o * TPOT_S * (c + o / 2.0)
        if self.cost_model is None:
            return value
        new = max(0, c - self.kept.get(req.program_id or "", 0))
        value += self.cost_model.prefill_seconds(new) * c
        if not req.hints.last:
            value += self.handling(req)[1]
        return value

    # -- lifecycle ---------------------------------------------------------------------
    def on_arrival(self, req: RequestView, now: float) -> None:
        super().on_arrival(req, now)
        self.value[req.request_id] = self.stage_value(req)

    def on_scheduled(self, req: RequestView, now: float) -> None:
        super().on_scheduled(req, now)
        self.value.pop(req.request_id, None)
        self.kept.pop(req.program_id or "", None)

    def on_finish(self, req: RequestView, now: float) -> bool:
        program = req.program_id
        if program is not None:
            hinted = req.hints.predicted_output_tokens
            if hinted and req.output_tokens:
                ratio = req.output_tokens / hinted
                self.correction[program] = min(CORRECTION_MAX, max(CORRECTION_MIN, ratio))
            self.last_output[program] = req.output_tokens
        keep = super().on_finish(req, now)
        if program is not None and self.choice.get(program) in ("preserve", "swap"):
            self.kept[program] = req.context_tokens
        return keep

    def on_event(self, event: AgentEvent, now: float) -> None:
        super().on_event(event, now)
        if event.kind == "tool_end" and event.seconds is not None:
            self.durations.observe(event.tool or "unknown", max(0.0, event.seconds))
        elif event.kind == "program_end":
            for table in (self.last_output, self.correction, self.kept):
                table.pop(event.program_id, None)

    def on_unpin(self, program_id, reason, now) -> None:  # type: ignore[no-untyped-def]
        super().on_unpin(program_id, reason, now)
        if self.choice.get(program_id) == "discard":
            self.kept.pop(program_id, None)  # it will recompute: no context comes back free

    # -- ordering and batching ---------------------------------------------------------
    def priority(self, req: RequestView, now: float) -> float:
        """Eq. 26: ``V + alpha * wait`` with V the negated cost (higher runs first)."""
        value = self.value.get(req.request_id)
        if value is None:
            value = self.value[req.request_id] = self.stage_value(req)
        waited = max(0.0, now - req.arrival_time)
        return -value + ALPHA_BATCHES * self.max_batch_tokens * waited

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        if req.num_preemptions > 0:
            return (PREEMPTED, 0.0, req.arrival_time)
        return (1, -self.priority(req, now), req.arrival_time)

    def token_budget(self, free_blocks: int, paused_blocks: int) -> int:
        """Eq. 27-32: proportional to the free plus paused share of KV memory (see above)."""
        if self.total_blocks <= 0:
            return self.max_batch_tokens
        share = (free_blocks + paused_blocks) / self.total_blocks
        scale = min(1.0, max(LOW, share))
        return max(self.block_size, int(self.max_batch_tokens * scale))
