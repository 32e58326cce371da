"""Hand-worked decisions of `infercept` and `augserve`, and AugServe's token budget in vLLM.

The cost model below is linear so every waste can be worked out on paper:
T_fwd(C) = C * 1e-4 s, T_swap(C) = C * 1e-5 s (one direction), so one step's swap budget
(the 0.05 s cap on the step interval) is 0.05 / 1e-5 = 5000 tokens.
"""

from __future__ import annotations

import pytest
from vllm_driver import Driver, make_scheduler

from server.policies import AgentEvent, Hints, RequestView, make_policy
from server.policies.least_waste import SwapBudget, Wastes, assign, chunked_recompute_waste, wastes


class LinearCost:
    def prefill_seconds(self, context_tokens: int) -> float:
        return context_tokens * 1e-4

    def swap_seconds(self, tokens: int) -> float:
        return tokens * 1e-5


class SlowLink(LinearCost):
    """PCIe 100x slower: a step's budget is 0.05 / 1e-3 = 50 tokens, so nothing is swapped."""

    def swap_seconds(self, tokens: int) -> float:
        return tokens * 1e-3


def view(rid: str, program: str | None, arrival: float, prompt: int = 1000, output: int = 0,
         **kw) -> RequestView:
    return RequestView(request_id=rid, program_id=program, arrival_time=arrival,
                       prompt_tokens=prompt, output_tokens=output, **kw)


def infercept(max_batch_tokens: int = 400, cost=None):
    p = make_policy("infercept", cost_model=cost or LinearCost())
    p.configure(max_batch_tokens=max_batch_tokens, total_blocks=1000, block_size=16)
    return p


def test_the_three_wastes_by_hand():
    # C = 1000 tokens, interception 1 s, C_batch = 3000 tokens of KV running, chunks of 400.
    # preserve (Eq. 2): 1 * 1000 = 1000
    # discard (Eq. 4): chunks end at 400, 800, 1000 tokens, taking 0.04, 0.04, 0.02 s:
    #   0.04 * 400 + 0.04 * 800 + 0.02 * 1000 = 16 + 32 + 20 = 68
    #   (the unchunked Eq. 1 would be 0.1 * (1000 + 3000) = 400: the others no longer stall)
    # swap (Eq. 3): 2 * T_swap(1000) * C_batch = 2 * 0.01 * 3000 = 60 (not the token budget)
    w = wastes(LinearCost(), 1000, 1.0, 3000, 400)
    assert (w.preserve, w.discard, w.swap) == pytest.approx((1000.0, 68.0, 60.0))
    assert w.without_swap() == pytest.approx(68.0) and w.preserve_or_discard() == "discard"
    # one chunk covering the context: T_fwd(C) * C = 0.1 * 1000 = 100
    assert chunked_recompute_waste(LinearCost(), 1000, 8192) == pytest.approx(100.0)
    # 0.05 s: preserve 50 < discard 68
    assert wastes(LinearCost(), 1000, 0.05, 3000, 400).preserve_or_discard() == "preserve"
    assert wastes(LinearCost(), 1000, 1.0, 0, 400).swap == 0.0  # nothing running waits


def test_eq5_swaps_the_most_wasteful_within_the_budget():
    # Budget 5000 tokens. Given in finish order:
    #   A 1000 tokens, otherwise-waste min(1000, 68) = 68
    #   B 4500 tokens, otherwise-waste 1101
    #   D  600 tokens, otherwise-waste min(200, 300) = 200
    #   E  400 tokens, otherwise-waste min(10, 50) = 10
    # Sorted by waste: B (swap, 500 left), D (600 > 500: preserve, its smaller waste),
    # A (1000 > 500: discard, 68 < 1000), E (400 <= 500: swap, 100 left).
    # First come, first served would have swapped A and left B without budget.
    out = assign([("A", 1000, Wastes(1000, 68, 0)), ("B", 4500, Wastes(4500, 1101, 0)),
                  ("D", 600, Wastes(200, 300, 0)), ("E", 400, Wastes(10, 50, 0))], 5000)
    assert out == {"B": "swap", "D": "preserve", "A": "discard", "E": "swap"}
    # nothing to save (a call that has just started, no prediction): no swap
    assert assign([("A", 10, Wastes(0.0, 5.0, 0))], 5000) == {"A": "preserve"}


def test_swap_budget_is_what_pcie_moves_in_one_step():
    b = SwapBudget(LinearCost())
    assert b.available(0.0) == 5000  # first step: the 0.05 s cap
    b.take(5000, 0.0)
    assert b.available(0.0) == 0  # same step: used up
    assert b.available(0.02) == 2000  # a 20 ms step moves 2000 tokens
    assert b.available(0.021) == 500  # 1 ms is clamped up to 5 ms


