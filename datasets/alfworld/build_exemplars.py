"""Write the ALFWorld worked examples of the prompt (`exemplars.json`) by playing the example
games (`exemplar-games/`, built by build_games.py from its `EXEMPLAR_GAMES`, never tasks) in
the real engine: every observation is what the game answered.

Run from the repository root: `.venv/bin/python datasets/alfworld/build_exemplars.py`
(`--check` plays them again and fails if the shipped file differs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from common.atomic import write_text_atomic  # noqa: E402
from harness.tools.alfworld import AlfWorldTool  # noqa: E402

EXEMPLARS_FILE = HERE / "exemplars.json"

#: (game, [(thought, command), ...]): a search a model could make, ending with the winning
#: command (its step has no observation: the episode ends there)
EPISODES: list[tuple[str, list[tuple[str, str]]]] = [
    ("exemplar-games/alfworld-example-apple-fridge.tw-pddl", [
        ("I need an apple and then the fridge. An apple may be on a countertop; try "
         "countertop 1.", "go to countertop 1"),
        ("No apple here. Try countertop 2.", "go to countertop 2"),
        ("There is apple 1. Take it.", "take apple 1 from countertop 2"),
        ("Now put it in the fridge.", "go to fridge 1"),
        ("The fridge is closed; open it.", "open fridge 1"),
        ("Put the apple in the fridge.", "move apple 1 to fridge 1"),
    ]),
]


async def play(game: str, steps: list[tuple[str, str]]) -> dict:
    tool = AlfWorldTool(HERE / game)
    try:
        intro = (await tool.start()).text
        rows = []
        for number, (thought, command) in enumerate(steps, start=1):
            observation = await tool.run(command)
            if not observation.ok:
                raise RuntimeError(f"{game}: `{command}` is not admissible: {observation.text}")
            last = number == len(steps)
            if observation.done != last:
                verb = "ends" if observation.done else "does not end"
                raise RuntimeError(f"{game}: `{command}` {verb} the game")
            row = {"thought": thought, "action": "alfworld", "argument": command}
            if not last:
                row["observation"] = observation.text
            rows.append(row)
        return {"task": intro, "game": game, "steps": rows}
    finally:
        await tool.aclose()


async def build() -> str:
    episodes = [await play(game, steps) for game, steps in EPISODES]
    return json.dumps(episodes, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="fail if the shipped exemplars.json differs from a rebuild")
    args = parser.parse_args(argv)
    text = asyncio.run(build())
    if args.check:
        if not EXEMPLARS_FILE.is_file() or EXEMPLARS_FILE.read_text() != text:
            print(f"out of date: {EXEMPLARS_FILE.name}", file=sys.stderr)
            return 1
        return 0
    write_text_atomic(EXEMPLARS_FILE, text)
    print(f"wrote {len(EPISODES)} example(s) to {EXEMPLARS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
