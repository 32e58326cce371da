"""Hand-worked decisions of `infercept` and `augserve`, and AugServe's token budget in vLLM.

The cost model below is linear so every waste can be worked out on paper:
T_fwd(C) = C * 1e-4 s, T_swap(C) = C * 1e-5 s (one direction).
"""

from __future__ import annotations

import pytest
from vllm_driver import Driver, make_scheduler

from server.policies import AgentEvent, Hints, RequestView, make_policy
from server.policies.least_waste import SwapBudget, wastes


class LinearCost:
    def prefill_seconds(self, context_tokens: int) -> float:
        return context_tokens * 1e-4

    def swap_seconds(self, tokens: int) -> float:
        return tokens * 1e-5


def view(rid: str, program: str | None, arrival: float, prompt: int = 1000, output: int = 0,
         **kw) -> RequestView:
    return RequestView(request_id=rid, program_id=program, arrival_time=arrival,
                       prompt_tokens=prompt, output_tokens=output, **kw)


def infercept(max_batch_tokens: int = 8192):
    p = make_policy("infercept", cost_model=LinearCost())
    p.configure(max_batch_tokens=max_batch_tokens, total_blocks=1000, block_size=16)
    return p


def test_the_three_wastes_by_hand():
    # C = 1000, 3000 other running tokens, N_fwd_max = 8192, interception 1 s:
    # preserve 1 * 1000 = 1000; discard 0.1 * 1000 + 0.1 * 3000 = 400;
    # swap 2 * 0.01 * 8192 = 163.84
    w = wastes(LinearCost(), 1000, 1.0, 3000, 8192, swap_allowed=True)
    assert (w.preserve, w.discard) == pytest.approx((1000.0, 400.0))
    assert w.swap == pytest.approx(163.84)
    assert w.least() == "swap" and w.least_value() == pytest.approx(163.84)
    # 0.1 s: preserve 100 beats both
    assert wastes(LinearCost(), 1000, 0.1, 3000, 8192, True).least() == "preserve"
    # no swap budget: discard (400) beats preserve (1000)
    assert wastes(LinearCost(), 1000, 1.0, 3000, 8192, False).least() == "discard"


def test_swap_budget_is_what_pcie_moves_in_one_step():
    b = SwapBudget(LinearCost())
    assert b.fits(5000, 0.0)  # first step: the 0.05 s cap -> 5000 tokens
    b.take(5000, 0.0)
    assert not b.fits(1, 0.0)  # same step: used up
    assert b.fits(2000, 0.02) and not b.fits(2001, 0.02)  # a 20 ms step moves 2000 tokens
    assert b.fits(500, 0.021) and not b.fits(501, 0.021)  # 1 ms is clamped up to 5 ms


def test_infercept_swaps_when_the_budget_allows_and_the_waste_says_so():
    p = infercept()
    # a running turn of program R holds 3000 tokens (C_other)
    p.on_scheduled(view("r0", "R", 0.0, prompt=3000), 0.0)
    for pid in ("A", "B"):
        p.on_arrival(view(f"{pid}0", pid, 0.0), 0.0)
        p.on_scheduled(view(f"{pid}0", pid, 0.0), 0.0)
    # both finish at t = 1 with a prediction of 1 s; A: 1000 ctx, B: 4500 ctx. In this first
    # step the budget is 5000 tokens.
    hint = Hints(predicted_s=1.0)
    assert not p.on_finish(view("A0", "A", 0.0, prompt=900, output=100, hints=hint), 1.0)
    assert p.choice["A"] == "swap"  # swap 163.84 < discard 400 < preserve 1000; budget 5000
    # B (4500 ctx) would need 4500 tokens of budget, only 4000 left:
    # preserve 4500 vs discard 0.45 * (4500 + 3000) = 3375 -> discard
    assert not p.on_finish(view("B0", "B", 0.0, prompt=4400, output=100, hints=hint), 1.0)
    assert p.choice["B"] == "discard"
    assert p.reload_from_cpu(view("A1", "A", 2.0)) and not p.reload_from_cpu(view("B1", "B", 2.0))


def test_infercept_without_a_hint_preserves_then_gives_up_as_time_passes():
    p = infercept()
    p.on_scheduled(view("r0", "R", 0.0, prompt=3000), 0.0)  # C_other = 3000: discard 400
    p.on_arrival(view("A0", "A", 0.0), 0.0)
    p.on_scheduled(view("A0", "A", 0.0), 0.0)
    # no prediction: the interception is t_now - t_call = 0 at the call -> preserve (a pin)
    assert p.on_finish(view("A0", "A", 0.0, prompt=900, output=100), 10.0)
    # 0.1 s later: preserve 100 < swap 163.84 -> keep
    assert not p.pin_expired("A", 10.1, has_waiting=False)
    # 0.2 s: preserve 200 > swap 163.84 (budget 2000 >= 1000 after a 0.1 s gap clamped to
    # 0.05 s -> 5000) -> release, reload from CPU
    assert p.pin_expired("A", 10.2, has_waiting=False)
    assert p.choice["A"] == "swap"
    # a program that is already back is never released by waste: it hands off
    p.on_finish(view("B0", "B", 0.0), 11.0)
    assert not p.pin_expired("B", 99.0, has_waiting=True)


