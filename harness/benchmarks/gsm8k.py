"""GSM8K-style math word problems with a calculator (ReAct actions).

Pass = the number in `finish[...]` equals the reference answer
(`harness.benchmarks.scoring.numeric_match`).
"""

from __future__ import annotations

from typing import Any

from common.actions import ActionSpec, react_format
from harness.agent import ToolBox
from harness.benchmarks.base import DATASETS, NO_RUN, Benchmark, RunContext, Task, finish
from harness.benchmarks.scoring import numeric_match
from harness.tools.calculator import Calculator
from harness.trajectory import Trajectory

SYSTEM = (
    "Solve the math word problem step by step. Use the calculator for every computation.\n"
    "Each reply: a line `Thought: ...` then one line `Action: calculator[expression]` or "
    "`Action: finish[number]` with the final numeric answer."
)
FORMAT = react_format(
    (ActionSpec("calculator", "Evaluate an arithmetic expression (+ - * / ** and parentheses).",
                "expression"),
     ActionSpec("finish", "Give the final numeric answer and end.", "answer")),
    "Thought: what to compute next and why\nAction: calculator[arithmetic expression]")


class Gsm8k(Benchmark):
    name = "gsm8k"
    tasks_file = DATASETS / "gsm8k" / "tasks.jsonl"
    replay_dir = DATASETS / "gsm8k" / "trajectories"
    exemplars_file = DATASETS / "gsm8k" / "exemplars.json"
    system = SYSTEM
    action_format = FORMAT

    def messages(self, task: Task) -> list[dict[str, Any]]:
        return self.prompt(f"Question: {task.data['question']}")

    async def toolbox(self, task: Task, program_id: str, run: RunContext = NO_RUN) -> ToolBox:
        calculator = Calculator()
        return ToolBox({"calculator": calculator.run, "finish": finish}, owned=[calculator])

    def score(self, task: Task, trajectory: Trajectory,
              run: RunContext = NO_RUN) -> dict[str, Any]:
        return {"passed": numeric_match(trajectory.answer, task.data["answer"]),
                "reference": task.data["answer"], "prediction": trajectory.answer}
