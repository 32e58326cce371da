"""Prefetch (`continuum-prefetch`, `server.prefetch`): an evicted context comes back from host
memory before the tool call returns, through the real `EngineCore` on a virtual clock.

The engine scenario: program A's first turn ends in a 3 s tool call (the client predicts 3 s),
too long for Continuum to pin (with a host tier the reload is a PCIe load of a few ms); B and C
then take the memory, so part of A's context is evicted from the GPU (a copy stays in host
memory); B keeps decoding past A's return, so the engine steps throughout. A's second turn
arrives at the predicted return.
"""

from __future__ import annotations

import os
from contextlib import closing

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vLLM is imported (no GPU here)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from server.engine import VirtualEngine  # noqa: E402
from server.engine_spec import EngineSpec
from server.perf.registry import load_profile  # noqa: E402
from server.policies import RequestView, make_policy  # noqa: E402
from server.policies.base import AgentEvent, Hints  # noqa: E402
from server.policies.continuum_prefetch import ContinuumPrefetchPolicy  # noqa: E402
from server.policies.spec import PolicySpec

PROFILE = "h100-llama-3.1-8b"
BLOCK = 16
FIRST = list(range(8, 1008))  # A's first prompt: 1000 tokens
B_PROMPT = list(range(2000, 3200))  # 1200 tokens, then 800 decoded: runs past A's return
C_PROMPT = list(range(4000, 5500))  # 1500 tokens, 4 decoded: evicts part of A's cache
NEW = list(range(100, 200))
TOOL_S = 3.0
A_FULL_BLOCK_TOKENS = (1000 + 20 - 1) // BLOCK * BLOCK  # A's computed tokens in full blocks


def scenario(policy: str, *, a1_at: float = TOOL_S, c_output: int = 4) -> dict:
    # 257 blocks: the null block plus 4096 tokens
    with closing(VirtualEngine(PolicySpec.named(policy), EngineSpec(
            profile=PROFILE, num_gpu_blocks=257, max_model_len=2048,
            offload_gib=1.0))) as engine:
        done: dict = {}
        engine.add_request("a0", FIRST, program_id="A", output_tokens=20, tool="bash",
                           predicted_s=TOOL_S)
        while engine.has_work():
            done.update((f.request_id, f) for f in engine.step())
        t0 = engine.clock.now()
        engine.add_request("b0", B_PROMPT, program_id="B", output_tokens=800)
        engine.add_request("c0", C_PROMPT, program_id="C", output_tokens=c_output)
        a1_sent = False
        while engine.has_work() or not a1_sent:
            if not a1_sent and engine.clock.now() >= t0 + a1_at:
                engine.add_request("a1", FIRST + done["a0"].token_ids + NEW, program_id="A",
                                   output_tokens=5, last=1)
                a1_sent = True
            if not engine.has_work():
                engine.advance_to(t0 + a1_at)
                continue
            done.update((f.request_id, f) for f in engine.step())
        scheduler = engine.scheduler
        done["stats"] = scheduler.pin_stats
        done["b_finished_after_a1_arrived"] = done["b0"].finished > done["a1"].arrival
        for pid in "ABC":
            engine.event("program_end", pid)
        engine.step()
        done["pins_left"] = len(scheduler.pins)
        done["held_blocks"] = engine.held_blocks()
        return done


@pytest.fixture(scope="module")
def runs():
    return {"continuum": scenario("continuum"), "prefetch": scenario("continuum-prefetch"),
            "again": scenario("continuum-prefetch")}


@pytest.mark.engine
def test_without_prefetch_the_turn_waits_for_its_reload(runs):
    a1 = runs["continuum"]["a1"]
    assert runs["continuum"]["b_finished_after_a1_arrived"]  # the engine was busy throughout
    assert a1.cached_tokens == A_FULL_BLOCK_TOKENS
    assert a1.external_tokens > 0  # part of A's context came back from host memory, on arrival
    assert runs["continuum"]["stats"].prefetched == 0


@pytest.mark.engine
def test_prefetch_brings_the_context_back_before_the_turn_arrives(runs):
    run = runs["prefetch"]
    a1 = run["a1"]
    stats = run["stats"]
    assert stats.prefetched == 1 and stats.prefetch_dropped == 0
    assert stats.handoff == 1  # the prefetched context was pinned and handed to A's turn
    assert a1.cached_tokens == A_FULL_BLOCK_TOKENS
    assert a1.external_tokens == 0  # nothing left to load when the turn came
    without = runs["continuum"]["a1"]
    assert a1.first_token - a1.arrival < without.first_token - without.arrival
    # B and C are not slowed by more than the prefetch's one step of work
    assert run["b0"].finished == pytest.approx(runs["continuum"]["b0"].finished, rel=0.01)