def test_infercept_a_predicted_short_call_is_preserved_until_overrun():
    p = infercept()
    p.on_scheduled(view("r0", "R", 0.0, prompt=3000), 0.0)  # C_other = 3000: discard 400
    p.on_finish(view("A0", "A", 0.0, prompt=900, output=100, hints=Hints(predicted_s=0.05)), 1.0)
    assert p.choice["A"] == "preserve"  # 50 < swap 163.84 < discard 400
    assert not p.pin_expired("A", 1.1, has_waiting=False)  # 0.1 s elapsed: 100 still less
    assert p.pin_expired("A", 1.5, has_waiting=False)  # 0.5 s overrun: 500 > 163.84


def test_infercept_orders_by_program_arrival_and_preempted_first():
    p = infercept()
    p.on_arrival(view("a0", "A", 0.0), 0.0)
    p.on_arrival(view("b0", "B", 1.0), 1.0)
    a1, b1 = view("a1", "A", 5.0), view("b1", "B", 4.0)
    assert sorted([b1, a1], key=lambda r: p.queue_key(r, 6.0)) == [a1, b1]
    assert p.queue_key(view("b2", "B", 4.5, num_preemptions=1), 6.0) < p.queue_key(a1, 6.0)


def augserve():
    p = make_policy("augserve", cost_model=LinearCost())
    p.configure(max_batch_tokens=8192, total_blocks=1000, block_size=16)
    return p


def test_augserve_stage_one_value_by_hand():
    p = augserve()
    # last turn, 1000 prompt tokens, none kept, 100 predicted output tokens:
    # prefill 0.1 s * 1000 = 100; decode 100 * 0.02 * (1000 + 50) = 2100 -> 2200
    last = view("x", "X", 0.0, hints=Hints(last=True, predicted_output_tokens=100))
    assert p.stage_value(last) == pytest.approx(2200.0)
    # the same turn followed by a 10 s API call adds the least waste for C = 1100:
    # preserve 11000, discard 0.11 * 1100 = 121 (nothing else running), swap 2*0.011*8192 =
    # 180.224 -> + 121
    mid = view("y", "Y", 0.0, hints=Hints(predicted_output_tokens=100, predicted_s=10.0))
    assert p.stage_value(mid) == pytest.approx(2321.0)


def test_augserve_puts_light_turns_first_and_ages_heavy_ones():
    p = augserve()
    heavy = view("h", "H", 0.0, prompt=8000, hints=Hints(last=True, predicted_output_tokens=1000))
    light = view("l", "L", 1.0, prompt=500, hints=Hints(last=True, predicted_output_tokens=20))
    for r in (heavy, light):
        p.on_arrival(r, r.arrival_time)
    assert p.queue_key(light, 1.0) < p.queue_key(heavy, 1.0)  # no head-of-line blocking
    assert p.queue_key(heavy, 30.0) < p.queue_key(light, 30.0)  # waited STARVE_S: goes first


def test_augserve_stage_two_corrects_output_predictions():
    p = augserve()
    first = view("a0", "A", 0.0, output=400, hints=Hints(predicted_output_tokens=100))
    p.on_scheduled(first, 0.0)
    p.on_finish(first, 1.0)
    assert p.correction["A"] == 4.0  # 400 / 100
    nxt = view("a1", "A", 2.0, hints=Hints(predicted_output_tokens=50))
    assert p.predicted_output(nxt) == 200.0
    # without a client hint the server uses the program's last output length
    assert p.predicted_output(view("a2", "A", 3.0)) == 400.0
    # the API duration is learnt from tool_end events (10 samples make the tool's own level)
    for _ in range(10):
        p.on_event(AgentEvent("tool_end", "A", tool="search", seconds=3.0), 2.0)
    assert p.predicted_api_seconds("search", None) == 3.0
    assert p.predicted_api_seconds("search", 0.5) == 0.5  # a client hint wins


def test_augserve_token_budget_follows_free_plus_paused_memory():
    p = augserve()
    assert p.token_budget(free_blocks=600, paused_blocks=0) == 8192  # 60% >= A_FULL
    assert p.token_budget(free_blocks=100, paused_blocks=200) == int(8192 * 0.6)  # 30% / 50%
    assert p.token_budget(free_blocks=10, paused_blocks=0) == 2048  # floor LOW = 25%


def test_augserve_budget_is_applied_by_the_scheduler(monkeypatch):
    d = Driver(make_scheduler("augserve", monkeypatch=monkeypatch, num_blocks=64,
                              max_batched_tokens=512))
    assert d.scheduler.agent_policy.max_batch_tokens == 512
    d.submit("A-0", list(range(8, 8 + 56 * 16)), "A", max_tokens=200)  # a 56-block prompt
    budgets = []
    for _ in range(3):
        share = d.free_blocks / d.scheduler.agent_policy.total_blocks
        d.step()
        budgets.append(d.scheduler.max_num_scheduled_tokens)
        assert budgets[-1] == int(512 * min(1.0, max(0.25, share / 0.5)))
    assert budgets[0] == 512 and budgets[-1] < 512  # the prompt filled memory: admission slows
