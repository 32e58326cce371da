"""Step times of the CPU engine as it is served: `harness profile --device cpu --served`.

Why: the in-process drive (`server.profilers.cpu`) times steps of an engine that does nothing
else. Served, the same engine also streams every running request's tokens out, takes requests
in, and shares the machine's two cores with the API server and the client; its steps measured
36% (median) slower than that table on a compute-bound replay, and the emulator priced with it
finished programs in half the real time (docs/emulated-gpu-checks.md). This drive sends the same
shape families (`server.profilers.cpu.grid`) as HTTP requests, shaped like the replay client's
(streamed, server-default sampling), to `harness serve --device cpu --step-log FILE`, and fits
the table to the steps the served engine logged: every step it ran is a row, timed the same
way (`server.step_log`).

Shapes over HTTP are looser than in-process (requests of one batch arrive a few milliseconds
apart), so the rows are what the engine really ran, not what was asked; the fit uses them all.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from harness.model_client import asse_lines
from harness.server_process import ServerProcess
from server.cpu.engine import DEFAULT_CPU_MODEL, model_folder
from server.profilers.cpu import Shape, grid, of_shape, quick_grid, table_from_steps
from server.step_log import StepLogTail, StepRecord

#: the in-process drive's token budget (vLLM's CPU default), passed explicitly
MAX_NUM_BATCHED_TOKENS = 2048
MIXED_CONTEXT = 1024


class HttpDriver:
    """Puts batches of a wanted shape through a served engine, as streamed completions."""

    def __init__(self, client: httpx.AsyncClient, url: str, model: str, seed: int = 0,
                 mixed_context: int = MIXED_CONTEXT) -> None:
        self.client = client
        self.url = url.rstrip("/") + "/v1/completions"
        self.model = model
        self.mixed_context = mixed_context
        self.rng = random.Random(seed)
        #: (sent, first token in hand) wall times of requests sent to an idle engine
        self.lone: list[tuple[float, float]] = []

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(8, 30000) for _ in range(n)]

    async def complete(self, prompt: list[int], max_tokens: int,
                       started: asyncio.Event | None = None, lone: bool = False) -> None:
        """One streamed completion; `started` is set when its first token arrives. `lone`:
        nothing else runs, so its send and first-token times are kept (`self.lone`)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "ignore_eos": True, "return_token_ids": True, "stream": True}
        sent, first = time.time(), None
        async with self.client.stream("POST", self.url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                raise RuntimeError(f"the server answered {response.status_code}: {text[:300]}")
            async for line in asse_lines(response.aiter_text()):
                if line.startswith("data: {"):
                    first = first or time.time()
                    if started is not None:
                        started.set()
        if started is not None:
            started.set()
        if lone and first is not None:
            self.lone.append((sent, first))

    async def decode(self, batch: int, ctx: int, steps: int) -> None:
        await asyncio.gather(*(self.complete(self.tokens(ctx), steps + 1)
                               for _ in range(batch)))

    async def prefill(self, chunk: int, cached: int, repeats: int) -> None:
        for _ in range(repeats):
            history = self.tokens(cached)
            if cached:
                await self.complete(history, 1)
            await self.complete(history + self.tokens(chunk), 1, lone=True)

    async def mixed(self, chunk: int, decodes: int, repeats: int) -> None:
        # decoders outlive the prompts of the others and every chunk (each chunk request
        # takes a few steps and an HTTP round trip, during which the decoders keep going)
        prefill_steps = -(-decodes * self.mixed_context // MAX_NUM_BATCHED_TOKENS) + decodes
        started = [asyncio.Event() for _ in range(decodes)]
        decoders = [asyncio.create_task(self.complete(self.tokens(self.mixed_context),
                                                      prefill_steps + 8 * repeats + 16, e))
                    for e in started]
        await asyncio.gather(*(e.wait() for e in started))
        for _ in range(repeats):
            await self.complete(self.tokens(chunk), 1)
        await asyncio.gather(*decoders)

    async def run(self, shape: Shape, repeats: int) -> None:
        kind, a, b = shape
        if kind == "decode":
            await self.decode(a, b, steps=repeats)
        elif kind == "prefill":
            await self.prefill(a, b, repeats)
        else:
            await self.mixed(a, b, repeats)


def served_path(lone: Sequence[tuple[float, float]], steps: Sequence[StepRecord]
                ) -> dict[str, float] | None:
    """The served path's own latency, from requests sent to an idle engine (one prompt of at
    most the token budget, one token): intake is from the client's send to the start of the
    request's step (HTTP, the API server, the engine's input queue), delivery from the end of
    that step to the client having the token. Medians; None without such requests."""
    starts = sorted((s.t, s.t + s.seconds) for s in steps if s.waited)
    intake, delivery = [], []
    for sent, first in lone:
        step = next(((t, end) for t, end in starts if t >= sent), None)
        if step is not None and step[1] <= first:
            intake.append(step[0] - sent)
            delivery.append(first - step[1])
    if not intake:
        return None
    return {"intake_s": statistics.median(intake), "delivery_s": statistics.median(delivery),
            "requests": len(intake)}


async def drive(url: str, model: str, step_log: Path, shapes: Sequence[Shape], repeats: int,
                log: Any = None, lone: list[tuple[float, float]] | None = None
                ) -> list[StepRecord]:
    """Every shape after a warm-up; the steps the server logged from then on. `lone`, if
    given, receives the (sent, first token) times of the requests sent to an idle engine. `log`
    defaults to the stderr of the moment of the call, not of import."""
    tail = StepLogTail(step_log)
    steps: list[StepRecord] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        driver = HttpDriver(client, url, model)
        await driver.run(("prefill", 64, 0), 2)  # warm-up: first steps are slow (allocations)
        await driver.run(("decode", 2, 64), 4)
        driver.lone.clear()
        tail.new()  # the warm-up's steps
        for i, shape in enumerate(shapes):
            await driver.run(shape, repeats)
            new = tail.new()  # a shape's last step is logged before its last token is sent
            steps += new
            own = [s for s in new if of_shape(s, shape)]
            ms = statistics.median(s.seconds for s in own) * 1e3 if own else float("nan")
            print(f"[{i + 1}/{len(shapes)}] {shape[0]} {shape[1]}x{shape[2]}: {len(new)} steps, "
                  f"{len(own)} of the shape, median {ms:.2f} ms", file=log or sys.stderr,
                  flush=True)
    if lone is not None:
        lone.extend(driver.lone)
    return steps


def measure_served(model: str = DEFAULT_CPU_MODEL, quick: bool = False, repeats: int = 6,
                   torch_compile: bool = False) -> dict[str, Any]:
    """The profile table of `harness serve --device cpu --model MODEL` driven over HTTP: every
    shape of the grid (`quick`: a few small ones) `repeats` times; `torch_compile`: compile
    the model as `harness serve --device cpu` does (default eager)."""
    folder = model_folder(model)
    shapes = quick_grid() if quick else None
    with tempfile.TemporaryDirectory() as tmp:
        step_log = Path(tmp) / "steps.jsonl"
        vllm_args = ["--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS)]
        if not torch_compile:
            vllm_args.append("--enforce-eager")
        started = time.time()
        with ServerProcess(policy="vllm", serve_args=[
                "--device", "cpu", "--model", str(folder), "--step-log", str(step_log)],
                vllm_args=vllm_args, startup_timeout_s=600) as server:
            startup = time.time() - started
            server.yield_cores_to_engine()
            if shapes is None:
                limit = json.loads(httpx.get(server.base_url + "/v1/models", timeout=30)
                                   .text)["data"][0]["max_model_len"]
                shapes = grid(MAX_NUM_BATCHED_TOKENS, int(limit))
            lone: list[tuple[float, float]] = []
            steps = asyncio.run(drive(server.base_url, folder.name, step_log, shapes, repeats,
                                      lone=lone))
            elapsed = time.time() - started - startup
    return table_from_steps(folder, steps, enforce_eager=not torch_compile, path="served",
                            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                            served_path=served_path(lone, steps),
                            startup_s=round(startup, 1), elapsed_s=round(elapsed, 1))
