"""Token-exact trajectories against a real `harness serve` (emulated GPU, replay model): each
turn keeps the prompt and output token ids the server used, the harness checks that every
prompt extends the previous turn's prompt + output, and reports where one does not."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.agent import Agent, Replay, ToolBox
from harness.benchmarks.base import Benchmark, Task, finish
from harness.events_client import EventClient
from harness.model_client import ChatClient
from harness.run import build_summary, run_task
from harness.tools.base import Observation
from harness.trajectory import first_difference, token_ids
from predictor.durations import ToolDurationModel

pytestmark = [pytest.mark.server, pytest.mark.slow]  # each starts `harness serve`: ~20 s
ROOT = Path(__file__).resolve().parent.parent
MODEL = "llama-3.1-8b"


def test_run_records_exact_token_ids_and_no_broken_prefix(server, tmp_path):
    out = tmp_path / "gsm8k"
    run = subprocess.run([sys.executable, "-m", "cli", "run", "gsm8k", "--server",
                          server.base_url, "--out", str(out), "--limit", "2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["token_id_turns"] > 0 and summary["prefix_broken_turns"] == 0
    for path in (out / "trajectories").iterdir():
        data = json.loads(path.read_text())
        turns = token_ids(data)
        assert len(turns) == len(data["steps"]) and data["info"]["prefix_broken_turns"] == 0
        for step, (prompt, output) in zip(data["steps"], turns, strict=True):
            assert len(prompt) == step["prompt_tokens"] and len(output) == step["output_tokens"]
        for (prompt, output), (following, _) in zip(turns, turns[1:], strict=False):
            assert following[:len(prompt) + len(output)] == prompt + output
        assert all(s["prefix"] == "extends" for s in data["steps"][1:])
        # stored compactly: the full prompt only on the first turn
        assert data["steps"][0]["prompt_token_ids"] and all(
            s["prompt_token_ids"] is None for s in data["steps"][1:])


class RewritingBench(Benchmark):
    """One tool call that rewrites the task message in place, as an agent framework that edits
    its history does: the next prompt no longer extends the previous one."""

    name = "rewriting"

    def __init__(self, messages):
        self.first = messages

    def messages(self, task):
        return self.first

    async def toolbox(self, task, program_id):
        async def edit(argument: str) -> Observation:
            self.first[0]["content"] = self.first[0]["content"].replace("apples", "pears")
            return Observation("edited")

        return ToolBox({"edit": edit, "finish": finish})

    def score(self, task, trajectory):
        return {"passed": trajectory.status == "submitted"}


def test_a_rewritten_history_is_reported_at_its_first_token(server, tmp_path):
    messages = [{"role": "user", "content": "Count the apples in the basket, then finish."}]
    bench = RewritingBench(messages)
    replay = Replay(["Thought: first I edit.\nAction: edit[x]",
                     "Thought: done.\nAction: finish[3]"])

    async def go():
        client = ChatClient(server.base_url, MODEL, token_ids=True)
        async with EventClient(server.base_url) as events:
            agent = Agent(client, events, ToolDurationModel(), tmp_path / "trajectories")
            result = await run_task(bench, Task("t1", {}), agent, replay, tmp_path, "rtest")
        await client.aclose()
        return result

    result = asyncio.run(go())
    assert result["token_id_turns"] == 2 and result["prefix_broken_turns"] == 1
    data = json.loads((tmp_path / "trajectories" / "t1.traj.json").read_text())
    first, second = data["steps"]
    assert second["prefix"] == "broken" and second["prompt_token_ids"] is not None
    at = second["prefix_break"]["at"]
    context = first["prompt_token_ids"] + first["output_token_ids"]
    assert at == first_difference(context, second["prompt_token_ids"]) and 0 < at < len(
        first["prompt_token_ids"])  # inside the rewritten user message, not at its end
    assert second["prefix_break"]["expected"] == context[at:at + 8]
    assert token_ids(data)[1][0] == second["prompt_token_ids"]
    summary = build_summary(bench, "continuum", [Task("t1", {})], tmp_path,
                            {"sent": 0, "dropped": 0}, MODEL, 1.0, None)
    assert summary["prefix_broken_turns"] == 1 and summary["token_id_turns"] == 2
