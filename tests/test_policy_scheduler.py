"""PolicyScheduler on the real vLLM v1 scheduler, block pool and prefix cache (CPU, no GPU).

Each test plays a small agent workload through `vllm_driver.Driver` on a virtual clock and
checks the retention mechanics the Continuum policy relies on.
"""

from __future__ import annotations

import random
import time

import pytest
from vllm_driver import Driver, make_scheduler

from server.intake.events import EventSender, read_status
from server.policies import AgentEvent
from server.policies.base import UNPIN_REASONS
from server.policies.continuum import MIN_SAMPLES, ContinuumPolicy
from server.settings import ServeOptionsError
from sim.loop import pin_counters

pytestmark = pytest.mark.engine
BLOCK = 16


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(8, 30000) for _ in range(n)]


@pytest.fixture
def events_address(tmp_path, monkeypatch):
    address = f"ipc://{tmp_path}/events.sock"
    monkeypatch.setenv("HARNESS_EVENTS_IPC", address)
    return address


def continuum_driver(monkeypatch, t_wait_s: float = 5.0, name: str = "continuum",
                     **kw) -> Driver:
    """A driver whose policy believes queueing costs `t_wait_s` per evicted turn, and whose
    tool "ls" always takes 0.5 s: the utility model then pins for exactly 0.5 s."""
    scheduler = make_scheduler(name, **kw)
    policy_cls: type[ContinuumPolicy] = type(scheduler.agent_policy)  # type: ignore[assignment]
    policy = policy_cls(cost_model=scheduler.agent_policy.cost_model, t_wait_default_s=t_wait_s)
    for _ in range(MIN_SAMPLES):
        policy.durations.observe("ls", 0.5)
    scheduler.agent_policy = policy
    return Driver(scheduler)


def deliver(driver: Driver, address: str, *events: dict) -> None:
    """Send events over the real side channel and step until the scheduler has taken them."""
    sender = EventSender(address)
    before = driver.scheduler.events_received
    sender.send(list(events))
    deadline = time.monotonic() + 5
    while driver.scheduler.events_received < before + len(events):
        assert time.monotonic() < deadline, "events never reached the scheduler"
        time.sleep(0.01)
        driver.scheduler.schedule()  # an empty step drains the channel
    sender.close()


def first_turn(driver: Driver, program: str = "A", n: int = 100, seed: int = 1) -> list[int]:
    tokens = prompt(seed, n)
    driver.submit(f"{program}-0", tokens, program, max_tokens=4, tool="ls")
    driver.run_until_finished(f"{program}-0")
    return tokens + driver.turns[f"{program}-0"].output


