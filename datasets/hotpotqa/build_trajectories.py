"""Write the recorded trajectories `--model replay:DIR` replays for the shipped questions.

Run from the repository root: `.venv/bin/python datasets/hotpotqa/build_trajectories.py`.
A competent agent's path: search each supporting page, look up the bridging entity on the
first page (a real lookup), then finish with the answer. Observations come from the real tool
over the offline corpus.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.benchmarks.hotpotqa import SYSTEM  # noqa: E402
from harness.tools.wikipedia import OfflineBackend, WikipediaTool  # noqa: E402

HERE = Path(__file__).resolve().parent


async def record(task: dict, backend: OfflineBackend) -> dict:
    tool = WikipediaTool(backend)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Question: {task['question']}"}]
    first, second = task["supporting_titles"][:2]
    plan = [("search", first, f"I need to search {first} first."),
            ("lookup", second.split()[0], f"I should look up {second.split()[0]} on this page."),
            ("search", second, f"Now I search {second}."),
            ("finish", task["answer"], f"So the answer is {task['answer']}.")]
    for number, (action, argument, thought) in enumerate(plan, start=1):
        messages.append({"role": "assistant", "content":
                         f"Thought {number}: {thought}\nAction {number}: {action}[{argument}]"})
        observation = await tool.run_action(action, argument)
        messages.append({"role": "user", "content": f"Observation: {observation.text}"})
    return {"messages": messages, "info": {"task_id": task["id"], "exit_status": "submitted",
                                           "submission": task["answer"]}}


def main() -> None:
    backend = OfflineBackend()
    out = HERE / "trajectories"
    out.mkdir(exist_ok=True)
    tasks = [json.loads(line) for line in (HERE / "questions.jsonl").read_text().splitlines()
             if line.strip()]
    for task in tasks:
        data = asyncio.run(record(task, backend))
        (out / f"{task['id']}.traj.json").write_text(json.dumps(data, indent=1))
    print(f"wrote {len(tasks)} trajectories to {out}")


if __name__ == "__main__":
    main()
