"""The one small interface every tool implements.

A tool instance belongs to one agent program (a container, a game, a calculator), lives as long
as the program and is closed when it ends, fails or is interrupted. `run` is async so many
programs share one event loop; blocking work (Docker, game engines) goes to a thread inside the
tool. A tool never raises for a bad argument from the model: the model gets an error observation
and may try again. Exceptions are for the harness's own failures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Observation:
    """What the agent sees after a tool call, plus what the harness needs to know."""

    text: str
    ok: bool = True  # False: the call failed (bad input, non-zero exit, timeout)
    done: bool = False  # the episode/program is over (finish[...], a won game, submit)
    answer: str | None = None  # a final answer or patch, when `done` carries one
    info: dict[str, Any] = field(default_factory=dict)  # e.g. exit code, won, truncated


class Tool:
    """Base class: subclasses set `name` and `description` and implement `run`."""

    name: str = "tool"
    description: str = ""

    async def run(self, argument: str) -> Observation:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release what the tool holds (containers, games). Safe to call twice."""

    async def __aenter__(self) -> Tool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
