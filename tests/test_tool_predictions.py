"""What the harness predicts in `tool_start`: the command-class level of the duration chain.

The agent knows a bash command before it runs it, so SWE-bench events carry the key
`bash:<class>`; `predicted_s` is the mean of the chain's chosen level when that level is the
command class or the tool, and is left out for coarser levels (see docs/events.md).
"""

from __future__ import annotations

import asyncio

import pytest

from common.tool_keys import event_tool
from harness.agent import Agent, ToolBox, tool_ended, tool_started
from harness.model_client import Completion
from harness.run import RunError, load_text_model
from harness.tools.base import Observation
from harness.trajectory import Step, Trajectory, trajectory_path
from predictor.data import Example, call_text, examples_from_trajectory
from predictor.durations import ToolDurationModel
from predictor.gaps import GapModel
from predictor.lengths import train
from server.intake.events import EventIn


class Sink:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def emit(self, kind: str, program_id: str, **fields: object) -> None:
        self.events.append({"type": kind, "program_id": program_id, **fields})


def test_tool_started_predicts_from_the_command_level() -> None:
    sink, model = Sink(), ToolDurationModel(min_samples=10)
    # nothing observed: the prior, no prediction
    assert tool_started(sink, model, "p", "bash:pytest", "pytest -q") == "prior"
    # 10 calculator calls: all tools has data, but that is too coarse to send
    for _ in range(10):
        model.observe("calculator", 0.001)
    assert tool_started(sink, model, "p", "bash:pytest", "pytest -q") == "global"
    # 10 bash calls (ls): bash's mean is sent for a pytest command too
    for _ in range(10):
        model.observe("bash:ls", 0.02)
    assert tool_started(sink, model, "p", "bash:pytest", "pytest -q") == "tool"
    # 10 pytest calls: its own mean, not bash's (20 calls, mean 2.01)
    for _ in range(10):
        model.observe("bash:pytest", 4.0)
    assert tool_started(sink, model, "p", "bash:pytest", "pytest -q") == "command"
    assert tool_started(sink, model, "p", "calculator", "1+1") == "tool"  # plain tools too
    assert [e["predicted_s"] for e in sink.events] == [None, None, pytest.approx(0.02),
                                                      pytest.approx(4.0),
                                                      pytest.approx(0.001)]
    assert {e["tool"] for e in sink.events[:4]} == {"bash:pytest"}
    # what goes on the wire passes the server's schema
    for event in sink.events:
        EventIn(**event)


def test_tool_ended_observes_at_every_level() -> None:
    sink, model = Sink(), ToolDurationModel()
    tool_ended(sink, model, "p", "bash:pytest", 3.0, "5 passed")
    assert model.counts() == {"__global__": 1, "bash": 1, "bash:pytest": 1}
    assert sink.events == [{"type": "tool_end", "program_id": "p", "tool": "bash:pytest",
                            "seconds": 3.0, "return_tokens": 2}]
    EventIn(**sink.events[0])


def test_agent_sends_the_command_class_prediction(tmp_path) -> None:
    async def bash(command: str) -> Observation:
        return Observation("<returncode>0</returncode>")

    sink, model = Sink(), ToolDurationModel(min_samples=10)
    for _ in range(10):
        model.observe("bash:pytest", 6.0)
        model.observe("bash:cat", 0.01)
    agent = Agent(None, sink, model, tmp_path)  # type: ignore[arg-type]
    toolbox = ToolBox({"bash": bash}, event_tool=event_tool)
    traj = Trajectory("t", "prog", "swe-bench")
    for command in ("cd /testbed && python3 -m pytest -q tests/", "git diff"):
        asyncio.run(agent._call_tool(traj, Step(0.0, 0, 0, 0), toolbox, "bash", command))
    starts = [e for e in sink.events if e["type"] == "tool_start"]
    ends = [e for e in sink.events if e["type"] == "tool_end"]
    assert [e["tool"] for e in starts] == [e["tool"] for e in ends] == ["bash:pytest",
                                                                        "bash:git"]
    assert starts[0]["predicted_s"] == 6.0  # pytest's own mean, not bash's (3.005)
    # git: no class data, so bash's 21 calls (10 x 6 s, 10 x 0.01 s, the pytest just run)
    assert starts[1]["predicted_s"] == pytest.approx(60.1 / 21, abs=0.01)
    assert model.count("bash:pytest") == 11 and model.count("bash:git") == 1


