"""The ReAct loop of one agent program.

Each program has its own message history, tools, step limit and time limit. Every LLM call
carries the program id and hints; every tool call is bracketed by `tool_start` / `tool_end`
events so the server knows the program is intercepted, for how long it probably will be (a
mean, `predicted_s`, and the gap model's quantiles, `predicted_q`), and when it is back. The
trajectory is saved after every step.

With the benchmark's action format (`common.actions.ActionFormat`) the loop sends its stop
strings (a ReAct model stops before writing an observation itself), parses only that format,
and answers a format error with the format's reminder. With `tool_calls` it sends the actions
as OpenAI `tools` and answers each call with a `role: tool` message carrying the call id.

Every program ends with a stated reason (`Trajectory.status`): `submitted`, `format_error` (more
than `max_format_errors` unusable replies in a row), `step_limit`, `context_limit` (the prompt
no longer fits the server's context), `time_limit`, `model_error`, `sandbox_error`, or
`replay_exhausted` (the recording ran out).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.actions import Action, ActionFormat, FormatError, parse_action
from common.tool_keys import text_model_tool
from harness.events_client import EventClient, EventSink
from harness.model_client import ChatClient, Completion, ContextLimit, ModelError, ModelUnavailable
from harness.tools.base import Observation, SandboxError, Tool
from harness.trajectory import Step, Trajectory, record_token_ids, save
from predictor.data import request_text
from predictor.durations import Source, ToolDurationModel
from predictor.gaps import GapModel

ToolFn = Callable[[str], Awaitable[Observation]]


@dataclass
class ToolBox:
    """The actions a program may take (`name -> async fn(argument)`) and what to close."""

    actions: dict[str, ToolFn]
    owned: list[Tool] = field(default_factory=list)
    # (action, argument) -> the duration key sent as the events' tool and used for duration
    # predictions, e.g. "bash:pytest" for a bash command running pytest (a (tool, command
    # class) key of predictor.durations); None: the action name
    event_tool: Callable[[str, str], str] | None = None

    async def aclose(self) -> None:
        for tool in self.owned:
            try:
                await tool.aclose()
            except Exception:  # noqa: BLE001 - closing one tool must not stop the others
                pass


@dataclass
class Limits:
    max_steps: int = 30
    time_limit_s: float = 1800.0
    max_format_errors: int = 3
    max_tokens: int = 1024  # the per-turn output cap
    temperature: float = 0.0  # greedy by default: runs repeat, policies compare turn by turn
    observation_chars: int = 10_000
    #: retries of a model call that failed in transit (5xx, connection lost) before the program
    #: ends retryable; 0 ends it at the first failure (for `harness run --resume` later)
    model_retries: int = 4


@dataclass
class Replay:
    """Recorded assistant messages the emulated server must say, in order."""

    texts: list[str]

    def text_for(self, step: int) -> str | None:
        return self.texts[step] if step < len(self.texts) else None


def approx_tokens(text: str) -> int:
    """Our tokenizer averages ~3.8 characters per token (server/tokenizer/README.md)."""
    return max(1, round(len(text) / 3.8))


def tool_started(events: EventSink, durations: ToolDurationModel, program_id: str, tool: str,
                 argument: str, text_model: Any = None, request: str | None = None,
                 gaps: GapModel | None = None) -> Source | str:
    """`tool_start` for the duration key `tool` ("bash:pytest", "calculator"), with the mean
    duration of the chain's chosen level as `predicted_s` when that level is the command class
    or the tool (at least `min_samples` calls). Before that, a text model
    (`predictor.lengths.LengthPredictor`, if given) predicts from the call itself (its cheap
    baseline, which is the better duration model on our data); returns where it came from.

    The text model is asked what it was trained on (`predictor.data.examples_from_messages`):
    the tool as `text_model_tool` names it, the whole argument, and `request`, the
    `predictor.data.request_text` of the conversation before the reply that made the call.

    With a gap model (`gaps`, each program a session of its own) it also sends the gap's kind,
    `tool` (nothing here hands the turn to a person), and its quantiles under the same key."""
    source, predicted = durations.client_prediction(tool)
    if predicted is None and text_model is not None:
        source, predicted = "text", text_model.predict_call(text_model_tool(tool), argument,
                                                             request, model="baseline")
    gap = gaps.tool_start_fields(program_id, "tool", tool) if gaps is not None else {}
    events.emit("tool_start", program_id, tool=tool, predicted_s=predicted,
                summary=argument[:200], **gap)
    return source


def tool_ended(events: EventSink, durations: ToolDurationModel, program_id: str, tool: str,
               seconds: float, output: str, gaps: GapModel | None = None) -> int:
    """Record the duration under the key `tool` (every level of its chain; with `gaps`, as
    the program's tool gap too), send `tool_end`; returns the output's approximate token
    count."""
    return_tokens = approx_tokens(output)
    durations.observe(tool, seconds)
    if gaps is not None:
        gaps.observe(program_id, "tool", tool, seconds)
    events.emit("tool_end", program_id, tool=tool, seconds=round(seconds, 4),
                return_tokens=return_tokens)
    return return_tokens


class Agent:
    def __init__(self, client: ChatClient, events: EventClient, durations: ToolDurationModel,
                 out_dir: Path, limits: Limits | None = None, text_model: Any = None,
                 tool_calls: bool = False, gaps: GapModel | None = None) -> None:
        """`text_model`: a `predictor.lengths.LengthPredictor` that adds each request's
        predicted output length to its hints (AugServe's stage-I input) and predicts tool
        durations the duration chain cannot yet answer; None sends neither. `tool_calls`:
        send the benchmark's actions as OpenAI `tools` (the server needs a tool parser).
        `gaps`: the gap model whose quantiles `tool_start` carries, shared like `durations`
        by whatever shares this agent's programs (None: one of the agent's own)."""
        self.text_model = text_model
        self.tool_calls = tool_calls
        self.client = client
        self.events = events
        self.durations = durations
        self.gaps = gaps if gaps is not None else GapModel()
        self.out_dir = out_dir
        self.limits = limits or Limits()

    async def run(self, task_id: str, program_id: str, benchmark: str,
                  messages: list[dict[str, Any]], toolbox: ToolBox,
                  replay: Replay | None = None,
                  action_format: ActionFormat | None = None) -> Trajectory:
        """`action_format`: the benchmark's (None: any format, no stop strings)."""
        traj = Trajectory(task_id, program_id, benchmark, messages=list(messages),
                          started_at=time.time())
        # the prompt's length: its worked examples' replies are not this program's turns
        traj.info["prompt_messages"] = len(messages)
        self.events.emit("program_start", program_id)
        try:
            await asyncio.wait_for(self._loop(traj, toolbox, replay, action_format),
                                   self.limits.time_limit_s)
        except TimeoutError:
            traj.status = "time_limit"
        except ContextLimit as exc:  # the history outgrew the model: a verdict, not a fault
            traj.status = "context_limit"
            traj.info["error"] = str(exc)
        except ModelError as exc:
            traj.status = "model_error"
            traj.info["error"] = str(exc)
            # the server is gone or broken, not this request: the task may run again
            traj.info["retryable"] = isinstance(exc, ModelUnavailable)
        except SandboxError as exc:  # the Docker engine or the program's container failed
            traj.status = "sandbox_error"
            traj.info["error"] = str(exc)
            traj.info["retryable"] = True
        finally:
            self.events.emit("program_end", program_id)
            traj.finished_at = time.time()
            save(traj, self.out_dir)
        return traj

    def _request_options(self, fmt: ActionFormat | None) -> dict[str, Any]:
        """What each request adds for the format: its `tools`, or its stop strings."""
        if fmt is None:
            return {}
        if self.tool_calls:
            return {"tools": fmt.tools(), "tool_choice": "auto"}
        return {"stop": list(fmt.stop)} if fmt.stop else {}

    async def _loop(self, traj: Trajectory, toolbox: ToolBox, replay: Replay | None,
                    fmt: ActionFormat | None = None) -> None:
        format_errors = 0
        context: list[int] | None = None  # the previous turn's prompt + output token ids
        options = self._request_options(fmt)
        for step in range(self.limits.max_steps):
            hints: dict[str, Any] = {"turn": step}
            if replay is not None:
                text = replay.text_for(step)
                if text is None:
                    traj.status = "replay_exhausted"
                    return
                hints["emulate_text"] = text
            request = None  # the text model's view of this request (`request_text`)
            if self.text_model is not None:
                request = request_text(traj.messages)
                hints.update(self.text_model.hints_of(request))
            completion = await self.client.complete(traj.messages, program_id=traj.program_id,
                                                    max_tokens=self.limits.max_tokens,
                                                    temperature=self.limits.temperature,
                                                    hints=hints, **options)
            message = completion.raw["choices"][0]["message"]
            record = self._record_turn(traj, completion)
            context = record_token_ids(record, context, completion.prompt_token_ids,
                                       completion.output_token_ids)
            if record.output_token_ids is not None:
                traj.info["token_id_turns"] = traj.info.get("token_id_turns", 0) + 1
                traj.info.setdefault("prefix_broken_turns", 0)
            if record.prefix == "broken":
                traj.info["prefix_broken_turns"] += 1
            calls = message.get("tool_calls")
            traj.messages.append(assistant_message(completion.text, calls))
            try:
                action = parse_action(completion.text, calls, fmt=fmt)
            except FormatError as exc:
                format_errors += 1
                record.ok = False
                record.format_error = exc.message
                if format_errors > self.limits.max_format_errors:
                    traj.status = "format_error"
                    save(traj, self.out_dir)
                    return
                traj.messages.extend(answer_messages(calls, f"Format error: {exc.message}"))
                save(traj, self.out_dir)
                continue
            format_errors = 0
            observation = await self._call_tool(traj, record, toolbox, action.tool,
                                                action.argument, request)
            traj.messages.append(observation_message(action, self._render(observation)))
            traj.messages.extend(unrun_calls(calls, action))
            save(traj, self.out_dir)
            if observation.done:
                traj.status = "submitted"
                traj.answer = observation.answer
                return
        traj.status = "step_limit"

    @staticmethod
    def _record_turn(traj: Trajectory, completion: Completion) -> Step:
        record = Step(llm_s=completion.seconds, prompt_tokens=completion.prompt_tokens,
                      output_tokens=completion.completion_tokens,
                      cached_tokens=completion.cached_tokens, ttft_s=completion.ttft_s,
                      finish_reason=completion.finish_reason,
                      started_s=round(time.time() - traj.started_at - completion.seconds, 4))
        traj.steps.append(record)
        return record

    async def _call_tool(self, traj: Trajectory, record: Step, toolbox: ToolBox, tool: str,
                         argument: str, request: str | None = None) -> Observation:
        """Run one action, bracketed by its events; `request`: the text model's view of the
        request whose reply made the call (see `tool_started`)."""
        record.tool, record.argument = tool, argument[:500]
        fn = toolbox.actions.get(tool)
        if fn is None:
            record.ok = False
            return Observation(f"Unknown action {tool!r}; available: "
                               f"{', '.join(sorted(toolbox.actions))}", ok=False)
        # the events' schema caps `tool` at 128 characters; a long class keeps its "tool:" head
        event_tool = (toolbox.event_tool(tool, argument) if toolbox.event_tool else tool)[:128]
        tool_started(self.events, self.durations, traj.program_id, event_tool, argument,
                     self.text_model, request, self.gaps)
        started = time.monotonic()
        try:
            observation = await fn(argument)
        except SandboxError:
            record.tool_s = time.monotonic() - started
            record.ok = False
            self.events.emit("tool_end", traj.program_id, tool=event_tool,
                             seconds=round(record.tool_s, 4), return_tokens=0)
            raise  # the program's sandbox is gone: it cannot go on
        except Exception as exc:  # noqa: BLE001 - a broken tool is an observation, not a crash
            observation = Observation(f"Tool {tool} failed: {exc}", ok=False)
        record.tool_s = time.monotonic() - started
        record.ok = observation.ok
        record.return_tokens = tool_ended(self.events, self.durations, traj.program_id,
                                          event_tool, record.tool_s, observation.text,
                                          self.gaps)
        return observation

    def _render(self, observation: Observation) -> str:
        text = observation.text
        limit = self.limits.observation_chars
        if len(text) > limit:
            text = text[: limit // 2] + f"\n[... {len(text) - limit} characters elided ...]\n" \
                + text[-limit // 2:]
        return f"Observation: {text}"


def assistant_message(text: str, tool_calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The reply as the history keeps it: its text exactly as generated (the next prompt must
    extend this turn's tokens) and its tool calls, if any."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def observation_message(action: Action, text: str) -> dict[str, Any]:
    """A tool call's result: a `role: tool` message with the call's id for an OpenAI tool
    call, else a user message."""
    if action.call_id is not None:
        return {"role": "tool", "tool_call_id": action.call_id, "content": text}
    return {"role": "user", "content": text}


def unrun_calls(tool_calls: list[dict[str, Any]] | None, ran: Action) -> list[dict[str, Any]]:
    """An answer to each further call of the reply: one action runs per step, and OpenAI
    servers reject a history with an unanswered call."""
    return [{"role": "tool", "tool_call_id": call["id"],
             "content": "Not run: one tool call per step; call it again if still needed."}
            for call in tool_calls or [] if call.get("id") and call["id"] != ran.call_id]


def answer_messages(tool_calls: list[dict[str, Any]] | None, text: str) -> list[dict[str, Any]]:
    """What follows a reply that could not be used: every tool call it made must be answered
    (OpenAI servers reject a history with an unanswered call), then `text` as a user message."""
    answers = [{"role": "tool", "tool_call_id": call.get("id"), "content": text}
               for call in tool_calls or [] if call.get("id")]
    return answers or [{"role": "user", "content": text}]