def test_infercept_assigns_one_steps_interceptions_together():
    p = infercept()  # chunks of 400 tokens
    p.on_scheduled(view("r0", "R", 0.0, prompt=3000), 0.0)  # C_batch = 3000
    for pid, prompt in (("A", 900), ("B", 4400)):
        p.on_arrival(view(f"{pid}0", pid, 0.0, prompt=prompt), 0.0)
        p.on_scheduled(view(f"{pid}0", pid, 0.0, prompt=prompt), 0.0)
    # A (1000 ctx) then B (4500 ctx) finish at t = 1 with a 1 s prediction: both are held
    # until the next step, whose assignment sorts them together.
    hint = Hints(predicted_s=1.0)
    assert p.on_finish(view("A0", "A", 0.0, prompt=900, output=100, hints=hint), 1.0)
    assert p.on_finish(view("B0", "B", 0.0, prompt=4400, output=100, hints=hint), 1.0)
    # next step, t = 1.01 (first budget: 5000 tokens), T_int = 1 s:
    #   A: preserve 1000, discard 68 (as above)             -> otherwise 68
    #   B: preserve 4500, discard: 11 chunks, 0.04 s each for 400 .. 4400, then 0.01 s to 4500:
    #      0.04 * 400 * (1 + ... + 11) + 0.01 * 4500 = 16 * 66 + 45 = 1101 -> otherwise 1101
    # B first: 4500 <= 5000 -> swap (500 left); A: 1000 > 500 -> discard (68 < 1000)
    assert p.pin_expired("B", 1.01, has_waiting=False)
    assert p.pin_expired("A", 1.01, has_waiting=False)
    assert (p.choice["A"], p.choice["B"]) == ("discard", "swap")
    assert p.reload_from_cpu(view("B1", "B", 2.0)) and not p.reload_from_cpu(view("A1", "A", 2.0))


def test_infercept_without_budget_preserves_then_discards_as_time_passes():
    p = infercept(cost=SlowLink())  # budget 50 tokens: a 1000-token context never fits
    p.on_scheduled(view("r0", "R", 0.0, prompt=3000), 0.0)
    p.on_arrival(view("A0", "A", 0.0), 0.0)
    p.on_scheduled(view("A0", "A", 0.0), 0.0)
    # no prediction: T_int = t_now - t_call; discard (Eq. 4, chunks of 400) is 68
    assert p.on_finish(view("A0", "A", 0.0, prompt=900, output=100), 10.0)
    assert not p.pin_expired("A", 10.0, has_waiting=False)  # 0 s: preserve 0
    assert not p.pin_expired("A", 10.05, has_waiting=False)  # preserve 50 < 68
    assert p.pin_expired("A", 10.1, has_waiting=False)  # preserve 100 > 68: discard
    assert p.choice["A"] == "discard" and not p.reload_from_cpu(view("A1", "A", 11.0))
    # a program that is already back is never released by waste: it hands off
    assert p.on_finish(view("B0", "B", 0.0), 11.0)
    p.on_arrival(view("B1", "B", 11.5), 11.5)
    assert not p.pin_expired("B", 99.0, has_waiting=True)


def test_infercept_a_predicted_short_call_is_preserved_until_overrun():
    p = infercept(cost=SlowLink())
    p.on_scheduled(view("r0", "R", 0.0, prompt=3000), 0.0)
    p.on_finish(view("A0", "A", 0.0, prompt=900, output=100, hints=Hints(predicted_s=0.05)), 1.0)
    assert not p.pin_expired("A", 1.01, has_waiting=False)  # predicted 0.05 s: 50 < 68
    assert p.choice["A"] == "preserve"
    assert p.pin_expired("A", 1.5, has_waiting=False)  # 0.5 s overrun: 500 > 68


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


def test_augserve_stage_one_value_depends_on_the_handling_by_hand():
    p = augserve()  # chunks of 8192 tokens: a context under that recomputes in one chunk
    p.on_scheduled(view("r0", "R", 0.0, prompt=3000), 0.0)  # C_batch = 3000
    # last turn, 1000 prompt tokens, none kept, 100 predicted output tokens:
    # prefill 0.1 s * 1000 = 100; decode 100 * 0.02 * (1000 + 50) = 2100 -> 2200
    last = view("x", "X", 0.0, hints=Hints(last=True, predicted_output_tokens=100))
    assert p.stage_value(last) == pytest.approx(2200.0)
    # followed by a 10 s call: C = 1100 fits one step's budget (5000) and would otherwise waste
    # min(11000, 0.11 * 1100 = 121) -> swapped, valued by Eq. 3: 2 * 0.011 * 3000 = 66
    mid = view("y", "Y", 0.0, hints=Hints(predicted_output_tokens=100, predicted_s=10.0))
    assert p.handling(mid) == ("swap", pytest.approx(66.0))
    assert p.stage_value(mid) == pytest.approx(2266.0)
    # 6000 prompt tokens: C = 6100 > 5000, no swap. Decode 100 * 0.02 * 6050 = 12100, prefill
    # 0.6 * 6000 = 3600. A 10 s call: preserve 61000 vs discard 0.61 * 6100 = 3721 -> discard
    big = view("z", "Z", 0.0, prompt=6000,
               hints=Hints(predicted_output_tokens=100, predicted_s=10.0))
    assert p.handling(big) == ("discard", pytest.approx(3721.0))
    assert p.stage_value(big) == pytest.approx(12100 + 3600 + 3721)
    # a 0.1 s call: preserve 610 < 3721 -> preserve, and the value follows it
    short = view("s", "S", 0.0, prompt=6000,
                 hints=Hints(predicted_output_tokens=100, predicted_s=0.1))
    assert p.handling(short) == ("preserve", pytest.approx(610.0))
    assert p.stage_value(short) == pytest.approx(12100 + 3600 + 610)


