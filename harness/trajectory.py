"""One trajectory file per program, rewritten after every step.

The file is the mini-swe-agent trajectory shape (a top-level `messages` list, which
`--model replay:DIR` replays) plus our per-step timings (`steps`), which the trace importer
(`eval.workloads.importers.from_harness_trajectory`) turns into a benchmark trace. Writes go to a
temporary file that is renamed over the old one, so an interrupted run never leaves half a file.

Token-exact steps: when the server returns token ids (vLLM's `return_token_ids`), each step
keeps the output ids it generated and its prompt ids, stored compactly: in full
(`prompt_token_ids`) on the first turn and wherever the prompt does not extend the previous
turn's prompt + output, else only the tokens added after it (`prompt_added_token_ids`).
`token_ids()` rebuilds every turn's full (prompt, output). A prompt that does not extend the
previous turn (a chat template that rewrites history, whitespace trimmed from a reply, a
re-tokenised boundary) is a broken prefix: `prefix: "broken"` and `prefix_break` give the first
token where it differs; such turns cannot reuse the previous turn's KV cache.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.atomic import write_json_atomic


@dataclass
class Step:
    llm_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    ttft_s: float | None = None
    tool: str | None = None
    argument: str | None = None
    tool_s: float = 0.0
    ok: bool = True
    return_tokens: int = 0
    prompt_token_ids: list[int] | None = None  # in full: turn 0, or a broken prefix
    prompt_added_token_ids: list[int] | None = None  # after the previous prompt + output
    output_token_ids: list[int] | None = None
    prefix: str | None = None  # "extends" | "broken" (None: first turn, or no token ids)
    prefix_break: dict[str, Any] | None = None  # {"at", "expected", "got"}: first difference
    finish_reason: str | None = None  # the server's: "stop", "length" (cut at max_tokens), ...
    started_s: float | None = None  # when the request was sent, seconds after program start
    format_error: str | None = None  # what was wrong with the reply, if it was unusable


@dataclass
class Trajectory:
    task_id: str
    program_id: str
    benchmark: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    status: str = "running"
    answer: str | None = None
    started_at: float = 0.0
    finished_at: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["info"] = {**self.info, "exit_status": self.status, "submission": self.answer}
        return data


def first_difference(context: list[int], prompt: list[int]) -> int | None:
    """The first index where `prompt` does not continue `context`; None when it extends it."""
    for i, token in enumerate(context):
        if i >= len(prompt) or prompt[i] != token:
            return i
    return None


def record_token_ids(step: Step, context: list[int] | None, prompt: list[int] | None,
                     output: list[int] | None) -> list[int] | None:
    """Store a turn's token ids in `step`, checking that its prompt extends `context` (the
    previous turn's prompt + output); returns this turn's prompt + output, the next context
    (None without token ids)."""
    if prompt is None or output is None:
        return None
    step.output_token_ids = output
    at = None if context is None else first_difference(context, prompt)
    if context is None:
        step.prompt_token_ids = prompt
    elif at is None:
        step.prefix = "extends"
        step.prompt_added_token_ids = prompt[len(context):]
    else:
        step.prefix = "broken"
        step.prompt_token_ids = prompt
        step.prefix_break = {"at": at, "expected": context[at:at + 8], "got": prompt[at:at + 8]}
    return prompt + output


def token_ids(data: dict[str, Any]) -> list[tuple[list[int], list[int]]]:
    """Every turn's full (prompt ids, output ids) from a trajectory file's JSON; raises
    ValueError when a turn has none."""
    turns: list[tuple[list[int], list[int]]] = []
    for number, step in enumerate(data["steps"]):
        output = step.get("output_token_ids")
        if output is None:
            raise ValueError(f"turn {number} has no token ids")
        if step.get("prompt_token_ids") is not None:
            prompt = list(step["prompt_token_ids"])
        elif step.get("prompt_added_token_ids") is not None and turns:
            prompt = turns[-1][0] + turns[-1][1] + list(step["prompt_added_token_ids"])
        else:
            raise ValueError(f"turn {number} has no prompt token ids")
        turns.append((prompt, list(output)))
    return turns


def trajectory_path(out_dir: Path, task_id: str) -> Path:
    return out_dir / f"{task_id}.traj.json"


def save(trajectory: Trajectory, out_dir: Path) -> Path:
    path = trajectory_path(out_dir, trajectory.task_id)
    write_json_atomic(path, trajectory.to_json())
    return path
