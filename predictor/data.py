"""Examples for the output-length and tool-duration predictors, and where they come from.

One example is one LLM request of an agent program: the text the predictor sees before the
model answers, how many tokens the answer had, and (when the answer called a tool) which tool,
with what argument, and how long the call took.

Why the text is not the whole prompt: a prompt grows to thousands of tokens, a small encoder
reads ~160, and the length of the next reply depends mostly on a few places in the prompt (the
system prompt says which kind of agent this is, the task says what is asked, the previous reply
says what the agent just did, and the last observation says what came back). `request_text`
keeps those places, each cut to a fixed number of characters, so training data and the live
harness build the text the same way and the data file stays small.

JSONL schema (one object per line; blank lines are skipped; unknown fields are errors, so a typo
does not silently drop a column):

======================  ================  ==================================================
field                   type              meaning
======================  ================  ==================================================
``text``                str, required     the request text (``request_text(messages)``)
``output_tokens``       int >= 1, req.    tokens of the reply, its end-of-turn token included
``tool``                str or null       the tool the reply called (the events' tool name:
                                          a bash command's class such as ``pytest``)
``call``                str or null       that call's argument (command, expression, query)
``tool_seconds``        float >= 0 / null wall seconds of that call (null: not measured)
``group``               str or null       program id: a program's requests stay on one side
                                          of the train / held-out split
``source``              str or null       where the example came from (free text)
======================  ================  ==================================================
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from common.actions import FormatError, parse_action
from common.atomic import write_text_atomic
from common.errors import UserError
from common.jsonl import json_lines
from common.tool_keys import event_tool, text_model_tool

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_DIR = ROOT / "server" / "tokenizer"
DATASETS = ROOT / "datasets"
#: The committed default data (built by datasets/predictor/build.py).
DEFAULT_DATA = DATASETS / "predictor" / "examples.jsonl"

#: Characters kept from each part of a request (see `request_text`): at most ~450 in all,
#: ~110 tokens of our tokenizer, within what the encoder reads (`text_models.MAX_LENGTH`).
#: Short on purpose: encoder time on CPU grows with the text, and the parts that decide the
#: next reply's length are near these ends.
SYSTEM_CHARS = 64
TASK_CHARS = 120
PREVIOUS_CHARS = 80
LAST_HEAD_CHARS = 80
LAST_TAIL_CHARS = 80
CALL_CHARS = 160

FIELDS = ("text", "output_tokens", "tool", "call", "tool_seconds", "group", "source")


class DataError(UserError):
    """Bad example data: the message names the file and line and says what to fix."""


@dataclass(frozen=True)
class Example:
    text: str
    output_tokens: int
    tool: str | None = None
    call: str | None = None
    tool_seconds: float | None = None
    group: str | None = None
    source: str | None = None

    @property
    def duration_text(self) -> str | None:
        """The text the duration model reads at `tool_start`, when the call is known."""
        if self.tool is None and self.call is None:
            return None
        return call_text(self.tool, self.call, self.text)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


# -- the text a predictor reads ------------------------------------------------------------


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    text = str(content or "")
    calls = message.get("tool_calls") or []
    for call in calls:  # a function-calling reply: its calls are what it said
        fn = call.get("function") or {}
        text += f"\n{fn.get('name', '')}({fn.get('arguments', '')})"
    return text


def _squeeze(text: str) -> str:
    return " ".join(text.split())


def _head(text: str, n: int) -> str:
    text = _squeeze(text)
    return text if len(text) <= n else text[:n] + "..."


def _tail(text: str, n: int) -> str:
    text = _squeeze(text)
    return text if len(text) <= n else "..." + text[-n:]


def _head_tail(text: str, head: int, tail: int) -> str:
    text = _squeeze(text)
    if len(text) <= head + tail:
        return text
    return text[:head] + " ... " + text[-tail:]


def request_text(messages: Sequence[dict[str, Any]]) -> str:
    """The predictor's view of a request whose prompt is `messages` (OpenAI chat format).

    Lines: the system prompt's start, the task (first user message) start, the turn number,
    the previous reply's end (its action) and the last message's start and end (the tool's
    output, whose head says what it is and whose tail holds summaries such as "3 failed").
    Whitespace runs become one space, so the same request always gives the same text.
    """
    system = next((_content(m) for m in messages if m.get("role") in ("system", "developer")),
                  "")
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    task_i = users[0] if users else None
    task = _content(messages[task_i]) if task_i is not None else ""
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    lines = [f"system: {_head(system, SYSTEM_CHARS)}", f"task: {_head(task, TASK_CHARS)}",
             f"turn {turn}"]
    previous = next((_content(m) for m in reversed(messages) if m.get("role") == "assistant"),
                    None)
    if previous is not None:
        lines.append(f"did: {_tail(previous, PREVIOUS_CHARS)}")
    if messages and (len(messages) - 1) != task_i and messages[-1].get("role") != "system":
        lines.append(f"got: {_head_tail(_content(messages[-1]), LAST_HEAD_CHARS, LAST_TAIL_CHARS)}")
    return "\n".join(lines)


def call_text(tool: str | None, call: str | None, request: str | None = None) -> str:
    """The duration model's view of a tool call, at `tool_start`: `call <tool> [<n> words]:
    <argument>` (the argument's head; its size is stated because a long argument, such as a
    text to read aloud, can take long), then the `system:` and `turn` lines of the request
    that made it.

    Why those two lines: the same call can take very different times in different agents or
    backends (a search on a local corpus vs. over an online API, named in the system prompt),
    and a program's first command pays for starting its sandbox (the turn number says so).
    """
    words = len((call or "").split())
    lines = [f"call {tool or 'tool'} [{words} words]: {_head(call or '', CALL_CHARS)}"]
    if request:
        lines += [line for line in request.splitlines()
                  if line.startswith("system: ") or line.startswith("turn ")]
    return "\n".join(lines)


# -- JSONL ---------------------------------------------------------------------------------


def parse_example(obj: Any, where: str) -> Example:
    """Validate one decoded JSON object; `where` (file:line) starts every error message."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise DataError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: "
                        f"{', '.join(FIELDS)}")
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        raise DataError(f"{where}: `text` must be a non-empty string")
    out = obj.get("output_tokens")
    if isinstance(out, float) and out.is_integer():
        out = int(out)
    if isinstance(out, bool) or not isinstance(out, int) or out < 1:
        raise DataError(f"{where}: `output_tokens` must be an integer >= 1, got {out!r}")
    for key in ("tool", "call", "group", "source"):
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            raise DataError(f"{where}: `{key}` must be a string or null, got {value!r}")
    seconds = obj.get("tool_seconds")
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                or not math.isfinite(seconds) or seconds < 0:
            raise DataError(f"{where}: `tool_seconds` must be a number >= 0 or null, "
                            f"got {seconds!r}")
        seconds = float(seconds)
    return Example(text=text, output_tokens=out, tool=obj.get("tool"), call=obj.get("call"),
                   tool_seconds=seconds, group=obj.get("group"), source=obj.get("source"))


def parse_examples(lines: Iterable[str], origin: str = "<examples>") -> list[Example]:
    examples = []
    for _, where, obj in json_lines(lines, origin, DataError):
        examples.append(parse_example(obj, where))
    if not examples:
        raise DataError(f"{origin}: no examples (the file is empty)")
    return examples


def load_examples(path: str | os.PathLike[str]) -> list[Example]:
    """Read a JSONL example file; a missing file or a bad line is a `DataError`."""
    p = Path(path)
    if not p.is_file():
        hint = (" (build the default with `.venv/bin/python datasets/predictor/build.py`)"
                if p.resolve() == DEFAULT_DATA.resolve() else "")
        raise DataError(f"{p}: no such file{hint}")
    try:
        with open(p, encoding="utf-8") as f:
            return parse_examples(f, str(p))
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 text ({exc.reason})") from None


def dumps_examples(examples: Iterable[Example]) -> str:
    return "".join(json.dumps(e.to_json(), ensure_ascii=False, separators=(",", ":")) + "\n"
                   for e in examples)


def save_examples(examples: Iterable[Example], path: str | os.PathLike[str]) -> Path:
    return write_text_atomic(path, dumps_examples(examples))


def file_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of a data file: a model remembers it to know which examples it trained on."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- the held-out split --------------------------------------------------------------------


def split(examples: Sequence[Example], seed: int, held_out: float = 0.2
          ) -> tuple[list[Example], list[Example]]:
    """(train, held-out): whole groups (programs) go to one side, chosen by a seeded shuffle.

    Splitting by program, not by request, matters: the turns of one program share their
    system prompt and task, so a request-level split would test on near-copies of training
    rows. Groups are shuffled with `random.Random(seed)` and taken into the held-out side until
    it holds `held_out` of the examples; the same seed and data always give the same split.
    """
    if not 0.0 < held_out < 1.0:
        raise ValueError(f"held_out must be in (0, 1), got {held_out}")
    order: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        order.setdefault(e.group if e.group is not None else f"#{i}", []).append(i)
    keys = sorted(order)
    random.Random(seed).shuffle(keys)
    target = held_out * len(examples)
    test_idx: set[int] = set()
    for key in keys:
        if len(test_idx) >= target:
            break
        test_idx.update(order[key])
    train = [e for i, e in enumerate(examples) if i not in test_idx]
    test = [e for i, e in enumerate(examples) if i in test_idx]
    if not train or not test:
        raise DataError(f"{len(examples)} example(s) in {len(order)} group(s) cannot be split "
                        "into a training and a held-out part; give more examples or groups")
    return train, test


# -- tokens --------------------------------------------------------------------------------

TokenCounter = Callable[[str], int]


@lru_cache(maxsize=1)
def load_tokenizer(path: str = str(TOKENIZER_DIR)) -> Any:
    """Our byte-level BPE tokenizer (server/tokenizer), loaded once, without the hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import PreTrainedTokenizerFast  # transformers: start-up cost

    tokenizer_file = Path(path) / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise DataError(f"no tokenizer at {tokenizer_file}; build it with "
                        "`.venv/bin/python datasets/tokenizer/build_tokenizer.py`")
    return PreTrainedTokenizerFast.from_pretrained(path)


def reply_tokens(text: str) -> int:
    """Tokens of a reply as the server counts them: the content plus its `<|eot_id|>`."""
    return len(load_tokenizer().encode(text, add_special_tokens=False)) + 1


# -- recorded trajectories -----------------------------------------------------------------


def _call_tool(action: str, argument: str) -> str:
    """The tool as the text model reads it (`text_model_tool`) of the duration key the harness
    sends in events for this action (`event_tool`): a bash command's class, or the action."""
    return text_model_tool(event_tool(action, argument))


def examples_from_messages(messages: Sequence[dict[str, Any]], *, benchmark: str,
                           group: str, source: str,
                           steps: Sequence[dict[str, Any]] | None = None,
                           count: TokenCounter = reply_tokens,
                           first: int = 0) -> list[Example]:
    """One example per assistant message: the request before it, the reply's length, the
    call it made. `steps` (harness trajectories) supply exact output tokens and measured tool
    seconds; without them tokens are counted with our tokenizer and seconds are unknown.
    `first`: the prompt's length in messages (its worked examples' replies are no turns)."""
    examples = []
    turn = 0
    for i, message in enumerate(messages):
        if message.get("role") != "assistant" or i < first:
            continue
        step = steps[turn] if steps is not None and turn < len(steps) else None
        reply = _content(message)
        tool = call = None
        seconds = None
        action = None
        try:
            action = parse_action(str(message.get("content") or ""), message.get("tool_calls"))
            tool, call = _call_tool(action.tool, action.argument), action.argument
        except FormatError:
            pass
        if step is not None:
            out = int(step.get("output_tokens") or 0) or count(reply)
            if step.get("tool") is not None:
                # a step keeps the argument's first 500 characters (`harness.agent`); the
                # reply's own call, when it is the same one, is the whole argument the agent
                # ran and predicted from (its word count is part of the call text)
                argument = step.get("argument") or ""
                if action is None or action.tool != step["tool"] \
                        or not action.argument.startswith(argument):
                    tool, call = _call_tool(step["tool"], argument), step.get("argument")
                seconds = round(float(step.get("tool_s") or 0.0), 4)
        else:
            out = count(reply)
        examples.append(Example(text=request_text(messages[:i]), output_tokens=max(1, out),
                                tool=tool, call=call, tool_seconds=seconds, group=group,
                                source=source))
        turn += 1
    return examples


def examples_from_trajectory(path: str | os.PathLike[str],
                             count: TokenCounter = reply_tokens) -> list[Example]:
    """Examples of one trajectory file: the recorded mini-swe-agent shape in datasets/*/
    trajectories* (messages only) or a harness run's file (messages plus timed `steps`)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{p}: cannot read the trajectory ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise DataError(f"{p}: not a trajectory (no `messages` list)")
    benchmark = str(data.get("benchmark") or p.parent.parent.name)
    info = data.get("info") or {}
    task = str(data.get("task_id") or info.get("task_id") or info.get("instance_id")
               or p.name.removesuffix(".traj.json"))
    kind = "run" if data.get("steps") else p.parent.name
    return examples_from_messages(data["messages"], benchmark=benchmark,
                                  group=f"{benchmark}/{kind}/{task}",
                                  source=f"recorded:{benchmark}", steps=data.get("steps"),
                                  count=count, first=int(info.get("prompt_messages") or 0))


def recorded_trajectory_files(root: str | os.PathLike[str] = DATASETS) -> list[Path]:
    """The committed recorded trajectories: datasets/<benchmark>/trajectories*/*.traj.json."""
    return sorted(Path(root).glob("*/trajectories*/*.traj.json"))


def examples_from_trace(path: str | os.PathLike[str], limit: int | None = None
                        ) -> list[Example]:
    """Examples from a benchmark trace (datasets/traces, common/trace.py format).

    A trace holds no text, only numbers, so the text is what a trace replay knows at request
    time: `benchmark <tag> | turn <i> | prompt <n> tokens | last tool <t>`. Useful to give the
    virtual-time benchmark the same kind of hint; the numbers in the trace are generated, so
    what a model learns from them is the generators' per-benchmark distribution.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file")
    examples = []
    with open(p, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if number == 1 or not line.strip():
                continue
            try:
                program = json.loads(line)
                turns = program["turns"]
                prompt = 0
                previous = None
                for i, turn in enumerate(turns):
                    prompt += int(turn["input_tokens"])
                    text = (f"benchmark {program.get('benchmark') or 'unknown'} | turn {i} | "
                            f"prompt {prompt} tokens | last tool {previous or 'none'}")
                    examples.append(Example(
                        text=text, output_tokens=max(1, int(turn["output_tokens"])),
                        tool=turn.get("tool"), call=None,
                        tool_seconds=(float(turn["tool_seconds"]) if turn.get("tool") else None),
                        group=f"trace/{p.stem}/{program['id']}", source=f"trace:{p.stem}"))
                    prompt += int(turn["output_tokens"]) + int(turn.get("tool_return_tokens", 0))
                    previous = turn.get("tool")
            except (KeyError, TypeError, ValueError) as exc:
                raise DataError(f"{p}:{number}: not a trace program ({exc})") from None
            if limit is not None and len(examples) >= limit:
                break
    return examples
