"""The tool-duration estimators (`predictor.durations`)."""

from __future__ import annotations

import math
import random

import pytest

from common.tool_keys import duration_key, event_tool, split_key, text_model_tool
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


# -- convergence of the online estimator --------------------------------------------------
def dkw_epsilon(n: int, alpha: float = 1e-3) -> float:
    """Dvoretzky-Kiefer-Wolfowitz (Massart's constant): P(sup |F_n - F| > eps) <= 2 e^(-2 n eps^2),
    so with probability 1 - alpha the empirical CDF of n samples is within this eps of F."""
    return math.sqrt(math.log(2 / alpha) / (2 * n))


def ks_distance(dist: EmpiricalDistribution, true_cdf) -> float:
    """sup_x |F_n(x) - F(x)| exactly: F_n is a step function, so the sup is reached at a jump,
    just before it (F_n(x-)) or at it (F_n(x))."""
    worst, below = 0.0, 0.0
    for x, at in dist.steps():
        f = true_cdf(x)
        worst = max(worst, abs(at - f), abs(below - f))
        below = at
    return worst


def exp_cdf(mean: float):
    return lambda x: 0.0 if x <= 0 else 1.0 - math.exp(-x / mean)


def lognormal_cdf(mu: float, sigma: float):
    return lambda x: 0.0 if x <= 0 else 0.5 * (1 + math.erf((math.log(x) - mu)
                                                             / (sigma * math.sqrt(2))))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_online_cdf_and_mean_converge_on_an_exponential(seed: int) -> None:
    # Exp(mean 4 s) fed call by call under a command key: after n samples the chosen level's
    # CDF is within the DKW bound of the true CDF everywhere, and the mean within 4 standard
    # errors (sd of Exp = its mean).
    rng = random.Random(seed)
    model = ToolDurationModel(min_samples=10)
    true = exp_cdf(4.0)
    for n in (100, 1000):
        while model.count("bash:pytest") < n:
            model.observe("bash:pytest", rng.expovariate(1 / 4.0))
        assert model.source_for("bash:pytest") == "command"
        dist = model.distribution("bash:pytest")
        assert dist is not None
        eps = dkw_epsilon(n)
        assert ks_distance(dist, true) <= eps
        for tau in (0.5, 1.0, 2.0, 4.0 * math.log(2), 4.0, 8.0, 16.0):
            assert abs(model.cdf("bash:pytest", tau) - true(tau)) <= eps
        assert abs(model.mean("bash:pytest") - 4.0) <= 4 * 4.0 / math.sqrt(n)
        # the median, 4 ln 2: where the true CDF is 1/2, so the empirical one is within eps
        assert abs(true(model.median("bash:pytest")) - 0.5) <= eps + 1 / n


def test_sliding_window_follows_a_change_of_distribution() -> None:
    # 1000 calls from lognormal(0, 1) (median 1 s), then 1000 from lognormal(2, 0.5) (median
    # e^2 = 7.4 s): a 1000-sample window then holds only the new calls, so the estimate is the
    # new distribution's within the DKW bound, at the command level and at the tool level.
    rng = random.Random(11)
    model = ToolDurationModel(window=1000)
    for _ in range(1000):
        model.observe("bash:pytest", rng.lognormvariate(0.0, 1.0))
    old = lognormal_cdf(0.0, 1.0)
    assert ks_distance(model.distribution("bash:pytest"), old) <= dkw_epsilon(1000)
    for _ in range(1000):
        model.observe("bash:pytest", rng.lognormvariate(2.0, 0.5))
    new = lognormal_cdf(2.0, 0.5)
    for key in ("bash:pytest", "bash", GLOBAL_KEY):
        dist = model.own(key)
        assert dist is not None and dist.count == 1000
        assert ks_distance(dist, new) <= dkw_epsilon(1000)
    mean = math.exp(2.0 + 0.5**2 / 2)  # 8.37 s
    sd = mean * math.sqrt(math.exp(0.5**2) - 1)  # 4.46 s
    assert abs(model.mean("bash:pytest") - mean) <= 4 * sd / math.sqrt(1000)
    assert model.cdf("bash:pytest", 1.0) < 0.01  # the old median is now far in the left tail


