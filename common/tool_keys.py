"""Tool keys: the one name under which a tool call's duration is observed, predicted and sent.

Why a module of its own at the bottom: the key travels. The agent sends it as the `tool` of its
`tool_start` / `tool_end` events, the server's policies (`server.policies.continuum`) observe and
predict under exactly the string they receive, and the predictor (`predictor.data`) trains its
text models on examples keyed the same way. Each of those layers builds the key with the
functions here, so the three cannot drift apart.

A key is a plain tool name (`"calculator"`) or `"<tool>:<class>"` (`"bash:pytest"`, built by
`duration_key`, split by `split_key` at the first `:`). One string rather than a (tool,
command) pair so that it fits the event schema's `tool` field unchanged. `:` is a safe
separator: OpenAI function-call names (`^[a-zA-Z0-9_-]+$`) cannot contain it, nor do the
harness's tools (a name that did would only gain a level, its part before the first `:`),
while a class may (the split is at the first `:`). A bash command's class is its program's
name (`command_class`), so predictions go per class and fall back to all of bash.

The text model (`predictor.lengths.LengthPredictor.predict_call`) reads the tool under a name of
its own, `text_model_tool(key)`: training (`predictor.data`) and serving (`harness.agent`) both
derive it from the event key with that one function, so the model is asked about the text it
was trained on.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

#: What a mini-swe-agent-style coding agent prints to submit (`echo ...` ends its program).
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

#: Separates the tool from the command class in a duration key (`bash:pytest`).
COMMAND_SEP = ":"


def duration_key(tool: str, command: str | None = None) -> str:
    """The key for `tool` running `command` (a command class such as `pytest`): `tool:command`,
    or just `tool` when there is no class (None or empty)."""
    return f"{tool}{COMMAND_SEP}{command}" if command else tool


def split_key(key: str) -> tuple[str, str | None]:
    """(tool, command class or None) of a duration key; the inverse of `duration_key`.

    A key whose tool or class part would be empty (`":x"`, `"bash:"`) is a plain tool name, so
    every string names some level and nothing a client sends is refused here."""
    tool, sep, command = key.partition(COMMAND_SEP)
    if not sep or not tool or not command:
        return key, None
    return tool, command


_PREFIX = re.compile(r"^\s*(?:cd\s+\S+\s*(?:&&|;)\s*)+")
_ENV = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)+")


def command_class(command: str) -> str:
    """The tool class of a bash command: its program's name (`python3 -m pytest` -> pytest)."""
    text = _PREFIX.sub("", command.strip())
    text = _ENV.sub("", text)
    try:
        words = shlex.split(text.splitlines()[0] if text else "", comments=True)
    except ValueError:
        words = text.split()
    while words and words[0] in ("timeout", "time", "sudo", "env", "nice", "command"):
        words = words[1:]
        while words and (words[0].startswith("-") or words[0].replace(".", "").isdigit()
                         or "=" in words[0]):
            words = words[1:]
    if not words:
        return "bash"
    program = Path(words[0]).name
    if re.fullmatch(r"python[0-9.]*", program):
        if len(words) >= 3 and words[1] == "-m":
            return "pytest" if words[2] == "pytest" else words[2]
        return "python"
    if program in ("py.test",):
        return "pytest"
    if program == "echo" and SUBMIT in command:
        return "submit"
    return program or "bash"


def event_tool(action: str, argument: str) -> str:
    """The duration key of an action: `bash:<class>` for a bash command (`bash:pytest`), so
    predictions go per command class and fall back to all of bash; the action otherwise."""
    return duration_key(action, command_class(argument)) if action == "bash" else action


def text_model_tool(key: str) -> str:
    """The tool name the text model reads in a call's text (`call pytest [3 words]: ...`,
    `predictor.data.call_text`) for the duration key `key`: the key's most specific level, the
    command class of `bash:pytest` (`pytest`) and the tool of a plain key (`calculator`).

    Why not the key itself: the committed training data (datasets/predictor/examples.jsonl,
    whose figures the README quotes) names a bash command by its class alone, and a model must
    be asked about the text it was trained on; the class alone is also what tells two bash
    calls apart in that text."""
    tool, command = split_key(key)
    return command if command is not None else tool
