"""Program schedulers: which programs hold memory, which run, where, and when they come back.

No module here imports vLLM, nor the policies: the engine (`server.policies.programs`) and the
router (`cluster.program_router`, `cluster.program_queue`) carry the same decisions out through
the schedulers' public methods. `base.py` says why the layer exists.
"""

from __future__ import annotations

from server.programs.base import ProgramScheduler, Room, roomiest
from server.programs.state import PER_PROGRAM_TOKENS, Kv, Phase, ProgramState, ProgramTable

__all__ = ["PER_PROGRAM_TOKENS", "Kv", "Phase", "ProgramScheduler", "ProgramState",
           "ProgramTable", "Room", "roomiest"]
