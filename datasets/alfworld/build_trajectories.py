"""Write the recorded trajectories `--model replay:DIR` replays for the shipped games.

Run from the repository root: `.venv/bin/python datasets/alfworld/build_trajectories.py`.
A competent agent follows the planner's walkthrough stored in each game; observations come
from the real engine while recording.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.benchmarks.alfworld import SYSTEM  # noqa: E402
from harness.tools.alfworld import AlfWorldTool  # noqa: E402

HERE = Path(__file__).resolve().parent


async def record(task: dict) -> dict:
    game = HERE / task["game"]
    walkthrough = json.loads(game.read_text())["walkthrough"]
    tool = AlfWorldTool(game)
    try:
        intro = (await tool.start()).text
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": intro}]
        observation = None
        for number, command in enumerate(walkthrough, start=1):
            messages.append({"role": "assistant", "content":
                             f"Thought {number}: next I {command}.\n"
                             f"Action {number}: alfworld[{command}]"})
            observation = await tool.run(command)
            messages.append({"role": "user", "content": f"Observation: {observation.text}"})
        assert observation is not None and observation.done, f"{task['id']} not won"
    finally:
        await tool.aclose()
    return {"messages": messages, "info": {"task_id": task["id"], "exit_status": "submitted"}}


def main() -> None:
    tasks = [json.loads(line) for line in (HERE / "tasks.jsonl").read_text().splitlines()
             if line.strip()]
    out = HERE / "trajectories"
    out.mkdir(exist_ok=True)
    for task in tasks:
        data = asyncio.run(record(task))
        (out / f"{task['id']}.traj.json").write_text(json.dumps(data, indent=1))
    print(f"wrote {len(tasks)} trajectories to {out}")


if __name__ == "__main__":
    main()
