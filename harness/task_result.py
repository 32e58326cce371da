"""One task's result in `harness run`: what `OUT/results/<task>.json` holds.

One type for every way a program ends (finished and scored, stopped by the infrastructure, a
task that could not be set up), so the summary reads fields rather than strings and a result
written by one run is read back by `--resume` with the same names. The benchmark's own fields
(`reference`, `f1`, `grader`, ...) ride along in `score` and are written beside the others,
as the files always held them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class TaskResult:
    task_id: str
    program_id: str
    status: str
    passed: bool = False
    jct_s: float = 0.0
    steps: int = 0
    llm_s: float = 0.0
    tool_s: float = 0.0
    output_tokens: int = 0
    format_errors: int = 0  # turns whose reply could not be used
    cut_at_max_tokens: int = 0  # turns cut at the reply's token cap
    #: a model server or Docker failure stopped it: not scored, `--resume` runs it again
    retryable: bool = False
    error: str | None = None
    resolved: bool | None = None  # the SWE-bench grader's verdict (None: not graded so)
    token_id_turns: int | None = None  # turns with token ids (None: none asked for)
    prefix_broken_turns: int | None = None  # of those, turns whose prompt broke the prefix
    #: the benchmark's further fields from its `score` (written at the top level)
    score: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def interrupted(cls, task_id: str, program_id: str, status: str, error: str,
                    started_at: float, steps: int = 0) -> TaskResult:
        """A program the infrastructure stopped: not scored, run again on resume."""
        return cls(task_id, program_id, status, error=error, retryable=True,
                   jct_s=time.time() - started_at, steps=steps)

    def to_json(self) -> dict[str, Any]:
        """The file's content: every field but those unset (None, `retryable` False)."""
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "score":
                data.update(value)
            elif value is not None and not (f.name == "retryable" and not value):
                data[f.name] = value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskResult:
        """A result file, also one written before a field existed (it takes its default)."""
        names = {f.name for f in fields(cls)} - {"score"}
        known = {k: v for k, v in data.items() if k in names}
        known.setdefault("program_id", "")
        return cls(**known, score={k: v for k, v in data.items() if k not in names})
