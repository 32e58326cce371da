"""Worked examples in a benchmark's system prompt (few-shot), as the ReAct paper's prompts and
mini-swe-agent's demonstrations give a model.

Each benchmark's examples are a data file beside its tasks (`datasets/BENCH/exemplars.json`):
a list of episodes, each a `task` (the first user message as the benchmark words it) and its
`steps` (`thought`, `action`, `argument`, and the tool's `observation`, absent on the step that
ends the episode). We wrote them from our own tools: tests/test_exemplars.py runs every
calculator and Wikipedia step through the real tool and checks its observation, and checks
that no example is a task under test.

They are given as chat turns between the system prompt and the task (the task as a user
message, each step as an assistant reply in the benchmark's own action format, each
observation as the harness words it), so the model sees exactly the replies it is asked for.
Measured with SmolLM2-135M-Instruct on the first 10 gsm8k tasks, the first reply parsed as an
action in 3 of 10 programs with the examples as turns and in 0 of 10 with the same examples as
text in the system prompt (README, "Running agents"). A trajectory records how many messages
its prompt has (`info.prompt_messages`), so the examples' assistant turns are never taken
for the model's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UserError


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


def exemplar_messages(exemplars: list[Exemplar], style: str) -> list[dict[str, Any]]:
    """The episodes as chat turns: the task, then each reply and the observation after it."""
    messages: list[dict[str, Any]] = []
    for exemplar in exemplars:
        messages.append({"role": "user", "content": exemplar.task})
        for step in exemplar.steps:
            reply = render_step(ExemplarStep(step.thought, step.action, step.argument), style)
            messages.append({"role": "assistant", "content": reply})
            if step.observation is not None:
                messages.append({"role": "user", "content": f"Observation: {step.observation}"})
    return messages
