"""Program schedulers: which programs hold memory, which run, where, and when they come back.

No module here imports vLLM: the engine (`server.policies.programs`) and the router
(`cluster.program_router`) carry the same decisions out. `base.py` says why the layer exists.
"""

from __future__ import annotations

from server.programs.base import PER_PROGRAM_TOKENS, ProgramScheduler, Room, roomiest
from server.programs.state import Kv, Phase, ProgramState, ProgramTable

__all__ = ["PER_PROGRAM_TOKENS", "Kv", "Phase", "ProgramScheduler", "ProgramState",
           "ProgramTable", "Room", "roomiest"]
