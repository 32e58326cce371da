"""`harness run BENCH`: many agent programs at once against a co-located server, scored.

Starts `harness serve` (emulated GPU unless `--model PATH` on a GPU) unless `--server` is given,
runs every task as an agent program with live progress, scores it as its benchmark does, and
writes `OUT/summary.json` beside the trajectories. Each finished program's result is written
the moment it finishes (`OUT/results/<task>.json`), so an interrupted run loses nothing that
finished, and `--resume` skips those tasks.

Faults. When the model server dies (or keeps failing) every running program ends as
`model_error` with a message saying what happened, programs not yet started are not started,
and the run exits with status 1; when the Docker engine fails under a program (it restarts,
the program's container is removed or stopped) that program ends as `sandbox_error`. Such a
result is marked `retryable`, is neither scored nor graded, and `--resume` runs its task again
(against a fresh server), so no task is run or graded twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from common.atomic import write_json_atomic
from common.errors import UserError
from common.metrics import summarize
from harness.agent import Agent, Limits, Replay
from harness.benchmarks import Benchmark, RunContext, Task, TaskSetupError, get_benchmark
from harness.events_client import EventClient
from harness.model_client import ChatClient, Retries, api_key_of, api_root, auth_headers
from harness.sandbox_prune import leftover_warning, sweep_run
from harness.server_process import CPU_STARTUP_TIMEOUT_S, ServerProcess
from harness.task_result import TaskResult
from harness.tools.base import SandboxError
from harness.tools.docker_client import shared_client
from harness.tools.sandbox_image import SandboxImageError
from harness.trajectory import Trajectory
from predictor.durations import ToolDurationModel
from server.launch import DEVICES
from server.models.store import servable_model

EMULATED_MODEL = "llama-3.1-8b"
#: the progress line: programs finished (of all) and how many of them passed
PROGRESS_TEXT = "done {task.completed:.0f}/{task.total:.0f} · passed {task.fields[passed]}"


class RunError(UserError):
    """Bad `harness run` input; printed without a traceback."""


@dataclass(frozen=True)
class RunSpec:
    """What one `harness run` does: the benchmark and the options of the command line, so the
    run can be started from Python without argparse (`harness compare` runs one per policy)."""

    benchmark: str
    policy: str = "continuum"
    #: replay:DIR, a served model NAME (with `server`) or a model PATH (see `ModelSpec`)
    model: str | None = None
    server: str | None = None  # URL of a running server; None: start a co-located one
    profile: str | None = None  # emulated GPU-MODEL of the co-located server
    limit: int | None = None  # only the first N tasks
    concurrency: int = 16
    tasks: str | None = None  # a task file instead of the shipped one
    out: str | None = None  # default runs/BENCH-POLICY-TIMESTAMP
    resume: bool = False
    max_steps: int = 30
    predictor: str | None = None  # a `harness predictor train` model directory
    token_ids: bool = True  # ask the server for token ids (`return_token_ids`)
    #: the co-located server's device (`harness serve --device`): None as `harness serve`
    #: (the emulated GPU, or a CUDA GPU for a model PATH); "cpu": the real CPU engine, whose
    #: `model` is resolved by `server.models.store` (a known name is added on first use)
    device: str | None = None
    max_tokens: int = Limits.max_tokens  # each reply's output cap
    temperature: float = Limits.temperature
    model_retries: int = Limits.model_retries
    #: worked examples before the task (False: zero-shot); None: for a real model, not when
    #: replaying recordings (they were made without them, so their prompts stay as recorded)
    exemplars: bool | None = None
    tool_calls: bool = False  # send the actions as OpenAI `tools` (needs a tool parser)
    #: also send the hints as the canonical `vllm_xargs.agentic_context` (for vllm-router)
    agentic_context: bool = False
    #: the key of a `server` started with `--api-key`; None: $HARNESS_API_KEY, else
    #: $OPENAI_API_KEY (`harness.model_client.api_key_of`), else none
    api_key: str | None = None


@dataclass
class ModelSpec:
    kind: str  # "replay" | "name" | "path"
    value: str

    @classmethod
    def parse(cls, text: str | None) -> ModelSpec:
        if not text:
            return cls("replay", "")
        if text.startswith("replay:"):
            return cls("replay", text[len("replay:"):])
        if Path(text).exists():
            return cls("path", text)
        return cls("name", text)


def load_replay(directory: Path, task_id: str) -> Replay:
    path = directory / f"{task_id}.traj.json"
    if not path.is_file():
        raise RunError(f"no recorded trajectory for task {task_id} in {directory} "
                       f"(expected {path.name})")
    try:
        data = json.loads(path.read_text())
        messages = data["messages"]
        # the prompt's own messages (worked examples' replies among them) are not replies
        first = int((data.get("info") or {}).get("prompt_messages") or 0)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RunError(f"{path} is not a trajectory with a 'messages' list: {exc}") from None
    return Replay([m.get("content") or "" for m in messages[first:]
                   if m.get("role") == "assistant"])


def result_path(out: Path, task_id: str) -> Path:
    return out / "results" / f"{task_id}.json"


def is_finished(out: Path, task_id: str) -> bool:
    """Whether the task has a final result: one that is not `retryable` (a model server or
    Docker engine failure), which `--resume` runs again."""
    path = result_path(out, task_id)
    if not path.is_file():
        return False
    try:
        return not json.loads(path.read_text()).get("retryable")
    except (json.JSONDecodeError, AttributeError):
        return False  # a torn or foreign file: run the task again


def record(out: Path, result: TaskResult) -> TaskResult:
    """Write a task's result the moment it is known (so an interrupted run keeps it)."""
    write_json_atomic(result_path(out, result.task_id), result.to_json())
    return result


