"""The analytical floor of `harness bench` (`eval.bench.floor`), worked by hand."""

from __future__ import annotations

import math
import random

import pytest

from common.trace import Program, Trace, Turn
from eval.bench.floor import (
    MemoryPrices,
    WorkPrices,
    add_bounds,
    gap_share,
    srpt_completions,
    throughput_floor,
)
from server.perf.registry import load_profile

PROFILE = "h100-llama-3.1-8b"


def test_srpt_by_hand():
    """Job 0 (4 s of work) starts at 0; job 1 (1 s) arrives at 1 with less left than job 0's
    3 s, runs and ends at 2; job 2 (1 s) arrives at 2, ends at 3; job 0 ends at 6."""
    assert srpt_completions([(0.0, 4.0), (1.0, 1.0), (2.0, 1.0)]) == [6.0, 2.0, 3.0]
    assert srpt_completions([(5.0, 1.0)]) == [6.0]  # idle until the release


def test_prices_never_exceed_a_steps_time():
    """The bound's claim: whatever the batch, a step lasts at least the sum of its
    sequences' prices, so the engine does at most one second of priced work per second."""
    profile = load_profile(PROFILE)
    prices = WorkPrices(profile, 2048)
    for decode in ([100], [23_000] * 3, [1_000, 5_000, 60_000] * 20, [300] * 200):
        for prefill in ([], [(2048, 10_000)], [(500, 0)]):
            priced = sum(prices.decode(c) for c in decode)
            priced += sum(prices.prefill(n, c) for n, c in prefill)
            assert profile.step_seconds(prefill, decode) >= priced


@pytest.mark.parametrize("profile_name", [PROFILE, "h20x2-llama-3.1-70b"])
def test_memory_prices_never_exceed_a_steps_time_within_the_cache(profile_name):
    """The memory bound's claim: a batch whose sequences hold at most the cache's capacity
    between them (beyond their shared prefix) lasts at least the sum of its memory prices,
    for every split of the linear roofline (theta); random batches of both profile kinds'
    shapes, from one long sequence to hundreds of short ones, with and without prefills."""
    profile = load_profile(profile_name)
    capacity = 200_000
    rng = random.Random(7)
    for theta in (0.0, 0.3, 0.5, 1.0):
        prices = MemoryPrices(profile, 2048, capacity, theta)
        prices.shared = 1200
        for _ in range(200):
            budget = capacity
            decode, prefill = [], []
            for _ in range(rng.choice([1, 3, 20, 300])):
                ctx = rng.choice([1300, 5_000, 23_000, 60_000])
                if ctx - prices.shared > budget:
                    break
                budget -= ctx - prices.shared
                decode.append(ctx)
            if rng.random() < 0.5 and budget > 3_000:
                prefill.append((2048, min(budget - 2048, 20_000) + prices.shared))
            if not decode and not prefill:
                continue
            priced = sum(prices.decode(c) for c in decode)
            priced += sum(prices.prefill(n, c) for n, c in prefill)
            assert profile.step_seconds(prefill, decode) >= priced * (1 - 1e-12)
    # a token at 50k of a 400k cache carries an eighth of the step's fixed part (the weights'
    # read and the step's overhead), which a batch of 512 would have spread thin
    c = profile.coefficients()
    memory = MemoryPrices(profile, 2048, 400_000, 0.0).decode(50_000)
    assert memory == pytest.approx((c.c0 + c.c1 * c.knee) / 8 + c.c3 * 50_000 + c.c4 + c.c5)
    if profile_name == PROFILE:  # an H100 reads the weights in 5 ms: the share dominates
        assert memory > WorkPrices(profile, 2048).decode(50_000) + (c.c0 + c.c1 * c.knee) / 10


def test_throughput_floor_of_two_programs():
    """Two one-turn programs, both released at 0: SRPT finishes the smaller work w1 first,
    then the other at w1 + w2, so the mean JCT is (2 w1 + w2) / 2."""
    turns = [Turn(input_tokens=1000, output_tokens=100)]
    longer = [Turn(input_tokens=1000, output_tokens=400)]
    trace = Trace(name="two", programs=[Program(id="a", arrival_s=0.0, turns=longer),
                                        Program(id="b", arrival_s=0.0, turns=turns)])
    floor = throughput_floor(trace, PROFILE, "peak80", 2048)
    prices = WorkPrices(load_profile(PROFILE), 2048)
    w_a, w_b = prices.program(trace.programs[0]), prices.program(trace.programs[1])
    assert w_b < w_a
    assert floor["throughput_jct_mean_s"] == pytest.approx((2 * w_b + w_a) / 2)
    assert floor["throughput_makespan_s"] == pytest.approx(w_a + w_b)


def test_gap_share_by_hand():
    """vllm 300 s, oracle 200 s: a policy at 250 s closes half the gap, one at 320 s -0.2,
    the oracle all of it; without an oracle row the share is unknown."""
    vllm, oracle = {"jct_mean_s": 300.0}, {"jct_mean_s": 200.0}
    assert gap_share(vllm, oracle, {"jct_mean_s": 250.0}) == pytest.approx(0.5)
    assert gap_share(vllm, oracle, {"jct_mean_s": 320.0}) == pytest.approx(-0.2)
    assert gap_share(vllm, oracle, oracle) == pytest.approx(1.0)
    assert math.isnan(gap_share(vllm, None, {"jct_mean_s": 250.0}))
    assert math.isnan(gap_share(vllm, vllm, vllm))  # no gap to close
    # swe-long at 0.1 jobs/s: vllm 190.39 s, oracle 190.42 s; a share of 0.03 s is noise
    assert math.isnan(gap_share({"jct_mean_s": 190.39}, {"jct_mean_s": 190.42},
                                {"jct_mean_s": 190.43}))


def test_add_bounds_puts_floor_and_gap_on_each_row():
    rows = [{"policy": "vllm", "jps": 0.2, "jct_mean_s": 300.0},
            {"policy": "x", "jps": 0.2, "jct_mean_s": 240.0},
            {"policy": "oracle", "jps": 0.2, "jct_mean_s": 180.0}]
    add_bounds(rows, {0.2: {"throughput_jct_mean_s": 150.0}}, isolated_mean=100.0)
    assert [r["gap_closed"] for r in rows] == pytest.approx([0.0, 0.5, 1.0])
    assert {r["floor_jct_mean_s"] for r in rows} == {150.0}
