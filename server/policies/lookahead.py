"""`lookahead`: our program scheduler inside the engine (rules in `server.programs.lookahead`).
It uses a host tier when the engine has one (`lookahead+offload`), and works without."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from server.policies.programs import ProgramPolicy
from server.programs.lookahead import Lookahead


class LookaheadPolicy(ProgramPolicy):
    name = "lookahead"
    scheduler_cls = Lookahead


class LookaheadOraclePolicy(LookaheadPolicy):
    """A clairvoyant reference, not a deployable policy: `lookahead`'s rules told each
    program's turn count (the bench's engine factory hands it the trace's futures, as it does
    `oracle`; `harness serve` refuses it). The gap between the two is what knowing program
    lengths would buy a program schedule of this form."""

    name = "lookahead-oracle"
    clairvoyant = True

    def foresee(self, futures: Mapping[str, Sequence[Any]]) -> None:
        self.programs.known_turns = {pid: len(turns) for pid, turns in futures.items()}
