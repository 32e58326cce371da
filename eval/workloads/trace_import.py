"""Benchmark traces from recorded agent runs: mini-swe-agent, SWE-agent and our own harness.

Each importer turns one trajectory (already parsed JSON) into one :class:`common.trace.Program`
with the accounting of :mod:`common.trace`: turn ``i`` is the ``i``-th model call; what the model
wrote is its ``output_tokens``; what came back before the next call is its
``tool_return_tokens``; the last model call ends the program (whatever ran after it, e.g. the
``submit`` command, is dropped: no model call follows it).

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

Our own harness records the server's exact ``prompt_tokens`` / ``output_tokens``, so
:func:`from_harness_trajectory` needs no tokenizer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from common.trace import Program, Trace, TraceFormatError, Turn
from eval.workloads.arrivals import retime

TokenCounter = Callable[[str], int]

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "server" / "tokenizer"

#: ``<|start_header_id|>``, ``<|end_header_id|>``, the ``\n\n`` after it, ``<|eot_id|>``
_MESSAGE_SPECIALS = 4
#: ``<|start_header_id|>``, ``<|end_header_id|>``, ``\n\n`` around "assistant"
_GENERATION_SPECIALS = 3

__all__ = [
    "TOKENIZER_DIR",
    "detect_format",
    "from_harness_trajectory",
    "from_mini_swe_agent",
    "from_swe_agent",
    "import_file",
    "import_trajectory",
    "local_token_counter",
    "message_text",
    "trace_from_files",
]


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


class _Framing:
    """Token counts of messages as our chat template renders them (see module docstring)."""

    def __init__(self, count_tokens: TokenCounter | None) -> None:
        self.count = count_tokens or local_token_counter()
        self.generation_prompt = self.count("assistant") + _GENERATION_SPECIALS

    def message(self, msg: dict[str, Any]) -> int:
        return (
            self.count(str(msg.get("role", ""))) + self.count(message_text(msg)) + _MESSAGE_SPECIALS
        )

    def reply(self, msg: dict[str, Any]) -> int:
        return max(1, self.count(message_text(msg)) + 1)

    def reply_text(self, text: str) -> int:
        return max(1, self.count(text) + 1)

    def first_prompt(self, messages: Iterable[dict[str, Any]]) -> int:
        return 1 + sum(self.message(m) for m in messages) + self.generation_prompt

    def returns(self, messages: Iterable[dict[str, Any]]) -> int:
        return sum(self.message(m) for m in messages) + self.generation_prompt

    def returns_text(self, role: str, text: str) -> int:
        return self.message({"role": role, "content": text}) + self.generation_prompt


def message_text(msg: dict[str, Any]) -> str:
    """The text of a chat message: string content, the text parts of a list content, and any
    tool calls rendered as our template renders them."""
    content = msg.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        text = "\n".join(parts)
    else:
        text = str(content)
    for call in msg.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        args = fn.get("arguments", {})
        args_text = args if isinstance(args, str) else json.dumps(args)
        text += f'<tool_call>{{"name": {json.dumps(fn.get("name", ""))}, "arguments": {args_text}}}'
        text += "</tool_call>"
    return text


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise TraceFormatError(msg)


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return max(0.0, float(value))


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# --------------------------------------------------------------------------------------------
# mini-swe-agent
# --------------------------------------------------------------------------------------------


def from_mini_swe_agent(
    data: dict[str, Any],
    *,
    program_id: str | None = None,
    arrival_s: float = 0.0,
    count_tokens: TokenCounter | None = None,
    default_tool_seconds: float = 1.0,
    tool_name: str = "bash",
    tool_namer: Callable[[dict[str, Any]], str] | None = None,
    benchmark: str = "swe",
) -> Program:
    """A program from a mini-swe-agent trajectory (``*.traj.json``: a top-level ``messages``
    list of ``{"role", "content", "extra"?}``; formats ``mini-swe-agent-1`` and the older
    one without ``trajectory_format``).

    * The messages before the first ``assistant`` message (system prompt, task, any
      demonstrations) are the first prompt; where ``info.prompt_messages`` gives the prompt's
      length (our harness's trajectories), that many messages are. ``exit`` messages are ignored.
    * Each ``assistant`` message is a turn; the messages between it and the next assistant
      message (observations as ``user`` or ``tool`` messages, format-error notes) are its
      tool return.
    * Tool seconds: newer versions stamp ``extra.timestamp`` on the reply (when the model
      answered) and on each observation (when the command finished); the difference is used.
      Where either is missing, ``default_tool_seconds``.
    * Tool name: ``tool_namer(assistant_message)`` if given, else ``tool_name``; a return that
      is an interruption (``extra.interrupt_type``, e.g. a FormatError note) is named after it
      (``format_error``).
    """
    _need(isinstance(data, dict), "a mini-swe-agent trajectory is a JSON object")
    messages = data.get("messages")
    _need(isinstance(messages, list), 'a mini-swe-agent trajectory needs a "messages" list')
    bad = next((i for i, m in enumerate(messages) if not isinstance(m, dict)), None)
    _need(bad is None, f"messages[{bad}] is not a JSON object")
    msgs = [m for m in messages if m.get("role") != "exit"]
    # a harness trajectory says how many messages its prompt has: worked examples among
    # them are assistant messages that are no turn of the program
    first = int((data.get("info") or {}).get("prompt_messages") or 0)
    replies = [i for i, m in enumerate(msgs) if m.get("role") == "assistant" and i >= first]
    _need(bool(replies), "the trajectory has no assistant message: nothing to replay")
    _need(replies[0] > 0, "the trajectory starts with an assistant message: no prompt before it")
    framing = _Framing(count_tokens)
    turns: list[Turn] = []
    timed = 0
    for k, start in enumerate(replies):
        reply = msgs[start]
        last = k == len(replies) - 1
        inp = framing.first_prompt(msgs[:start]) if k == 0 else 0
        if last:
            turns.append(Turn(input_tokens=inp, output_tokens=framing.reply(reply)))
            break
        returned = msgs[start + 1 : replies[k + 1]]
        seconds = _mini_tool_seconds(reply, returned)
        timed += seconds is not None
        interrupt = next(
            (
                m["extra"]["interrupt_type"]
                for m in returned
                if isinstance(m.get("extra"), dict) and m["extra"].get("interrupt_type")
            ),
            None,
        )
        if interrupt:
            tool = _snake(str(interrupt))
        else:
            tool = tool_namer(reply) if tool_namer else tool_name
        turns.append(
            Turn(
                input_tokens=inp,
                output_tokens=framing.reply(reply),
                tool=tool or tool_name,
                tool_seconds=seconds
                if seconds is not None
                else (0.0 if interrupt else default_tool_seconds),
                tool_return_tokens=framing.returns(returned)
                if returned
                else framing.generation_prompt,
            )
        )
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    pid = program_id or data.get("instance_id") or info.get("instance_id") or "mini-swe-agent"
    return Program(
        id=str(pid),
        arrival_s=arrival_s,
        turns=turns,
        benchmark=benchmark,
        source="import:mini-swe-agent",
        meta={
            "trajectory_format": data.get("trajectory_format", "mini-swe-agent-0"),
            "exit_status": info.get("exit_status"),
            "tool_seconds_measured": timed,
        },
    )


def _mini_tool_seconds(reply: dict[str, Any], returned: Sequence[dict[str, Any]]) -> float | None:
    extra = reply.get("extra")
    start = _seconds(extra.get("timestamp")) if isinstance(extra, dict) else None
    if start is None:
        return None
    stamps = [
        _seconds(m["extra"].get("timestamp")) for m in returned if isinstance(m.get("extra"), dict)
    ]
    stamps = [s for s in stamps if s is not None]
    if not stamps:
        return None
    return max(0.0, max(stamps) - start)


# --------------------------------------------------------------------------------------------
# SWE-agent
# --------------------------------------------------------------------------------------------


def _first_word(action: str) -> str:
    words = action.strip().split()
    return words[0] if words else "none"


def from_swe_agent(
    data: dict[str, Any],
    *,
    program_id: str | None = None,
    arrival_s: float = 0.0,
    count_tokens: TokenCounter | None = None,
    default_tool_seconds: float = 1.0,
    tool_namer: Callable[[dict[str, Any]], str] | None = None,
    benchmark: str = "swe",
) -> Program:
    """A program from a SWE-agent ``.traj`` file.

    The file (SWE-agent 1.x) holds ``trajectory``: one entry per step with ``action``,
    ``observation``, ``response`` (the model's whole reply), ``thought``, ``execution_time``
    (seconds the action ran), ``query`` (the messages sent for that step), ``state`` and
    ``extra_info``; ``history``: the chat messages (``role``, ``content``, ``message_type``,
    demonstrations included); and ``info``. A retry-agent file with only ``attempts`` uses
    the best attempt (``info.best_attempt_idx``) or the first.

    * First prompt: the ``history`` messages before the first ``assistant`` one (system
      prompt, demonstrations, instance); without history, the first step's ``query``.
    * Turn ``i`` = step ``i``: output = ``response`` (or ``thought`` + ``action``), tool =
      ``tool_namer(step)`` or the action's first word (``str_replace_editor``, ``python``,
      ``find_file``, ...), tool seconds = ``execution_time`` (else ``default_tool_seconds``),
      tool return = the observation as a ``user`` message. The last step (usually
      ``submit``) ends the program.
    """
    _need(isinstance(data, dict), "a SWE-agent trajectory is a JSON object")
    if "trajectory" not in data and isinstance(data.get("attempts"), list) and data["attempts"]:
        info = data.get("info") if isinstance(data.get("info"), dict) else {}
        best = info.get("best_attempt_idx", 0)
        best = best if isinstance(best, int) and 0 <= best < len(data["attempts"]) else 0
        return from_swe_agent(
            {**data["attempts"][best], "info": data["attempts"][best].get("info", info)},
            program_id=program_id,
            arrival_s=arrival_s,
            count_tokens=count_tokens,
            default_tool_seconds=default_tool_seconds,
            tool_namer=tool_namer,
            benchmark=benchmark,
        )
    steps = data.get("trajectory")
    _need(
        isinstance(steps, list) and bool(steps),
        'a SWE-agent .traj needs a non-empty "trajectory" list of steps',
    )
    _need(all(isinstance(s, dict) for s in steps), "every trajectory step must be a JSON object")
    framing = _Framing(count_tokens)

    history = data.get("history")
    initial: list[dict[str, Any]] | None = None
    if isinstance(history, list) and history:
        initial = []
        for item in history:
            if not isinstance(item, dict):
                continue
            if item.get("role") == "assistant":
                break
            initial.append(item)
    if not initial:
        query = steps[0].get("query")
        if isinstance(query, list) and query and all(isinstance(m, dict) for m in query):
            initial = query
    _need(
        bool(initial),
        "cannot size the first prompt: no history before the first "
        "assistant message and no query in the first step",
    )
    assert initial is not None

    turns: list[Turn] = []
    timed = 0
    for i, step in enumerate(steps):
        response = step.get("response")
        if not isinstance(response, str) or not response:
            response = "\n".join(
                str(step.get(k) or "") for k in ("thought", "action") if step.get(k)
            )
        inp = framing.first_prompt(initial) if i == 0 else 0
        out = framing.reply_text(response)
        if i == len(steps) - 1:
            turns.append(Turn(input_tokens=inp, output_tokens=out))
            break
        seconds = _seconds(step.get("execution_time"))
        timed += seconds is not None
        tool = tool_namer(step) if tool_namer else _first_word(str(step.get("action") or ""))
        turns.append(
            Turn(
                input_tokens=inp,
                output_tokens=out,
                tool=tool or "none",
                tool_seconds=seconds if seconds is not None else default_tool_seconds,
                tool_return_tokens=framing.returns_text("user", str(step.get("observation") or "")),
            )
        )
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    pid = program_id or data.get("instance_id") or info.get("instance_id") or "swe-agent"
    return Program(
        id=str(pid),
        arrival_s=arrival_s,
        turns=turns,
        benchmark=benchmark,
        source="import:swe-agent",
        meta={"exit_status": info.get("exit_status"), "tool_seconds_measured": timed},
    )


# --------------------------------------------------------------------------------------------
# our harness
# --------------------------------------------------------------------------------------------


def from_harness_trajectory(
    data: dict[str, Any],
    *,
    program_id: str | None = None,
    arrival_s: float = 0.0,
) -> Program:
    """A program from a trajectory written by our harness (``harness/trajectory.py``).

    Shape (extra keys are ignored)::

        {
          "task_id": "gsm8k-17", "program_id": "p-3", "benchmark": "gsm8k",   # optional
          "messages": [{"role": ..., "content": ...}, ...],   # optional here (replay text)
          "steps": [                                          # required: one per model call
            {"llm_s": 0.42,            # seconds the model call took (kept in meta)
             "prompt_tokens": 812,     # the server's prompt length for this call (exact)
             "output_tokens": 64,      # tokens the model generated
             "tool": "calculator",     # tool called after this call; null/absent: none
             "tool_s": 0.003,          # seconds the tool ran
             "return_tokens": 12,      # optional: tokens the tool result added (0 = unknown)
             "cached_tokens": 800, "argument": "...", "ok": true},   # optional, unused
            ...
          ],
          "status": "submitted", "started_at": 1732200000.0          # optional
        }

    The counts come from the server, so no tokenizer is needed. The growth between calls,
    ``gap_i = prompt_tokens[i+1] - (prompt_tokens[i] + output_tokens[i])``, is split into the
    tool return of turn ``i`` (``return_tokens`` when given and > 0, at most ``gap_i``; else
    all of it) and the input of turn ``i+1`` (the rest). A negative gap (the harness trimmed
    the history) is clamped to 0 and counted in ``meta["negative_gaps"]``. A step with no tool
    that is not the last becomes a turn whose tool is ``"none"`` (0 s unless ``tool_s``).
    """
    _need(isinstance(data, dict), "a harness trajectory is a JSON object")
    steps = data.get("steps")
    _need(
        isinstance(steps, list) and bool(steps),
        'a harness trajectory needs a non-empty "steps" list (one entry per model call)',
    )
    for i, step in enumerate(steps):
        _need(isinstance(step, dict), f"steps[{i}] must be a JSON object")
        for key in ("prompt_tokens", "output_tokens"):
            value = step.get(key)
            _need(
                isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                f"steps[{i}].{key} must be a non-negative integer, got {value!r}",
            )
        _need(step["prompt_tokens"] >= 1, f"steps[{i}].prompt_tokens must be >= 1")
    turns: list[Turn] = []
    next_input = steps[0]["prompt_tokens"]
    negative = 0
    for i, step in enumerate(steps):
        out = max(1, step["output_tokens"])
        if i == len(steps) - 1:
            turns.append(Turn(input_tokens=next_input, output_tokens=out))
            break
        gap = steps[i + 1]["prompt_tokens"] - (step["prompt_tokens"] + step["output_tokens"])
        if gap < 0:
            negative += 1
            gap = 0
        given = step.get("return_tokens")
        ret = min(given, gap) if isinstance(given, int) and given > 0 else gap
        tool = step.get("tool")
        seconds = _seconds(step.get("tool_s"))
        turns.append(
            Turn(
                input_tokens=next_input,
                output_tokens=out,
                tool=str(tool) if tool else "none",
                tool_seconds=seconds or 0.0,
                tool_return_tokens=ret,
            )
        )
        next_input = gap - ret
    pid = program_id or data.get("program_id") or data.get("task_id") or "harness"
    return Program(
        id=str(pid),
        arrival_s=arrival_s,
        turns=turns,
        benchmark=str(data.get("benchmark") or ""),
        source="import:harness",
        meta={
            "task_id": data.get("task_id"),
            "status": data.get("status"),
            "llm_s": [_seconds(s.get("llm_s")) for s in steps],
            "negative_gaps": negative,
        },
    )


# --------------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------------

_IMPORTERS: dict[str, Callable[..., Program]] = {
    "harness": from_harness_trajectory,
    "swe-agent": from_swe_agent,
    "mini-swe-agent": from_mini_swe_agent,
}


def detect_format(data: Any) -> str:
    """``harness`` (has ``steps``), ``swe-agent`` (``trajectory`` / ``attempts``) or
    ``mini-swe-agent`` (``messages``)."""
    if isinstance(data, dict):
        if isinstance(data.get("steps"), list):
            return "harness"
        if isinstance(data.get("trajectory"), list) or isinstance(data.get("attempts"), list):
            return "swe-agent"
        if isinstance(data.get("messages"), list):
            return "mini-swe-agent"
    raise TraceFormatError(
        'unknown trajectory format: expected a JSON object with "steps" (harness), '
        '"trajectory" (SWE-agent) or "messages" (mini-swe-agent)'
    )


def import_trajectory(data: Any, fmt: str = "auto", **kwargs: Any) -> Program:
    """Dispatch to the importer for ``fmt`` (or the detected format)."""
    name = detect_format(data) if fmt == "auto" else fmt
    if name not in _IMPORTERS:
        raise ValueError(f"unknown format {fmt!r}; choose auto or one of {sorted(_IMPORTERS)}")
    if name == "harness":
        kwargs = {k: v for k, v in kwargs.items() if k in ("program_id", "arrival_s")}
    return _IMPORTERS[name](data, **kwargs)


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".traj.json", ".traj", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def import_file(path: str | Path, fmt: str = "auto", **kwargs: Any) -> Program:
    """One trajectory file; the program id defaults to the file name without its suffix.
    Errors name the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: not a JSON trajectory ({exc})") from None
    kwargs.setdefault("program_id", _stem(path))
    try:
        return import_trajectory(data, fmt, **kwargs)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None
    except ValueError as exc:  # pydantic validation of the built program
        raise TraceFormatError(f"{path}: the trajectory gives an invalid program: {exc}") from None


def trace_from_files(
    paths: Iterable[str | Path],
    *,
    name: str,
    fmt: str = "auto",
    jps: float | None = None,
    seed: int = 0,
    description: str = "",
    **kwargs: Any,
) -> Trace:
    """A trace of recorded trajectories. Arrivals: a Poisson process at ``jps`` when given
    (in the order of ``paths``); else harness trajectories arrive at their ``started_at``
    relative to the earliest, and others all at 0."""
    files = [Path(p) for p in paths]
    if not files:
        raise ValueError("no trajectory files given")
    programs = [import_file(p, fmt, **kwargs) for p in files]
    if jps is None:
        starts = []
        for p in files:
            try:
                started = json.loads(p.read_text(encoding="utf-8")).get("started_at")
            except (AttributeError, json.JSONDecodeError):
                started = None
            starts.append(_seconds(started))
        if all(s is not None for s in starts):
            t0 = min(s for s in starts if s is not None)
            programs = [
                p.model_copy(update={"arrival_s": round((s or 0.0) - t0, 6)})
                for p, s in zip(programs, starts, strict=True)
            ]
    trace = Trace(
        name=name,
        description=description or f"{len(programs)} recorded trajectories",
        params={"imported": [str(p) for p in files], "fmt": fmt},
        programs=programs,
    )
    return retime(trace, jps, seed) if jps is not None else trace
