"""ALFWorld household tasks on the real TextWorld engine, with games we author as PDDL problems.

The agent acts with ReAct lines `Action: alfworld[go to drawer 2]`; pass = the engine's `won`
(the tool ends the episode only then).
"""

from __future__ import annotations

from typing import Any

from common.actions import ActionSpec, react_format
from harness.agent import ToolBox
from harness.benchmarks.base import DATASETS, NO_RUN, Benchmark, RunContext, Task
from harness.tools.alfworld import AlfWorldTool
from harness.trajectory import Trajectory

SYSTEM = (
    "You are in a household text game. Interact with `Action: alfworld[command]`, where the "
    "command is one of the game's admissible commands (go to X, open X, take X from Y, "
    "move X to Y, heat X with Y, cool X with Y, clean X with Y, use X, examine X, look, "
    "inventory). Each reply: `Thought: ...` then one Action line."
)
GAMES = DATASETS / "alfworld"
FORMAT = react_format(
    (ActionSpec("alfworld", "One of the game's admissible commands, e.g. `go to drawer 2`.",
                "command"),),
    "Thought: what to do next and why\nAction: alfworld[admissible command]")


class AlfWorld(Benchmark):
    name = "alfworld"
    tasks_file = GAMES / "tasks.jsonl"
    replay_dir = GAMES / "trajectories"
    exemplars_file = GAMES / "exemplars.json"  # played in example games, not tasks
    system = SYSTEM
    action_format = FORMAT

    def __init__(self) -> None:
        self._intro: dict[str, str] = {}  # the game's opening text, known once it is loaded

    def messages(self, task: Task) -> list[dict[str, Any]]:
        return self.prompt(self._intro.get(task.id, task.data["goal"]))

    async def toolbox(self, task: Task, program_id: str, run: RunContext = NO_RUN) -> ToolBox:
        tool = AlfWorldTool(GAMES / task.data["game"])
        self._intro[task.id] = (await tool.start()).text
        return ToolBox({"alfworld": tool.run}, owned=[tool])

    def score(self, task: Task, trajectory: Trajectory,
              run: RunContext = NO_RUN) -> dict[str, Any]:
        # the tool ends the episode (done) only when the engine reports the game won
        won = trajectory.status == "submitted"
        self._intro.pop(task.id, None)
        return {"passed": won, "won": won, "task_type": task.data["task_type"]}
