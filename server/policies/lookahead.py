"""`lookahead`: our program scheduler inside the engine (rules in `server.programs.lookahead`).
It uses a host tier when the engine has one (`lookahead+offload`), and works without."""

from __future__ import annotations

from server.policies.programs import ProgramPolicy
from server.programs.lookahead import Lookahead


class LookaheadPolicy(ProgramPolicy):
    name = "lookahead"
    scheduler_cls = Lookahead
