"""The one small interface every tool implements.

A tool instance belongs to one agent program (a container, a game, a calculator), lives as long
as the program and is closed when it ends, fails or is interrupted. `run` is async so many
programs share one event loop; blocking work (Docker, game engines) goes to a thread inside the
tool. A tool never raises for a bad argument from the model: the model gets an error observation
and may try again. Exceptions are for the harness's own failures; `SandboxError` is the one a
tool raises when what runs it broke (the Docker engine went away, the program's container
vanished): the program cannot go on, and its task is worth running again.
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


class SandboxError(RuntimeError):
    """The machinery under a tool failed, not the call: the Docker engine stopped answering or
    restarted, the program's container was removed or stopped. The program ends as
    `sandbox_error` with this message, and `harness run --resume` runs its task again."""


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
