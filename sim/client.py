"""What the replayed client tells the server besides its prompts: the hints on each request
and, before a tool runs, its predicted duration.

Why a module of its own: both replayers (the virtual-time loop, `sim.loop`, and the wall-clock
one, `eval.replay.http_replay`) must send the same hints, or their results cannot be compared.
Requests carry the hints a client would send (``turn``, ``tool``, ``last``). ``tool_start``
carries a ``predicted_s`` only if asked (``hints``: one of ``HINT_MODES``, which a policy spec's
``@HINTS`` names, `server.policies.spec`); otherwise policies that need one learn durations
from ``tool_end``.
"""

from __future__ import annotations

from typing import Any

from common.trace import Program
from predictor.durations import ToolDurationModel
from server.policies.spec import HINT_MODES


def turn_hints(program: Program, i: int) -> dict[str, Any]:
    """The ``vllm_xargs`` hints a client sends with turn ``i``'s request (None: left out)."""
    return {"turn": i, "tool": program.turns[i].tool,
            "last": 1 if i == program.n_turns - 1 else None}


class ClientPredictions:
    """The replayed client's tool-duration predictions (see ``HINT_MODES``)."""

    def __init__(self, mode: str = "none") -> None:
        if mode not in HINT_MODES:
            raise ValueError(f"hints {mode!r}: choose one of {', '.join(HINT_MODES)}")
        self.mode = mode
        self.durations = ToolDurationModel()

    def predict(self, tool: str, seconds: float) -> float | None:
        """`predicted_s` for a call of `tool` that will take `seconds`."""
        if self.mode == "none":
            return None
        return seconds if self.mode == "oracle" else self.durations.client_prediction(tool)[1]

    def observe(self, tool: str, seconds: float) -> None:
        if self.mode == "online":
            self.durations.observe(tool, seconds)
