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
from harness.benchmarks.base import Benchmark, RunContext, Task, finish
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

    async def toolbox(self, task, program_id, run):
        async def edit(argument: str) -> Observation:
            self.first[0]["content"] = self.first[0]["content"].replace("apples", "pears")
            return Observation("edited")

        return ToolBox({"edit": edit, "finish": finish})

    def score(self, task, trajectory, run):
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
            result = await run_task(bench, Task("t1", {}), agent, replay,
                                    RunContext(out_dir=tmp_path, run_id="rtest"))
        await client.aclose()
        return result

    result = asyncio.run(go())
    assert result.token_id_turns == 2 and result.prefix_broken_turns == 1
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


def hermes_call(name: str, **arguments: str) -> str:
    """A call as the emulated model's chat template renders one (no newlines inside the tags):
    a reply that spells it otherwise (Qwen's `<tool_call>\\n{...}\\n</tool_call>`) is
    re-rendered differently and breaks the prefix on every tool turn (measured: 3 of 3)."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_tool_calls_path_through_the_servers_parser(server, tmp_path):
    """`--tool-calls`: the actions go as OpenAI `tools`, the server's Hermes parser turns the
    reply into `tool_calls`, each is answered by a `role: tool` message with its id, and the
    re-rendered calls keep the token prefix."""
    replays = tmp_path / "replays"
    replays.mkdir()
    replies = [hermes_call("calculator", expression="48 + 25"),
               hermes_call("calculator", expression="48 + 73"),
               hermes_call("calculator", expression="121 * 3"), hermes_call("finish", answer="363")]
    (replays / "gsm-001.traj.json").write_text(json.dumps(
        {"messages": [{"role": "assistant", "content": r} for r in replies]}))
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "cli", "run", "gsm8k", "--server",
                          server.base_url, "--out", str(out), "--limit", "1", "--tool-calls",
                          "--model", f"replay:{replays}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads((out / "results" / "gsm-001.json").read_text())
    assert result["status"] == "submitted" and result["passed"]
    data = json.loads((out / "trajectories" / "gsm-001.traj.json").read_text())
    own = data["messages"][data["info"]["prompt_messages"]:]
    calls = [m["tool_calls"][0] for m in own if m["role"] == "assistant"]
    answers = [m for m in own if m["role"] == "tool"]
    assert [c["function"]["name"] for c in calls] == ["calculator"] * 3 + ["finish"]
    assert [a["tool_call_id"] for a in answers] == [c["id"] for c in calls]
    assert answers[0]["content"] == "Observation: 73"
    assert data["info"]["prefix_broken_turns"] == 0, [s["prefix_break"] for s in data["steps"]]


def test_a_reply_stopped_at_observation_keeps_the_prefix(server, tmp_path):
    """A ReAct reply that goes on to invent the tool's result is stopped at "\\nObservation";
    the stop string's tokens are in the output ids, so the reply is kept with it (vLLM's
    `include_stop_str_in_output`) and the next prompt extends this turn."""
    replays = tmp_path / "replays"
    replays.mkdir()
    replies = ["Thought: add.\nAction: calculator[48 + 25]\nObservation: 70\nThought: so",
               "Thought: add.\nAction: calculator[48 + 73]", "Action: calculator[121 * 3]",
               "Action: finish[363]"]
    (replays / "gsm-001.traj.json").write_text(json.dumps(
        {"messages": [{"role": "assistant", "content": r} for r in replies]}))
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "cli", "run", "gsm8k", "--server",
                          server.base_url, "--out", str(out), "--limit", "1",
                          "--model", f"replay:{replays}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    data = json.loads((out / "trajectories" / "gsm-001.traj.json").read_text())
    own = data["messages"][data["info"]["prompt_messages"]:]
    assert own[0]["content"] == "Thought: add.\nAction: calculator[48 + 25]\nObservation"
    assert own[1]["content"] == "Observation: 73"  # the tool's, not the made-up 70
    assert data["info"]["exit_status"] == "submitted"
    assert data["info"]["prefix_broken_turns"] == 0 and data["steps"][1]["prefix"] == "extends"
