"""One trajectory file per program, rewritten after every step.

The file is the mini-swe-agent trajectory shape (a top-level `messages` list, which
`--model replay:DIR` replays) plus our per-step timings (`steps`), which the trace importer
(`eval.trace_import.from_harness_trajectory`) turns into a benchmark trace. Writes go to a
temporary file that is renamed over the old one, so an interrupted run never leaves half a file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.atomic import write_json_atomic


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


def trajectory_path(out_dir: Path, task_id: str) -> Path:
    return out_dir / f"{task_id}.traj.json"


def save(trajectory: Trajectory, out_dir: Path) -> Path:
    path = trajectory_path(out_dir, trajectory.task_id)
    write_json_atomic(path, trajectory.to_json())
    return path
