"""`mori`: MORI's program scheduler inside the engine, with the host tier (rules in
`server.programs.mori`): the engine turns on vLLM's CPU KV offloading for it."""

from __future__ import annotations

from server.policies.programs import ProgramPolicy
from server.programs.mori import Mori


class MoriPolicy(ProgramPolicy):
    name = "mori"
    scheduler_cls = Mori
    needs_offload = True
