"""The ALFWorld tool on the shipped games: real TextWorld/fast-downward engine, ALFWorld names,
admissible commands, "Nothing happens." for the rest, winning sequences and both experts."""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.tools.alfworld import GAMES_DIR, AlfWorldError, AlfWorldTool, game_path
from harness.tools.base import Observation

ROOT = Path(__file__).resolve().parents[1]
TASKS = [json.loads(line) for line in (ROOT / "datasets/alfworld/tasks.jsonl").open()]
TASK_IDS = [t["id"] for t in TASKS]

# One correct playthrough per game, written by hand from the room descriptions in
# datasets/alfworld/build_games.py (not taken from the planner).
SOLUTIONS = {
    "alfworld-pick-cellphone-dresser": [
        "go to drawer 2",
        "open drawer 2",
        "take cellphone 1 from drawer 2",
        "go to dresser 1",
        "move cellphone 1 to dresser 1",
    ],
    "alfworld-look-book-desklamp": [
        "go to drawer 1",
        "open drawer 1",
        "take book 1 from drawer 1",
        "go to sidetable 1",
        "use desklamp 1",
    ],
    "alfworld-clean-spatula-drawer": [
        "go to countertop 1",
        "take spatula 1 from countertop 1",
        "go to sinkbasin 1",
        "clean spatula 1 with sinkbasin 1",
        "go to drawer 1",
        "open drawer 1",
        "move spatula 1 to drawer 1",
    ],
    "alfworld-heat-potato-diningtable": [
        "go to fridge 1",
        "open fridge 1",
        "take potato 1 from fridge 1",
        "go to microwave 1",
        "heat potato 1 with microwave 1",
        "go to diningtable 1",
        "move potato 1 to diningtable 1",
    ],
    "alfworld-cool-mug-cabinet": [
        "go to coffeemachine 1",
        "take mug 1 from coffeemachine 1",
        "go to fridge 1",
        "cool mug 1 with fridge 1",
        "go to cabinet 2",
        "open cabinet 2",
        "move mug 1 to cabinet 2",
    ],
    "alfworld-two-pencil-drawer": [
        "go to desk 1",
        "take pencil 1 from desk 1",
        "go to drawer 1",
        "open drawer 1",
        "move pencil 1 to drawer 1",
        "go to sidetable 1",
        "take pencil 2 from sidetable 1",
        "go to drawer 1",
        "move pencil 2 to drawer 1",
    ],
}

TASK_TYPES = {
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
}


async def _play(tool: AlfWorldTool, commands: list[str]) -> list[Observation]:
    return [await tool.run(c) for c in commands]


def _solve(game: str, commands: list[str]) -> tuple[Observation, list[Observation]]:
    async def go() -> tuple[Observation, list[Observation]]:
        async with AlfWorldTool(game) as tool:
            first = await tool.start()
            return first, await _play(tool, commands)

    return asyncio.run(go())


@functools.cache
def _solved(game: str) -> tuple[Observation, list[Observation]]:
    """`_solve` with the game's known sequence, played once for the tests that read it (a game
    takes about 0.3 s to load; observations are snapshots, the tests only read them)."""
    return _solve(game, SOLUTIONS[game])


def test_tasks_cover_every_task_type_and_game_file() -> None:
    assert {t["task_type"] for t in TASKS} == TASK_TYPES
    assert sorted(p.name for p in GAMES_DIR.glob("*.tw-pddl")) == sorted(
        Path(t["game"]).name for t in TASKS
    )
    assert set(SOLUTIONS) == set(TASK_IDS)
    for task in TASKS:
        data = json.loads((ROOT / "datasets/alfworld" / task["game"]).read_text())
        assert data["solvable"] is True
        assert "UNKNOWN GOAL" not in data["grammar"]
        assert f"Your task is to: {task['goal']}." in data["grammar"]
        assert data["alfworld"]["task_type"] == task["task_type"]