def load_results(out: Path, tasks: list[Task]) -> list[TaskResult]:
    """The results the tasks have in `out` (this run's and, resumed, earlier ones)."""
    return [TaskResult.from_json(json.loads(path.read_text()))
            for path in (result_path(out, t.id) for t in tasks) if path.is_file()]


def scored(task_id: str, program_id: str, trajectory: Trajectory,
           score: dict[str, Any]) -> TaskResult:
    """A finished program's result: its trajectory's figures and the benchmark's verdict."""
    steps = trajectory.steps
    extra = dict(score)
    result = TaskResult(
        task_id, program_id, trajectory.status, passed=bool(extra.pop("passed")),
        jct_s=(trajectory.finished_at or time.time()) - trajectory.started_at,
        steps=len(steps), llm_s=sum(s.llm_s for s in steps),
        tool_s=sum(s.tool_s for s in steps),
        output_tokens=sum(s.output_tokens for s in steps),
        format_errors=sum(s.format_error is not None for s in steps),
        cut_at_max_tokens=sum(s.finish_reason == "length" for s in steps),
        resolved=extra.pop("resolved", None), score=extra)
    if "error" in trajectory.info:  # e.g. the server's words for a context_limit
        result.error = str(trajectory.info["error"])
    if "token_id_turns" in trajectory.info:
        result.token_id_turns = trajectory.info["token_id_turns"]
        result.prefix_broken_turns = trajectory.info["prefix_broken_turns"]
    return result


