"""What each engine step ran and how long it took: the measured side of the step-time model.

Why: the emulator prices a step by its batch (prefill chunks with their context, decode
contexts; `server.perf.step_form.step_features`). To check that model against a real engine, or
to tell a slow step from time the engine loop spends outside steps (taking requests in,
sending outputs out, waiting), each executed step is recorded with the same batch description
the emulated executor prices, timed from the start of `schedule()` to the end of
`update_from_output()` (vLLM's `EngineCore.step` is those two around the forward pass).
Seconds are wall-clock seconds: under the virtual clock they time the simulation itself, while
`t` and `waited` are on the engine's clock either way.

`PolicyScheduler` records when given a sink (`CpuEngine` in-process, `harness profile --device
cpu`) or when `HARNESS_STEP_LOG` names a file (`harness serve --step-log FILE`): one JSON line
per step, ``{"t": wall start, "seconds": ..., "gap": seconds since the previous step ended,
"busy": whether requests were left then, "prefill": [[chunk, context before], ...],
"decode": [context, ...], "waited": [seconds from arrival, per request first scheduled],
"waiting": requests queued, "schedule_s" and "update_s": seconds inside schedule() and
update_from_output(), "pins": the scheduler's pin counters so far}``.
A gap after a busy step is the engine loop's own time outside steps (requests in, outputs
out); after an idle one it includes waiting. No vLLM import here.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ENV_STEP_LOG = "HARNESS_STEP_LOG"


@dataclass
class StepRecord:
    """One engine step as executed: wall seconds of the whole step (schedule, forward pass,
    sampling, output processing) and the batch it ran, as the emulator's features see it.
    `gap` is the time since the previous step ended, `busy` whether the engine still had
    requests then (the gap is then engine-loop work, else it includes idling); `t` the start
    on the engine's clock."""

    seconds: float
    prefill: list[tuple[int, int]]  # (new tokens, tokens already in context) per prefill chunk
    decode: list[int]  # context length per decoding sequence, the decoded token included
    gap: float = 0.0
    busy: bool = False
    t: float = 0.0
    #: for each request this step schedules for the first time: seconds from its arrival
    #: (vLLM stamps it when the API server takes the request in) to this step's start
    waited: list[float] = field(default_factory=list)
    #: requests waiting to be admitted when the step was scheduled, and the seconds
    #: `schedule()` took (part of `seconds`): the scheduler's own work grows with the queue
    waiting: int = 0
    schedule_s: float = 0.0
    #: seconds `update_from_output()` took (part of `seconds`); the rest is the forward pass
    update_s: float = 0.0
    #: the scheduler's pin counters so far (`PinStats`: pinned, released by reason), so a run
    #: shows when KV was released under pressure and had to be rebuilt
    pins: dict[str, int] = field(default_factory=dict)


def batch_shape(num_scheduled: Mapping[str, int], requests: Mapping[str, Any]
                ) -> tuple[list[tuple[int, int]], list[int]]:
    """The batch of a schedule, after vLLM advanced `num_computed_tokens` by it: a request
    scheduled one token that reaches the end of what it knows, with outputs already, decodes
    (at its context, that token included); anything else is a prefill chunk (n, before),
    a recomputation after preemption included. The emulated executor classifies alike."""
    prefill: list[tuple[int, int]] = []
    decode: list[int] = []
    for req_id, n in num_scheduled.items():
        request = requests.get(req_id)
        if request is None:
            continue
        before = request.num_computed_tokens - n
        if n == 1 and request.num_output_tokens > 0 and before + 1 == request.num_tokens:
            decode.append(before + 1)
        else:
            prefill.append((n, before))
    return prefill, decode


class StepTimer:
    """Pairs each `schedule()` that ran something with its `update_from_output()` (in order:
    with vLLM's batch queue a second schedule may come before the first update) and hands
    the finished records to a sink. Schedules of nothing are not steps: neither end counts
    them, so an empty scheduling pass with no update (`CpuEngine.step` when idle) is safe."""

    def __init__(self, sink: Callable[[StepRecord], None]) -> None:
        self.sink = sink
        self._open: deque[tuple[float, StepRecord]] = deque()
        self._last_end: float | None = None
        self._busy = False

    def scheduled(self, started: float, wall: float, num_scheduled: Mapping[str, int],
                  requests: Mapping[str, Any], new_ids: Iterable[str] = (),
                  waiting: int = 0, pins: Mapping[str, int] | None = None) -> None:
        if num_scheduled:
            prefill, decode = batch_shape(num_scheduled, requests)
            waited = [round(wall - requests[r].arrival_time, 6) for r in new_ids if r in requests]
            self._open.append((started, StepRecord(
                0.0, prefill, decode, t=wall, waited=waited, waiting=waiting,
                schedule_s=time.perf_counter() - started, pins=dict(pins or {}))))

    def updated(self, scheduled_tokens: int, requests_left: int,
                update_started: float | None = None) -> None:
        if not scheduled_tokens or not self._open:
            return
        started, record = self._open.popleft()
        end = time.perf_counter()
        if update_started is not None:
            record.update_s = end - update_started
        record.seconds = end - started
        record.gap = max(started - self._last_end, 0.0) if self._last_end is not None else 0.0
        record.busy = self._busy
        self._last_end, self._busy = end, requests_left > 0
        self.sink(record)


class JsonlStepSink:
    """Appends records to a file, one JSON object per line, flushed as written (a served
    engine is stopped by a signal; nothing before it is lost)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", buffering=1)

    def __call__(self, record: StepRecord) -> None:
        self._file.write(json.dumps(asdict(record), separators=(",", ":")) + "\n")


def sink_from_env() -> JsonlStepSink | None:
    path = os.environ.get(ENV_STEP_LOG)
    return JsonlStepSink(path) if path else None


def record_from(line: str) -> StepRecord:
    """A record from its JSON line (fields a log from an older version lacks take defaults)."""
    d = json.loads(line)
    d["prefill"] = [tuple(p) for p in d["prefill"]]
    return StepRecord(**d)


def read_step_log(path: str | Path) -> list[StepRecord]:
    return [record_from(line) for line in Path(path).read_text().splitlines() if line.strip()]


class StepLogTail:
    """Follows a step log another process appends to: each `new()` returns the records
    written since the previous call, reading only those bytes (a line still being written
    waits for the next call)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0

    def new(self) -> list[StepRecord]:
        if not self.path.is_file():
            return []
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return [record_from(line) for line in complete.decode().splitlines() if line.strip()]


def relative_errors(predict: Callable[[list[tuple[int, int]], list[int]], float],
                    steps: Iterable[StepRecord]) -> list[float]:
    """|predicted - measured| / measured per step, sorted."""
    return sorted(abs(predict(s.prefill, s.decode) - s.seconds) / s.seconds for s in steps
                  if s.seconds > 0)