def test_augserve_previous_handling_decides_what_is_prefilled_again():
    p = augserve()
    p.on_arrival(view("a0", "A", 0.0, prompt=900), 0.0)
    p.on_scheduled(view("a0", "A", 0.0, prompt=900), 0.0)
    assert p.on_finish(view("a0", "A", 0.0, prompt=900, output=100), 1.0)  # held: 1000 kept
    nxt = view("a1", "A", 2.0, prompt=1200, hints=Hints(last=True, predicted_output_tokens=10))
    # decode 10 * 0.02 * (1200 + 5) = 241; prefill of the 200 new tokens 0.02 s * 1200 = 24
    assert p.stage_value(nxt) == pytest.approx(265.0)
    p.choice["A"] = "discard"  # the assignment discarded it: the pin ends, nothing is kept
    p.on_unpin("A", "expired", 1.5)
    # prefill of all 1200 tokens: 0.12 * 1200 = 144 -> 385
    assert p.stage_value(nxt) == pytest.approx(385.0)


def test_augserve_anti_starvation_is_additive_in_the_wait():
    p = augserve()  # alpha = 1 * 8192 token-seconds per second waited
    # heavy: decode 1000 * 0.02 * (8000 + 500) = 170000, prefill 0.8 * 8000 = 6400 -> 176400
    heavy = view("h", "H", 0.0, prompt=8000, hints=Hints(last=True, predicted_output_tokens=1000))
    # light: decode 20 * 0.02 * (500 + 10) = 204, prefill 0.05 * 500 = 25 -> 229
    light = view("l", "L", 1.0, prompt=500, hints=Hints(last=True, predicted_output_tokens=20))
    for r in (heavy, light):
        p.on_arrival(r, r.arrival_time)
    # P = V + alpha * wait, V = -cost: at t = 10 the heavy turn has P = -176400 + 81920
    assert p.priority(heavy, 10.0) == pytest.approx(-94480.0)
    assert p.queue_key(light, 1.0) < p.queue_key(heavy, 1.0)  # no head-of-line blocking
    # the heavy turn passes a light one that has just arrived once 8192 w > 176400 - 229,
    # w > 21.505 s: behind at 21 s (P -4368 vs -229), ahead at 22 s (P 3824 vs -229)
    fresh = [view(f"f{t}", f"F{t}", t, prompt=500,
                  hints=Hints(last=True, predicted_output_tokens=20)) for t in (21.0, 22.0)]
    for r in fresh:
        p.on_arrival(r, r.arrival_time)
    assert p.queue_key(fresh[0], 21.0) < p.queue_key(heavy, 21.0)
    assert p.queue_key(heavy, 22.0) < p.queue_key(fresh[1], 22.0)


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


def test_augserve_token_budget_grows_and_shrinks_with_free_plus_paused_memory():
    p = augserve()  # B_max = 8192, 1000 blocks
    assert p.token_budget(free_blocks=1000, paused_blocks=0) == 8192  # all available
    assert p.token_budget(free_blocks=500, paused_blocks=0) == 4096  # nominal: half
    # pausing programs lifts it: 500 free + 300 paused -> 80%: int(8192 * 0.8) = 6553
    assert p.token_budget(free_blocks=500, paused_blocks=300) == 6553
    # (the old rule saturated at 50% and could never rise above that point)
    assert p.token_budget(free_blocks=300, paused_blocks=0) == int(8192 * 0.3)  # 2457
    assert p.token_budget(free_blocks=10, paused_blocks=0) == 2048  # floor LOW = 25%


@pytest.mark.engine
def test_augserve_budget_is_applied_by_the_scheduler(monkeypatch):
    d = Driver(make_scheduler("augserve", num_blocks=64,
                              max_batched_tokens=512))
    assert d.scheduler.agent_policy.max_batch_tokens == 512
    d.submit("A-0", list(range(8, 8 + 56 * 16)), "A", max_tokens=200)  # a 56-block prompt
    budgets = []
    for _ in range(3):
        share = d.free_blocks / d.scheduler.agent_policy.total_blocks
        d.step()
        budgets.append(d.scheduler.max_num_scheduled_tokens)
        assert budgets[-1] == int(512 * min(1.0, max(0.25, share)))
    # vLLM's null block is never free: the first step sees 63 of 64 blocks, 512 * 63/64 = 504;
    # then the prompt fills memory and admission slows
    assert budgets[0] == 504 and budgets[-1] < 504