async def run_task(bench: Benchmark, task: Task, agent: Agent, replay: Replay | None,
                   run: RunContext, program_prefix: str | None = None,
                   diagnose: Callable[[], str | None] | None = None) -> TaskResult:
    """Run, score and record (in `run.out_dir`) one task. Its program is
    `PREFIX-TASK` (`program_prefix`, by default the run's id). `diagnose` says what became of
    the model server (a co-located one that died), added to a `model_error`'s message."""
    assert run.out_dir is not None, "a task's result is written to the run's folder"
    out = run.out_dir
    program_id = f"{program_prefix or run.run_id}-{task.id}"
    started_at = time.time()
    try:
        toolbox = await bench.toolbox(task, program_id, run)
    except TaskSetupError as exc:  # this task cannot run (say its repository is missing)
        return record(out, TaskResult(task.id, program_id, "setup_error", error=str(exc)))
    except SandboxError as exc:  # the engine failed before the program began
        return record(out, TaskResult.interrupted(task.id, program_id, "sandbox_error",
                                                  f"the Docker sandbox failed: {exc}",
                                                  started_at))
    try:
        trajectory = await agent.run(task.id, program_id, bench.name, bench.messages(task),
                                     toolbox, replay, bench.action_format)
    finally:
        await toolbox.aclose()
    steps = len(trajectory.steps)
    if trajectory.info.get("retryable"):  # the server or the engine failed: not a verdict
        error = str(trajectory.info.get("error"))
        if trajectory.status == "model_error":
            error = f"the model server stopped answering mid-run: {error}"
            found = diagnose() if diagnose is not None else None
            if found:
                error += f"; {found}"
        else:
            error = f"the Docker sandbox failed mid-run: {error}"
        return record(out, TaskResult.interrupted(task.id, program_id, trajectory.status,
                                                  error, trajectory.started_at, steps))
    try:
        score = bench.score(task, trajectory, run)
        if inspect.isawaitable(score):  # e.g. grading in a container
            score = await score
    except SandboxError as exc:  # the engine failed under the grader
        return record(out, TaskResult.interrupted(
            task.id, program_id, "sandbox_error",
            f"the Docker sandbox failed while grading: {exc}", trajectory.started_at, steps))
    return record(out, scored(task.id, program_id, trajectory, score))


def load_replays(bench: Benchmark, tasks: list[Task], spec: ModelSpec) -> dict[str, Replay]:
    """Every task's recording, read before any server starts so a missing one fails fast."""
    if spec.kind != "replay":
        return {}
    directory = Path(spec.value) if spec.value else bench.replay_dir
    return {t.id: load_replay(directory, t.id) for t in tasks}


def load_text_model(directory: str | None) -> Any:
    """The `--predictor` model, loaded before any server starts so a bad path fails fast."""
    if directory is None:
        return None
    # the predictor pulls numpy models (and torch for BERT): only runs with --predictor load it
    from predictor.lengths import LengthPredictor, PredictorError

    try:
        return LengthPredictor.load(directory)
    except (PredictorError, OSError) as exc:
        raise RunError(f"--predictor {directory}: {exc}") from None


@dataclass(frozen=True)
class RunPlan:
    """What `run_all` runs, decided by `run_benchmark` before any program starts: the tasks
    and their recordings, the server and how to talk to it, where results go."""

    bench: Benchmark
    tasks: list[Task]
    base_url: str
    model: str  # the served model's name (SWE-bench predictions carry it)
    out: Path
    replays: dict[str, Replay] = field(default_factory=dict)
    concurrency: int = 16
    limits: Limits = field(default_factory=Limits)
    text_model: Any = None  # a `--predictor` model, or None
    token_ids: bool = True
    tool_calls: bool = False
    agentic_context: bool = False
    #: what became of a co-located model server (None: a `--server` nobody watches)
    diagnose: Callable[[], str | None] | None = None
    api_key: str | None = None  # for a server started with `--api-key`


async def run_all(plan: RunPlan, console: Console) -> dict[str, int]:
    """Run the tasks (once the model server is gone no new program starts); returns the
    events sent / dropped."""
    bench, limits = plan.bench, plan.limits
    client = ChatClient(plan.base_url, plan.model, token_ids=plan.token_ids,
                        agentic_context=plan.agentic_context,
                        retries=Retries(max_retries=limits.model_retries), api_key=plan.api_key)
    semaphore = asyncio.Semaphore(plan.concurrency)
    halted: str | None = None  # why no new program starts: the model server is gone

    def log(message: str) -> None:
        console.print(message, markup=False, highlight=False, soft_wrap=True)

    run = RunContext(out_dir=plan.out, run_id=f"r{int(time.time())}", model_name=plan.model,
                     log=log)
    async with EventClient(plan.base_url, api_key=plan.api_key) as events:
        agent = Agent(client, events, ToolDurationModel(), plan.out / "trajectories", limits,
                      plan.text_model, plan.tool_calls)
        columns = (TextColumn("[bold]{task.description}"), BarColumn(),
                   TextColumn(PROGRESS_TEXT), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=False) as progress:
            bar = progress.add_task(bench.name, total=len(plan.tasks), passed=0)
            passed = 0

            async def one(task: Task) -> None:
                nonlocal passed, halted
                async with semaphore:
                    if halted is not None:  # build_summary counts these as not started
                        return
                    result = await run_task(bench, task, agent, plan.replays.get(task.id), run,
                                            diagnose=plan.diagnose)
                if result.retryable and result.status == "model_error" and halted is None:
                    halted = str(result.error)
                    log(f"{task.id}: {halted}; no new program starts")
                passed += result.passed
                progress.update(bar, advance=1, passed=passed)

            jobs = [asyncio.create_task(one(t)) for t in plan.tasks]
            try:
                await asyncio.gather(*jobs)
            finally:
                for job in jobs:
                    job.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.gather(*jobs, return_exceptions=True)
    await client.aclose()
    if bench.uses_docker:
        sweep_containers(str(run.run_id), log)
    return {"sent": events.sent, "dropped": events.dropped}


