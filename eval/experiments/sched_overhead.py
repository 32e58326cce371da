"""The scheduler's time per step, per policy, at large batches.

The policies add work to vLLM's `schedule()` (sorting the queue, asking about pins, a token
budget); this measures how much, in the same in-process engine the benchmark uses. A burst of
agent programs (short prompts, long answers, sub-second tool calls) keeps 128 or more turns
running; only steps that start with at least `--min-running` running requests count. The
figure is `PolicyScheduler.sched_seconds` (wall time inside `schedule()`, vLLM's own work
included; `schedule()` runs on one thread, so on a quiet machine that is its CPU time),
divided by those steps, and its ratio to `vllm`'s and to `vllm+offload`'s (stock vLLM with KV
offloading on: the baseline for the policies that turn offloading on, whose connector's
scheduler side also runs inside `schedule()`).

    harness eval sched-overhead [--programs 320] [--min-running 128] [--repeat 2]

The policies change which requests run, so their steps are not identical; the ratio compares
CPU per step at the same batch size (128 running), the scheduler's work per decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from common.atomic import write_json_atomic
from common.trace import Program, Trace, Turn
from eval import ExperimentError
from server.engine import VirtualEngine
from server.engine_spec import EngineSpec
from server.policies import POLICIES
from server.policies.spec import PolicySpec
from sim.replay import replay

#: `vllm` and `vllm+offload` first: the baselines the ratios divide by
DEFAULT_POLICIES = ("vllm", "vllm+offload", *(p for p in POLICIES if p != "vllm"))


class SchedOverheadError(ExperimentError):
    """A measurement that cannot be made as asked (printed without a traceback)."""


@dataclass(frozen=True)
class SchedOverheadOptions:
    """One measurement (each field is an option of `harness eval sched-overhead`)."""

    programs: int = field(default=320, metadata={"help": "programs of the burst"})
    min_running: int = field(default=128, metadata={
        "help": "count only steps with at least this many requests running"})
    policies: tuple[str, ...] = field(default=DEFAULT_POLICIES, metadata={
        "help": "policies; vllm+offload is stock vLLM with KV offloading on"})
    profile: str = field(default="h100-llama-3.1-8b", metadata={"help": "emulated GPU-MODEL"})
    repeat: int = field(default=2, metadata={
        "help": "rounds over the policies; each policy's least CPU per step is kept (other "
        "load on the machine only ever adds time)"})
    out: str | None = field(default=None, metadata={
        "help": "also write the rows to this JSON file"})

    def __post_init__(self) -> None:
        for name in ("programs", "min_running", "repeat"):
            if getattr(self, name) < 1:
                raise SchedOverheadError(f"--{name.replace('_', '-')} {getattr(self, name)}: "
                                         "give at least 1")
        unknown = [p for p in self.policies if not _parses(p)]
        if unknown or not self.policies:
            raise SchedOverheadError(f"--policies: unknown {', '.join(unknown) or '(none)'}; "
                                     f"choose from {', '.join(sorted(POLICIES))} (+offload)")


def _parses(name: str) -> bool:
    """Whether `name` is a policy this experiment runs (`PolicySpec.parse`: ``NAME[+offload]``
    and the rest of a replay's grammar), so it refuses what every replay refuses."""
    try:
        PolicySpec.parse(name)
    except ValueError:
        return False
    return True


def burst_trace(programs: int, turns: int = 3) -> Trace:
    """Programs arriving within one second: 300-token prompts, 300-token answers, 0.5 s tools."""
    def turn(i: int) -> Turn:
        last = i == turns - 1
        return Turn(input_tokens=300 if i == 0 else 20, output_tokens=300,
                    tool=None if last else "search", tool_seconds=0.0 if last else 0.5,
                    tool_return_tokens=0 if last else 60)

    return Trace(name="burst", description="scheduler overhead burst", programs=[
        Program(id=f"b{i:04d}", arrival_s=i / programs, turns=[turn(t) for t in range(turns)])
        for i in range(programs)])


class _Counting:
    """Wraps an engine to time `schedule()` only in steps that begin with enough running."""

    def __init__(self, engine: VirtualEngine, min_running: int) -> None:
        self.engine = engine
        self.min_running = min_running
        self.cpu = 0.0
        self.steps = 0
        self.max_running = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def step(self) -> Any:
        scheduler = self.engine.scheduler
        running = len(scheduler.running)
        self.max_running = max(self.max_running, running)
        before = scheduler.sched_seconds
        done = self.engine.step()
        if running >= self.min_running:
            self.cpu += scheduler.sched_seconds - before
            self.steps += 1
        return done


def measure(policy: str, trace: Trace, min_running: int, profile: str) -> dict[str, Any]:
    """`policy` may be ``vllm+offload``: stock vLLM with the native KV offloading connector on,
    the fair baseline for the policies that need offloading (its scheduler side runs inside
    `schedule()` and is vLLM's cost, not the policy's)."""
    engine = VirtualEngine(PolicySpec.parse(policy), EngineSpec(profile=profile, seed=0))
    try:
        counting = _Counting(engine, min_running)
        replay(trace, counting)
    finally:
        engine.close()
    per_step = counting.cpu / counting.steps if counting.steps else float("nan")
    return {"policy": policy, "steps": counting.steps, "max_running": counting.max_running,
            "cpu_per_step_ms": per_step * 1e3}


def run_sched_overhead(options: SchedOverheadOptions) -> list[dict[str, Any]]:
    """Measure every policy `repeat` times, print the table, write it to `out` (JSON) if
    given; returns the rows."""
    programs, min_running, policies, profile, repeat, out = (
        options.programs, options.min_running, options.policies, options.profile,
        options.repeat, options.out)
    trace = burst_trace(programs)
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    for _ in range(repeat):  # rounds over all policies, so drift hits every policy alike
        for p in policies:
            runs[p].append(measure(p, trace, min_running, profile))
    rows = [min(runs[p], key=lambda r: r["cpu_per_step_ms"]) for p in policies]
    base = next((r["cpu_per_step_ms"] for r in rows if r["policy"] == "vllm"), None)
    base_offload = next((r["cpu_per_step_ms"] for r in rows if r["policy"] == "vllm+offload"),
                        None)
    print(f"{'policy':<12} {'steps>=' + str(min_running):>10} {'max run':>8} "
          f"{'ms/step':>8} {'x vllm':>7} {'x vllm+offload':>15}")
    for r in rows:
        r["ratio_to_vllm"] = r["cpu_per_step_ms"] / base if base else None
        r["ratio_to_vllm_offload"] = (r["cpu_per_step_ms"] / base_offload if base_offload
                                      else None)
        ratio = f"{r['ratio_to_vllm']:.2f}" if base else "-"
        ratio_offload = f"{r['ratio_to_vllm_offload']:.2f}" if base_offload else "-"
        print(f"{r['policy']:<12} {r['steps']:>10} {r['max_running']:>8} "
              f"{r['cpu_per_step_ms']:>8.3f} {ratio:>7} {ratio_offload:>15}")
    if out:
        write_json_atomic(out, rows)
    return rows
