"""`lookahead`: our program scheduler inside the engine (rules in `server.programs.lookahead`).
It uses a host tier when the engine has one (`lookahead+offload`), and works without."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from server.costs import CostModel
from server.policies.programs import ProgramPolicy
from server.programs.lookahead import Lookahead


class LookaheadPolicy(ProgramPolicy):
    name = "lookahead"
    scheduler_cls = Lookahead
    programs: Lookahead


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
