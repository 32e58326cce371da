"""`lookahead`: our program scheduler inside the engine (rules in `server.programs.lookahead`).
It uses a host tier when the engine has one (`lookahead+offload`), and works without."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from server.costs import CostModel
from server.policies.base import RequestView
from server.policies.programs import ProgramPolicy
from server.programs.lookahead import Lookahead

#: A prompt that has to share a step with a shorter one waiting takes at most this share of
#: the step's token budget (vLLM's long-prefill cap, set per step).
PREFILL_SHARE = 0.25
#: A turn waiting this long (s) to start goes first whatever its prompt (the bound on
#: shortest-prompt-first).
PROMPT_AGING_S = 10.0


class LookaheadPolicy(ProgramPolicy):
    """Which programs run and what their KV does: `server.programs.lookahead`. Which of their
    turns' prompts is computed first: here, shortest new prompt first.

    On real sessions a prompt may add 40-90k new tokens (a large tool output, a rewritten
    conversation): seconds of prefill, which vLLM's order (running turns first, each taking
    what the step's budget has left, then the queue in arrival order) puts ahead of every turn
    that arrives meanwhile, most of them a few hundred new tokens behind a tool call. So the
    queue is ordered by new prompt tokens (`new_tokens`; a turn waiting `PROMPT_AGING_S` goes
    first), and while a turn shorter than a prompt in its prefill waits, that prompt computes
    at most `PREFILL_SHARE` of the step (`prefill_share`): the short turn starts at the next
    step instead of after the long one. A quarter of the budget (2,048 tokens on an H100) is
    still a compute-bound chunk, so the long prompt loses only what the short ones take."""

    name = "lookahead"
    scheduler_cls = Lookahead
    programs: Lookahead
    shares_prefill_steps = True

    def new_tokens(self, req: RequestView) -> int:
        """What of the turn's prompt is new (`Lookahead.new_prompt_tokens`)."""
        return self.programs.new_prompt_tokens(req.program_id, req.prompt_tokens)

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        aged = now - req.arrival_time >= PROMPT_AGING_S
        return (0 if aged else 1, 0 if aged else self.new_tokens(req),
                *super().queue_key(req, now))

    def prefill_share(self, budget: int, computing: list[int], waiting: list[RequestView]
                      ) -> int:
        shortest = min(computing + [self.new_tokens(r) for r in waiting])
        if shortest >= max(computing):
            return 0  # the one prompt in its prefill is the shortest: it goes on undivided
        return max(1, int(budget * PREFILL_SHARE))


def told_turns(program_id: str, turns: int, error: float) -> int:
    """A length predictor's estimate of a program's turn count: the true count times
    ``exp(error z)``, z a standard normal drawn from the program's id (so every run, and every
    error, sees the same draw for a program: a sweep of `error` is one predictor made worse),
    rounded, at least 1. `error` 0 is the true count."""
    if error == 0:
        return turns
    z = random.Random(program_id).gauss(0.0, 1.0)
    return max(1, round(turns * math.exp(error * z)))


class LookaheadOraclePolicy(LookaheadPolicy):
    """A clairvoyant reference, not a deployable policy: `lookahead`'s rules told each
    program's turn count (the bench's engine factory hands it the trace's futures, as it does
    `oracle`; `harness serve` refuses it). The gap between the two is what knowing program
    lengths would buy a program schedule of this form.

    ``lookahead-oracle:E`` is told them with a lognormal error of E (`told_turns`: the log of
    the estimate is off by E standard normals): a length predictor of that accuracy, to say
    how good one must be for the rules to reach what they reach told the truth."""

    name = "lookahead-oracle"
    clairvoyant = True
    argument = "length_error"

    def __init__(self, cost_model: CostModel | None = None, length_error: float = 0.0) -> None:
        super().__init__(cost_model)
        self.length_error = length_error

    @classmethod
    def parse_argument(cls, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"policy '{cls.name}:{text}': after ':' give the told lengths' "
                             f"error, a lognormal sigma >= 0 (e.g. {cls.name}:0.5)")
        return value

    def foresee(self, futures: Mapping[str, Sequence[Any]]) -> None:
        self.programs.tell_lengths({pid: told_turns(pid, len(turns), self.length_error)
                                    for pid, turns in futures.items()})
