"""Write the recorded trajectories `--model replay:DIR` replays for the shipped GSM8K tasks.

Run from the repository root: `.venv/bin/python datasets/gsm8k/build_trajectories.py`.
Each task's `steps` (expressions we wrote with the task) become calculator actions, the
calculator computes the observations, and the last result is submitted with `finish[...]`.
Task `gsm-004` is also written as a wrong recording (it submits the cost instead of the
change) under `trajectories-wrong/`, so a run can show that a wrong answer is detected.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.benchmarks.gsm8k import SYSTEM  # noqa: E402
from harness.tools.calculator import evaluate  # noqa: E402

HERE = Path(__file__).resolve().parent


def record(task: dict, steps: list[str], answer: str | None = None) -> dict:
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Question: {task['question']}"}]
    result = ""
    for i, expression in enumerate(steps, start=1):
        messages.append({"role": "assistant", "content":
                         f"Thought: step {i}, compute {expression}.\n"
                         f"Action: calculator[{expression}]"})
        result = evaluate(expression)
        messages.append({"role": "user", "content": f"Observation: {result}"})
    final = answer if answer is not None else result
    messages.append({"role": "assistant", "content":
                     f"Thought: the answer is {final}.\nAction: finish[{final}]"})
    return {"messages": messages, "info": {"task_id": task["id"], "exit_status": "submitted",
                                           "submission": final}}


def main() -> None:
    tasks = [json.loads(line) for line in (HERE / "tasks.jsonl").read_text().splitlines()
             if line.strip()]
    for folder in ("trajectories", "trajectories-wrong"):
        (HERE / folder).mkdir(exist_ok=True)
    for task in tasks:
        data = record(task, task["steps"])
        assert data["info"]["submission"] == task["answer"], (task["id"], data["info"])
        (HERE / "trajectories" / f"{task['id']}.traj.json").write_text(json.dumps(data, indent=1))
    wrong = next(t for t in tasks if t["id"] == "gsm-004")
    (HERE / "trajectories-wrong" / "gsm-004.traj.json").write_text(
        json.dumps(record(wrong, wrong["steps"][:1]), indent=1))
    print(f"wrote {len(tasks)} trajectories and 1 wrong one under {HERE}")


if __name__ == "__main__":
    main()