def sweep_containers(run_id: str, log: Callable[[str], None]) -> None:
    """Remove what programs whose engine failed could not (their containers), saying so."""
    try:
        client = shared_client()
    except SandboxImageError as exc:
        log(f"could not check for containers left by run {run_id}: {exc}")
        return
    removed, problem = sweep_run(client, run_id)
    if removed:
        log(f"removed {len(removed)} container(s) that failed programs left: "
            f"{', '.join(removed)}")
    if problem:
        log(problem)


def server_events_received(base_url: str, api_key: str | None = None) -> int | None:
    try:
        return int(httpx.get(api_root(base_url) + "/v1/agent/events", timeout=5,
                             headers=auth_headers(api_key)).json()["received"])
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def received_during(before: int | None, after: int | None) -> int | None:
    """The events the server received during this run: the difference of its counter (which
    counts since the server started); None when either reading failed."""
    return after - before if before is not None and after is not None else None


def build_summary(bench: Benchmark, policy: str, tasks: list[Task], out: Path,
                  events: dict[str, int], model: str, wall_s: float,
                  received: int | None) -> dict[str, Any]:
    """`received`: the events the server received during this run (`received_during`)."""
    results = load_results(out, tasks)
    passed = sum(r.passed for r in results)
    jct = summarize([r.jct_s for r in results], "jct")
    extra = {"resolved": sum(bool(r.resolved) for r in results)} \
        if any(r.resolved is not None for r in results) else {}
    if any(r.token_id_turns is not None for r in results):  # turns that broke the prefix
        extra["token_id_turns"] = sum(r.token_id_turns or 0 for r in results)
        extra["prefix_broken_turns"] = sum(r.prefix_broken_turns or 0 for r in results)
    statuses = Counter(r.status for r in results)
    steps = sum(r.steps for r in results)
    output_tokens = sum(r.output_tokens for r in results)
    llm_s = sum(r.llm_s for r in results)
    return {"benchmark": bench.name, "policy": policy, "model": model, "tasks": len(results),
            "passed": passed, **extra, "pass_rate": passed / len(results) if results else 0.0,
            "steps_mean": steps / len(results) if results else 0.0,
            # programs that ended on unusable replies, and unusable replies among all turns
            "format_error_share": statuses["format_error"] / len(results) if results else 0.0,
            "format_error_turns": sum(r.format_errors for r in results),
            "turns": steps,
            "cut_at_max_tokens": sum(r.cut_at_max_tokens for r in results),
            "output_tokens": output_tokens,
            # what one program's requests see (output tokens over the seconds they took)
            "request_tokens_per_s": output_tokens / llm_s if llm_s else 0.0,
            "jct_mean_s": jct["jct_mean_s"], "jct_p95_s": jct["jct_p95_s"],
            "events_sent": events["sent"], "events_dropped": events["dropped"],
            "events_received_by_server": received, "wall_s": wall_s,
            "statuses": dict(statuses),
            "retryable": sum(r.retryable for r in results),
            "not_started": len(tasks) - len(results)}


