"""`thunderagent`: ThunderAgent's program scheduler inside the engine (rules in
`server.programs.thunderagent`). No pins: a paused program's KV is left to vLLM's LRU, as
ThunderAgent in front of an unmodified engine leaves it."""

from __future__ import annotations

from server.policies.programs import ProgramPolicy
from server.programs.thunderagent import ThunderAgent


class ThunderAgentPolicy(ProgramPolicy):
    name = "thunderagent"
    scheduler_cls = ThunderAgent
