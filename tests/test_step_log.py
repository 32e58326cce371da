"""Step records (`server.step_log`): the batch each engine step ran, as the step-time
model prices it, and the timing around it. The served CPU engine's log is checked in
tests/test_cpu_engine.py; here the classification, the pairing of schedule and update, the
file format, and that the scheduler's record of a step is the batch the emulated executor
priced for that very step."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from server.engine import VirtualEngine
from server.engine_spec import EngineSpec
from server.policies.spec import PolicySpec
from server.step_log import (
    JsonlStepSink,
    StepLogTail,
    StepRecord,
    StepTimer,
    batch_shape,
    read_step_log,
    relative_errors,
)


def req(computed_after: int, outputs: int, tokens: int, arrival: float = 0.0):
    """A request as the scheduler holds it right after `schedule()` advanced it."""
    return SimpleNamespace(num_computed_tokens=computed_after, num_output_tokens=outputs,
                           num_tokens=tokens, arrival_time=arrival)


def test_decodes_and_prefill_chunks_are_told_apart():
    requests = {
        "first-chunk": req(512, 0, 2000),  # 512 of a 2000-token prompt
        "last-chunk": req(2000, 0, 2000),  # the rest of the prompt, 1488 tokens
        "decode": req(2031, 31, 2031),  # one token at the end of what it knows
        "recompute": req(1200, 30, 2030),  # after a preemption: outputs, but many tokens
        "one-token-prompt-tail": req(100, 0, 100),  # its last prompt token, no output yet
    }
    scheduled = {"first-chunk": 512, "last-chunk": 1488, "decode": 1, "recompute": 1200,
                 "one-token-prompt-tail": 1, "gone": 7}
    prefill, decode = batch_shape(scheduled, requests)
    assert decode == [2031]  # its context, the token being decoded included
    assert prefill == [(512, 0), (1488, 512), (1200, 0), (1, 99)]


def test_timer_pairs_each_step_and_skips_empty_passes():
    records: list[StepRecord] = []
    timer = StepTimer(records.append)
    requests = {"a": req(64, 0, 64, arrival=9.5), "b": req(301, 1, 301)}
    t0 = time.perf_counter()
    timer.scheduled(t0, 10.0, {"a": 64}, requests, ["a"], waiting=3)
    timer.updated(64, requests_left=2, update_started=time.perf_counter())
    timer.scheduled(time.perf_counter(), 10.1, {}, requests)  # an idle scheduling pass
    timer.updated(0, requests_left=2)  # ... and an update of nothing: not a step
    timer.scheduled(time.perf_counter(), 10.2, {"b": 1}, requests)
    timer.updated(1, requests_left=0)
    timer.scheduled(time.perf_counter(), 10.3, {"b": 1}, requests)
    timer.updated(1, requests_left=0)
    assert [(r.prefill, r.decode) for r in records] == [([(64, 0)], []), ([], [301]),
                                                       ([], [301])]
    assert records[0].waited == [0.5] and records[1].waited == []
    assert records[0].waiting == 3 and records[1].waiting == 0
    first = records[0]  # the parts it timed lie inside the step
    assert 0 <= first.schedule_s and 0 <= first.update_s
    assert first.schedule_s + first.update_s <= first.seconds
    assert [r.t for r in records] == [10.0, 10.2, 10.3]
    assert all(r.seconds >= 0 and r.gap >= 0 for r in records)
    # the second step followed a step that left requests: its gap is the loop's own time
    assert [r.busy for r in records] == [False, True, False]


def test_log_file_round_trip(tmp_path):
    sink = JsonlStepSink(tmp_path / "sub" / "steps.jsonl")
    sink(StepRecord(0.004, [(16, 32)], [100, 200], gap=0.0002, busy=True, t=5.0,
                    waited=[0.01]))
    sink(StepRecord(0.002, [], [101], pins={"pinned": 2, "pressure": 1}))
    back = read_step_log(tmp_path / "sub" / "steps.jsonl")
    assert back == [StepRecord(0.004, [(16, 32)], [100, 200], 0.0002, True, 5.0, [0.01]),
                    StepRecord(0.002, [], [101], pins={"pinned": 2, "pressure": 1})]
    # the model's error on each step, sorted
    errors = relative_errors(lambda prefill, decode: 0.003, back)
    assert errors == pytest.approx([0.25, 0.5])


def test_tail_reads_only_what_was_appended_and_waits_for_a_whole_line(tmp_path):
    path = tmp_path / "steps.jsonl"
    tail = StepLogTail(path)
    assert tail.new() == []  # no log yet
    sink = JsonlStepSink(path)
    sink(StepRecord(0.004, [(16, 0)], []))
    sink(StepRecord(0.002, [], [17]))
    assert [r.decode for r in tail.new()] == [[], [17]]
    assert tail.new() == []
    with path.open("a") as f:  # the writer is half-way through a line
        f.write('{"seconds":0.003,"prefill":[],')
    assert tail.new() == []
    with path.open("a") as f:
        f.write('"decode":[18]}\n')
    assert tail.new() == [StepRecord(0.003, [], [18])]


@pytest.mark.engine
def test_a_virtual_engine_runs_with_the_gpus_batch_limits(autoclose):
    """The in-process engine on the emulated H100 schedules as `vllm serve` does on one
    (8,192 tokens, 1,024 requests a step), not with the CPU platform's defaults of this host."""
    engine = autoclose(VirtualEngine(PolicySpec.named("vllm"), EngineSpec()))
    scheduler = engine.scheduler
    assert (scheduler.max_num_scheduled_tokens, scheduler.max_num_running_reqs) == (8192, 1024)


