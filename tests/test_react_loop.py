"""The ReAct loop against a scripted OpenAI server (httpx's in-process transport): what each
request carries for the benchmark's format (stop strings, `tools`), how format errors are
counted and answered, and that every program ends with a stated reason. The real agent, chat
client, benchmarks and tools run; only the model's replies are scripted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from rich.progress import Progress, TextColumn

from harness.agent import Agent, Limits
from harness.benchmarks import Task, get_benchmark
from harness.model_client import ChatClient, Retries
from harness.run import (
    PROGRESS_TEXT,
    RunError,
    RunSpec,
    build_summary,
    received_during,
    run_benchmark,
)
from harness.trajectory import Trajectory
from predictor.durations import ToolDurationModel


class Events:
    """An event sink that keeps what the agent emits."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, type: str, program_id: str, **fields: Any) -> None:
        self.events.append((type, fields))


def scripted_client(replies: list[dict[str, Any]], bodies: list[dict[str, Any]],
                    token_ids: bool = True) -> ChatClient:
    """A chat client whose server answers `replies` in order: a dict with `content` (and
    optionally `tool_calls`, `finish_reason`), or `{"status": 400, "error": text}`."""

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        reply = replies[min(len(bodies), len(replies)) - 1]
        if "status" in reply:
            return httpx.Response(reply["status"], json={"error": {"message": reply["error"]}})
        message = {"role": "assistant", "content": reply.get("content", "")}
        if reply.get("tool_calls"):
            message["tool_calls"] = reply["tool_calls"]
        return httpx.Response(200, json={
            "choices": [{"message": message, "finish_reason": reply.get("finish_reason", "stop")}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}})

    client = ChatClient("http://scripted", "m", stream=False, token_ids=token_ids,
                        retries=Retries(0))
    client._client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return client


def run_program(bench_name: str, replies: list[dict[str, Any]], tmp_path: Path,
                tool_calls: bool = False, limits: Limits | None = None,
                token_ids: bool = True) -> tuple[Trajectory, list[dict[str, Any]], Events]:
    bench = get_benchmark(bench_name)
    task = bench.load_tasks()[0]
    bodies: list[dict[str, Any]] = []
    events = Events()

    async def go() -> Trajectory:
        client = scripted_client(replies, bodies, token_ids)
        agent = Agent(client, events, ToolDurationModel(), tmp_path, limits or Limits(),  # type: ignore[arg-type]
                      tool_calls=tool_calls)
        toolbox = await bench.toolbox(task, "p1")
        try:
            return await agent.run(task.id, "p1", bench.name, bench.messages(task), toolbox,
                                   None, bench.action_format)
        finally:
            await toolbox.aclose()
            await client.aclose()

    return asyncio.run(go()), bodies, events


def test_text_actions_stop_before_a_made_up_observation_and_keep_the_stop_string(tmp_path):
    replies = [{"content": "Thought: add.\nAction: calculator[2 + 3]\nObservation"},
               {"content": "Thought: done.\nAction: finish[5]"}]
    traj, bodies, _ = run_program("gsm8k", replies, tmp_path)
    assert traj.status == "submitted" and traj.answer == "5"
    assert bodies[0]["stop"] == ["\nObservation", "Observation:"]
    assert bodies[0]["include_stop_str_in_output"]
    assert bodies[0]["temperature"] == 0.0 and bodies[0]["max_tokens"] == Limits.max_tokens
    # the reply is kept as generated (stop string included), the observation follows it
    n = traj.info["prompt_messages"]
    assert traj.messages[n]["content"].endswith("\nObservation")
    assert traj.messages[n + 1] == {"role": "user", "content": "Observation: 5"}
    # without token ids (a non-vLLM server) the vLLM extension is not sent
    _, bodies, _ = run_program("gsm8k", replies, tmp_path, token_ids=False)
    assert bodies[0]["stop"] and "include_stop_str_in_output" not in bodies[0]


def test_format_errors_show_the_benchmarks_own_format(tmp_path):
    replies = [{"content": "```bash\necho 42\n```"}, {"content": "The answer is 42."},
               {"content": "Action: python[print(42)]"}, {"content": "still nothing"}]
    traj, _, _ = run_program("gsm8k", replies, tmp_path)
    assert traj.status == "format_error" and len(traj.steps) == 4
    errors = [m["content"] for m in traj.messages if m["content"].startswith("Format error")]
    assert len(errors) == 3
    assert "no bash tool" in errors[0]  # a bare fence is not a bash call in gsm8k
    assert "unknown action 'python'" in errors[2]
    for error in errors:  # the reminder is gsm8k's: calculator and finish, no bash block
        assert "Action: calculator[" in error and "calculator, finish" in error
        assert "```bash" not in error.split(".", 1)[1]
    assert [s.format_error is not None for s in traj.steps] == [True] * 4


def test_a_repeated_unknown_action_ends_as_format_error_not_at_the_step_limit(tmp_path):
    replies = [{"content": "Thought: hmm.\nAction: calculate[1 + 1]"}]  # forever
    traj, bodies, _ = run_program("gsm8k", replies, tmp_path, limits=Limits(max_steps=30))
    assert traj.status == "format_error" and len(bodies) == Limits.max_format_errors + 1


@pytest.mark.parametrize("error", [
    # what vLLM 0.32's OpenAI server answered SmolLM2's server (max_model_len 8192)
    "This model's maximum context length is 8192 tokens. However, your prompt contains at "
    "least 8193 input tokens, which exceeds this limit even without any output tokens.",
    # its engine's own check
    "The decoder prompt (length 8300) is longer than the maximum model length of 8192."])
