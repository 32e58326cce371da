"""What one sweep is: the programs and loads (`Workload`), the policies and how they are
measured (`BenchSpec`), and the replays it comes to (`Run`, a policy at a load).

Why values, checked when made: the command line, the experiments built on the bench and the
tests describe a sweep the same way, and a mistake (a time scale of 0, a steady share of half
the programs) is refused with one line naming the flag before any engine starts, wherever the
sweep was described. Below the sweep nothing reads these fields apart from what it is handed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from common.metrics import SLO
from eval.bench.specs import BenchError
from eval.workloads.warm_prefix import check_share

TOO_LONG = ("error", "skip")


def jps_label(x: float | None, closed: int | None = None) -> str:
    """A load as it appears in file names: jobs/s, ``trace`` (its own arrivals) or
    ``closedN`` (closed loop, N at once)."""
    if closed is not None:
        return f"closed{closed}"
    return "trace" if x is None else f"{x:g}"


def load_text(x: float | None, closed: int | None) -> str:
    return f"{closed} at once" if closed is not None else f"{jps_label(x)} jobs/s"


@dataclass(frozen=True)
class Workload:
    """The programs every run replays and the loads they arrive at: `jps` open-loop rates
    (None: a file's own arrivals), or `concurrency`, closed loops of that many at once (then
    `jps` is ``(None,)`` and only the programs and their order matter)."""

    trace: str  # a generated trace's name (`eval.bench.traces.TRACE_NAMES`) or a file
    programs: int | None = None  # None: 100 generated, every program of a file
    jps: tuple[float | None, ...] = (None,)
    concurrency: tuple[int, ...] | None = None
    seed: int = 0
    time_scale: float = 1.0  # arrival gaps and tool durations times this
    too_long: str = "error"  # a program longer than the context: stop ("error") or "skip" it
    #: kv-cache-tester's warm prefix (`eval.workloads.warm_prefix`): this fraction of the
    #: largest tool + system prompt opens every program's first prompt, shared; 0: none
    warm_prefix_pct: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "jps", tuple(self.jps))
        if self.concurrency is not None:
            object.__setattr__(self, "concurrency", tuple(self.concurrency))
            if self.jps != (None,):
                raise BenchError("give either --jps (arrivals) or --concurrency (closed loop)")
            if not self.concurrency or min(self.concurrency) < 1:
                raise BenchError("--concurrency: at least one program must run at once")
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise BenchError(f"--time-scale must be a positive number, not {self.time_scale}")
        try:
            check_share(self.warm_prefix_pct)
        except ValueError as exc:
            raise BenchError(str(exc)) from None
        if self.too_long not in TOO_LONG:
            raise BenchError(f"--too-long {self.too_long!r}: choose from {', '.join(TOO_LONG)}")

    def loads(self) -> list[tuple[float | None, int | None]]:
        """(jobs/s, programs at once) per load, in the order they are swept."""
        if self.concurrency:
            return [(None, c) for c in self.concurrency]
        return [(x, None) for x in self.jps]


@dataclass(frozen=True)
class Run:
    """One replay of the sweep: `policy` at one load, its metrics over the programs `steady`
    leaves in (`sim.records.steady_programs`)."""

    policy: str
    jps: float | None
    concurrency: int | None = None
    steady: float = 0.0

    def label(self) -> str:
        return f"{self.policy} @ {load_text(self.jps, self.concurrency)}"


@dataclass(frozen=True)
class BenchSpec:
    """A sweep: every policy at every load of `workload`. `steady`: the share of programs left
    out of the metrics at each end (by start time); `slo`: the per-turn bounds of SLO
    attainment and goodput; `jobs`: replays at once, each in its own process (the figures do
    not change, only the wall time)."""

    workload: Workload
    policies: tuple[str, ...]
    steady: float = 0.0
    slo: SLO = field(default_factory=SLO)
    jobs: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "policies", tuple(self.policies))
        if not self.policies:
            raise BenchError("--policies is empty; give e.g. vllm,continuum")
        if not (0.0 <= self.steady < 0.5):
            raise BenchError(f"--steady {self.steady:g}: give a fraction in [0, 0.5)")
        if self.jobs < 1:
            raise BenchError(f"--jobs {self.jobs}: give at least 1")
        for flag, value in (("--slo-ttft", self.slo.ttft_s), ("--slo-tpot", self.slo.tpot_s)):
            if not (value > 0 and math.isfinite(value)):
                raise BenchError(f"{flag} must be a positive number of seconds, not {value}")

    def runs(self) -> list[Run]:
        """Every policy at every load, policies outermost (the order of `summary.json`)."""
        return [Run(policy, x, closed, self.steady) for policy in self.policies
                for x, closed in self.workload.loads()]