@pytest.mark.engine
def test_scheduler_records_the_batches_the_emulator_priced(autoclose, monkeypatch):
    """The step log describes a batch exactly as the emulated executor prices it, so a model
    fitted to logged steps is the model the emulator runs."""
    engine = autoclose(VirtualEngine(PolicySpec.named("continuum"), EngineSpec(
        profile="h100-llama-3.1-8b", max_num_batched_tokens=512)))
    logged: list[StepRecord] = []
    priced: list[tuple[list, list]] = []
    engine.scheduler.record_steps(logged.append)
    profile = engine.core.model_executor.profile
    price = profile.step_seconds

    def recording(prefill, decode):
        priced.append(([tuple(p) for p in prefill], list(decode)))
        return price(prefill, decode)

    monkeypatch.setattr(profile, "step_seconds", recording)
    first = list(range(8, 1208))
    engine.add_request("a0", first, program_id="A", output_tokens=12, tool="bash",
                       predicted_s=1e-4)  # short: worth pinning A's KV through it
    engine.add_request("b0", list(range(3000, 3700)), program_id="B", output_tokens=30)
    done = []
    while engine.has_work():
        done += engine.step()
    engine.add_request("a1", first + list(range(100, 400)), program_id="A",
                       output_tokens=5)
    while engine.has_work():
        done += engine.step()
    assert len(done) == 3
    assert [(r.prefill, r.decode) for r in logged] == priced
    # chunked prompts (budget 512) beside decodes, and the second turn's prefix-cache hit
    assert any(r.prefill and r.decode for r in logged)
    assert any(chunk == 300 and before >= 1200 for r in logged for chunk, before in r.prefill)
    # A's KV was pinned through its tool call and released (its TTL ran out, or its next turn
    # took it over): the log says when
    assert logged[0].pins["pinned"] == 0
    last = logged[-1].pins
    assert last["pinned"] == 1 and last["handoff"] + last["expired"] == 1


def test_served_path_is_the_latency_around_a_lone_requests_step():
    """`harness profile --device cpu --served` measures the HTTP/API-server path on requests
    sent to an idle engine: send -> start of its step, end of that step -> first token."""
    from harness.profile_served import served_path

    steps = [StepRecord(0.010, [(64, 0)], [], t=100.004, waited=[0.001]),
             StepRecord(0.003, [], [65], t=100.015),
             StepRecord(0.020, [(256, 0)], [], t=200.005, waited=[0.002])]
    lone = [(100.0, 100.016), (200.0, 200.028), (300.0, 300.01)]  # no step after the last
    path = served_path(lone, steps)
    assert path == pytest.approx({"intake_s": 0.0045, "delivery_s": 0.0025, "requests": 2})
    assert served_path([], steps) is None
