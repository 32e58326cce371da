"""TTFT tails beside the means: the per-turn P50, P95 and P99 of a replay's row, of a cluster
replay's initial and incremental prefills, and their cell in the bench report."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rich.console import Console

from common.metrics import cluster_metrics, percentile, replay_metrics
from eval.bench.report import print_table, report_markdown


def _turn(index: int, arrival: float, ttft: float) -> SimpleNamespace:
    return SimpleNamespace(turn=index, arrival=arrival, admitted=arrival,
                           first_token=arrival + ttft, finished=arrival + ttft + 1.0,
                           output_tokens=11, prompt_tokens=100, cached_tokens=0,
                           recomputed_tokens=0, reloaded_tokens=0, preemptions=0,
                           prefill_replica=None, replica=0)


#: ten turns of two programs; TTFTs 0.1 .. 1.0 s, the first turn of each 0.1 and 0.6 s
TTFTS = [0.1 * (i + 1) for i in range(10)]


def _result() -> SimpleNamespace:
    programs = {}
    for p in range(2):
        turns = [_turn(i, 10.0 * i, TTFTS[5 * p + i]) for i in range(5)]
        programs[f"p{p}"] = SimpleNamespace(program_id=f"p{p}", arrival=0.0, finished=50.0,
                                            jct=50.0, turns=turns)
    return SimpleNamespace(programs=programs, makespan=50.0, pin_stats={"block_seconds": 0.0},
                           total_blocks=100, engine_steps=1, sched_steps=1, sched_seconds=0.0,
                           router="r", replicas=[])


def test_a_rows_ttft_tail_is_the_percentile_of_its_turns() -> None:
    row = replay_metrics(_result())
    assert row["ttft_mean_s"] == pytest.approx(0.55)
    # linear interpolation over the ten sorted TTFTs: P95 sits 0.55 of the way from 0.9 to 1.0
    assert row["ttft_p50_s"] == pytest.approx(0.55)
    assert row["ttft_p95_s"] == pytest.approx(0.955)
    assert row["ttft_p99_s"] == pytest.approx(0.991)
    assert row["ttft_p99_s"] == pytest.approx(percentile(TTFTS, 99))


def test_a_cluster_row_has_the_tail_of_each_prefill_kind() -> None:
    row = cluster_metrics(_result())
    first = [0.1, 0.6]
    later = [t for i, t in enumerate(TTFTS) if i % 5]
    for name, values in (("initial", first), ("incremental", later)):
        for q in (50, 95, 99):
            assert row[f"ttft_{name}_p{q}_s"] == pytest.approx(percentile(values, q))


def _summary(row: dict) -> dict:
    return {"trace_name": "t", "programs": 2, "profile": "h100-llama-3.1-8b", "seed": 0,
            "isolated_jct_mean_s": 1.0, "wall_s": 1.0, "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
            "results": [row]}


def test_the_report_shows_mean_p95_and_p99_in_one_ttft_cell(capsys) -> None:
    row = {"policy": "vllm", "jps": 1.0, "jct_mean_s": 50.0, "jct_p95_s": 50.0,
           "ttft_mean_s": 0.55, "ttft_p95_s": 0.955, "ttft_p99_s": 0.991}
    text = report_markdown(_summary(row))
    assert "| TTFT s mean / P95 / P99 |" in text
    assert "| 0.550 / 0.955 / 0.991 |" in text
    # a row without the tail (an old summary.json) still reads
    del row["ttft_p99_s"]
    assert "| 0.550 / 0.955 / - |" in report_markdown(_summary(row))
    print_table(_summary(row), Console(width=400))
    assert "0.550 / 0.955 / -" in capsys.readouterr().out