def print_summary(console: Console, summary: dict[str, Any], out: Path) -> None:
    table = Table(title=f"harness run {summary['benchmark']} --policy {summary['policy']}")
    for key in ("tasks", "passed", "resolved", "pass_rate", "steps_mean", "format_error_share",
                "jct_mean_s", "jct_p95_s", "request_tokens_per_s", "events_sent",
                "events_dropped", "prefix_broken_turns"):
        if key not in summary:
            continue
        value = summary[key]
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    console.print(table)
    console.print(f"summary: {out / 'summary.json'}; trajectories: {out / 'trajectories'}")


def warn_leftovers(console: Console) -> None:
    """Say so when dead runs left containers or stale task images (never stops the run)."""
    try:
        client = shared_client()
    except SandboxImageError:
        return  # each task then says what is wrong
    warning = leftover_warning(client)
    if warning:
        console.print(warning, markup=False, highlight=False, soft_wrap=True)


def run_benchmark(spec: RunSpec) -> int:
    """Run and score the benchmark's tasks as `spec` says; 0 when every task has a final
    result, 1 when a model server or Docker failure left some unfinished. Bad input raises a
    `UserError` (`RunError`, `BenchmarkError`, ...) before any program starts."""
    console = Console()
    # worked examples for a real model, not when replaying recordings made without them
    exemplars = spec.exemplars if spec.exemplars is not None \
        else ModelSpec.parse(spec.model).kind != "replay"
    bench = get_benchmark(spec.benchmark, exemplars)
    tasks = bench.load_tasks(Path(spec.tasks) if spec.tasks else None)
    if spec.limit is not None:
        if spec.limit < 1:
            raise RunError("--limit must be at least 1")
        tasks = tasks[: spec.limit]
    if spec.concurrency < 1:
        raise RunError("--concurrency must be at least 1")
    if spec.max_tokens < 1:
        raise RunError("--max-tokens must be at least 1")
    if spec.temperature < 0:
        raise RunError("--temperature must be at least 0")
    if spec.model_retries < 0:
        raise RunError("--model-retries must be at least 0")
    if spec.api_key and not spec.server:
        raise RunError("--api-key is the key of a running server: give it with --server URL "
                       "(the server harness run starts itself needs none)")
    if spec.resume and not spec.out:
        raise RunError("--resume needs --out: the folder of the run to continue")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(spec.out or f"runs/{bench.name}-{spec.policy}-{stamp}")
    if not spec.resume and (out / "results").is_dir() and any((out / "results").iterdir()):
        raise RunError(f"{out} already holds results: pass --resume to continue that run, or "
                       "choose another --out")
    todo = [t for t in tasks if not (spec.resume and is_finished(out, t.id))]
    if len(todo) < len(tasks) or spec.resume:
        again = sum(result_path(out, t.id).is_file() for t in todo)
        console.print(f"resuming: {len(tasks) - len(todo)} of {len(tasks)} tasks already done"
                      + (f"; {again} interrupted by a model server or Docker failure run "
                         "again" if again else ""))
    model_spec, model = served_model(spec, console)
    replays = load_replays(bench, todo, model_spec)
    text_model = load_text_model(spec.predictor)
    if bench.uses_docker:
        warn_leftovers(console)
    started = time.monotonic()
    limits = Limits(max_steps=spec.max_steps, max_tokens=spec.max_tokens,
                    temperature=spec.temperature, model_retries=spec.model_retries)
    diagnose: Callable[[], str | None] | None = None
    api_key = api_key_of(spec.api_key) if spec.server else None
    with contextlib.ExitStack() as stack:
        if spec.server:
            base_url = api_root(spec.server)
            check_reachable(base_url, api_key)
        else:
            serve_args = ["--model", model_spec.value] if model_spec.kind == "path" else []
            if spec.device:
                serve_args += ["--device", spec.device]
            console.print(f"starting harness serve --policy {spec.policy} {' '.join(serve_args)}"
                          + (" (the CPU engine: a few minutes, longer the first time)"
                             if spec.device == "cpu" else " ..."))
            server = stack.enter_context(ServerProcess(
                policy=spec.policy, profile=spec.profile, serve_args=serve_args,
                startup_timeout_s=CPU_STARTUP_TIMEOUT_S if spec.device == "cpu" else 240.0))
            base_url = server.base_url
            diagnose = server.exit_description
        before = server_events_received(base_url, api_key)
        plan = RunPlan(bench, todo, base_url, model, out, replays, spec.concurrency, limits,
                       text_model, spec.token_ids, spec.tool_calls, spec.agentic_context,
                       diagnose, api_key)
        events = asyncio.run(run_all(plan, console)) if todo else {"sent": 0, "dropped": 0}
        received = received_during(before, server_events_received(base_url, api_key))
    summary = build_summary(bench, spec.policy, tasks, out, events, model,
                            time.monotonic() - started, received)
    write_json_atomic(out / "summary.json", summary)
    print_summary(console, summary, out)
    return report_unfinished(console, summary, spec, out)


