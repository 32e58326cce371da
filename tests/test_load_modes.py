"""Loads as users run them: closed loop (`--concurrency N`: a new program starts when one ends)
and steady state (`--steady FRAC`: warm-up and cool-down programs left out of the metrics)."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from common.metrics import replay_metrics
from eval.bench.traces import make_trace
from server.engine_spec import EngineSpec
from server.policies.spec import PolicySpec
from sim.engines import make_engine
from sim.records import ProgramRecord, ReplayResult, steady_programs
from sim.replay import replay

PROFILE = "h100-llama-3.1-8b"


@pytest.mark.engine
def test_closed_loop_keeps_exactly_n_programs_running(autoclose) -> None:
    trace = make_trace("swe", 5, 1.0, seed=3)
    engine = autoclose(make_engine(PolicySpec.named("vllm"), EngineSpec(profile=PROFILE)))
    result = replay(trace, engine, concurrency=2)
    records = [result.programs[p.id] for p in trace.programs]  # trace order = start order
    start = records[0].arrival
    assert records[0].arrival == records[1].arrival == start  # two start at once
    finishes = sorted(r.finished for r in records)
    # the k-th later program starts the moment the k-th program ends
    assert [r.arrival for r in records[2:]] == pytest.approx(finishes[:3])
    for r in records:  # and its first turn is due then
        assert r.turns[0].arrival == r.arrival
    events = sorted([(r.arrival, 1) for r in records] + [(r.finished, -1) for r in records],
                    key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    assert peak == 2


def test_steady_programs_trims_both_ends_by_start_time() -> None:
    programs = {f"p{i}": ProgramRecord(f"p{i}", arrival=float(9 - i), finished=20.0 + i)
                for i in range(10)}
    result = ReplayResult(programs=programs, makespan=29.0, total_blocks=1,
                          pin_stats={"block_seconds": 0.0}, sched_seconds=0.0,
                          sched_steps=1, engine_steps=1)
    assert steady_programs(result, 0.0) is None
    # arrivals 9..0 for p0..p9: the two earliest starters are p9, p8; the two latest p0, p1
    assert steady_programs(result, 0.2) == {"p2", "p3", "p4", "p5", "p6", "p7"}
    result.measured = steady_programs(result, 0.2)
    metrics = replay_metrics(result)
    assert metrics["programs"] == 6
    assert metrics["makespan_s"] == pytest.approx(27.0 - 2.0)  # p7 finishes 27, p7 starts 2
    two = {k: programs[k] for k in ("p0", "p1")}
    with pytest.raises(ValueError, match="leaves none"):
        steady_programs(ReplayResult(programs=two, makespan=1.0, total_blocks=1,
                                     pin_stats={"block_seconds": 0.0}, sched_seconds=0.0,
                                     sched_steps=1, engine_steps=1), 0.6)


@pytest.mark.engine
def test_bench_closed_loop_and_steady_state(tmp_path, capsys) -> None:
    out = tmp_path / "o"
    argv = ["bench", "--trace", "swe", "--programs", "5", "--policies", "vllm",
            "--concurrency", "1,3", "--steady", "0.2", "--no-bounds", "--out", str(out)]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["results"]
    assert [(r["jps"], r["concurrency"]) for r in rows] == [(None, 1), (None, 3)]
    assert all(r["programs"] == 3 for r in rows)  # 5 programs, one left out at each end
    assert all(r["engine_steps_per_s"] > 0 for r in rows)
    # with stderr not a terminal, each run prints a line as it ends (a log file shows progress)
    err = capsys.readouterr().err
    assert "vllm @ 3 at once: 3 programs, mean JCT" in err and "steps/s" in err
    one, three = rows
    assert three["makespan_s"] < one["makespan_s"]  # three workers finish sooner
    report = (out / "report.md").read_text()
    assert "closed loop" in report and "left out of the metrics" in report
    assert "| closed 3 |" in report
    run = json.loads((out / "runs" / "vllm-jpsclosed3.json").read_text())
    assert sum(p["measured"] for p in run["programs"]) == 3

    assert main([*argv[:-2], "--jps", "1", "--out", str(out)]) == 2
    assert "either --jps" in capsys.readouterr().err
    assert main(["bench", "--trace", "swe", "--concurrency", "0", "--out", str(out)]) == 2
    assert "at least one program" in capsys.readouterr().err
