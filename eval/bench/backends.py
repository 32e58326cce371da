"""What the sweep asks of wherever its replays run: the `Backend` protocol.

Why a protocol: the same trace and the same metrics are wanted from a single in-process engine
(`eval.bench.virtual.SingleEngine`), from a virtual-time cluster of replicas behind a router
(`eval.bench.virtual.Cluster`) and from a running server over HTTP on the wall clock
(`eval.bench.served.Served`). What differs between them (where the isolated JCTs come from,
which metrics a replay has, whether there is a throughput bound, whether replays may run in
worker processes) is each back end's answer to one of these questions, so the sweep
(`eval.bench.sweep`) is one loop that never asks which back end it has.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from common.metrics import SLO
from common.trace import Trace
from eval.bench.isolated import IsolatedCost
from eval.bench.runs import Run
from server.engine_spec import EngineSpec

Progress = Callable[[int], None] | None  # programs finished so far, for a progress bar


class Replayed(NamedTuple):
    """One replay's result (`sim.records.ReplayResult` or the HTTP replay's), the wall seconds
    it took, and this process's CPU seconds (on a shared machine the wall time also counts
    others' work)."""

    result: Any
    wall_s: float
    cpu_s: float


class Backend(Protocol):
    """Where a sweep's replays run. Implementations are frozen dataclasses, so a worker
    process of `--jobs` gets the whole back end by pickling (`parallel`)."""

    #: the engine the isolated JCTs are measured on: the summary's profile and settings
    engine: EngineSpec
    #: `summary.json`'s ``mode``: ``virtual`` or ``http URL``
    mode: str
    #: whether replays may run in worker processes (each alone on its engines)
    parallel: bool

    def cluster(self) -> dict[str, Any] | None:
        """`summary.json`'s ``cluster``: the cluster file replayed, or None."""

    def context_limit(self) -> int | None:
        """The longest conversation every engine takes (checked before any replay), or None
        where a served engine answers a too-long request itself (HTTP 400)."""

    def isolated(self, trace: Trace, out: Path,
                 progress: Progress) -> tuple[dict[str, float], IsolatedCost | None]:
        """Each program's JCT alone, and what measuring them cost (None: not measured here,
        e.g. read from the output folder's cache)."""

    def replay(self, trace: Trace, run: Run, progress: Progress) -> Replayed:
        """`run.policy` replaying `trace` at `run`'s load."""

    def metrics(self, replayed: Replayed, isolated: dict[str, float],
                slo: SLO) -> dict[str, Any]:
        """A replay's row of metrics against the isolated JCTs, its timing last."""

    def floor(self, trace: Trace) -> dict[str, float] | None:
        """The throughput bound of `trace` arriving at its rate (`eval.bench.floor`), or None
        where the back end has none."""


def timed(replay: Callable[[], Any]) -> Replayed:
    """Run `replay`, timing it on the wall clock and this process's CPU."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = replay()
    return Replayed(result, time.perf_counter() - wall, time.process_time() - cpu)


def timing(replayed: Replayed, metrics: dict[str, Any], steps: bool) -> dict[str, Any]:
    """`metrics` with the replay's wall and CPU time after them, and, where the back end
    counts engine steps (`steps`), how fast the replay ran: engine steps (all replicas) per
    wall second."""
    row = {**metrics, "wall_s": replayed.wall_s, "cpu_s": replayed.cpu_s}
    if steps:
        row["engine_steps_per_s"] = row.get("engine_steps", 0) / max(row["wall_s"], 1e-9)
    return row