def test_a_long_class_is_cut_to_the_schema_limit(tmp_path) -> None:
    async def bash(command: str) -> Observation:
        return Observation("")

    sink = Sink()
    agent = Agent(None, sink, ToolDurationModel(), tmp_path)  # type: ignore[arg-type]
    toolbox = ToolBox({"bash": bash}, event_tool=event_tool)
    asyncio.run(agent._call_tool(Trajectory("t", "p", "swe-bench"), Step(0.0, 0, 0, 0),
                                 toolbox, "bash", "x" * 300 + " --flag"))
    assert all(len(e["tool"]) == 128 and e["tool"].startswith("bash:x") for e in sink.events)
    for event in sink.events:
        EventIn(**event)


def test_tool_start_carries_the_gap_model_quantiles() -> None:
    """With a gap model, `tool_start` sends the gap's kind and quantiles under the duration
    key, and `tool_end` teaches it the gap as the program's own: a long gap moves that
    program's quantiles up, not another's."""
    sink, durations, gaps = Sink(), ToolDurationModel(), GapModel()
    tool_started(sink, durations, "p", "bash:pytest", "pytest -q")
    assert "gap_kind" not in sink.events[-1] and "predicted_q" not in sink.events[-1]

    def sent(program: str) -> dict[str, float]:
        tool_started(sink, durations, program, "bash:pytest", "pytest -q", gaps=gaps)
        assert sink.events[-1]["gap_kind"] == "tool"
        return sink.events[-1]["predicted_q"]

    cold = sent("p")  # nothing observed: the kind's prior
    assert set(cold) == {"p50", "p90", "p99"} and cold["p50"] > 5.0
    for i in range(10):  # the run's other programs: ten 1 s test runs
        tool_ended(sink, durations, f"w{i % 2}", "bash:pytest", 1.0, "ok", gaps)
    learnt = sent("p")
    assert learnt["p50"] == pytest.approx(1.0, rel=0.05)  # the pool, no longer the prior
    tool_ended(sink, durations, "p", "bash:pytest", 600.0, "ok", gaps)
    after_long = sent("p")
    assert all(after_long[q] > learnt[q] for q in learnt)
    assert sent("q")["p50"] < after_long["p50"]  # another program is not p
    assert gaps.count("tool") == 11 and durations.count("bash:pytest") == 11
    for event in sink.events:  # what goes on the wire passes the server's schema
        EventIn(**event)


def test_agent_sends_the_gap_from_the_run_s_gap_model(tmp_path) -> None:
    async def bash(command: str) -> Observation:
        return Observation("<returncode>0</returncode>")

    sink, gaps = Sink(), GapModel()
    for i in range(10):  # the run has seen 2 s test runs of other programs
        gaps.observe(f"w{i % 2}", "tool", "bash:pytest", 2.0)
    agent = Agent(None, sink, ToolDurationModel(), tmp_path, gaps=gaps)  # type: ignore[arg-type]
    toolbox = ToolBox({"bash": bash}, event_tool=event_tool)
    traj = Trajectory("t", "prog", "swe-bench")
    for _ in range(2):
        asyncio.run(agent._call_tool(traj, Step(0.0, 0, 0, 0), toolbox, "bash", "pytest -q"))
    starts = [e for e in sink.events if e["type"] == "tool_start"]
    assert [e["gap_kind"] for e in starts] == ["tool", "tool"]
    assert starts[0]["predicted_q"]["p50"] == pytest.approx(2.0, rel=0.05)
    # the first call returned at once: this program's next gap is forecast shorter
    assert starts[1]["predicted_q"]["p50"] < starts[0]["predicted_q"]["p50"]
    assert gaps.count("tool") == 12
    own = Agent(None, sink, ToolDurationModel(), tmp_path)  # type: ignore[arg-type]
    assert isinstance(own.gaps, GapModel) and own.gaps is not gaps


def _text_model():
    """A baseline-only predictor (no torch) learnt from requests whose wording decides the
    reply length and whose tool decides the call's duration."""
    examples = []
    for i in range(60):
        long = i % 2 == 0
        tool = "slow" if i % 3 == 0 else "quick"
        examples.append(Example(
            text=f"user: please write a {'long essay' if long else 'one word'} reply {i}",
            output_tokens=400 if long else 3, tool=tool, call=f"{tool} job {i}",
            tool_seconds=8.0 if tool == "slow" else 0.05, group=f"g{i}"))
    return train(examples, neural=False, seed=0)


def test_text_model_predicts_what_the_chain_cannot_yet(tmp_path) -> None:
    model = _text_model()
    sink = Sink()
    source = tool_started(sink, ToolDurationModel(), "p", "slow", "slow job 99", model)
    assert source == "text"  # no durations yet: the chain has nothing better than the prior
    assert sink.events[0]["predicted_s"] > 1.0  # the slow tool, not the quick one
    EventIn(**sink.events[0])
    durations = ToolDurationModel(min_samples=1)
    durations.observe("slow", 2.0)
    assert tool_started(sink, durations, "p", "slow", "slow job", model) == "tool"
    assert sink.events[1]["predicted_s"] == 2.0  # the harness's own samples win


