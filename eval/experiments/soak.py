"""`harness eval soak`: real sessions against one `harness serve` for an hour, with faults,
judged against stated bounds on memory, held state and waiting (docs/soak.md).

Why: the program schedulers and the KV pins hold memory and queue slots for programs that may
never come back. Unit tests show each release rule; only a long run with clients that break
their promises shows that nothing accumulates: RSS flat after the warm-up, the program table,
pins and orphaned KV back to zero after the last client leaves, no request hung, no turn
starved. This starts the server, replays sessions from a trace over HTTP in a closed loop
(`--sessions` at once; a new one starts when one ends) with their gaps scaled and their token
counts times `--token-scale` (cut at the first turn longer than the engine's context), runs
the fault plan (`eval.experiments.soak_faults`) beside them, samples every `--sample-s`
(`eval.experiments.soak_sampler`), then drains (no clients; a one-token request per sample
keeps the engine stepping, as an engine with no work never steps) and judges
(`eval.experiments.soak_judge`). Written to `--out`: ``samples.jsonl``, ``progress.json``,
``summary.json``, ``soak.png``, ``serve.log``. `--resume` continues a run whose soak process
was killed. Exit status 1 when a check fails.

    harness eval soak --trace /work/kvtraces --minutes 60 --time-scale 0.01 --sessions 8
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from common.atomic import write_json_atomic
from common.processes import sigterm_unwinds
from common.trace import Program, Trace
from eval import ExperimentError
from eval.bench.traces import make_trace
from eval.experiments.soak_cluster import ClusterProcess
from eval.experiments.soak_faults import FaultPlan, parse_faults
from eval.experiments.soak_judge import (
    DRAIN_SLACK_S,
    REQUEST_TIMEOUT_S,
    judge,
)
from eval.experiments.soak_loop import Soak, drain_bound_s
from eval.experiments.soak_record import Record, plot
from eval.workloads.token_scale import scale_tokens
from harness.server_process import ServerProcess, model_server
from server.programs.state import STALE_AFTER_S
from sim.conversation import too_long_turns

#: one server's policy when --policy is not given
DEFAULT_SOAK_POLICY = "continuum"


class SoakError(ExperimentError):
    pass


@dataclass(frozen=True)
class SoakOptions:
    trace: str | None = field(default=None, metadata={
        "help": "the sessions: a harness trace file, a folder of recorded sessions (Claude "
        "Code's among them), or a generated trace's name"})
    policy: str | None = field(default=None, metadata={
        "help": f"the server's policy (default {DEFAULT_SOAK_POLICY}; with --cluster, each "
        "replica's is the cluster file's)"})
    device: str | None = field(default=None, metadata={
        "choices": ("cpu", "gpu"),
        "help": "serve a real model on this device (with --model); default: the emulated GPU"})
    model: str | None = field(default=None, metadata={
        "help": "the model for --device (e.g. smollm2-135m-instruct)"})
    profile: str | None = field(default=None, metadata={
        "help": "the emulated GPU's profile (default: the server's)"})
    cluster: str | None = field(default=None, metadata={
        "help": "soak a cluster file's replicas behind its router (`harness cluster serve`; "
        "the `programs` router for program schedulers) instead of one server"})
    offload_gib: float = field(default=0.0, metadata={
        "help": "a host KV tier of this many GiB (0: none)"})
    minutes: float = field(default=60.0, metadata={"help": "how long to drive the server"})
    time_scale: float = field(default=0.01, metadata={
        "help": "multiplies the sessions' tool gaps (0.01: a hundred times shorter)"})
    token_scale: float = field(default=1.0, metadata={
        "help": "multiplies every token count of the sessions (prompts, outputs, tool returns, "
        "kept prefixes), in (0, 1]: a real small model's context is shorter than any real "
        "session's first prompt"})
    sessions: int = field(default=8, metadata={"help": "sessions at once (closed loop)"})
    faults: str = field(default="all", metadata={
        "help": "the faults: all, none, or names with commas (kill_mid_tool, kill_mid_turn, "
        "drop_events, unknown_events, no_program_end, restart, kill_replica: with --cluster); "
        "-NAME leaves one out"})
    sample_s: float = field(default=5.0, metadata={"help": "seconds between samples"})
    stale_after_s: float | None = field(default=None, metadata={
        "help": "the server's silent-program bound (`harness serve --stale-after-s`, or "
        "`harness cluster serve --stale-after-s` for every replica and the router; default: "
        "its own 3,600 s times --time-scale, as the sessions' gaps are)"})
    drain_s: float | None = field(default=None, metadata={
        "help": "how long to wait after the last client left (default: the server's "
        "silent-program bound, plus slack)"})
    request_timeout_s: float = field(default=REQUEST_TIMEOUT_S, metadata={
        "help": "a request unanswered this long is a hang"})
    seed: int = field(default=0, metadata={"help": "the fault plan's seed"})
    out: str = field(default="runs/soak", metadata={"help": "the run record's folder"})
    resume: bool = field(default=False, metadata={
        "help": "continue the run record in --out after the soak process was killed"})

    def __post_init__(self) -> None:
        if self.trace is None:
            raise SoakError("--trace is required: a trace file or a folder of sessions")
        for name in ("minutes", "time_scale", "sample_s", "request_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise SoakError(f"--{name.replace('_', '-')} must be a positive number")
        if not (0 < self.token_scale <= 1 and math.isfinite(self.token_scale)):
            raise SoakError(f"--token-scale must be in (0, 1], not {self.token_scale:g}")
        if self.sessions < 1:
            raise SoakError("--sessions must be at least 1")
        if self.stale_after_s is not None and not (
                self.stale_after_s > 0 and math.isfinite(self.stale_after_s)):
            raise SoakError("--stale-after-s must be a positive number")
        if self.drain_s is not None and self.drain_s < 0:
            raise SoakError("--drain-s must not be negative")
        if self.cluster is not None and (self.device is not None or self.offload_gib
                                         or self.profile is not None or self.policy):
            raise SoakError("--cluster: the cluster file says each replica's policy, device, "
                            "model, profile and tiers; --policy, --device, --model, --profile "
                            "and --offload-gib are for one server")
        if (self.device is None) != (self.model is None):
            raise SoakError("--device and --model go together")
        parse_faults(self.faults)


def server_policy(options: SoakOptions) -> str:
    """One server's policy: given, else the soak's default."""
    return options.policy or DEFAULT_SOAK_POLICY


def stale_after_s(options: SoakOptions) -> float:
    """How long the soak's server keeps a silent program: given, or the server's own bound
    scaled as the sessions' gaps are (a program silent an hour in the trace is silent 36 s at
    a time scale of 0.01). A cluster's replicas and its router take the same bound
    (`harness cluster serve --stale-after-s`)."""
    if options.stale_after_s is not None:
        return options.stale_after_s
    return STALE_AFTER_S * options.time_scale


def make_server(options: SoakOptions, out: Path) -> ServerProcess | ClusterProcess:
    if options.cluster is not None:
        return ClusterProcess(options.cluster, out / "cluster-logs",
                              stale_after_s=stale_after_s(options))
    serve_args = ["--stale-after-s", f"{stale_after_s(options):g}"]
    if options.offload_gib:
        serve_args += ["--offload-gib", f"{options.offload_gib:g}"]
    log = out / "serve.log"
    if options.device is not None:
        assert options.model is not None
        return model_server(options.model, options.device, server_policy(options), serve_args,
                            log_path=log)
    return ServerProcess(policy=server_policy(options), profile=options.profile,
                         serve_args=serve_args, log_path=log)


def fit_sessions(trace: Trace, limit: int | None,
                 token_scale: float = 1.0) -> tuple[list[Program], list[str]]:
    """The sessions at `token_scale` of their size (`eval.workloads.token_scale`), then cut to
    the engine's context: one whose turn `k` is longer than `limit` keeps its first `k` turns
    (its last one then calls no tool), one whose first turn is too long is left out; a line for
    each. Scaled first, so a session is judged on the size it is replayed at. Sub-agents are
    replayed as sessions of their own."""
    trace = scale_tokens(trace, token_scale)
    programs = [p.model_copy(update={"parent": None}) for p in trace.programs]
    if not limit:
        return programs, []
    first_long = {pid: (turn, tokens) for pid, turn, tokens in too_long_turns(trace, limit)}
    kept, lines = [], []
    for program in programs:
        if program.id not in first_long:
            kept.append(program)
            continue
        turn, tokens = first_long[program.id]
        why = f"turn {turn} needs {tokens:,} tokens > the engine's {limit:,}"
        if turn == 0:
            lines.append(f"{program.id}: left out ({why})")
            continue
        turns = [*program.turns[:turn - 1], program.turns[turn - 1].model_copy(update={
            "tool": None, "tool_seconds": 0.0, "tool_return_tokens": 0, "gap_kind": "tool"})]
        kept.append(Program.model_validate({**program.model_dump(), "turns": [
            t.model_dump() for t in turns]}))
        lines.append(f"{program.id}: cut to its first {turn} turns ({why})")
    return kept, lines


def max_model_len(base: str) -> int | None:
    try:
        models = httpx.get(f"{base}/v1/models", timeout=10.0).json()["data"]
        return int(models[0]["max_model_len"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


def run_soak(options: SoakOptions) -> int:
    out = Path(options.out)
    record = Record(out)
    if options.resume:
        if not record.progress_path.exists():
            raise SoakError(f"--resume: {out} holds no soak run (no progress.json)")
        record.stop_leftover_server()
    elif record.progress_path.exists():
        raise SoakError(f"{out} already holds a soak run: pass --resume to continue it, or "
                        "choose another --out")
    try:
        trace = make_trace(options.trace or "", None, 1.0, options.seed)
    except (ExperimentError, ValueError, FileNotFoundError) as exc:
        raise SoakError(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    plan = FaultPlan(parse_faults(options.faults), options.seed)
    run_s = options.minutes * 60.0
    bound = drain_bound_s(stale_after_s(options) + DRAIN_SLACK_S, options.sample_s)
    drain_s = bound if options.drain_s is None else options.drain_s
    server = make_server(options, out)
    with sigterm_unwinds():
        what = (f"the cluster {options.cluster}" if options.cluster
                else f"harness serve --policy {server_policy(options)}")
        print(f"starting {what} ...", flush=True)
        server.start()
        try:
            sessions, skipped = fit_sessions(trace, max_model_len(server.base_url),
                                             options.token_scale)
            for line in skipped:
                print(f"longer than the engine's context: {line}")
            if not sessions:
                raise SoakError("every session is longer than the engine's context")
            soak = Soak(server=server, sessions=sessions, plan=plan, record=record,
                        options=options, run_s=run_s, drain_s=drain_s)
            if options.resume:
                soak.restore(record.read_progress())
            tokens = ("" if options.token_scale == 1.0
                      else f", token scale {options.token_scale:g}")
            print(f"driving {options.sessions} sessions at once from {len(sessions)} for "
                  f"{max(0.0, run_s - soak.t0):.0f} s (time scale {options.time_scale:g}"
                  f"{tokens}, "
                  f"faults: {', '.join(sorted(plan.enabled)) or 'none'}), then draining up to "
                  f"{drain_s:.0f} s", flush=True)
            started = time.monotonic()
            asyncio.run(soak.run())
        finally:
            server.stop()
    samples = record.read_samples()
    checks = judge(samples, soak.tally.record(), run_s=run_s, drain_bound_s=bound)
    summary = {"options": asdict(options), "trace": trace.name, "sessions": len(sessions),
               "left_out": skipped, "tally": soak.tally.record(), "wall_s":
               time.monotonic() - started, "drain_bound_s": bound,
               "checks": [asdict(c) for c in checks], "samples": len(samples),
               "passed": all(c.passed is not False for c in checks)}
    write_json_atomic(out / "summary.json", summary)
    plot(samples, out / "soak.png")
    for check in checks:
        print(check.line())
    print(f"record: {out}/summary.json, samples.jsonl, soak.png")
    return 0 if summary["passed"] else 1

