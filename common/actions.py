"""Turning a model reply into one tool call.

Three formats, tried in this order, because agents in the wild use all three:

1. OpenAI `tool_calls` on the reply message (function-calling models, LangChain agents);
2. one fenced bash block, as mini-swe-agent asks its model for (```bash ... ```);
3. a ReAct `Action: tool[argument]` line, as in the ReAct paper's prompts.

A reply with none of them, or with several fenced blocks, is a format error: the agent is told
what was wrong (`FormatError.message`) and may try again.

A benchmark says which format its model is asked for and which actions exist (`ActionFormat`):
then only that format is parsed (a bare code fence is not a bash call where there is no bash
tool), an action the benchmark does not have is a format error too, and every format error
message ends with the benchmark's own reminder of the expected format. Without one (reading
recorded trajectories of any origin, `predictor.data`) every format and name is accepted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, NoReturn

FENCE = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)\n?```", re.DOTALL)
REACT = re.compile(r"^\s*Action(?:\s*\d+)?\s*:\s*([A-Za-z_][\w-]*)\s*\[(.*)\]\s*$",
                   re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Action:
    tool: str
    argument: str
    call_id: str | None = None  # the OpenAI tool_call id, echoed back in the tool message


class FormatError(ValueError):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


#: Where a ReAct model stops: it must not write the tool's result itself, after its action
#: ("\nObservation") or instead of one (a reply that opens with "Observation:", which
#: SmolLM2-135M wrote in 8 of 10 first hotpotqa replies, then ran on with a made-up result).
#: vLLM keeps the stop string in the reply when asked (`include_stop_str_in_output`), which
#: keeps the history the model sees next turn the tokens it generated (README, "Token-exact
#: trajectories").
REACT_STOP = ("\nObservation", "Observation:")


@dataclass(frozen=True)
class ActionSpec:
    """One action a benchmark has: its name, what it does, and its one string argument (the
    parameter's name in the OpenAI tool schema)."""

    name: str
    description: str
    parameter: str = "argument"

    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools` entry for this action."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object",
                           "properties": {self.parameter: {"type": "string"}},
                           "required": [self.parameter]}}}


@dataclass(frozen=True)
class ActionFormat:
    """The action format one benchmark asks its model for.

    `style`: "react" (`Action: name[argument]` lines) or "bash" (one fenced bash block, the
    action `bash`); `specs`: the actions the benchmark has; `example`: a reply in the format,
    shown in every format error, a pattern with words in place of a real argument (a tiny
    model copies a concrete example verbatim: SmolLM2-135M answered `finish[3 * 4]` to
    gsm8k tasks after an example reminder computed `3 * 4`); `stop`: the stop strings sent
    with each request."""

    style: str
    specs: tuple[ActionSpec, ...]
    example: str
    stop: tuple[str, ...] = ()

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.specs)

    def tools(self) -> list[dict[str, Any]]:
        """The OpenAI `tools` list of the benchmark's actions."""
        return [spec.schema() for spec in self.specs]

    def reminder(self) -> str:
        """What a reply must look like, said after every format error."""
        if self.style == "bash":
            return ("Reply with a short THOUGHT, then exactly one ```bash``` block holding "
                    f"one command, for example:\n{self.example}")
        return ("Reply with a line `Thought: ...`, then one line `Action: NAME[argument]` "
                f"where NAME is one of {', '.join(self.actions)}, for example:\n"
                f"{self.example}")


def react_format(specs: tuple[ActionSpec, ...], example: str) -> ActionFormat:
    """A ReAct benchmark's format: `Action:` lines, stopped before a made-up observation."""
    return ActionFormat("react", specs, example, REACT_STOP)


def parse_action(text: str, tool_calls: list[dict[str, Any]] | None = None,
                 default_fenced_tool: str = "bash",
                 fmt: ActionFormat | None = None) -> Action:
    """The reply's one action; raises `FormatError` saying what is wrong and, with `fmt`, the
    expected format."""
    try:
        action = _parse(text or "", tool_calls, default_fenced_tool, fmt)
    except FormatError as exc:
        if fmt is None:
            raise
        raise FormatError(f"{exc.message}. {fmt.reminder()}") from None
    if fmt is not None and action.tool not in fmt.actions:
        raise FormatError(f"unknown action {action.tool!r}; the actions are "
                          f"{', '.join(fmt.actions)}. {fmt.reminder()}")
    return action


def _parse(text: str, tool_calls: list[dict[str, Any]] | None, default_fenced_tool: str,
           fmt: ActionFormat | None) -> Action:
    if tool_calls:
        call = tool_calls[0]
        function = call.get("function") or {}
        name = function.get("name")
        if not name:
            raise FormatError("the tool call has no function name")
        return Action(name, _argument_from_json(function.get("arguments")), call.get("id"))
    if fmt is None or fmt.style == "bash":
        fenced = FENCE.findall(text)
        if len(fenced) == 1:
            return Action(default_fenced_tool, fenced[0].strip())
        if len(fenced) > 1:
            raise FormatError(f"found {len(fenced)} code blocks; reply with exactly one "
                              "```bash``` block per step")
        if fmt is not None:
            raise FormatError("no ```bash``` block found")
    match = _last_react_action(text)
    if match is not None:
        return match
    if fmt is not None:
        return _no_react_action(text)
    raise FormatError("no action found: reply with one ```bash``` block, or a line "
                      "`Action: tool[argument]`")


def _no_react_action(text: str) -> NoReturn:
    """Say why a ReAct reply has no action: a code block where none is wanted, or no line."""
    if FENCE.search(text):
        raise FormatError("a code block is not an action here (this task has no bash tool)")
    raise FormatError("no `Action: NAME[argument]` line found")


def _last_react_action(text: str) -> Action | None:
    for line in reversed(text.splitlines()):
        m = REACT.match(line)
        if m:
            return Action(m.group(1).strip().lower(), m.group(2).strip())
    return None


def _argument_from_json(arguments: Any) -> str:
    """Tools take one string; a JSON object with a single field gives that field's value."""
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    if isinstance(arguments, dict):
        if len(arguments) == 1:
            return str(next(iter(arguments.values())))
        return json.dumps(arguments)
    return str(arguments)