@pytest.mark.engine
def test_prefetch_leaves_nothing_behind_and_repeats_exactly(runs):
    for name in ("continuum", "prefetch"):
        assert runs[name]["pins_left"] == 0
        assert runs[name]["held_blocks"] == 0
    assert runs["prefetch"]["a1"] == runs["again"]["a1"]


@pytest.mark.engine
def test_a_turn_that_comes_before_its_prefetch_is_due_needs_none():
    run = scenario("continuum-prefetch", a1_at=0.05)  # returns long before the predicted 3 s
    assert run["stats"].prefetched == 0
    assert run["a1"].cached_tokens > 0
    assert run["held_blocks"] == 0


@pytest.mark.engine
def test_a_prefetch_that_finds_no_free_memory_waits_and_the_turn_replaces_it():
    # C decodes 540 tokens too: B and C hold about 223 of 256 blocks when the prefetch is due, so it
    # waits behind every turn (taking nobody's memory) and is dropped when A's turn arrives
    run = scenario("continuum-prefetch", c_output=540)
    stats = run["stats"]
    assert stats.prefetched == 1 and stats.prefetch_dropped == 1 and stats.handoff == 0
    base = scenario("continuum", c_output=540)
    for rid in ("a1", "b0", "c0"):  # the dropped prefetch changed nothing
        assert (run[rid].first_token, run[rid].finished) == (base[rid].first_token,
                                                            base[rid].finished)
    assert run["held_blocks"] == 0 and run["pins_left"] == 0


# -- the policy's timing, worked by hand ------------------------------------------------------
def view(rid: str, pid: str, prompt: int, output: int, **hints) -> RequestView:
    return RequestView(rid, pid, arrival_time=0.0, prompt_tokens=prompt, output_tokens=output,
                       hints=Hints(**hints))


def test_prefetch_starts_at_the_predicted_return_minus_queueing_and_load():
    profile = load_profile(PROFILE)
    policy = make_policy("continuum-prefetch", cost_model=profile)
    assert isinstance(policy, ContinuumPrefetchPolicy) and policy.needs_offload
    policy.configure(max_batch_tokens=8192, total_blocks=1000, block_size=16, host_tier=True)
    policy.on_arrival(view("a0", "A", 1000, 0, turn=0), 0.0)
    policy.on_scheduled(view("a0", "A", 1000, 0), 0.0)
    pinned = policy.on_finish(view("a0", "A", 1000, 20, turn=0, tool="bash",
                                   predicted_s=10.0), 2.0)
    assert not pinned  # B = 0 + load(1020 tokens) is far below tau = 12 s
    load = profile.swap_seconds(1020)
    start = 2.0 + 10.0 - 0.0 - load - 0.1  # T_wait is 0 before any sample; 0.1 s margin
    assert policy.prefetch_due(start - 1e-6) == []
    assert policy.prefetch_due(start) == ["A"]
    assert policy.prefetch_due(start + 1.0) == []  # once per interception
    # after the load: pinned until the predicted return plus the hint slack
    assert policy.on_prefetched("A", 1019, start + 0.01)
    assert policy.deadline("A") == pytest.approx(12.0 + 0.2 * 10.0)


def test_a_new_prediction_moves_the_prefetch_and_an_arrival_cancels_it():
    policy = make_policy("continuum-prefetch")
    policy.configure(max_batch_tokens=8192, total_blocks=1000, block_size=16, host_tier=True)
    policy.on_arrival(view("a0", "A", 1000, 0, turn=0), 0.0)
    policy.on_finish(view("a0", "A", 1000, 20, turn=0, tool="bash", predicted_s=10.0), 0.0)
    policy.on_event(AgentEvent("tool_start", "A", tool="bash", predicted_s=20.0), 0.1)
    load = 4e-6 * 1020  # the documented fallback: 4 us per token from host memory
    assert policy.prefetch_due(10.0) == []
    assert policy.prefetch_due(20.0 - load - 0.1) == ["A"]
    # program B: its turn arrives before the prefetch is due, so none is made
    policy.on_arrival(view("b0", "B", 500, 0, turn=0), 0.0)
    policy.on_finish(view("b0", "B", 500, 10, turn=0, tool="bash", predicted_s=5.0), 1.0)
    policy.on_arrival(view("b1", "B", 600, 0, turn=1), 2.0)
    assert policy.prefetch_due(100.0) == []


def test_no_prediction_no_prefetch():
    policy = make_policy("continuum-prefetch")
    policy.configure(max_batch_tokens=8192, total_blocks=1000, block_size=16, host_tier=True)
    policy.on_arrival(view("a0", "A", 1000, 0, turn=0), 0.0)
    policy.on_finish(view("a0", "A", 1000, 20, turn=0, tool="bash"), 0.0)  # prior only
    assert policy.prefetch_due(1e9) == []
    assert not policy.on_prefetched("A", 1000, 5.0)
