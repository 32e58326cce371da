"""mini-swe-agent trajectories (``*.traj.json``): a top-level ``messages`` list."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common.trace import Program, Turn
from eval.workloads.importers.shared import (
    Format,
    Framing,
    TokenCounter,
    info_of,
    instance_id,
    need,
    seconds,
    snake,
)

Message = dict[str, Any]


@dataclass(frozen=True)
class _Tools:
    """What a turn's tool is called and how long it ran when the trajectory does not say:
    the caller's defaults, the same for every turn of the program."""

    default_seconds: float
    name: str
    namer: Callable[[Message], str] | None

    def name_of(self, reply: Message) -> str:
        return self.namer(reply) if self.namer else self.name


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
    msgs, replies = _conversation(data)
    framing = Framing(count_tokens)
    turns, timed = _turns(msgs, replies, framing, _Tools(default_tool_seconds, tool_name,
                                                         tool_namer))
    info = info_of(data)
    return Program(
        id=instance_id(data, info, program_id, "mini-swe-agent"),
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


def _conversation(data: Any) -> tuple[list[Message], list[int]]:
    """The messages (``exit`` ones left out) and the indices of those that are turns: the
    ``assistant`` messages after the prompt."""
    need(isinstance(data, dict), "a mini-swe-agent trajectory is a JSON object")
    messages = data.get("messages")
    need(isinstance(messages, list), 'a mini-swe-agent trajectory needs a "messages" list')
    bad = next((i for i, m in enumerate(messages) if not isinstance(m, dict)), None)
    need(bad is None, f"messages[{bad}] is not a JSON object")
    msgs = [m for m in messages if m.get("role") != "exit"]
    # a harness trajectory says how many messages its prompt has: worked examples among
    # them are assistant messages that are no turn of the program
    first = int(info_of(data).get("prompt_messages") or 0)
    replies = [i for i, m in enumerate(msgs) if m.get("role") == "assistant" and i >= first]
    need(bool(replies), "the trajectory has no assistant message: nothing to replay")
    need(replies[0] > 0, "the trajectory starts with an assistant message: no prompt before it")
    return msgs, replies


def _turns(msgs: list[Message], replies: list[int], framing: Framing,
           tools: _Tools) -> tuple[list[Turn], int]:
    """One turn per reply, and how many of them had their tool seconds measured."""
    turns: list[Turn] = []
    timed = 0
    for k, start in enumerate(replies):
        inp = framing.first_prompt(msgs[:start]) if k == 0 else 0
        if k == len(replies) - 1:
            turns.append(Turn(input_tokens=inp, output_tokens=framing.reply(msgs[start])))
            break
        turn, measured = _tool_turn(msgs[start], msgs[start + 1 : replies[k + 1]], inp, framing,
                                    tools)
        turns.append(turn)
        timed += measured
    return turns, timed


def _tool_turn(reply: Message, returned: list[Message], inp: int, framing: Framing,
               tools: _Tools) -> tuple[Turn, bool]:
    """A turn that calls a tool: ``reply`` and what came back before the next reply;
    whether its tool seconds were measured."""
    measured = _tool_seconds(reply, returned)
    interrupt = _interruption(returned)
    tool = snake(str(interrupt)) if interrupt else tools.name_of(reply)
    if measured is not None:
        tool_seconds = measured
    else:
        tool_seconds = 0.0 if interrupt else tools.default_seconds
    turn = Turn(
        input_tokens=inp,
        output_tokens=framing.reply(reply),
        tool=tool or tools.name,
        tool_seconds=tool_seconds,
        tool_return_tokens=framing.returns(returned) if returned else framing.generation_prompt,
    )
    return turn, measured is not None


def _interruption(returned: Sequence[Message]) -> Any:
    """The first ``extra.interrupt_type`` among the returned messages (a FormatError note),
    or None."""
    return next(
        (
            m["extra"]["interrupt_type"]
            for m in returned
            if isinstance(m.get("extra"), dict) and m["extra"].get("interrupt_type")
        ),
        None,
    )


def _tool_seconds(reply: Message, returned: Sequence[Message]) -> float | None:
    """The latest observation's ``extra.timestamp`` minus the reply's; None if either lacks
    one."""
    extra = reply.get("extra")
    start = seconds(extra.get("timestamp")) if isinstance(extra, dict) else None
    if start is None:
        return None
    stamps = [
        seconds(m["extra"].get("timestamp")) for m in returned if isinstance(m.get("extra"), dict)
    ]
    stamps = [s for s in stamps if s is not None]
    if not stamps:
        return None
    return max(0.0, max(stamps) - start)


def _detect(data: dict[str, Any]) -> bool:
    return isinstance(data.get("messages"), list)


FORMAT = Format("mini-swe-agent", from_mini_swe_agent, _detect, '"messages" (mini-swe-agent)')
