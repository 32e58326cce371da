"""What the replayed client tells the server besides its prompts: the hints on each request
and, before a tool runs, its predicted duration.

Why a module of its own: both replayers (the virtual-time loop, `sim.loop`, and the wall-clock
one, `eval.replay.http_replay`) must send the same hints, or their results cannot be compared.
Requests carry the hints a client would send (``turn``, ``tool``, ``last``). ``tool_start``
carries a ``predicted_s`` only if asked (``hints``: one of ``HINT_MODES``, which a policy spec's
``@HINTS`` names, `server.policies.spec`); otherwise policies that need one learn durations
from ``tool_end``. With ``@gaps`` it also carries the gap's kind and the gap model's quantiles
(``gap_kind``, ``predicted_q``), learnt by this client from the gaps it has seen (each program
a session of its own).
"""

from __future__ import annotations

from typing import Any

from common.trace import Program
from predictor.durations import ToolDurationModel
from predictor.gaps import GapModel
from server.policies.spec import HINT_MODES


def turn_hints(program: Program, i: int) -> dict[str, Any]:
    """The ``vllm_xargs`` hints a client sends with turn ``i``'s request (None: left out)."""
    return {"turn": i, "tool": program.turns[i].tool,
            "last": 1 if i == program.n_turns - 1 else None}


class ClientPredictions:
    """The replayed client's tool-duration and gap predictions (see ``HINT_MODES``)."""

    def __init__(self, mode: str = "none") -> None:
        if mode not in HINT_MODES:
            raise ValueError(f"hints {mode!r}: choose one of {', '.join(HINT_MODES)}")
        self.mode = mode
        self.durations = ToolDurationModel()
        self.gaps = GapModel() if mode == "gaps" else None

    def tool_start(self, program: Program, i: int) -> dict[str, Any]:
        """The fields of ``tool_start`` after turn `i` of `program` besides its tool name:
        ``predicted_s`` always (None: none sent), the gap's fields with ``@gaps`` only."""
        turn = program.turns[i]
        tool = turn.tool or turn.gap_kind  # every turn a gap follows names its tool
        fields: dict[str, Any] = {"predicted_s": self._predicted_s(tool, turn.tool_seconds)}
        if self.gaps is not None:
            fields.update(self.gaps.tool_start_fields(program.id, turn.gap_kind, tool))
        return fields

    def observe(self, program: Program, i: int) -> None:
        """The gap after turn `i` of `program` has ended: learn its duration."""
        turn = program.turns[i]
        tool = turn.tool or turn.gap_kind
        if self.mode in ("online", "gaps"):
            self.durations.observe(tool, turn.tool_seconds)
        if self.gaps is not None:
            self.gaps.observe(program.id, turn.gap_kind, tool, turn.tool_seconds)

    def _predicted_s(self, tool: str, seconds: float) -> float | None:
        if self.mode == "none":
            return None
        if self.mode == "oracle":
            return seconds
        return self.durations.client_prediction(tool)[1]