class ScriptedClient:
    """Says the given replies in order."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)

    async def complete(self, messages, program_id, max_tokens, hints, **options):  # noqa: ANN001, ANN003
        text = self.replies.pop(0)
        return Completion(text=text, finish_reason="stop", prompt_tokens=1,
                          completion_tokens=1, cached_tokens=0, seconds=0.0,
                          raw={"choices": [{"message": {"content": text}}]}, ttft_s=0.0)


def test_the_text_model_is_asked_what_it_was_trained_on(tmp_path) -> None:
    """At `tool_start` the agent asks the text model about the very call text that the
    training example built from the same trajectory step holds (`predictor.data`): the same
    tool name (a bash command's class), the whole argument (a step keeps 500 characters) and
    the same request lines, so the served predictions are the trained ones."""
    async def run(argument: str) -> Observation:
        return Observation("ok")

    async def finish(argument: str) -> Observation:
        return Observation("done", done=True, answer=argument)

    patch = "git apply <<'EOF'\n" + "+ a line of the patch\n" * 60 + "EOF"  # > 500 chars
    replies = ["THOUGHT: run the tests\n\n```bash\ncd /testbed && python3 -m pytest -q\n```",
               "THOUGHT: fix it\n\n```bash\n" + patch + "\n```",
               "Thought: how many?\nAction: calculator[12 * 7]",
               "Action: finish[84]"]
    model = _text_model()
    asked: list[tuple] = []
    predict_calls = model.predict_calls

    def spy(calls, which=None):  # noqa: ANN001, ANN202
        asked.extend(calls)
        return predict_calls(calls, which)

    model.predict_calls = spy  # type: ignore[method-assign]
    sink = Sink()
    client = ScriptedClient(replies)
    agent = Agent(client, sink, ToolDurationModel(), tmp_path,  # type: ignore[arg-type]
                  text_model=model)
    toolbox = ToolBox({"bash": run, "calculator": run, "finish": finish}, event_tool=event_tool)
    messages = [{"role": "system", "content": "You are a careful software engineer."},
                {"role": "user", "content": "Fix the failing test in the repository."}]
    traj = asyncio.run(agent.run("task-1", "p1", "swe-bench", messages, toolbox))
    assert traj.status == "submitted" and len(asked) == 4

    trained = [e for e in examples_from_trajectory(trajectory_path(tmp_path, "task-1"))
               if e.tool is not None]
    assert [e.tool for e in trained] == ["pytest", "git", "calculator", "finish"]
    assert [call_text(*call) for call in asked] == [e.duration_text for e in trained]
    assert "system: You are a careful" in trained[0].duration_text
    assert "turn 2" in trained[2].duration_text
    sent = [e["predicted_s"] for e in sink.events if e["type"] == "tool_start"]
    assert sent == [model.predict_call(e.tool, e.call, e.text, model="baseline") for e in trained]


def test_agent_sends_the_predicted_output_length_with_each_request(tmp_path) -> None:
    class Client:
        hints: list[dict] = []

        async def complete(self, messages, program_id, max_tokens, hints, **options):  # noqa: ANN001, ANN003
            self.hints.append(dict(hints))
            return Completion(text="Action: finish[done]", finish_reason="stop",
                              prompt_tokens=1, completion_tokens=1, cached_tokens=0,
                              seconds=0.0, raw={"choices": [{"message": {}}]}, ttft_s=0.0)

    async def finish(argument: str) -> Observation:
        return Observation("ok", done=True, answer=argument)

    client = Client()
    agent = Agent(client, Sink(), ToolDurationModel(), tmp_path,  # type: ignore[arg-type]
                  text_model=_text_model())
    for wording, expect_long in (("long essay", True), ("one word", False)):
        messages = [{"role": "user", "content": f"please write a {wording} reply"}]
        asyncio.run(agent.run("t", f"p-{wording}", "test", messages,
                              ToolBox({"finish": finish})))
        predicted = client.hints[-1]["predicted_output_tokens"]
        assert (predicted > 100) if expect_long else (predicted < 20)


def test_a_bad_predictor_path_fails_before_any_server_starts(tmp_path) -> None:
    with pytest.raises(RunError, match="--predictor .*not a predictor directory"):
        load_text_model(str(tmp_path))
    assert load_text_model(None) is None
    _text_model().save(tmp_path / "model")
    assert load_text_model(str(tmp_path / "model")).backend == "baseline"
