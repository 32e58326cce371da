"""Hand-worked decisions of discard, preserve and autellix, and their mechanics in vLLM."""

from __future__ import annotations

import pytest
from vllm_driver import Driver, make_scheduler

from server.policies import AgentEvent, Hints, RequestView, make_policy


def view(rid: str, program: str, arrival: float, **kw) -> RequestView:
    return RequestView(request_id=rid, program_id=program, arrival_time=arrival,
                       prompt_tokens=100, **kw)


def test_discard_keeps_program_arrival_order():
    p = make_policy("discard")
    p.on_arrival(view("a0", "A", 0.0), 0.0)
    p.on_arrival(view("b0", "B", 1.0), 1.0)
    # A comes back from a tool at t=5, after B's second turn arrived at t=4
    a1, b1 = view("a1", "A", 5.0), view("b1", "B", 4.0)
    assert not p.on_finish(view("a0", "A", 0.0), 2.0)  # nothing is kept
    assert sorted([b1, a1], key=lambda r: p.queue_key(r, 6.0)) == [a1, b1]
    preempted = view("b2", "B", 4.5, num_preemptions=1)
    assert p.queue_key(preempted, 6.0) < p.queue_key(a1, 6.0)


def test_preserve_pins_until_program_end_and_not_the_last_turn():
    p = make_policy("preserve")
    p.on_arrival(view("a0", "A", 0.0), 0.0)
    assert p.on_finish(view("a0", "A", 0.0), 1.0)
    assert not p.pin_expired("A", 1e9, has_waiting=False)  # no TTL: the whole interception
    assert not p.on_finish(view("a5", "A", 0.0, hints=Hints(last=True)), 2.0)
    p.on_event(AgentEvent("program_end", "A"), 3.0)
    assert p.pin_expired("A", 3.0, has_waiting=False)
    assert not p.on_finish(view("a6", "A", 0.0), 4.0)  # a late turn of an ended program


def test_preserve_victim_is_latest_arrived_program():
    p = make_policy("preserve")
    for pid, t in (("A", 0.0), ("B", 2.0), ("C", 1.0)):
        p.on_arrival(view(f"{pid}0", pid, t), t)
    assert p.pin_victim(["A", "B", "C"]) == "B"


def test_autellix_levels_and_least_attained_service_first():
    p = make_policy("autellix")
    assert [p.level(s) for s in (0.0, 0.49, 0.5, 0.99, 1.0, 2.0, 1e6)] == [0, 0, 1, 1, 2, 3, 9]
    # program A has run 3 s (level 3), program B 0.2 s (level 0)
    for pid, seconds in (("A", 3.0), ("B", 0.2)):
        first = view(f"{pid}0", pid, 0.0 if pid == "A" else 1.0)
        p.on_arrival(first, first.arrival_time)
        p.on_scheduled(first, 10.0)
        p.on_finish(first, 10.0 + seconds)
    a1, b1 = view("a1", "A", 20.0), view("b1", "B", 21.0)
    assert p.queue_key(b1, 22.0) < p.queue_key(a1, 22.0)  # B attained less, despite arriving later
    # starvation guard: A has waited more than max(10 s, 2 x 3 s) -> level 0, and A arrived first
    assert p.queue_key(a1, 31.0) < p.queue_key(b1, 31.0)


def test_autellix_demotes_a_running_program_when_it_crosses_a_boundary():
    p = make_policy("autellix")
    # A arrived at 0 and already attained 0.3 s (a finished turn); B arrived at 1, new
    a0 = view("a0", "A", 0.0)
    p.on_arrival(a0, 0.0)
    p.on_scheduled(a0, 0.0)
    p.on_finish(a0, 0.3)
    a1, b0 = view("a1", "A", 9.0), view("b0", "B", 1.0)
    p.on_arrival(b0, 1.0)
    for r in (a1, b0):
        p.on_scheduled(r, 10.0)  # both running from t = 10
    # t = 10.1: A 0.3 + 0.1 = 0.4 s, B 0.1 s: both level 0, A first (earlier program)
    assert p.attained("A", 10.1) == pytest.approx(0.4)
    assert sorted([b0, a1], key=lambda r: p.running_key(r, 10.1)) == [a1, b0]
    # t = 10.25: A 0.55 s >= Q0 = 0.5 -> level 1 while its turn runs; B 0.25 s, level 0.
    # A drops behind B: served after it, and the first vLLM preempts (the end of the batch)
    assert p.running_key(a1, 10.25)[0] == 1 and p.running_key(b0, 10.25)[0] == 0
    assert sorted([a1, b0], key=lambda r: p.running_key(r, 10.25)) == [b0, a1]
    # a waiting turn of A (a parallel call) sees the live service too: level 1
    assert p.queue_key(view("a2", "A", 10.2), 10.25)[1] == 1
    # the finished turn's service is kept: 0.3 + 0.5 = 0.8 s, and nothing runs any more
    p.on_finish(a1, 10.5)
    assert p.attained("A", 20.0) == pytest.approx(0.8)


@pytest.mark.engine
def test_autellix_in_the_scheduler_reorders_the_running_batch(monkeypatch):
    d = Driver(make_scheduler("autellix", num_blocks=64))
    d.submit("A-0", list(range(8, 40)), "A", max_tokens=100)
    d.step()
    d.submit("B-0", list(range(100, 132)), "B", max_tokens=100)
    d.step()
    assert [r.request_id for r in d.scheduler.running] == ["A-0", "B-0"]
    d.scheduler.agent_policy.service["A"] = 0.49  # as if A had run 0.49 s before
    d.step()  # A's running turn adds >= 0.01 s: 0.5 s, level 1 -> behind B
    assert [r.request_id for r in d.scheduler.running] == ["B-0", "A-0"]


@pytest.mark.engine
def test_preserve_in_the_scheduler_hands_off_and_releases_under_pressure(monkeypatch):
    d = Driver(make_scheduler("preserve", num_blocks=24))
    prompt_a = list(range(8, 108))
    d.submit("A-0", prompt_a, "A", max_tokens=4)
    d.run_until_finished("A-0")
    assert "A" in d.scheduler.pins
    d.advance(100.0)
    d.scheduler.schedule()
    assert "A" in d.scheduler.pins  # no expiry by time
    d.submit("C-0", list(range(500, 820)), "C", max_tokens=2)  # 20 blocks: A's pin must go
    d.run_until_finished("C-0")
    assert d.scheduler.pin_stats.pressure == 1
    d.advance(1.0)
    d.scheduler.schedule()
    d.scheduler.release_all_pins("reset")
    assert d.free_blocks == d.total_blocks
