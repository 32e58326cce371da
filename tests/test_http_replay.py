"""Wall-clock trace replay over HTTP (`eval.replay.http_replay`) against a real `harness serve`.

One emulated continuum server (started with per-request metrics, so admission times come back)
serves the whole file; a small trace (four programs, three turns, 0.2 s tools) replays in a few
seconds. What must hold: every turn is recorded with ordered timestamps and the trace's token
counts, later turns find the earlier conversation in the KV cache (pins and the prefix cache work
over HTTP), the metrics of `harness bench` come out, and a bad URL fails at once.
"""

from __future__ import annotations

import math
import time

import pytest

from common.metrics import replay_metrics
from common.processes import free_port
from common.trace import Program, Trace, Turn
from eval.replay.http_replay import (
    HttpReplayError,
    http_replay_metrics,
    isolated_jcts_over_http,
    replay_over_http,
    scale_trace,
)
from harness.server_process import ServerProcess

TOOL_S = 0.2


def small_trace() -> Trace:
    programs = []
    for n in range(4):
        turns = [Turn(input_tokens=600 + 40 * n, output_tokens=24, tool="bash",
                      tool_seconds=TOOL_S, tool_return_tokens=60),
                 Turn(input_tokens=10, output_tokens=16, tool="pytest", tool_seconds=TOOL_S,
                      tool_return_tokens=90),
                 Turn(input_tokens=0, output_tokens=12)]
        programs.append(Program(id=f"http-{n}", arrival_s=0.15 * n, turns=turns,
                                shared_prefix_tokens=256, shared_prefix_id="sys"))
    return Trace(name="http-small", programs=programs)


@pytest.fixture(scope="module")
def server():
    with ServerProcess(policy="continuum", vllm_args=["--enable-per-request-metrics"]) as s:
        yield s


@pytest.fixture(scope="module")
def trace():
    return small_trace()


@pytest.fixture(scope="module")
def result(server, trace):
    done = []
    out = replay_over_http(trace, server.base_url, progress=done.append)
    assert done == [1, 2, 3, 4]
    return out


@pytest.mark.server
@pytest.mark.slow
def test_every_turn_is_recorded_with_sane_timestamps(trace, result):
    assert set(result.programs) == {p.id for p in trace.programs}
    for program in trace.programs:
        record = result.programs[program.id]
        assert record.arrival == pytest.approx(program.arrival_s)
        assert [t.turn for t in record.turns] == [0, 1, 2]
        for i, turn in enumerate(record.turns):
            assert turn.prompt_tokens == program.context_before(i)
            assert turn.output_tokens == program.turns[i].output_tokens
            assert turn.admitted is not None  # the server gives per-request timing
            assert turn.arrival <= turn.admitted <= turn.first_token <= turn.finished
            assert turn.finished - turn.arrival < 10.0
        for before, after in zip(record.turns, record.turns[1:], strict=False):
            # the next turn is due when the tool (0.2 s) has run after the previous one
            assert after.arrival == pytest.approx(before.finished + TOOL_S)
        assert record.finished == record.turns[-1].finished
        assert record.jct > 2 * TOOL_S
    assert result.per_request_metrics
    assert result.events_dropped == 0 and result.events_sent == 4 * (1 + 2 * 2 + 1)


@pytest.mark.server
@pytest.mark.slow
def test_later_turns_reuse_the_conversation_under_continuum(trace, result):
    for program in trace.programs:
        turns = result.programs[program.id].turns
        for i in (1, 2):
            # everything computed in turn i-1 (prompt and answer, minus the last sampled token)
            # comes back from the cache, to the last full 16-token block
            computed = program.context_after(i - 1) - 1
            assert turns[i].cached_tokens >= computed // 16 * 16
            assert turns[i].recomputed_tokens < 16


