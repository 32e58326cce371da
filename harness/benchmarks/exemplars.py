"""Worked examples in a benchmark's system prompt (few-shot), as the ReAct paper's prompts and
mini-swe-agent's demonstrations give a model.

Each benchmark's examples are a data file beside its tasks (`datasets/BENCH/exemplars.json`):
a list of episodes, each a `task` (the first user message as the benchmark words it) and its
`steps` (`thought`, `action`, `argument`, and the tool's `observation`, absent on the step that
ends the episode). We wrote them from our own tools: tests/test_exemplars.py runs every
calculator and Wikipedia step through the real tool and checks its observation, and checks
that no example is a task under test. They are rendered in the benchmark's own action format,
so the model sees exactly the replies it is asked for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from common.errors import UserError

HEADER = "Examples of solved tasks (not your task):"


class ExemplarError(UserError):
    """An unreadable exemplar file."""


@dataclass(frozen=True)
class ExemplarStep:
    thought: str
    action: str
    argument: str
    observation: str | None = None


@dataclass(frozen=True)
class Exemplar:
    task: str
    steps: tuple[ExemplarStep, ...]


def load_exemplars(path: Path) -> list[Exemplar]:
    try:
        rows = json.loads(path.read_text())
        return [Exemplar(row["task"], tuple(ExemplarStep(**step) for step in row["steps"]))
                for row in rows]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ExemplarError(f"exemplar file {path}: {exc}") from None


def render_step(step: ExemplarStep, style: str) -> str:
    """One step as the model should write it (and the observation as the harness gives it)."""
    if style == "bash":
        text = f"THOUGHT: {step.thought}\n\n```bash\n{step.argument}\n```"
        return text if step.observation is None else f"{text}\n\nObservation: {step.observation}"
    text = f"Thought: {step.thought}\nAction: {step.action}[{step.argument}]"
    return text if step.observation is None else f"{text}\nObservation: {step.observation}"


def render(exemplars: list[Exemplar], style: str) -> str:
    """Every episode: its task, then its steps; episodes apart by a blank line."""
    separator = "\n\n" if style == "bash" else "\n"
    return "\n\n".join(exemplar.task + separator
                       + separator.join(render_step(s, style) for s in exemplar.steps)
                       for exemplar in exemplars)


def with_exemplars(system: str, exemplars: list[Exemplar], style: str) -> str:
    """The system prompt followed by the worked examples."""
    if not exemplars:
        return system
    return f"{system}\n\n{HEADER}\n\n{render(exemplars, style)}"
