"""SWE-agent trajectories (``.traj``): ``trajectory`` steps, or a retry agent's ``attempts``."""

from __future__ import annotations

from collections.abc import Callable
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
)

Step = dict[str, Any]


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
    need(isinstance(data, dict), "a SWE-agent trajectory is a JSON object")
    attempt = _best_attempt(data)
    if attempt is not None:
        return from_swe_agent(
            attempt,
            program_id=program_id,
            arrival_s=arrival_s,
            count_tokens=count_tokens,
            default_tool_seconds=default_tool_seconds,
            tool_namer=tool_namer,
            benchmark=benchmark,
        )
    steps = data.get("trajectory")
    need(
        isinstance(steps, list) and bool(steps),
        'a SWE-agent .traj needs a non-empty "trajectory" list of steps',
    )
    need(all(isinstance(s, dict) for s in steps), "every trajectory step must be a JSON object")
    framing = Framing(count_tokens)
    initial = _first_prompt(data, steps)
    turns, timed = _turns(steps, initial, framing, default_tool_seconds, tool_namer)
    info = info_of(data)
    return Program(
        id=instance_id(data, info, program_id, "swe-agent"),
        arrival_s=arrival_s,
        turns=turns,
        benchmark=benchmark,
        source="import:swe-agent",
        meta={"exit_status": info.get("exit_status"), "tool_seconds_measured": timed},
    )


def _best_attempt(data: dict[str, Any]) -> dict[str, Any] | None:
    """A retry agent's best attempt (``info.best_attempt_idx``, else the first), with the
    file's ``info`` where the attempt has none; None for a file with a ``trajectory``."""
    if "trajectory" in data or not isinstance(data.get("attempts"), list) or not data["attempts"]:
        return None
    info = info_of(data)
    best = info.get("best_attempt_idx", 0)
    best = best if isinstance(best, int) and 0 <= best < len(data["attempts"]) else 0
    return {**data["attempts"][best], "info": data["attempts"][best].get("info", info)}


def _first_prompt(data: dict[str, Any], steps: list[Step]) -> list[dict[str, Any]]:
    """The messages of the first prompt: the history before the first assistant message,
    else the first step's query."""
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
    need(
        bool(initial),
        "cannot size the first prompt: no history before the first "
        "assistant message and no query in the first step",
    )
    assert initial is not None
    return initial


def _turns(steps: list[Step], initial: list[dict[str, Any]], framing: Framing,
           default_tool_seconds: float,
           tool_namer: Callable[[Step], str] | None) -> tuple[list[Turn], int]:
    """One turn per step, and how many of them had their tool seconds recorded."""
    turns: list[Turn] = []
    timed = 0
    for i, step in enumerate(steps):
        inp = framing.first_prompt(initial) if i == 0 else 0
        out = framing.reply_text(_response(step))
        if i == len(steps) - 1:
            turns.append(Turn(input_tokens=inp, output_tokens=out))
            break
        measured = seconds(step.get("execution_time"))
        timed += measured is not None
        tool = tool_namer(step) if tool_namer else _first_word(str(step.get("action") or ""))
        turns.append(
            Turn(
                input_tokens=inp,
                output_tokens=out,
                tool=tool or "none",
                tool_seconds=measured if measured is not None else default_tool_seconds,
                tool_return_tokens=framing.returns_text("user", str(step.get("observation") or "")),
            )
        )
    return turns, timed


def _response(step: Step) -> str:
    """The model's reply of a step: ``response``, else its ``thought`` and ``action``."""
    response = step.get("response")
    if not isinstance(response, str) or not response:
        response = "\n".join(str(step.get(k) or "") for k in ("thought", "action") if step.get(k))
    return response


def _first_word(action: str) -> str:
    words = action.strip().split()
    return words[0] if words else "none"


def _detect(data: dict[str, Any]) -> bool:
    return isinstance(data.get("trajectory"), list) or isinstance(data.get("attempts"), list)


FORMAT = Format("swe-agent", from_swe_agent, _detect, '"trajectory" (SWE-agent)')
