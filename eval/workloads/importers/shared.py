"""What every importer shares: token counts of recorded text, the message text they are counted
from, the checks that turn bad data into a `TraceFormatError`, and `Format`, the entry each
format module gives the registry (`eval.workloads.importers.formats`).

Token counts
------------
Recorded text is counted with a ``count_tokens(text) -> int`` callable; by default the project's
own tokenizer (``server/tokenizer``, loaded with ``transformers.AutoTokenizer``), the one the
emulated model serves with, so a replay's prompt lengths match what the server will see. Chat
framing follows our Llama-3-style template (``datasets/tokenizer/chat_template.jinja``): one
``<|begin_of_text|>``; per message ``<|start_header_id|>role<|end_header_id|>\\n\\n ...
<|eot_id|>`` = ``count(role) + count(content) + 4``; the generation prompt
``<|start_header_id|>assistant<|end_header_id|>\\n\\n`` = ``count("assistant") + 3``, counted in
the prompt of every call (in turn 0's input and in each tool return); a reply is
``count(content) + 1`` (its ``<|eot_id|>``). Tool calls in a reply count as our template renders
them (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from common.trace import Program, TraceFormatError

TokenCounter = Callable[[str], int]

TOKENIZER_DIR = Path(__file__).resolve().parents[3] / "server" / "tokenizer"

#: ``<|start_header_id|>``, ``<|end_header_id|>``, the ``\n\n`` after it, ``<|eot_id|>``
_MESSAGE_SPECIALS = 4
#: ``<|start_header_id|>``, ``<|end_header_id|>``, ``\n\n`` around "assistant"
_GENERATION_SPECIALS = 3


@dataclass(frozen=True)
class Format:
    """One trajectory format, as the registry knows it: a new format is a module that defines
    one of these, named in `eval.workloads.importers.formats.FORMATS`.

    ``detect(data)`` says whether a JSON object is of this format (the registry asks each
    format in turn, so a format whose keys another's data also has comes after it);
    ``expects`` names what it looks for, in the error that lists every format; ``options``
    are the keyword options ``importer`` takes of `import_trajectory`'s, None for all of them
    (an importer that needs no tokenizer takes only the program id and arrival). A format
    whose one file holds several programs (a session and its sub-agents) gives them all with
    ``programs`` (same options); ``importer`` gives its main one."""

    name: str
    importer: Callable[..., Program]
    detect: Callable[[dict[str, Any]], bool]
    expects: str
    options: tuple[str, ...] | None = None
    programs: Callable[..., list[Program]] | None = None


@lru_cache(maxsize=1)
def local_token_counter() -> TokenCounter:
    """``count_tokens`` with the project's tokenizer (``server/tokenizer``), loaded once."""
    try:  # transformers: start-up cost; only counting tokens of imported text needs it
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - transformers is a dependency
        raise RuntimeError(
            "counting tokens needs `transformers`; install the project's dependencies or pass "
            "count_tokens=..."
        ) from exc
    if not (TOKENIZER_DIR / "tokenizer.json").exists():
        raise RuntimeError(
            f"no tokenizer at {TOKENIZER_DIR}; build it with "
            "`.venv/bin/python datasets/tokenizer/build_tokenizer.py` or pass count_tokens=..."
        )
    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0

    return count


class Framing:
    """Token counts of messages as our chat template renders them (see module docstring)."""

    def __init__(self, count_tokens: TokenCounter | None) -> None:
        self.count = count_tokens or local_token_counter()
        self.generation_prompt = self.count("assistant") + _GENERATION_SPECIALS

    def message(self, msg: dict[str, Any]) -> int:
        return (
            self.count(str(msg.get("role", ""))) + self.count(message_text(msg)) + _MESSAGE_SPECIALS
        )

    def reply(self, msg: dict[str, Any]) -> int:
        return self.reply_text(message_text(msg))

    def reply_text(self, text: str) -> int:
        return max(1, self.count(text) + 1)

    def first_prompt(self, messages: Iterable[dict[str, Any]]) -> int:
        return 1 + self.returns(messages)  # <|begin_of_text|>

    def returns(self, messages: Iterable[dict[str, Any]]) -> int:
        return sum(self.message(m) for m in messages) + self.generation_prompt

    def returns_text(self, role: str, text: str) -> int:
        return self.message({"role": role, "content": text}) + self.generation_prompt


def message_text(msg: dict[str, Any]) -> str:
    """The text of a chat message: string content, the text parts of a list content, and any
    tool calls rendered as our template renders them."""
    text = _content_text(msg.get("content"))
    for call in msg.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        args = fn.get("arguments", {})
        args_text = args if isinstance(args, str) else json.dumps(args)
        text += f'<tool_call>{{"name": {json.dumps(fn.get("name", ""))}, "arguments": {args_text}}}'
        text += "</tool_call>"
    return text


def _content_text(content: Any) -> str:
    """A message's ``content``: a string, or the text parts of a list, one a line."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return str(content)


def need(cond: bool, msg: str) -> None:
    """Raise `TraceFormatError` with ``msg`` unless ``cond``: the data is not of the format."""
    if not cond:
        raise TraceFormatError(msg)


def seconds(value: Any) -> float | None:
    """A recorded number of seconds (negative ones as 0); None for anything not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return max(0.0, float(value))


def snake(name: str) -> str:
    """``FormatError`` -> ``format_error``: a recorded class name as a tool name."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def info_of(data: dict[str, Any]) -> dict[str, Any]:
    """The trajectory's ``info`` object ({} when absent or not an object)."""
    return data.get("info") if isinstance(data.get("info"), dict) else {}


def instance_id(data: dict[str, Any], info: dict[str, Any], given: str | None,
                fallback: str) -> str:
    """The program id: ``given``, else the recorded instance id (top level, then ``info``),
    else ``fallback`` (the format's name)."""
    return str(given or data.get("instance_id") or info.get("instance_id") or fallback)