def test_a_prompt_past_the_context_ends_the_program_as_context_limit(tmp_path, error):
    replies = [{"content": "Thought: add.\nAction: calculator[2 + 3]"},
               {"status": 400, "error": error}]
    traj, bodies, events = run_program("gsm8k", replies, tmp_path)
    assert traj.status == "context_limit" and "8192" in traj.info["error"]
    assert len(bodies) == 2 and events.events[-1][0] == "program_end"
    # any other 400 stays a model error
    traj, _, _ = run_program("gsm8k", [{"status": 400, "error": "bad temperature"}], tmp_path)
    assert traj.status == "model_error"


def test_steps_keep_their_timing_and_finish_reason(tmp_path):
    replies = [{"content": "Thought: add.\nAction: calculator[2 + 3]", "finish_reason": "length"},
               {"content": "Action: finish[5]"}]
    traj, _, _ = run_program("gsm8k", replies, tmp_path)
    assert [s.finish_reason for s in traj.steps] == ["length", "stop"]
    assert all(s.started_s is not None and s.started_s >= 0 and s.llm_s >= 0
               for s in traj.steps)
    assert traj.steps[1].started_s >= traj.steps[0].started_s


def call(call_id: str, name: str, **arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_tool_calls_path_sends_tools_and_answers_with_the_call_id(tmp_path):
    replies = [{"content": "", "tool_calls": [call("c1", "calculator", expression="6 * 7"),
                                              call("c1b", "calculator", expression="1")]},
               {"content": "", "tool_calls": [call("c2", "python", code="1")]},
               {"content": "", "tool_calls": [call("c3", "finish", answer="42")]}]
    traj, bodies, _ = run_program("gsm8k", replies, tmp_path, tool_calls=True)
    assert traj.status == "submitted" and traj.answer == "42"
    names = [t["function"]["name"] for t in bodies[0]["tools"]]
    assert names == ["calculator", "finish"] and "stop" not in bodies[0]
    params = bodies[0]["tools"][0]["function"]["parameters"]
    assert params["required"] == ["expression"]
    n = traj.info["prompt_messages"]
    roles = [(m["role"], m.get("tool_call_id")) for m in traj.messages[n:]]
    # one call runs per step; the reply's second call is answered as not run
    assert roles == [("assistant", None), ("tool", "c1"), ("tool", "c1b"), ("assistant", None),
                     ("tool", "c2"), ("assistant", None), ("tool", "c3")]
    assert traj.messages[n + 2]["content"].startswith("Not run")
    assert traj.messages[n + 1]["content"] == "Observation: 42"
    assert traj.messages[n]["tool_calls"][0]["id"] == "c1"
    # the unknown tool is a format error answered on its own call id
    assert "unknown action 'python'" in traj.messages[n + 4]["content"]
    # the second request carried the first reply and the answers to both its calls
    assert [m["role"] for m in bodies[1]["messages"]][-3:] == ["assistant", "tool", "tool"]


@pytest.mark.parametrize("bench_name", ["gsm8k", "hotpotqa", "alfworld", "swe-bench"])
def test_every_benchmark_states_its_format(bench_name):
    fmt = get_benchmark(bench_name).action_format
    assert fmt is not None and fmt.actions
    assert (fmt.style == "bash") == (bench_name == "swe-bench")
    assert bool(fmt.stop) == (fmt.style == "react")


def test_progress_line_says_done_and_passed_apart():


    console = Console(record=True, width=80)
    with Progress(TextColumn(PROGRESS_TEXT), console=console, auto_refresh=False) as progress:
        bar = progress.add_task("gsm8k", total=10, passed=0)
        progress.update(bar, advance=10, passed=0)
        progress.refresh()
    assert "done 10/10 · passed 0" in console.export_text()


def test_summary_counts_this_runs_events_and_the_reasons(tmp_path):

    assert received_during(120, 180) == 60 and received_during(None, 180) is None
    results = [{"task_id": "a", "status": "format_error", "passed": False, "jct_s": 2.0,
                "steps": 4, "llm_s": 2.0, "output_tokens": 100, "format_errors": 4},
               {"task_id": "b", "status": "submitted", "passed": True, "jct_s": 4.0,
                "steps": 2, "llm_s": 2.0, "output_tokens": 60, "format_errors": 0,
                "cut_at_max_tokens": 1}]
    for result in results:
        (tmp_path / "results").mkdir(exist_ok=True)
        (tmp_path / "results" / f"{result['task_id']}.json").write_text(json.dumps(result))
    summary = build_summary(get_benchmark("gsm8k"), "vllm", [Task("a", {}), Task("b", {})],
                            tmp_path, {"sent": 12, "dropped": 0}, "m", 5.0,
                            received_during(100, 112))
    assert summary["events_received_by_server"] == 12
    assert summary["format_error_share"] == 0.5 and summary["format_error_turns"] == 4
    assert summary["steps_mean"] == 3.0 and summary["request_tokens_per_s"] == 40.0
    assert summary["cut_at_max_tokens"] == 1 and summary["statuses"] == {
        "format_error": 1, "submitted": 1}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("max_tokens", 0, "--max-tokens must be at least 1"),
    ("temperature", -0.5, "--temperature must be at least 0"),
    ("model_retries", -1, "--model-retries must be at least 0")])
def test_bad_reply_options_are_clear_errors(field, value, message):

    with pytest.raises(RunError, match=message):
        run_benchmark(RunSpec("gsm8k", **{field: value}))
