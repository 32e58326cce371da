"""Our own harness's trajectories (``harness/trajectory.py``): the server's exact token counts,
so no tokenizer is needed."""

from __future__ import annotations

from typing import Any

from common.trace import Program, Turn
from eval.workloads.importers.shared import Format, need, seconds

Step = dict[str, Any]


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
    steps = _checked_steps(data)
    turns, negative = _turns(steps)
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
            "llm_s": [seconds(s.get("llm_s")) for s in steps],
            "negative_gaps": negative,
        },
    )


def _checked_steps(data: Any) -> list[Step]:
    """The ``steps``, each checked to carry the server's prompt and output counts."""
    need(isinstance(data, dict), "a harness trajectory is a JSON object")
    steps = data.get("steps")
    need(
        isinstance(steps, list) and bool(steps),
        'a harness trajectory needs a non-empty "steps" list (one entry per model call)',
    )
    for i, step in enumerate(steps):
        need(isinstance(step, dict), f"steps[{i}] must be a JSON object")
        for key in ("prompt_tokens", "output_tokens"):
            value = step.get(key)
            need(
                isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                f"steps[{i}].{key} must be a non-negative integer, got {value!r}",
            )
        need(step["prompt_tokens"] >= 1, f"steps[{i}].prompt_tokens must be >= 1")
    return steps


def _turns(steps: list[Step]) -> tuple[list[Turn], int]:
    """One turn per step (see `from_harness_trajectory` for how the gaps are split), and how
    many gaps were negative."""
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
        turns.append(
            Turn(
                input_tokens=next_input,
                output_tokens=out,
                tool=str(tool) if tool else "none",
                tool_seconds=seconds(step.get("tool_s")) or 0.0,
                tool_return_tokens=ret,
            )
        )
        next_input = gap - ret
    return turns, negative


def _detect(data: dict[str, Any]) -> bool:
    return isinstance(data.get("steps"), list)


FORMAT = Format("harness", from_harness_trajectory, _detect, '"steps" (harness)',
                options=("program_id", "arrival_s"))