# -- keys and the command-class level ------------------------------------------------------
def test_duration_keys() -> None:
    assert duration_key("bash", "pytest") == "bash:pytest"
    assert duration_key("bash") == duration_key("bash", "") == "bash"
    assert split_key("bash:pytest") == ("bash", "pytest")
    assert split_key("calculator") == ("calculator", None)
    assert split_key("bash:a:b") == ("bash", "a:b")  # split at the first colon only
    assert split_key("bash:") == ("bash:", None)  # an empty part: a plain name
    assert split_key(":x") == (":x", None)
    # the text model's tool: a bash command's class, another tool as it is
    assert text_model_tool(event_tool("bash", "python3 -m pytest -q")) == "pytest"
    assert text_model_tool(event_tool("bash", "")) == "bash"
    assert text_model_tool(event_tool("calculator", "1+1")) == "calculator"
    model = ToolDurationModel()
    assert model.chain("bash:pytest") == [("command", "bash:pytest"), ("tool", "bash"),
                                          ("global", GLOBAL_KEY)]
    assert model.chain("ls") == [("tool", "ls"), ("global", GLOBAL_KEY)]  # as before


def test_cold_start_chain_with_command_classes() -> None:
    # min_samples = 10; counts after each stage worked out by hand (every call counts at each
    # level of its chain).
    model = ToolDurationModel(min_samples=10)
    assert model.source_for("bash:pytest") == "prior"  # nothing anywhere
    assert model.mean("bash:pytest") == 1.0 and model.median("bash:pytest") == math.log(2)

    for _ in range(10):  # calculator 10, global 10
        model.observe("calculator", 1.0)
    assert model.source_for("bash:pytest") == "global"  # command 0, bash 0, global 10
    assert model.mean("bash:pytest") == 1.0

    for _ in range(9):  # bash:ls 9, bash 9, global 19
        model.observe("bash:ls", 0.01)
    assert model.source_for("bash:ls") == "global"  # 9 < 10 at the command and tool levels
    assert model.source_for("bash") == "global"

    model.observe("bash:pytest", 5.0)  # bash:pytest 1, bash 10, global 20
    assert model.source_for("bash:pytest") == "tool"  # 1 of its own, 10 for bash
    assert model.source_for("bash:ls") == "tool"
    assert model.source_for("bash:git") == "tool"  # a class never seen starts from bash
    assert model.source_for("bash") == "tool"
    assert model.mean("bash:pytest") == pytest.approx((9 * 0.01 + 5.0) / 10)

    for _ in range(8):  # bash:pytest 9, bash 18, global 28
        model.observe("bash:pytest", 5.0)
    assert model.source_for("bash:pytest") == "tool"  # 9 < 10
    assert model.mean("bash:pytest") == pytest.approx((9 * 0.01 + 9 * 5.0) / 18)
    assert model.cdf("bash:pytest", 1.0) == 0.5  # the 9 ls calls of 18 bash calls

    model.observe("bash:pytest", 5.0)  # bash:pytest 10, bash 19, global 29
    assert model.source_for("bash:pytest") == "command"
    assert model.mean("bash:pytest") == 5.0 and model.median("bash:pytest") == 5.0
    assert model.cdf("bash:pytest", 1.0) == 0.0 and model.cdf("bash:pytest", 5.0) == 1.0
    assert model.candidates("bash:pytest") == [0.0, 5.0]
    assert model.source_for("bash:ls") == "tool"  # still 9 of its own
    assert model.cdf("bash:ls", 1.0) == pytest.approx(9 / 19)
    assert model.source_for("calculator") == "tool"  # plain names: the old chain
    assert model.source_for("python") == "global"
    assert model.counts() == {GLOBAL_KEY: 29, "bash": 19, "bash:ls": 9, "bash:pytest": 10,
                              "calculator": 10}