def test_pin_on_tool_call_then_reuse_and_handoff(monkeypatch):
    d = continuum_driver(monkeypatch)
    context = first_turn(d)
    pin = d.scheduler.pins["A"]
    assert len(pin.blocks) == -(-103 // BLOCK)  # 100 prompt + 3 computed output tokens
    assert d.free_blocks == d.total_blocks - len(pin.blocks)
    assert d.scheduler.agent_policy.deadline("A") == pytest.approx(pin.pinned_at + 0.5)

    d.advance(0.3)  # the tool returns inside its TTL
    d.submit("A-1", context + prompt(2, 40), "A", max_tokens=4)
    out = d.step()
    new = {n.req_id: n for n in out.scheduled_new_reqs}
    # every full block of the first turn's context is reused, not recomputed
    assert new["A-1"].num_computed_tokens == (len(context) - 1) // BLOCK * BLOCK
    assert "A" not in d.scheduler.pins and d.scheduler.pin_stats.handoff == 1


def test_ttl_expiry_releases_blocks(monkeypatch):
    d = continuum_driver(monkeypatch)
    first_turn(d)
    d.advance(0.4)
    d.scheduler.schedule()
    assert "A" in d.scheduler.pins
    d.advance(0.2)  # past pinned_at + 0.5
    d.scheduler.schedule()
    assert "A" not in d.scheduler.pins and d.scheduler.pin_stats.expired == 1
    assert d.free_blocks == d.total_blocks


def test_expiry_held_back_while_program_waits(monkeypatch):
    d = continuum_driver(monkeypatch, max_num_seqs=2)
    context = first_turn(d)
    # two long requests of other programs take both running slots
    d.submit("X-0", prompt(5, 20), "X", max_tokens=40)
    d.submit("Y-0", prompt(6, 20), "Y", max_tokens=40)
    d.step()
    d.submit("A-1", context + prompt(2, 10), "A", max_tokens=4)
    d.advance(2.0)  # far past the TTL, but A's next turn is waiting
    for _ in range(5):
        d.step()
        assert "A" in d.scheduler.pins
    assert d.scheduler.pin_stats.expired == 0
    d.run_until_finished("A-1")
    assert d.scheduler.pin_stats.handoff == 1


def test_unpin_on_program_end(monkeypatch, events_address):
    """...and the status file the API server shows (`GET /v1/agent/events`, `/metrics`)
    follows the pin: made when the turn ends, released by the event."""
    d = continuum_driver(monkeypatch)
    first_turn(d)
    pinned = read_status(events_address)
    assert pinned["pinned_now"] == 1 and pinned["pins"]["pinned"] == 1, pinned
    # what a long run watches for leaks (`harness eval soak`): the blocks, the oldest pin's
    # clock time, and no program table under a policy without one
    pin = d.scheduler.pins["A"]
    assert pinned["pinned_blocks"] == len(pin.blocks) > 0
    assert pinned["oldest_pin_at"] == pin.pinned_at and pinned["programs_tracked"] is None
    deliver(d, events_address, {"type": "program_end", "program_id": "A"})
    assert "A" not in d.scheduler.pins and d.scheduler.pin_stats.program_end == 1
    assert d.free_blocks == d.total_blocks
    d.step()  # the status is written after each step's outputs
    ended = read_status(events_address)
    assert ended["pinned_now"] == 0 and ended["pins"]["program_end"] == 1, ended
    assert ended["pinned_blocks"] == 0 and ended["oldest_pin_at"] is None
    assert ended["events_received"] == 1
    d.scheduler.shutdown()
    assert read_status(events_address) is None  # gone with the scheduler


def test_tool_start_event_recomputes_ttl(monkeypatch, events_address):
    d = continuum_driver(monkeypatch)
    policy = d.scheduler.agent_policy
    for _ in range(MIN_SAMPLES):
        policy.durations.observe("pytest", 30.0)  # far longer than pinning is worth
    first_turn(d)
    assert "A" in d.scheduler.pins
    deliver(d, events_address, {"type": "tool_start", "program_id": "A", "tool": "pytest"})
    d.scheduler.schedule()
    assert "A" not in d.scheduler.pins and d.scheduler.pin_stats.expired == 1


def test_memory_pressure_releases_latest_program_pin(monkeypatch):
    d = continuum_driver(monkeypatch, num_blocks=24)
    first_turn(d, "A", n=100, seed=1)  # 7 blocks
    d.advance(0.01)
    first_turn(d, "B", n=100, seed=3)  # 7 blocks, program B arrived later
    assert set(d.scheduler.pins) == {"A", "B"}
    # C needs 10 blocks; only 23 - 14 = 9 are free: one pin must go, and it is B's
    d.submit("C-0", prompt(4, 150), "C", max_tokens=2)
    d.run_until_finished("C-0")
    assert d.scheduler.pin_stats.pressure == 1
    assert set(d.scheduler.pins) == {"A", "C"} or set(d.scheduler.pins) == {"A"}


def test_every_unpin_reason_is_counted_and_summed_by_the_benchmark(monkeypatch):
    """The reasons are written once (`UnpinReason`); each is a `PinStats` counter that the
    virtual-time loop sums over replicas: giving pins up for any reason counts it there."""
    from server.scheduler import PinStats  # vLLM: start-up cost, not at collection
    assert set(UNPIN_REASONS) <= set(PinStats().counts()) <= set(pin_counters())
    d = continuum_driver(monkeypatch)
    for reason in UNPIN_REASONS:
        first_turn(d, f"P-{reason}", n=40, seed=len(reason))
        assert f"P-{reason}" in d.scheduler.pins
        d.scheduler.release_all_pins(reason)
        assert getattr(d.scheduler.pin_stats, reason) >= 1 and not d.scheduler.pins


def test_pinned_program_goes_before_older_unpinned_program(monkeypatch):
    d = continuum_driver(monkeypatch, max_num_seqs=1)
    d.submit("OLD-0", prompt(9, 30), "OLD", max_tokens=2)  # program OLD arrived first...
    d.run_until_finished("OLD-0")
    d.scheduler.release_all_pins("reset")
    context = first_turn(d, "A")
    d.submit("OLD-1", prompt(10, 30), "OLD", max_tokens=2)
    d.submit("A-1", context + prompt(2, 10), "A", max_tokens=2)
    out = d.step()
    assert [n.req_id for n in out.scheduled_new_reqs] == ["A-1"]


@pytest.mark.parametrize("policy", ["vllm", "continuum", "continuum-code", "discard", "preserve",
                                    "autellix", "infercept", "ampd", "thunderagent",
                                    "lookahead"])
def test_random_workload_always_progresses_and_leaks_no_block(monkeypatch, policy):
    rng = random.Random(7)
    if policy.startswith("continuum"):
        d = continuum_driver(monkeypatch, t_wait_s=2.0, name=policy, num_blocks=96,
                             max_num_seqs=8)
    else:
        d = Driver(make_scheduler(policy, num_blocks=96,
                                  max_num_seqs=8))
    programs = {f"P{i}": {"turns": rng.randint(1, 5), "done": 0, "ctx": prompt(100 + i,
                rng.randint(20, 300)), "ready_at": rng.uniform(0, 2), "inflight": None}
                for i in range(24)}
    steps = 0
    while any(p["done"] < p["turns"] for p in programs.values()):
        steps += 1
        assert steps < 20000, "the engine stopped making progress"
        now = d.clock.now() - 1000.0
        for name, p in programs.items():
            rid = p["inflight"]
            if rid is not None and rid in d.finished:
                p["ctx"] = p["ctx"] + d.turns[rid].output + prompt(rng.random(), 16)
                p["done"] += 1
                p["inflight"] = None
                p["ready_at"] = now + rng.choice([0.1, 0.5, 0.5, 3.0])
            if rid is None and p["done"] < p["turns"] and now >= p["ready_at"]:
                rid = f"{name}-{p['done']}"
                d.submit(rid, p["ctx"], name, max_tokens=rng.randint(1, 12), tool="ls",
                         last=p["done"] == p["turns"] - 1)
                p["inflight"] = rid
        if d.scheduler.has_requests():
            d.step()
        else:
            d.advance(0.05)
    # drain: every pin ends by expiry or hand-off, and every block comes back
    d.advance(60.0)
    d.scheduler.schedule()
    assert not d.scheduler.pins
    assert d.free_blocks == d.total_blocks
    if policy in ("continuum", "continuum-code", "preserve"):
        assert d.scheduler.pin_stats.pinned > 0 and d.scheduler.pin_stats.handoff > 0


def pressure_run(monkeypatch, name: str) -> Driver:
    """A pinned (TTL 5 s) while B and C run and D's 200-token prompt does not fit.

    24 blocks, 23 usable: A's pin 7 (103 tokens), B and C 3 each (48 tokens) -> 10 free < 13
    for D."""
    scheduler = make_scheduler(name, num_blocks=24)
    policy = type(scheduler.agent_policy)(cost_model=scheduler.agent_policy.cost_model,
                                          t_wait_default_s=50.0)
    for _ in range(MIN_SAMPLES):
        policy.durations.observe("ls", 5.0)  # B ~ 50 s: U(5) > 0, pin for 5 s
    scheduler.agent_policy = policy
    d = Driver(scheduler)
    first_turn(d)
    d.submit("B-0", prompt(3, 48), "B", max_tokens=300)
    d.submit("C-0", prompt(4, 48), "C", max_tokens=300)
    d.step()
    d.submit("D-0", prompt(5, 200), "D", max_tokens=2)
    d.step()
    return d


def test_continuum_gives_up_a_pin_on_any_failed_allocation(monkeypatch):
    d = pressure_run(monkeypatch, "continuum")
    assert "A" not in d.scheduler.pins and d.scheduler.pin_stats.pressure == 1
    assert "D-0" in {r.request_id for r in d.scheduler.running}


def test_continuum_code_preempts_the_latest_program_and_keeps_the_pin(monkeypatch):
    d = pressure_run(monkeypatch, "continuum-code")
    assert "A" in d.scheduler.pins and d.scheduler.pin_stats.pressure == 0
    assert "D-0" not in {r.request_id for r in d.scheduler.running}  # waits: B and C run
    # A's next turn finds its pin (reused blocks) and is admitted last: vLLM alone would
    # preempt it first (the end of its running list); the rule preempts C's instead
    d.submit("A-1", list(d.turns["A-0"].request.all_token_ids) + prompt(2, 8), "A", max_tokens=300)
    d.step()
    assert [r.request_id for r in d.scheduler.running] == ["B-0", "C-0", "A-1"]  # admitted
    d.step()  # sorted at the top of the next step: program arrival A < B < C
    assert [r.request_id for r in d.scheduler.running] == ["A-1", "B-0", "C-0"]
    requests = d.scheduler.requests
    for _ in range(300):  # the three grow until a decode finds no free block
        d.step()
        if any(r.num_preemptions for r in requests.values()):
            break
    preempted = [rid for rid, r in requests.items() if r.num_preemptions]
    assert preempted == ["C-0"]  # the latest-arrived program's running request
    assert d.scheduler.pin_stats.pressure == 0  # no pin was given up while others ran


def test_a_profile_that_does_not_load_stops_the_scheduler_naming_it(monkeypatch, tmp_path):
    """Not a scheduler whose policy quietly runs without its cost model."""
    with pytest.raises(ServeOptionsError, match=r"profile 'h100-llama-3\.1-8x' .*unknown"):
        make_scheduler("continuum", profile="h100-llama-3.1-8x")
    table = tmp_path / "measured.json"
    table.write_text("{")
    with pytest.raises(ServeOptionsError, match=r"measured\.json.*not valid JSON"):
        make_scheduler("augserve", profile=str(table))



def test_a_program_scheduler_holds_back_a_paused_programs_turn_while_memory_is_free(
        monkeypatch):
    """ThunderAgent on 64 blocks (63 usable: 1,008 tokens): A and B (300 tokens + 100 each)
    are admitted, C (800 more) does not fit and waits although the blocks it needs are free;
    when A ends, the next decision admits it."""
    d = Driver(make_scheduler("thunderagent", num_blocks=64))
    for name, seed in (("A", 1), ("B", 2), ("C", 3)):
        d.submit(f"{name}-0", prompt(seed, 300), name, max_tokens=2)
    out = d.step()
    scheduled = {n.req_id for n in out.scheduled_new_reqs}
    assert scheduled == {"A-0", "B-0"}
    assert d.free_blocks > 300 // BLOCK  # C would fit: the gate, not memory, holds it
    d.run_until_finished("A-0")
    d.run_until_finished("B-0")
    assert "C-0" not in d.finished
    d.scheduler.handle_event(AgentEvent("program_end", "A"), d.clock.now())
    d.advance(6.0)  # the next tick
    d.run_until_finished("C-0")
    assert d.scheduler.pin_stats.gate_overridden == 0


def test_an_idle_engine_admits_a_held_turn_rather_than_stall():
    """ThunderAgent on 1,008 tokens: A and B (400 tokens + 100 each, then 2 of output) are
    admitted and go into tool calls; C (300 + 100 more) does not fit its accounting, and its
    next decision comes only at the tick. With nothing running the gate would idle the
    engine, so the scheduler admits C anyway and counts the override."""
    d = Driver(make_scheduler("thunderagent", num_blocks=64))
    d.submit("A-0", prompt(1, 400), "A", max_tokens=2)
    d.submit("B-0", prompt(2, 400), "B", max_tokens=2)
    d.run_until_finished("A-0")
    d.run_until_finished("B-0")
    d.submit("C-0", prompt(3, 300), "C", max_tokens=2)
    d.run_until_finished("C-0")
    assert d.scheduler.pin_stats.gate_overridden >= 1


def test_a_held_turn_whose_client_went_away_frees_its_programs_slot(monkeypatch):
    """ThunderAgent holds C back (A and B fill the 1,008 tokens); C's client goes away (the
    API server aborts its request): the program is forgotten, nothing of it stays queued."""
    d = Driver(make_scheduler("thunderagent", num_blocks=64))
    for name, seed in (("A", 1), ("B", 2), ("C", 3)):
        d.submit(f"{name}-0", prompt(seed, 300), name, max_tokens=2)
    d.step()
    programs = d.scheduler.agent_policy.programs
    assert "C" in programs.table and not programs.may_run("C")
    from vllm.v1.request import RequestStatus
    d.scheduler.finish_requests("C-0", RequestStatus.FINISHED_ABORTED)
    assert "C" not in programs.table


def test_a_program_scheduler_is_told_the_blocks_the_engine_holds():
    """`lookahead` on real vLLM: A's first turn (320 tokens, then 2 of output) runs and its KV
    is kept through the tool call (a pin). The occupancy sample taken before the next step's
    admission has what the engine held then: A's blocks, counted by vLLM's block pool."""
    d = Driver(make_scheduler("lookahead", num_blocks=64))
    d.submit("A-0", prompt(1, 320), "A", max_tokens=2)
    d.run_until_finished("A-0")
    held = d.total_blocks - d.free_blocks
    assert held >= 320 // BLOCK  # the pin
    d.advance(6.0)  # past the sampling period
    d.submit("B-0", prompt(2, 100), "B", max_tokens=2)
    d.step()
    _, sample = d.scheduler.agent_policy.occupancy[-1]
    assert sample["in_use"] == held * BLOCK


def test_a_program_moved_away_leaves_nothing_held_here(events_address):
    """`lookahead` on real vLLM: A's first turn runs and its KV is kept through the tool call
    (a pin, A active in the program table). A cluster router then sends A's next turns to
    another replica: `program_moved`, over the real side channel, releases the pin (counted
    as `moved`) and forgets A here without learning a program length from it (A ran one
    turn here, not its whole life)."""
    d = Driver(make_scheduler("lookahead", num_blocks=64))
    d.submit("A-0", prompt(1, 320), "A", max_tokens=2)
    d.run_until_finished("A-0")
    programs = d.scheduler.agent_policy.programs
    assert "A" in d.scheduler.pins and programs.table.get("A").active
    deliver(d, events_address, {"type": "program_moved", "program_id": "A"})
    assert "A" not in d.scheduler.pins and d.scheduler.pin_stats.moved == 1
    assert d.free_blocks == d.total_blocks
    assert programs.table.get("A") is None and not programs.estimates.lengths.lengths


def test_a_program_scheduler_is_told_what_each_programs_turns_still_allocate():
    """`lookahead` on real vLLM: before each step's admission it is told, per program, the
    tokens its turns have still to take blocks for. A's first turn (320 tokens + 2 of output)
    is pinned through the tool call, so A's next turn (that context + 40 new tokens) has only
    its 40 new tokens to allocate; B's first turn, 100 tokens, all of them."""
    d = Driver(make_scheduler("lookahead", num_blocks=64))
    first = prompt(1, 320)
    d.submit("A-0", first, "A", max_tokens=2)
    d.run_until_finished("A-0")
    pinned = d.scheduler.pins["A"].tokens
    d.submit("A-1", first + [11, 12] + prompt(3, 40), "A", max_tokens=2)
    d.submit("B-0", prompt(2, 100), "B", max_tokens=2)
    d.step()
    ahead = d.scheduler.agent_policy.programs.engine.ahead
    assert ahead == {"A": 320 + 2 + 40 - pinned, "B": 100}
    assert 320 + 2 + 40 - pinned <= 42
