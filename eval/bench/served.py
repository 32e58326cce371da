"""The wall-clock back end: replays over HTTP against a running `harness serve` or
`harness cluster serve` (`eval.replay.http_replay`).

Why its own: a served engine has its own settings and answers a too-long request itself, its
replay cannot be split into processes (one server), it has no engine steps to count and no
throughput bound, and its isolated JCTs are measured on the emulated profile (`engine`) unless
asked to measure them on the server (`HttpTarget.isolated_over_http`, costing their sum in
wall time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.metrics import SLO
from common.trace import Trace
from eval.bench.backends import Progress, Replayed, timed, timing
from eval.bench.isolated import IsolatedCost, isolated_timed
from eval.bench.runs import Run
from eval.bench.specs import BenchError, HttpTarget
from eval.replay.http_replay import (
    HttpReplayError,
    http_replay_metrics,
    isolated_jcts_over_http,
    replay_over_http,
)
from server.engine_spec import EngineSpec


@dataclass(frozen=True)
class Served:
    """Each replay over HTTP against `target`; `engine`: where the isolated JCTs are measured
    when not on the server."""

    target: HttpTarget
    engine: EngineSpec
    parallel: bool = False
    mode: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", f"http {self.target.url}")

    def cluster(self) -> dict[str, Any] | None:
        return None

    def context_limit(self) -> int | None:
        return None  # the server answers a too-long request itself (HTTP 400)

    def isolated(self, trace: Trace, out: Path,
                 progress: Progress) -> tuple[dict[str, float], IsolatedCost | None]:
        if self.target.isolated_over_http:
            return isolated_jcts_over_http(trace, self.target.url, model=self.target.model,
                                           progress=progress), None
        return isolated_timed(trace, self.engine, out, progress)

    def replay(self, trace: Trace, run: Run, progress: Progress) -> Replayed:
        def one() -> Any:
            try:
                return replay_over_http(trace, self.target.url, model=self.target.model,
                                        progress=progress)
            except HttpReplayError as exc:
                raise BenchError(str(exc)) from None

        return timed(one)

    def metrics(self, replayed: Replayed, isolated: dict[str, float],
                slo: SLO) -> dict[str, Any]:
        return timing(replayed, http_replay_metrics(replayed.result, isolated, slo),
                      steps=False)

    def floor(self, trace: Trace) -> dict[str, float] | None:
        return None
