"""Turning a model reply into one tool call.

Three formats, tried in this order, because agents in the wild use all three:

1. OpenAI `tool_calls` on the reply message (function-calling models, LangChain agents);
2. one fenced bash block, as mini-swe-agent asks its model for (```bash ... ```);
3. a ReAct `Action: tool[argument]` line, as in the ReAct paper's prompts.

A reply with none of them, or with several fenced blocks, is a format error: the agent is told
what was wrong (`FormatError.message`) and may try again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

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


def parse_action(text: str, tool_calls: list[dict[str, Any]] | None = None,
                 default_fenced_tool: str = "bash") -> Action:
    if tool_calls:
        call = tool_calls[0]
        function = call.get("function") or {}
        name = function.get("name")
        if not name:
            raise FormatError("the tool call has no function name")
        return Action(name, _argument_from_json(function.get("arguments")), call.get("id"))
    fenced = FENCE.findall(text or "")
    if len(fenced) == 1:
        return Action(default_fenced_tool, fenced[0].strip())
    if len(fenced) > 1:
        raise FormatError(f"found {len(fenced)} code blocks; reply with exactly one ```bash "
                          "block per step")
    match = _last_react_action(text or "")
    if match is not None:
        return match
    raise FormatError("no action found: reply with one ```bash``` block, or a line "
                      "`Action: tool[argument]`")


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
