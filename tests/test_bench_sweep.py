"""The sweep's one loop (`eval.bench.sweep.bench`) against the `Backend` protocol, with a
back end that replays nothing: what it is asked, in which order, and what reaches
``summary.json``; and the sweep's values refusing a mistake in one line.

Fast: no engine runs (the real back ends are exercised by tests/test_bench.py)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from common.metrics import SLO
from eval.bench.backends import Replayed
from eval.bench.parallel import Serial
from eval.bench.runs import BenchSpec, Run, Workload
from eval.bench.specs import BenchError, check_profile
from eval.bench.summary import BenchSummary
from eval.bench.sweep import bench
from server.engine_spec import EngineSpec
from sim.records import ProgramRecord, TurnRecord


@dataclass
class Recording:
    """A back end that answers every question with a fixed value and notes the calls."""

    engine: EngineSpec = EngineSpec(profile="h100-llama-3.1-8b", seed=7)
    mode: str = "recording"
    parallel: bool = True
    with_floor: bool = True
    calls: list[Any] = field(default_factory=list)

    def cluster(self) -> dict[str, Any] | None:
        return None

    def context_limit(self) -> int | None:
        return None

    def isolated(self, trace: Any, out: Path, progress: Any) -> Any:
        self.calls.append("isolated")
        return {p.id: 1.0 for p in trace.programs}, None

    def replay(self, trace: Any, run: Run, progress: Any) -> Replayed:
        self.calls.append(run)
        programs = {p.id: ProgramRecord(p.id, p.arrival_s, p.arrival_s + 2.0,
                                        [TurnRecord(p.id, 0, p.arrival_s)])
                    for p in trace.programs}
        return Replayed(SimpleNamespace(programs=programs), 0.5, 0.25)

    def metrics(self, replayed: Replayed, isolated: dict[str, float],
                slo: SLO) -> dict[str, Any]:
        return {"jct_mean_s": 2.0, "jct_p95_s": 3.0, "slo_ttft": slo.ttft_s,
                "wall_s": replayed.wall_s}

    def floor(self, trace: Any) -> dict[str, float] | None:
        if not self.with_floor:
            return None
        return {"throughput_jct_mean_s": 1.5, "throughput_makespan_s": 9.0, "work_s": 3.0,
                "offered_load": 0.5}


def test_the_loop_asks_the_backend_in_order_and_writes_its_answers(tmp_path):
    backend = Recording()
    spec = BenchSpec(Workload("swe", 3, (1.0, 2.0), seed=5), ("vllm", "other"),
                     slo=SLO(ttft_s=3.0))
    summary = bench(spec, backend, tmp_path)
    # the isolated JCTs first, then every policy at every load, policies outermost
    assert backend.calls == ["isolated", Run("vllm", 1.0), Run("vllm", 2.0),
                             Run("other", 1.0), Run("other", 2.0)]
    assert [(r["policy"], r["jps"]) for r in summary.results] == [
        ("vllm", 1.0), ("vllm", 2.0), ("other", 1.0), ("other", 2.0)]
    row = summary.results[0]
    assert row["slo_ttft"] == 3.0 and row["wall_s"] == 0.5  # the back end's metrics, as given
    # the floor is the back end's throughput bound, per load
    assert row["floor_jct_mean_s"] == 1.5 and [f["jps"] for f in summary.floors] == [1.0, 2.0]
    assert (summary.mode, summary.cluster, summary.profile) == (
        "recording", None, "h100-llama-3.1-8b")
    written = json.loads((tmp_path / "summary.json").read_text())
    assert list(written) == [f.name for f in dataclasses.fields(BenchSummary)]
    assert written["results"][3]["policy"] == "other" and written["seed"] == 5
    assert (tmp_path / "runs" / "other-jps2.json").exists()
    assert "| other | 2.0 | 2.00 |" in (tmp_path / "report.md").read_text()


def test_a_closed_loop_has_no_throughput_bound_and_one_trace(tmp_path):
    backend = Recording()
    spec = BenchSpec(Workload("swe", 2, concurrency=(1, 2)), ("vllm",))
    summary = bench(spec, backend, tmp_path)
    assert backend.calls[1:] == [Run("vllm", None, 1), Run("vllm", None, 2)]
    assert summary.floors == [] and summary.concurrency == [1, 2] and summary.jps == [None]


def test_a_backend_without_a_bound_gives_the_isolated_floor(tmp_path):
    summary = bench(BenchSpec(Workload("swe", 2, (1.0,)), ("vllm",)),
                    Recording(with_floor=False), tmp_path)
    assert summary.floors == [] and summary.results[0]["floor_jct_mean_s"] == 1.0


def test_serial_calls_run_in_the_order_their_results_are_taken():
    ran: list[int] = []
    pool = Serial()
    first, second = pool.submit(ran.append, 1), pool.submit(ran.append, 2)
    assert ran == []  # submitted, not yet run
    first.result()
    second.result()
    second.result()  # once only
    assert ran == [1, 2]


@pytest.mark.parametrize("make, message", [
    (lambda: Workload("swe", time_scale=0), "--time-scale must be a positive number, not 0"),
    (lambda: Workload("swe", jps=(1.0,), concurrency=(4,)), "give either --jps"),
    (lambda: Workload("swe", concurrency=(0,)), "--concurrency: at least one program"),
    (lambda: Workload("swe", too_long="maybe"), "--too-long 'maybe': choose from error, skip"),
    (lambda: BenchSpec(Workload("swe"), ()), "--policies is empty"),
    (lambda: BenchSpec(Workload("swe"), ("vllm",), steady=0.5), "--steady 0.5: give a fraction"),
    (lambda: BenchSpec(Workload("swe"), ("vllm",), jobs=0), "--jobs 0: give at least 1"),
    (lambda: BenchSpec(Workload("swe"), ("vllm",), slo=SLO(tpot_s=-1)),
     "--slo-tpot must be a positive"),
    (lambda: check_profile(EngineSpec(profile="no-such-gpu")), "--profile 'no-such-gpu'"),
])
def test_a_mistake_in_a_sweep_is_one_line_naming_the_flag(make, message):
    with pytest.raises(BenchError, match="^" + message.replace("(", r"\(")) as error:
        make()
    assert "\n" not in str(error.value)