def served_model(spec: RunSpec, console: Console) -> tuple[ModelSpec, str]:
    """What `--model` (with `--device`) asks for, and the name the server serves it under.
    With `--device cpu` the model is resolved here (a known name is added now, with progress),
    before any server starts, so a bad name fails fast."""
    model_spec = ModelSpec.parse(spec.model)
    if spec.device not in (None, *DEVICES):
        raise RunError(f"--device {spec.device}: pick one of {', '.join(DEVICES)}")
    if spec.device == "cpu":
        if spec.server:
            raise RunError("--device cpu starts the CPU engine; --server uses a running server "
                           "(give one or the other)")
        if model_spec.kind == "replay":
            raise RunError("--device cpu runs a real model: give --model NAME|DIR|FILE.gguf "
                           "(e.g. smollm2-135m-instruct); recorded trajectories (replay) need "
                           "the emulated GPU")
        resolved = servable_model(model_spec.value, progress=lambda m: console.print(
            f"model: {m}", markup=False, highlight=False))
        return ModelSpec("path", model_spec.value), resolved.name
    if model_spec.kind == "name" and not spec.server:
        raise RunError(f"--model {model_spec.value}: a model name needs --server URL, or "
                       "--device cpu to serve it on the CPU engine (or give a replay:DIR or a "
                       "model PATH)")
    if model_spec.kind == "name":
        return model_spec, model_spec.value
    if model_spec.kind == "path":
        return model_spec, Path(model_spec.value).name
    return model_spec, EMULATED_MODEL


def check_reachable(base_url: str, api_key: str | None = None) -> None:
    """A `--server` nobody answers at, or one that refuses our key, is a mistake to say before
    any program starts (any other HTTP answer will do: servers differ in what they serve at
    `/v1/models`)."""
    try:
        answer = httpx.get(base_url + "/v1/models", timeout=10, headers=auth_headers(api_key))
    except httpx.HTTPError as exc:
        raise RunError(f"--server {base_url}: no server answers there ({type(exc).__name__}: "
                       f"{exc}); start one (`harness serve`) or leave out --server to have "
                       "harness run start it") from None
    if answer.status_code == 401:
        raise RunError(f"--server {base_url} answered 401 Unauthorized: "
                       + ("it does not take this API key" if api_key else "it wants an API "
                          "key") + "; give --api-key KEY or set HARNESS_API_KEY (or "
                       "OPENAI_API_KEY)")


def report_unfinished(console: Console, summary: dict[str, Any], spec: RunSpec,
                      out: Path) -> int:
    """0 when every task has a final result; else say what is left and how to finish it, 1."""
    if not summary["retryable"] and not summary["not_started"]:
        return 0
    statuses = ", ".join(f"{n} {s}" for s, n in sorted(summary["statuses"].items())
                         if s in ("model_error", "sandbox_error"))
    console.print(f"unfinished: {summary['retryable']} program(s) stopped by the model server "
                  f"or the Docker engine ({statuses or 'none'}), {summary['not_started']} "
                  f"task(s) not started; finished results are kept in {out / 'results'} "
                  f"(errors in each result's `error`). Finish the run with: harness run "
                  f"{spec.benchmark} --out {out} --resume"
                  + (" --server URL" if spec.server else ""),
                  markup=False, highlight=False, soft_wrap=True)
    return 1
