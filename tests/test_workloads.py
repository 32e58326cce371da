"""The workload generators (eval/workloads): fitted distributions, arrivals, the generators'
published statistics, reproducible seeds, merging and the registry."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from common.trace import load_trace, summarize_by
from eval.workloads.arrivals import gamma_arrivals, poisson_arrivals
from eval.workloads.bfcl import _bfcl_spec, bfcl_like
from eval.workloads.distributions import ClippedLogNormal, DiscreteNormal
from eval.workloads.infercept import INFERCEPT_TABLE, infercept_mix
from eval.workloads.registry import TRACES, load_or_generate, merge
from eval.workloads.swe import SWE_LONG_TARGETS, _swe_spec, swe_like, swe_long_like

ROOT = Path(__file__).resolve().parent.parent
TRACES_DIR = ROOT / "datasets" / "traces"


# --- distributions and arrivals ---------------------------------------------------------------


@pytest.mark.parametrize(
    "dist",
    [
        ClippedLogNormal(0.925, 3.55, 0.01, 60.0),
        ClippedLogNormal(3.4025, 7.333, 0.05, 120.0),
        ClippedLogNormal(9e-5, 3e-5, 1e-5, 1e-3),
        ClippedLogNormal(1.923, 2.133, 0.02, 60.0),
    ],
)
def test_clipped_lognormal_has_the_fitted_moments(dist):
    x = dist.sample(np.random.default_rng(0), 2_000_000)
    assert x.min() >= dist.lo and x.max() <= dist.hi
    assert x.mean() == pytest.approx(dist.mean, rel=0.01)
    assert x.std() == pytest.approx(dist.sd, rel=0.03)


def test_discrete_normal_pmf_is_exact():
    d = DiscreteNormal(6.3, 2.3, 2, 20)
    assert d.pmf.sum() == pytest.approx(1.0)
    assert d.moment(lambda n: n) == pytest.approx(6.3, abs=1e-6)
    assert math.sqrt(d.moment(lambda n: n * n) - 6.3**2) == pytest.approx(2.3, abs=1e-6)
    with pytest.raises(ValueError):
        DiscreteNormal(1.0, 1.0, 2, 10)


def test_poisson_arrivals_have_the_rate():
    t = poisson_arrivals(20_000, 3.0, np.random.default_rng(1))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert np.all(gaps >= 0)
    assert len(t) / t[-1] == pytest.approx(3.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)  # exponential: CV 1


def test_gamma_arrivals_have_rate_and_cv():
    t = gamma_arrivals(20_000, 2.0, 3.0, np.random.default_rng(2))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert len(t) / t[-1] == pytest.approx(2.0, rel=0.08)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.08)


@pytest.mark.parametrize("rate", [0, -1.0, math.inf, math.nan])
def test_bad_rates_are_refused(rate):
    with pytest.raises(ValueError, match="positive number"):
        swe_like(3, rate, 0)


def test_generator_arrivals_follow_jps():
    s = swe_like(3000, 5.0, 4).stats()
    assert s.arrival_rate_jps == pytest.approx(5.0, rel=0.08)


# --- generators --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TRACES))
def test_generators_are_deterministic(name, tmp_path):
    gen = TRACES[name]
    a, b, c = gen(40, 1.0, 7), gen(40, 1.0, 7), gen(40, 1.0, 8)
    assert a.save(tmp_path / "a").read_bytes() == b.save(tmp_path / "b").read_bytes()
    assert [p.turns for p in a.programs] != [p.turns for p in c.programs]
    # the load changes the arrivals, not the programs (same seed, other jps)
    d = gen(40, 3.0, 7)
    by_id = {p.id: p for p in d.programs}
    assert all(by_id[p.id].turns == p.turns for p in a.programs)
    assert [p.arrival_s for p in a.programs] != [by_id[p.id].arrival_s for p in a.programs]


def test_swe_like_hits_continuum_table_2():
    spec = _swe_spec()
    # the distributions themselves hit the targets exactly
    assert spec.tool_seconds_moments() == pytest.approx((0.925, 3.55), rel=1e-3)
    assert spec.expected_tokens()[0] == pytest.approx(70_000, rel=1e-6)
    s = swe_like(4000, 2.0, 0).stats()
    assert s.turns_mean == pytest.approx(10.9, rel=0.02)
    assert s.turns_sd == pytest.approx(2.1, rel=0.06)
    assert s.tool_s_mean == pytest.approx(0.925, rel=0.10)
    assert s.tool_s_sd == pytest.approx(3.55, rel=0.20)
    assert s.tool_s_p50 < 0.5 < 3.0 < s.tool_s_p95  # long tail: most calls fast
    assert s.tokens_per_program_mean == pytest.approx(70_000, rel=0.03)
    # plausible SWE contexts: a few thousand tokens at the start, ~10k at the end
    assert 1500 < s.first_prompt_mean < 4000
    assert 6000 < s.final_context_mean < 15_000
    assert 100 < s.output_tokens_per_turn_mean < 300


def test_swe_long_like_hits_the_public_mini_swe_agent_runs():
    """Means and medians of the 500 public runs (SWE_LONG_TARGETS), from 1,000 programs."""
    t = SWE_LONG_TARGETS
    trace = swe_long_like(1000, 0.1, 0)
    s = trace.stats()
    assert s.turns_mean == pytest.approx(t["turns_mean"], rel=0.05)
    assert s.turns_sd == pytest.approx(t["turns_sd"], rel=0.10)
    assert s.first_prompt_mean == pytest.approx(t["first_prompt_mean"], rel=0.03)
    assert s.output_tokens_per_turn_mean == pytest.approx(t["output_tokens_per_turn_mean"],
                                                          rel=0.06)
    assert s.tool_return_tokens_mean == pytest.approx(t["tool_return_tokens_mean"], rel=0.06)
    assert s.final_context_mean == pytest.approx(t["final_context_mean"], rel=0.08)
    outputs = [x.output_tokens for p in trace.programs for x in p.turns]
    returns = [x.tool_return_tokens for p in trace.programs for x in p.turns[:-1]]
    # heavy tails: the medians sit far below the means, as in the runs
    assert np.median(outputs) == pytest.approx(t["output_tokens_per_turn_median"], rel=0.08)
    assert np.median(returns) == pytest.approx(t["tool_return_tokens_median"], rel=0.08)
    # a fifth of them outgrow a 32k context; every tool is a `bash:<class>` command
    assert 0.1 < sum(p.final_context_tokens > 32_768 for p in trace.programs) / 1000 < 0.35
    assert {x.tool for p in trace.programs for x in p.turns[:-1]} == {
        "bash:edit", "bash:grep", "bash:python"}


def test_bfcl_like_hits_continuum_table_2():
    assert _bfcl_spec().expected_tokens() == pytest.approx((93_000, 69_000), rel=1e-4)
    s = bfcl_like(4000, 2.0, 0).stats()
    assert s.turns_mean == pytest.approx(6.3, rel=0.03)
    assert s.turns_sd == pytest.approx(2.3, rel=0.06)
    assert s.tool_s_mean == pytest.approx(1.923, rel=0.05)
    assert s.tool_s_sd == pytest.approx(2.133, rel=0.10)
    assert s.tokens_per_program_mean == pytest.approx(93_000, rel=0.06)
    assert s.tokens_per_program_sd == pytest.approx(69_000, rel=0.12)


def test_bfcl_scale_multiplies_tokens():
    base, half = bfcl_like(50, 1.0, 3), bfcl_like(50, 1.0, 3, scale=0.5)
    ratio = half.stats().tokens_total / base.stats().tokens_total
    assert ratio == pytest.approx(0.5, rel=0.01)
    assert [p.n_turns for p in half.programs] == [p.n_turns for p in base.programs]
    with pytest.raises(ValueError, match="scale"):
        bfcl_like(5, 1.0, 0, scale=0)


def test_infercept_mix_follows_its_table():
    trace = infercept_mix(6000, 2.0, 0)
    groups = summarize_by(trace)
    assert set(groups) == {row.kind for row in INFERCEPT_TABLE}
    contexts: dict[str, list[int]] = defaultdict(list)
    returns: dict[str, list[int]] = defaultdict(list)
    for p in trace.programs:
        contexts[p.benchmark] += [after for _, after in p.contexts()[:-1]]
        returns[p.benchmark] += [t.tool_return_tokens for t in p.turns[:-1]]
        assert p.shared_prefix_id == f"infercept-{p.benchmark}"
    for row in INFERCEPT_TABLE:
        s = groups[row.kind]
        assert 800 < s.n_programs < 1200  # equal shares
        n = s.n_programs
        assert s.turns_mean == pytest.approx(
            row.interceptions + 1, abs=5 * row.interceptions_sd / math.sqrt(n)
        )
        assert s.tool_s_mean == pytest.approx(row.seconds, rel=0.06)
        assert np.mean(returns[row.kind]) == pytest.approx(row.returned, rel=0.08)
        # mean context at an interception is the table's
        assert np.mean(contexts[row.kind]) == pytest.approx(row.context, rel=0.05)
    tools = {p.benchmark: p.turns[0].tool for p in trace.programs}
    assert tools["math"] == "calculator" and tools["ve"] == "alfworld"


def test_infercept_mix_kinds_and_weights():
    only = infercept_mix(30, 1.0, 0, kinds=["math", "qa"], weights=[1, 0])
    assert {p.benchmark for p in only.programs} == {"math"}
    with pytest.raises(ValueError, match="unknown InferCept kind"):
        infercept_mix(3, 1.0, 0, kinds=["poker"])


def test_merge_interleaves_by_arrival():
    a, b = swe_like(30, 1.0, 0), bfcl_like(30, 1.0, 0)
    m = merge(a, b)
    assert len(m) == 60
    arrivals = [p.arrival_s for p in m.programs]
    assert arrivals == sorted(arrivals)
    assert {p.benchmark for p in m.programs[:20]} == {"swe", "bfcl"}
    with pytest.raises(ValueError, match="unique ids"):
        merge(a, swe_like(5, 2.0, 1))


def test_load_or_generate(tmp_path):
    gen = load_or_generate("bfcl", n=10, jps=1.0, seed=3, scale=0.5)
    assert gen == bfcl_like(10, 1.0, 3, scale=0.5)
    with pytest.raises(ValueError, match="give n"):
        load_or_generate("swe")
    with pytest.raises(FileNotFoundError, match="neither a trace name"):
        load_or_generate("nope")
    path = gen.save(tmp_path / "g.jsonl")
    assert load_or_generate(path) == gen
    few = load_or_generate(str(path), n=4)
    assert [p.id for p in few.programs] == [p.id for p in gen.programs[:4]]
    fast = load_or_generate(path, jps=50.0, seed=1)
    assert [p.turns for p in fast.programs] == [p.turns for p in gen.programs]
    assert fast.programs[-1].arrival_s < gen.programs[-1].arrival_s


def test_committed_traces_are_current_and_small():
    for name, (generator, n, jps, seed) in {
        "swe-100.jsonl": ("swe", 100, 0.5, 100),
        "bfcl-100.jsonl": ("bfcl", 100, 0.5, 200),
        "mix-200.jsonl": ("mix", 200, 2.0, 300),
    }.items():
        path = TRACES_DIR / name
        assert path.stat().st_size < 1_000_000
        assert load_trace(path) == TRACES[generator](n, jps, seed), (
            f"{name} is out of date: run datasets/traces/build.py"
        )
