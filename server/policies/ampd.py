"""`ampd`: prefill reordering in a small lookahead window (AMPD, Algorithm 2, section 4.2).

Paper: He et al., "Efficient Multi-round LLM Inference over Disaggregated Serving" (AMPD).
Why: FCFS lets one long prefill at the head of the queue push the short ones behind it past
their TTFT SLO; running a short one first can save several and cost the long one nothing it
had not already lost. Searching every ordering of the whole queue is too dear and starves long
prefills, so AMPD looks only at the head of the queue and caps how often a task is passed over.

The decision (`best_order`, pure): over the orderings of the first `WINDOW` waiting prefills
that respect the postponement cap, take the one that maximises the number predicted to meet
the TTFT SLO (Eq. 4), where a task's predicted TTFT (Eq. 3) = the time it has waited + the
prefill time of the tasks ahead of it in the window + its own prefill time. Ties go to the
order nearest FCFS (permutations are tried in lexicographic order, FCFS first). The scheduler
then runs the head, as vLLM runs its queue.

The cap, counted per decision (Algorithm 2 line 7): a decision is an ordering whose head is
then admitted; each task that ordering postpones (a task from behind it in FCFS order placed
ahead of it) counts one postponement, once per decision however many requests the step admits.
Once postponed `POSTPONE_CAP` (= w) times, no ordering may put a task from behind it ahead of
it again, so every prefill runs eventually. Eq. 3 assumes the window's prefills run one at a
time: on a replica whose step budget admits several at once the predicted TTFTs are upper
bounds; the bench runs AMPD's prefill replicas one prefill at a time (`max_num_seqs` 1).

A prefill's time is its new tokens on top of the program's history held on this replica (the
context of the program's last turn finished here): `prefill_seconds(prompt) -
prefill_seconds(history)` of the cost model (the profile). Without a cost model the queue stays
FCFS. Retention is vLLM's: a finished turn's KV cache is freed at once.

Constants: WINDOW = 3 (w, the paper's), POSTPONE_CAP = WINDOW, TTFT_SLO_S = 1.0 (a default;
the deployment states its SLO: `ServeSettings.ttft_slo_s`, from a cluster file's
`router.ttft_slo_s` or `harness serve --ttft-slo`, reaches the constructor via `make_policy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count, permutations

from server.policies.base import AgentEvent, CostModel, Policy, RequestView

WINDOW = 3
POSTPONE_CAP = WINDOW
TTFT_SLO_S = 1.0


@dataclass(frozen=True, slots=True)
class PrefillTask:
    """One waiting prefill as Algorithm 2 sees it."""

    waited_s: float
    prefill_s: float
    postponed: int = 0


def predicted_ttfts(tasks: Sequence[PrefillTask], order: Sequence[int]) -> list[float]:
    """Eq. 3 for each task of `order` (indices into `tasks`), in that order."""
    out, ahead = [], 0.0
    for i in order:
        ahead += tasks[i].prefill_s
        out.append(tasks[i].waited_s + ahead)
    return out


def postponed_in(order: Sequence[int]) -> set[int]:
    """The tasks `order` postpones: those with a task from behind them (a larger index, FCFS
    being 0, 1, ...) placed ahead of them."""
    return {i for k, i in enumerate(order) if any(j > i for j in order[:k])}


def best_order(tasks: Sequence[PrefillTask], slo_s: float,
               cap: int = POSTPONE_CAP) -> tuple[int, ...]:
    """Algorithm 2 on a window (`tasks` in FCFS order): the ordering, as indices, that
    maximises the tasks meeting `slo_s` (Eq. 4) without postponing a task postponed `cap`
    times; FCFS (always allowed) wins ties."""
    capped = {i for i, t in enumerate(tasks) if t.postponed >= cap}
    best, best_met = tuple(range(len(tasks))), -1
    for order in permutations(range(len(tasks))):
        if capped & postponed_in(order):
            continue
        met = sum(ttft <= slo_s for ttft in predicted_ttfts(tasks, order))
        if met > best_met:
            best, best_met = order, met
    return best


class AMPDPolicy(Policy):
    name = "ampd"
    reorders_queue = True
    options = ("ttft_slo_s",)

    def __init__(self, cost_model: CostModel | None = None,
                 ttft_slo_s: float = TTFT_SLO_S) -> None:
        super().__init__(cost_model)
        self.ttft_slo_s = ttft_slo_s
        self.postponed: dict[str, int] = {}  # waiting request id -> times postponed
        #: the last ordering: (its head, the request ids it postpones), until a step admits
        self._decision: tuple[str, frozenset[str]] | None = None
        self.decisions = 0  # orderings whose head was admitted (Algorithm 2 runs)
        #: FCFS keys of the queue as last ordered, less the requests admitted since
        self._waiting: dict[str, tuple[bool, float, int]] = {}
        self._history: dict[str, int] = {}  # program -> context of its last turn finished here
        self._seq: dict[str, int] = {}  # request id -> arrival order (ties of arrival_time)
        self._next_seq = count()

    def fcfs_key(self, req: RequestView) -> tuple[bool, float, int]:
        """vLLM's order: preempted requests back at the front, the rest by arrival."""
        seq = self._seq.get(req.request_id)
        if seq is None:
            seq = self._seq[req.request_id] = next(self._next_seq)
        return (req.num_preemptions == 0, req.arrival_time, seq)

    # -- bookkeeping -----------------------------------------------------------------------
    def on_arrival(self, req: RequestView, now: float) -> None:
        self.fcfs_key(req)

    def on_scheduled(self, req: RequestView, now: float) -> None:
        """The head of the last ordering was admitted: that ordering was a decision, and each
        task it postpones that still waits counts one postponement (once per decision)."""
        self._waiting.pop(req.request_id, None)
        self._seq.pop(req.request_id, None)
        self.postponed.pop(req.request_id, None)
        decision, self._decision = self._decision, None
        if decision is None or decision[0] != req.request_id:
            return  # no ordering chose it (one waiting; or a second admission of a step)
        self.decisions += 1
        for other in decision[1]:
            if other in self._waiting:
                self.postponed[other] = self.postponed.get(other, 0) + 1

    def on_finish(self, req: RequestView, now: float) -> bool:
        if req.program_id is not None:
            if req.hints.last:
                self._history.pop(req.program_id, None)
            else:
                self._history[req.program_id] = req.context_tokens
        return False

    def on_event(self, event: AgentEvent, now: float) -> None:
        if event.kind == "program_end":
            self._history.pop(event.program_id, None)

    # -- Eq. 3 inputs ----------------------------------------------------------------------
    def prefill_s(self, req: RequestView) -> float:
        """The turn's new tokens on top of the program's history held here."""
        assert self.cost_model is not None
        prompt = req.prompt_tokens
        history = min(prompt, self._history.get(req.program_id or "", 0))
        return (self.cost_model.prefill_seconds(prompt)
                - self.cost_model.prefill_seconds(history))

    # -- ordering --------------------------------------------------------------------------
    def order_waiting(self, waiting: list[RequestView], now: float) -> list[RequestView]:
        # what is not waiting any more (admitted, aborted) is forgotten here
        self._waiting = {r.request_id: self.fcfs_key(r) for r in waiting}
        self._seq = {rid: key[2] for rid, key in self._waiting.items()}
        self.postponed = {rid: self.postponed.get(rid, 0) for rid in self._waiting}
        fcfs = sorted(waiting, key=lambda r: self._waiting[r.request_id])
        if self.cost_model is None:
            return fcfs
        head = fcfs[:WINDOW]
        tasks = [PrefillTask(now - r.arrival_time, self.prefill_s(r),
                             self.postponed[r.request_id]) for r in head]
        order = best_order(tasks, self.ttft_slo_s)
        self._decision = (head[order[0]].request_id,
                          frozenset(head[i].request_id for i in postponed_in(order)))
        return [head[i] for i in order] + fcfs[WINDOW:]
