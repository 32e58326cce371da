"""The tool-duration estimators (`predictor.durations`)."""

from __future__ import annotations

import math
import random

import pytest

from predictor.durations import GLOBAL_KEY, EmpiricalDistribution, ToolDurationModel


def test_converges_on_a_known_distribution() -> None:
    # Exp(mean 1 s): median ln 2, so the empirical CDF there should be close to 0.5, and the
    # empirical median / mean close to ln 2 / 1.
    rng = random.Random(7)
    dist = EmpiricalDistribution()
    for _ in range(1000):
        dist.add(rng.expovariate(1.0))
    assert abs(dist.cdf(math.log(2)) - 0.5) < 0.05
    assert abs(dist.quantile(0.5) - math.log(2)) < 0.1
    assert abs(dist.mean - 1.0) < 0.1
    # the 90th percentile of Exp(1) is ln 10 = 2.303
    assert abs(dist.quantile(0.9) - math.log(10)) < 0.25


def test_window_keeps_only_the_latest_samples() -> None:
    dist = EmpiricalDistribution(window=5)
    for x in range(10):  # 0..9; the window keeps 5, 6, 7, 8, 9
        dist.add(x)
    assert dist.count == 5 == len(dist)
    assert dist.support() == [5.0, 6.0, 7.0, 8.0, 9.0]
    assert dist.mean == 7.0
    assert dist.cdf(4.9) == 0.0
    # the oldest goes first even when it is not the smallest
    dist.add(0.0)  # drops 5
    assert dist.support() == [0.0, 6.0, 7.0, 8.0, 9.0]


def test_default_window_is_1000() -> None:
    dist = EmpiricalDistribution()
    for x in range(1500):
        dist.add(x)
    assert dist.count == 1000
    assert dist.quantile(0.0) == 500.0


def test_cdf_and_quantiles_by_hand() -> None:
    dist = EmpiricalDistribution()
    for x in [3, 1, 10, 2, 5, 4, 9, 6, 8, 7]:  # 1..10 in random order
        dist.add(x)
    assert dist.cdf(5) == 0.5  # 1..5 of 10
    assert dist.cdf(5.5) == 0.5
    assert dist.cdf(0.5) == 0.0
    assert dist.cdf(100) == 1.0
    # inverse CDF: the smallest x with P(X <= x) >= q
    assert dist.quantile(0.0) == 1.0
    assert dist.quantile(0.5) == 5.0
    assert dist.quantile(0.55) == 6.0
    assert dist.quantile(1.0) == 10.0


def test_support_and_steps_merge_duplicates() -> None:
    dist = EmpiricalDistribution()
    for x in [2.0, 0.5, 2.0, 0.5, 0.5, 7.0]:
        dist.add(x)
    assert dist.support() == [0.5, 2.0, 7.0]
    assert list(dist.steps()) == [(0.5, 0.5), (2.0, 5 / 6), (7.0, 1.0)]


def test_bad_input_is_refused_with_a_message() -> None:
    dist = EmpiricalDistribution()
    with pytest.raises(ValueError, match="empty"):
        dist.cdf(1.0)
    with pytest.raises(ValueError, match="empty"):
        _ = dist.mean
    with pytest.raises(ValueError, match="finite"):
        dist.add(float("nan"))
    dist.add(1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        dist.quantile(1.5)
    with pytest.raises(ValueError, match="window"):
        EmpiricalDistribution(window=0)
    with pytest.raises(ValueError, match=">= 0"):
        ToolDurationModel().observe("ls", -1.0)


def test_cold_start_chain() -> None:
    model = ToolDurationModel(min_samples=10)
    assert model.source_for("ls") == "prior"  # 0 samples anywhere
    for _ in range(9):
        model.observe("ls", 0.5)
    assert model.source_for("ls") == "prior"  # 9 < 10, and the global also has 9
    model.observe("ls", 0.5)
    assert model.source_for("ls") == "tool"  # 10 of its own
    assert model.source_for("cat") == "global"  # none of its own, 10 in all
    assert model.counts() == {GLOBAL_KEY: 10, "ls": 10}
    assert model.count("cat") == 0 and model.global_count == 10


def test_candidates_cdf_and_mean_follow_the_chosen_source() -> None:
    model = ToolDurationModel(min_samples=2, prior_mean_s=1.0)
    # prior: no candidates, Exp(1) CDF, mean 1
    assert model.candidates("ls") == []
    assert model.cdf("ls", math.log(2)) == pytest.approx(0.5)
    assert model.cdf("ls", 0.0) == 0.0
    assert model.mean("ls") == 1.0
    model.observe("ls", 0.5)
    model.observe("ls", 2.0)
    model.observe("ls", 0.5)
    assert model.candidates("ls") == [0.0, 0.5, 2.0]
    assert model.cdf("ls", 1.0) == pytest.approx(2 / 3)
    assert model.mean("ls") == 1.0  # (0.5 + 2 + 0.5) / 3
    # a zero duration is not listed twice
    model.observe("noop", 0.0)
    model.observe("noop", 0.0)
    assert model.candidates("noop") == [0.0]
