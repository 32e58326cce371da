"""What a benchmark supplies to `harness run`: tasks, the first messages (its system prompt
with worked examples), its action format, a program's tools, recorded trajectories for the
replay model, and scoring."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.actions import ActionFormat
from common.errors import UserError
from common.jsonl import json_lines
from harness.agent import ToolBox
from harness.benchmarks.exemplars import exemplar_messages, load_exemplars
from harness.tools.base import Observation
from harness.trajectory import Trajectory

DATASETS = Path(__file__).resolve().parents[2] / "datasets"


class BenchmarkError(UserError):
    """Bad benchmark input (unknown name, unreadable task file); printed without traceback."""


class TaskSetupError(RuntimeError):
    """One task cannot be set up (say its repository is missing): that task fails, the run
    goes on."""


@dataclass(frozen=True)
class Task:
    id: str
    data: dict[str, Any]


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise BenchmarkError(f"task file {path} does not exist")
    return [row for _, _, row in json_lines(path.read_text().splitlines(), str(path),
                                            BenchmarkError)]


def _quiet(message: str) -> None:
    """No run output to write to (a task run outside `harness run`)."""


@dataclass(frozen=True)
class RunContext:
    """The run a task is part of, handed to the benchmark with each task instead of written
    onto it, so one benchmark object can serve several runs (`harness eval load` runs copies
    of a task side by side) and nothing about a run outlives it."""

    out_dir: Path | None = None  # the run's output folder (SWE-bench writes its reports there)
    run_id: str | None = None  # the run's id: the label of its containers
    model_name: str | None = None  # the served model the run talks to
    #: a line for the run's output (`harness run` prints it above the progress bar)
    log: Callable[[str], None] = _quiet


#: a task outside any run (a test, a script): no folder, no id, no output
NO_RUN = RunContext()


async def finish(argument: str) -> Observation:
    """The `finish[answer]` action: ends the program with its answer."""
    return Observation(f"Episode finished with answer: {argument}", done=True, answer=argument)


class Benchmark:
    name = "benchmark"
    tasks_file: Path = DATASETS
    replay_dir: Path = DATASETS
    uses_docker = False  # its tools run in containers: a run first looks for leftovers
    system = ""  # the system prompt's instructions
    #: the format its model is asked for and its actions (None: any format, any name)
    action_format: ActionFormat | None = None
    exemplars_file: Path | None = None  # worked examples (`harness.benchmarks.exemplars`)
    use_exemplars = True  # `harness run --no-exemplars` leaves them out (zero-shot)

    def load_tasks(self, path: Path | None = None) -> list[Task]:
        file = Path(path) if path else self.tasks_file
        rows = load_jsonl(file)
        tasks = []
        for number, row in enumerate(rows, start=1):
            if "id" not in row:
                raise BenchmarkError(f"{file}: task {number} has no 'id' field")
            tasks.append(Task(str(row["id"]), row))
        return tasks

    def prompt(self, task_text: str) -> list[dict[str, Any]]:
        """The first messages: the instructions, the worked examples as chat turns in the
        benchmark's action format (`harness.benchmarks.exemplars`), then the task."""
        examples: list[dict[str, Any]] = []
        if self.use_exemplars and self.exemplars_file is not None:
            style = self.action_format.style if self.action_format else "react"
            examples = exemplar_messages(load_exemplars(self.exemplars_file), style)
        return [{"role": "system", "content": self.system}, *examples,
                {"role": "user", "content": task_text}]

    def messages(self, task: Task) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def toolbox(self, task: Task, program_id: str, run: RunContext = NO_RUN) -> ToolBox:
        raise NotImplementedError

    def score(self, task: Task, trajectory: Trajectory,
              run: RunContext = NO_RUN) -> dict[str, Any]:
        """At least `passed: bool`; more fields go into the per-task result. May be an
        `async def` (awaited by `harness run`)."""
        raise NotImplementedError