@pytest.mark.parametrize("task", TASKS, ids=TASK_IDS)
def test_game_loads_with_task_and_admissible_commands(task: dict) -> None:
    first, _ = _solved(task["id"])
    assert first.ok and not first.done
    assert first.text.startswith("You are in the middle of a room. Looking quickly around you")
    assert first.text.endswith(f"Your task is to: {task['goal']}.")
    assert "Welcome to TextWorld" not in first.text
    commands = first.info["admissible_commands"]
    assert {"look", "inventory", "help"} <= set(commands)
    assert any(c.startswith("go to ") for c in commands)
    assert first.info["won"] is False and first.info["score"] == 0 and first.info["moves"] == 0
    assert first.info["task_type"] == task["task_type"]


@pytest.mark.parametrize("task", TASKS, ids=TASK_IDS)
def test_known_sequence_wins(task: dict) -> None:
    commands = SOLUTIONS[task["id"]]
    _, observations = _solved(task["id"])
    for obs, command in zip(observations[:-1], commands, strict=False):
        assert obs.ok, (command, obs.text)
        assert obs.text != "Nothing happens."
        assert not obs.done and obs.info["won"] is False
    last = observations[-1]
    assert last.ok and last.done
    assert last.info["won"] is True and last.info["score"] == 1
    assert last.info["moves"] == len(commands)


@pytest.mark.parametrize(
    ("game", "commands"),
    [
        (
            "alfworld-clean-spatula-drawer",
            ["go to countertop 1", "take spatula 1 from countertop 1", "go to drawer 1",
             "open drawer 1", "move spatula 1 to drawer 1"],
        ),
        (
            "alfworld-heat-potato-diningtable",
            ["go to fridge 1", "open fridge 1", "take potato 1 from fridge 1",
             "go to diningtable 1", "move potato 1 to diningtable 1"],
        ),
        (
            "alfworld-cool-mug-cabinet",
            ["go to coffeemachine 1", "take mug 1 from coffeemachine 1", "go to cabinet 1",
             "open cabinet 1", "move mug 1 to cabinet 1"],
        ),
        (
            "alfworld-two-pencil-drawer",
            ["go to desk 1", "take pencil 1 from desk 1", "go to drawer 1", "open drawer 1",
             "move pencil 1 to drawer 1"],
        ),
    ],
)
def test_skipping_a_required_step_does_not_win(game: str, commands: list[str]) -> None:
    _, observations = _solve(game, commands)
    assert all(o.ok for o in observations), [o.text for o in observations]
    assert observations[-1].info["won"] is False and not observations[-1].done


def test_inadmissible_action_says_nothing_happens() -> None:
    async def go() -> list[Observation]:
        async with AlfWorldTool("alfworld-cool-mug-cabinet") as tool:
            await tool.start()
            return await _play(tool, [
                "fly to the moon",
                "take mug 1 from coffeemachine 1",  # not there yet
                "go to coffeemachine 1",
                "cool mug 1 with fridge 1",  # not holding it, not at the fridge
            ])

    nonsense, too_far, arrived, wrong = asyncio.run(go())
    for obs in (nonsense, too_far, wrong):
        assert obs.text == "Nothing happens."
        assert obs.ok is False and obs.info["admissible"] is False and not obs.done
    assert nonsense.info["moves"] == too_far.info["moves"] == 0
    assert "go to coffeemachine 1" in nonsense.info["admissible_commands"]
    assert arrived.ok and arrived.info["moves"] == 1
    assert arrived.text == "You arrive at coffeemachine 1. On the coffeemachine 1, you see a mug 1."
    assert "take mug 1 from coffeemachine 1" in arrived.info["admissible_commands"]
    assert wrong.info["moves"] == 1


def test_commands_are_normalised_and_put_is_an_alias_of_move() -> None:
    commands = ["  Go to CounterTop 1. ", "take spatula 1 from countertop 1",
                "go to sinkbasin 1", "clean spatula 1 with sinkbasin 1", "go to drawer 1",
                "put spatula 1 in drawer 1",  # closed: no alias applies
                "open drawer 1", "put spatula 1 in/on drawer 1"]
    _, observations = _solve("alfworld-clean-spatula-drawer", commands)
    assert observations[0].ok and observations[0].info["command"] == "go to countertop 1"
    assert observations[5].text == "Nothing happens."
    assert observations[-1].info["command"] == "move spatula 1 to drawer 1"
    assert observations[-1].done and observations[-1].info["won"] is True


