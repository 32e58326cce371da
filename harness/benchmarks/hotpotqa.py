"""HotpotQA-style multi-hop questions over Wikipedia (the ReAct paper's search / lookup / finish).

The offline corpus is the default; set `HARNESS_WIKI=mediawiki` (or an API URL) to ask the real
Wikipedia. Pass = exact match after SQuAD normalisation; F1 is reported beside it.
"""

from __future__ import annotations

import os
from typing import Any

from common.actions import ActionSpec, react_format
from harness.agent import ToolBox
from harness.benchmarks.base import DATASETS, NO_RUN, Benchmark, RunContext, Task
from harness.benchmarks.scoring import exact_match, f1_score
from harness.tools.wikipedia import WikiBackend, WikipediaTool, make_backend
from harness.trajectory import Trajectory

SYSTEM = (
    "Answer the question by interleaving Thought and Action lines. Actions:\n"
    "search[entity] returns the first sentences of the entity's Wikipedia page, or similar "
    "titles; lookup[keyword] returns the next sentence with the keyword on the current page; "
    "finish[answer] gives the final answer.\n"
    "Each reply: `Thought: ...` then one `Action: ...` line."
)
FORMAT = react_format(
    (ActionSpec("search", "The first sentences of the entity's Wikipedia page, or similar "
                "titles.", "entity"),
     ActionSpec("lookup", "The next sentence with the keyword on the current page.", "keyword"),
     ActionSpec("finish", "Give the final answer and end.", "answer")),
    "Thought: what to find out next and why\nAction: search[entity name]")


class HotpotQA(Benchmark):
    name = "hotpotqa"
    tasks_file = DATASETS / "hotpotqa" / "questions.jsonl"
    replay_dir = DATASETS / "hotpotqa" / "trajectories"
    exemplars_file = DATASETS / "hotpotqa" / "exemplars.json"
    system = SYSTEM
    action_format = FORMAT

    def __init__(self) -> None:
        self._backend: WikiBackend | None = None

    def backend(self) -> WikiBackend:
        if self._backend is None:  # one corpus / HTTP client shared by all programs
            self._backend = make_backend(os.environ.get("HARNESS_WIKI"))
        return self._backend

    def messages(self, task: Task) -> list[dict[str, Any]]:
        return self.prompt(f"Question: {task.data['question']}")

    async def toolbox(self, task: Task, program_id: str, run: RunContext = NO_RUN) -> ToolBox:
        tool = WikipediaTool(self.backend())
        return ToolBox(tool.actions(), owned=[tool])

    def score(self, task: Task, trajectory: Trajectory,
              run: RunContext = NO_RUN) -> dict[str, Any]:
        reference = task.data["answer"]
        return {"passed": exact_match(trajectory.answer, reference),
                "f1": f1_score(trajectory.answer, reference), "reference": reference,
                "prediction": trajectory.answer}