@pytest.mark.server
@pytest.mark.slow
def test_metrics_come_out_as_in_the_benchmark(result):
    plain = replay_metrics(result)  # unchanged: the in-process benchmark's function
    assert plain["programs"] == 4 and plain["turns"] == 12
    assert 0 < plain["jct_mean_s"] <= plain["jct_p95_s"] <= plain["makespan_s"]
    assert plain["ttft_mean_s"] > 0 and plain["queue_mean_s"] >= 0
    assert 0.5 < plain["prefix_hit_rate"] < 1.0
    assert math.isnan(plain["pin_memory_share"])  # pins are not visible over HTTP
    metrics = http_replay_metrics(result)
    server = result.server
    # the server's own counters agree with the per-turn usage we recorded
    assert server["prefix_cache_queries"] == plain["prompt_tokens"]
    assert server["prefix_cache_hits"] == plain["prefix_hit_tokens"]
    assert server["generation_tokens"] == plain["output_tokens"]
    assert metrics["preemptions"] == 0 and metrics["engine_steps"] > 0
    assert math.isnan(metrics["sched_cpu_ms_per_step"]) and metrics["pins"] is None
    assert metrics["url"] == result.url and metrics["model"] == "llama-3.1-8b"


@pytest.mark.server
@pytest.mark.slow
def test_a_second_replay_starts_from_a_cold_cache(server, trace, result):
    again = replay_over_http(trace, server.base_url)
    assert again.run_id != result.run_id
    first = [again.programs[p.id].turns[0] for p in trace.programs]
    # the identical prompts of the first replay are not found (each replay salts the cache) ...
    assert first[0].cached_tokens == 0
    # ... but programs of one replay share their system prompt
    assert all(t.cached_tokens >= 256 for t in first[1:])


@pytest.mark.server
@pytest.mark.slow
def test_isolated_jcts_over_http(server, trace):
    two = Trace(name="two", programs=trace.programs[:2])
    isolated = isolated_jcts_over_http(two, server.base_url)
    assert set(isolated) == {"http-0", "http-1"}
    assert all(2 * TOOL_S < jct < 10.0 for jct in isolated.values())


def test_bad_url_fails_fast_and_clearly(trace):
    started = time.monotonic()
    with pytest.raises(HttpReplayError, match="no server answers at http://127.0.0.1"):
        replay_over_http(trace, f"127.0.0.1:{free_port()}")
    assert time.monotonic() - started < 5.0


@pytest.mark.server
@pytest.mark.slow
def test_a_server_that_is_not_openai_is_refused(server, trace):
    with pytest.raises(HttpReplayError, match="answered 404"):
        replay_over_http(trace, server.base_url + "/nothing-here")
    with pytest.raises(HttpReplayError, match="does not serve 'gpt-9'"):
        replay_over_http(trace, server.base_url + "/v1", model="gpt-9")


def test_time_scale_shortens_arrivals_and_tools_only(trace):
    scaled = scale_trace(trace, 0.1)
    for a, b in zip(trace.programs, scaled.programs, strict=True):
        assert b.arrival_s == pytest.approx(a.arrival_s * 0.1)
        assert [t.tool_seconds for t in b.turns] == pytest.approx(
            [t.tool_seconds * 0.1 for t in a.turns])
        assert [t.output_tokens for t in b.turns] == [t.output_tokens for t in a.turns]
        assert b.processed_tokens == a.processed_tokens
    assert scale_trace(trace, 1.0) is trace
    with pytest.raises(ValueError, match="time_scale"):
        scale_trace(trace, 0.0)


@pytest.mark.engine
@pytest.mark.server
@pytest.mark.slow
def test_harness_bench_over_http(server, tmp_path, capsys):
    """`harness bench --url`: the same sweep and outputs, replayed against the running server."""
    import json

    from cli.main import main

    out = tmp_path / "bench"
    assert main(["bench", "--trace", "swe", "--programs", "2", "--jps", "2", "--time-scale",
                 "0.05", "--policies", "continuum", "--url", server.base_url,
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == f"http {server.base_url}" and summary["time_scale"] == 0.05
    (row,) = summary["results"]
    assert row["policy"] == "continuum" and row["programs"] == 2
    assert row["prefix_hit_tokens"] > 0 and row["jct_mean_s"] > 0
    assert math.isnan(row["pin_memory_share"])  # not visible over HTTP: not invented
    assert "Wall-clock replay over HTTP" in (out / "report.md").read_text()
