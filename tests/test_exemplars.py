"""The worked examples in each benchmark's prompt: written from our own tools (every
observation is what the real tool answers), never a task under test, and in the format the
benchmark parses."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from common.actions import parse_action
from harness.benchmarks import get_benchmark
from harness.benchmarks.exemplars import load_exemplars, render_step
from harness.tools.alfworld import AlfWorldTool
from harness.tools.bash_output import format_observation
from harness.tools.calculator import Calculator
from harness.tools.wikipedia import WikipediaTool, make_backend

BENCHMARKS_WITH_EXEMPLARS = ("gsm8k", "hotpotqa", "alfworld", "swe-bench")


def observations(bench_name: str, steps) -> list[str | None]:
    """What the benchmark's real tool answers to each step, run in order."""

    async def go() -> list[str | None]:
        if bench_name == "gsm8k":
            calculator = Calculator()
            actions = {"calculator": calculator.run}
        else:
            tool = WikipediaTool(make_backend(None))  # the offline corpus
            actions = tool.actions()
        return [None if step.action == "finish"
                else (await actions[step.action](step.argument)).text for step in steps]

    return asyncio.run(go())


def test_alfworld_example_is_played_in_an_example_game_not_a_task():
    bench = get_benchmark("alfworld")
    rows = json.loads(bench.exemplars_file.read_text())
    games = {task.data["game"] for task in bench.load_tasks()}

    async def play(game: str, steps) -> list[str | None]:
        tool = AlfWorldTool(bench.exemplars_file.parent / game)
        try:
            intro = (await tool.start()).text
            seen = [(await tool.run(step.argument)) for step in steps]
        finally:
            await tool.aclose()
        assert seen[-1].done and seen[-1].info["won"]  # the last step wins the game
        return [intro] + [None if o.done else o.text for o in seen]

    for row, exemplar in zip(rows, load_exemplars(bench.exemplars_file), strict=True):
        assert row["game"].startswith("exemplar-games/") and row["game"] not in games
        assert asyncio.run(play(row["game"], exemplar.steps)) == \
            [exemplar.task] + [step.observation for step in exemplar.steps]


@pytest.mark.parametrize("bench_name", ["gsm8k", "hotpotqa"])
def test_observations_are_what_our_tools_answer(bench_name):
    bench = get_benchmark(bench_name)
    for exemplar in load_exemplars(bench.exemplars_file):
        assert observations(bench_name, exemplar.steps) == \
            [step.observation for step in exemplar.steps]
        assert exemplar.steps[-1].action == "finish"


def test_swebench_example_commands_give_its_observations(tmp_path):
    """The bash example runs in a plain shell on the files it names (the sandbox runs the
    same commands in the task container)."""
    bench = get_benchmark("swe-bench")
    rows = json.loads(bench.exemplars_file.read_text())
    for row, exemplar in zip(rows, load_exemplars(bench.exemplars_file), strict=True):
        for name, text in row["files"].items():
            (tmp_path / name).write_text(text)
        for step in exemplar.steps[:-1]:
            done = subprocess.run(["bash", "-c", step.argument], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=30)
            assert format_observation(done.returncode, done.stdout + done.stderr,
                                      timed_out=False, timeout=0) == step.observation
        assert exemplar.steps[-1].argument == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@pytest.mark.parametrize("bench_name", BENCHMARKS_WITH_EXEMPLARS)
def test_no_example_is_a_task_under_test(bench_name):
    bench = get_benchmark(bench_name)
    tasks = bench.load_tasks()
    texts = [json.dumps(task.data) for task in tasks]
    for exemplar in load_exemplars(bench.exemplars_file):
        question = exemplar.task.removeprefix("Question: ")
        assert not any(question in text for text in texts)
    if bench_name == "hotpotqa":  # nor does one read a page a question is about
        used = {title for task in tasks for title in task.data["supporting_titles"]}
        searched = {s.argument for e in load_exemplars(bench.exemplars_file) for s in e.steps
                    if s.action == "search"}
        assert not searched & used


@pytest.mark.parametrize("bench_name", BENCHMARKS_WITH_EXEMPLARS)
def test_each_example_reply_parses_as_the_benchmarks_format(bench_name):
    bench = get_benchmark(bench_name)
    fmt = bench.action_format
    for exemplar in load_exemplars(bench.exemplars_file):
        for step in exemplar.steps:
            reply = render_step(step, fmt.style).split("\n\nObservation: ")[0] \
                .split("\nObservation: ")[0]
            action = parse_action(reply, fmt=fmt)
            assert (action.tool, action.argument) == (step.action, step.argument)


def test_the_prompt_gives_the_examples_as_turns_unless_zero_shot():
    bench = get_benchmark("gsm8k")
    task = bench.load_tasks()[0]
    messages = bench.messages(task)
    assert messages[0] == {"role": "system", "content": bench.system}
    assert messages[-1] == {"role": "user", "content": f"Question: {task.data['question']}"}
    assert messages[2] == {"role": "assistant", "content": "Thought: First the number of books "
                           "on all shelves: 4 shelves of 35 books.\nAction: calculator[4 * 35]"}
    assert messages[3] == {"role": "user", "content": "Observation: 140"}
    assert [m["role"] for m in messages[1:-1]].count("assistant") == 6
    bench.use_exemplars = False
    assert len(bench.messages(task)) == 2


def test_a_replay_takes_only_the_replies_after_the_prompt(tmp_path):
    from harness.run import load_replay

    bench = get_benchmark("gsm8k")
    prompt = bench.messages(bench.load_tasks()[0])
    data = {"messages": [*prompt, {"role": "assistant", "content": "Action: finish[1]"}],
            "info": {"prompt_messages": len(prompt)}}
    (tmp_path / "t.traj.json").write_text(json.dumps(data))
    assert load_replay(tmp_path, "t").texts == ["Action: finish[1]"]
