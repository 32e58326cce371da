"""Load: many agent programs at once against one `harness serve`, with real tools.

    harness eval load --programs 200 --out runs/load

runs N programs concurrently (default 200), split over the benchmarks of `--mix` (default all
four: gsm8k's calculator, hotpotqa's Wikipedia through a local MediaWiki stub server in its
own process, ALFWorld's TextWorld games, swe-bench's bash in one Docker container per program
plus a grading container), with the replay model: the emulated server says each task's
recorded turns, so every request, event and tool call is real and the programs finish with
their recorded verdicts. A benchmark with fewer tasks than programs runs its tasks again, each
copy in its own folder (`OUT/<benchmark>/c<k>/`, laid out as `harness run`'s `OUT`). It
prints, and writes to `OUT/load.json`: programs by status, errors, programs passed, events
sent / dropped (and received by the server), containers of the run left on the engine
afterwards, peak memory (RSS) of this harness process (the server and the stub are other
processes), and wall time. Target: no error, nothing left behind, no event dropped.

Exit status: 0 when that target is met, 1 otherwise, 2 for bad options.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.atomic import write_json_atomic
from common.processes import free_port
from eval import ExperimentError
from harness.agent import Agent, Limits
from harness.benchmarks import (
    BENCHMARKS,
    Benchmark,
    BenchmarkError,
    RunContext,
    Task,
    get_benchmark,
)
from harness.events_client import EventClient
from harness.model_client import ChatClient, api_root
from harness.run import (
    EMULATED_MODEL,
    ModelSpec,
    load_replays,
    run_task,
    server_events_received,
)
from harness.server_process import ServerProcess
from harness.task_result import TaskResult
from harness.tools.labels import RUN_LABEL
from predictor.durations import ToolDurationModel
from predictor.gaps import GapModel

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MIX = "gsm8k,hotpotqa,alfworld,swe-bench"
# statuses a replayed program ends with when nothing went wrong
CLEAN = {"submitted", "step_limit", "replay_exhausted", "format_error"}


class LoadError(ExperimentError):
    """Bad options; printed without a traceback."""


@dataclass(frozen=True)
class LoadOptions:
    """One load run (`harness eval load`: each field is an option, its help the metadata's)."""

    programs: int = field(default=200, metadata={"help": "programs in all"})
    mix: str = field(default=DEFAULT_MIX, metadata={
        "help": "benchmarks and weights, e.g. gsm8k,swe-bench=2 (equal shares unless given)"})
    concurrency: int | None = field(default=None, metadata={
        "help": "programs at once (default: all of them)"})
    policy: str = field(default="continuum", metadata={"help": "the started server's policy"})
    profile: str | None = field(default=None, metadata={
        "help": "emulated GPU-MODEL for the server"})
    server: str | None = field(default=None, metadata={
        "help": "a running harness serve (emulated)"})
    out: str | None = field(default=None, metadata={
        "help": "output folder (default runs/load-TIME)"})

    def __post_init__(self) -> None:
        if self.programs < 1:
            raise LoadError("--programs must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise LoadError("--concurrency must be at least 1")
        parse_mix(self.mix)


def parse_mix(text: str) -> dict[str, float]:
    """`gsm8k,swe-bench=2` -> {name: weight}; a name alone weighs 1."""
    mix: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, weight = part.partition("=")
        if name not in BENCHMARKS:
            raise LoadError(f"--mix: unknown benchmark {name!r}; choose from "
                            f"{', '.join(sorted(BENCHMARKS))}")
        try:
            mix[name] = float(weight) if weight else 1.0
        except ValueError:
            raise LoadError(f"--mix: {part!r}: the weight must be a number") from None
        if mix[name] <= 0:
            raise LoadError(f"--mix: {part!r}: the weight must be positive")
    if not mix:
        raise LoadError("--mix names no benchmark")
    return mix


def split(programs: int, mix: dict[str, float]) -> dict[str, int]:
    """Programs per benchmark in proportion to the weights (largest remainders)."""
    total = sum(mix.values())
    exact = {name: programs * w / total for name, w in mix.items()}
    counts = {name: int(x) for name, x in exact.items()}
    for name in sorted(exact, key=lambda n: exact[n] - counts[n], reverse=True):
        if sum(counts.values()) >= programs:
            break
        counts[name] += 1
    return counts


class WikiStub:
    """The MediaWiki stub in a process of its own (its memory is not the harness's)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[str] | None = None

    def __enter__(self) -> str:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "harness.tools.mediawiki_stub", "--port", str(self.port)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "serving" not in line:
            self.process.kill()
            raise LoadError(f"the MediaWiki stub did not start: {line.strip()}")
        return line.rsplit(" at ", 1)[1].strip()

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)


def plan(counts: dict[str, int], out: Path, run_id: str) -> list[tuple[Benchmark, Task, Any,
                                                                        RunContext, str]]:
    """(benchmark copy, task, replay, the copy's run: its out folder, program-id prefix)
    per program."""
    jobs = []
    for name, count in counts.items():
        if count == 0:
            continue
        try:
            tasks = get_benchmark(name).load_tasks()
        except BenchmarkError as exc:
            raise LoadError(str(exc)) from None
        replays = load_replays(get_benchmark(name), tasks, ModelSpec("replay", ""))
        copies: dict[int, Benchmark] = {}
        for i in range(count):
            k, task = divmod(i, len(tasks))[0], tasks[i % len(tasks)]
            if k not in copies:  # a fresh benchmark per copy, with its tasks loaded
                bench = copies[k] = get_benchmark(name)
                bench.load_tasks()
            jobs.append((copies[k], task, replays[task.id],
                         RunContext(out_dir=out / name / f"c{k}", run_id=run_id),
                         f"{run_id}-{name}-c{k}"))
    return jobs


async def run_load(jobs: list[tuple[Benchmark, Task, Any, RunContext, str]], base_url: str,
                   concurrency: int, log: Any) -> dict[str, Any]:
    client = ChatClient(base_url, EMULATED_MODEL, token_ids=True)
    semaphore = asyncio.Semaphore(concurrency)
    durations, gaps = ToolDurationModel(), GapModel()  # learnt by all the agents together
    results: list[TaskResult] = []
    crashes: list[str] = []
    async with EventClient(base_url) as events:
        agents = {run.out_dir: Agent(client, events, durations, run.out_dir / "trajectories",
                                     Limits(), gaps=gaps)
                  for _, _, _, run, _ in jobs if run.out_dir is not None}

        async def one(bench: Benchmark, task: Task, replay: Any, run: RunContext,
                      prefix: str) -> None:
            async with semaphore:
                try:
                    results.append(await run_task(bench, task, agents[run.out_dir], replay,
                                                  run, prefix))
                except Exception as exc:  # noqa: BLE001 - counted as an error, the rest go on
                    crashes.append(f"{prefix}-{task.id}: {type(exc).__name__}: {exc}")

        async def progress() -> None:
            started = time.monotonic()
            while True:
                await asyncio.sleep(15)
                log(f"  {time.monotonic() - started:5.0f} s: {len(results)} of {len(jobs)} "
                    f"programs done, {events.sent} events sent")

        ticker = asyncio.create_task(progress())
        try:
            await asyncio.gather(*(one(*job) for job in jobs))
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
    await client.aclose()
    return {"results": results, "crashes": crashes, "sent": events.sent,
            "dropped": events.dropped}


def containers_left(run_id: str) -> int | None:
    """Containers labelled with this run still on the engine (None: no engine answers)."""
    # the docker SDK: start-up cost; only a mix with swe-bench programs needs it
    from harness.tools.docker_client import shared_client
    from harness.tools.sandbox_image import SandboxImageError

    try:
        client = shared_client()
        return len(client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}))
    except (SandboxImageError, Exception):  # noqa: BLE001 - reported as unknown
        return None


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_load_bench(options: LoadOptions) -> int:
    """The whole benchmark; the exit status (0: target met, 1: not). `concurrency` None: all
    programs at once; `server` None: start a `harness serve --policy POLICY [--profile ...]`;
    `out` None: `runs/load-TIME`. Bad options raise `LoadError` (when `options` is made); a
    server that does not start, `ServerStartError`."""
    programs, server, policy, profile = (options.programs, options.server, options.policy,
                                         options.profile)
    concurrency = options.concurrency or programs
    counts = split(programs, parse_mix(options.mix))
    out = Path(options.out or f"runs/load-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        raise LoadError(f"{out} is not empty: choose another --out")
    run_id = f"load{int(time.time())}"
    jobs = plan(counts, out, run_id)

    def log(message: str) -> None:
        print(message, flush=True)

    log(f"load: {len(jobs)} programs ({', '.join(f'{n} {b}' for b, n in counts.items())}), "
        f"{concurrency} at once, run {run_id}, out {out}")
    wiki: str | None = None
    with contextlib.ExitStack() as stack:
        if counts.get("hotpotqa"):
            wiki = os.environ["HARNESS_WIKI"] = stack.enter_context(WikiStub())
        if server:
            base_url = api_root(server)
        else:
            log(f"starting harness serve --policy {policy} ...")
            base_url = stack.enter_context(ServerProcess(policy=policy,
                                                         profile=profile)).base_url
        started = time.monotonic()
        done = asyncio.run(run_load(jobs, base_url, concurrency, log))
        wall_s = time.monotonic() - started
        received = server_events_received(base_url)
    results = done["results"]
    statuses = Counter(r.status for r in results)
    errors = [f"{r.program_id}: {r.status}: {r.error or ''}" for r in results
              if r.status not in CLEAN] + done["crashes"]
    left = containers_left(run_id) if counts.get("swe-bench") else 0
    figures = {
        "programs": len(jobs), "by_benchmark": counts, "concurrency": concurrency,
        "statuses": dict(statuses), "errors": len(errors), "error_examples": errors[:10],
        "passed": sum(r.passed for r in results),
        "events_sent": done["sent"], "events_dropped": done["dropped"],
        "events_received_by_server": received, "containers_left": left, "wikipedia": wiki,
        "peak_rss_mib": round(peak_rss_mib(), 1), "wall_s": round(wall_s, 1),
        "programs_per_s": round(len(results) / wall_s, 2) if wall_s else None,
    }
    write_json_atomic(out / "load.json", figures)
    for key in ("programs", "statuses", "errors", "passed", "events_sent", "events_dropped",
                "events_received_by_server", "containers_left", "peak_rss_mib", "wall_s",
                "programs_per_s"):
        log(f"{key:>26}: {figures[key]}")
    for line in errors[:10]:
        log(f"  error: {line}")
    log(f"figures: {out / 'load.json'}")
    ok = not errors and left == 0 and done["dropped"] == 0 and len(results) == len(jobs)
    return 0 if ok else 1