def test_after_winning_the_game_is_over() -> None:
    commands = SOLUTIONS["alfworld-look-book-desklamp"] + ["look"]
    _, observations = _solve("alfworld-look-book-desklamp", commands)
    assert observations[-2].done
    assert observations[-1].done and not observations[-1].ok
    assert "over" in observations[-1].text


@pytest.mark.parametrize("task", TASKS, ids=TASK_IDS)
def test_planner_expert_wins_from_start_and_mid_game(task: dict) -> None:
    async def go() -> tuple[list[str], list[str], Observation]:
        async with AlfWorldTool(task["id"]) as tool:
            await tool.start()
            plan = await tool.expert_plan()
            await tool.run(SOLUTIONS[task["id"]][0])
            rest = await tool.expert_plan()
            observations = await _play(tool, rest)
            return plan, rest, observations[-1]

    plan, rest, last = asyncio.run(go())
    assert len(plan) == task["expert_steps"] <= len(SOLUTIONS[task["id"]])
    assert len(rest) == len(plan) - 1
    assert last.done and last.info["won"] is True


@pytest.mark.parametrize("task", TASKS, ids=TASK_IDS)
def test_handcoded_expert_wins(task: dict) -> None:
    async def go() -> tuple[list[str], Observation]:
        async with AlfWorldTool(task["id"]) as tool:
            plan = await tool.expert_plan("handcoded")
            await tool.start()
            return plan, (await _play(tool, plan))[-1]

    plan, last = asyncio.run(go())
    assert 1 <= len(plan) <= 30
    assert last.done and last.info["won"] is True


def test_games_play_concurrently() -> None:
    async def one(task: dict) -> bool:
        async with AlfWorldTool(task["id"]) as tool:
            await tool.start()
            return (await _play(tool, SOLUTIONS[task["id"]]))[-1].info["won"]

    async def go() -> list[bool]:
        return await asyncio.gather(*(one(t) for t in TASKS))

    assert asyncio.run(go()) == [True] * len(TASKS)


def test_run_without_start_starts_the_game_and_close_is_idempotent() -> None:
    async def go() -> Observation:
        tool = AlfWorldTool("alfworld-pick-cellphone-dresser")
        obs = await tool.run("go to drawer 2")
        await tool.aclose()
        await tool.aclose()
        with pytest.raises(AlfWorldError):
            await tool.run("look")
        return obs

    obs = asyncio.run(go())
    assert obs.ok and obs.text == "You arrive at drawer 2. The drawer 2 is closed."


def test_unknown_game_and_expert_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(AlfWorldError, match="shipped games: .*alfworld-two-pencil-drawer"):
        game_path("no-such-game")
    bad = tmp_path / "bad.tw-pddl"
    bad.write_text("{}")
    with pytest.raises(AlfWorldError, match="missing pddl_domain"):
        AlfWorldTool(bad)
    tool = AlfWorldTool("alfworld-two-pencil-drawer")
    with pytest.raises(ValueError, match="unknown expert"):
        asyncio.run(tool.expert_plan("oracle"))
    name = "alfworld-two-pencil-drawer"
    assert game_path(f"{name}.tw-pddl") == game_path(name) == GAMES_DIR / f"{name}.tw-pddl"


def test_shipped_games_match_the_builder() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "datasets/alfworld/build_games.py"), "--check"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_malformed_game_is_a_clear_error(tmp_path: Path) -> None:
    data = json.loads(game_path("alfworld-two-pencil-drawer").read_text())
    data["pddl_problem"] = "(define (problem broken"
    bad = tmp_path / "broken.tw-pddl"
    bad.write_text(json.dumps(data))
    with pytest.raises(AlfWorldError, match="cannot load ALFWorld game"):
        asyncio.run(AlfWorldTool(bad).start())
