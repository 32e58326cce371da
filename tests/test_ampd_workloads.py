"""AMPD's Table 1 workloads (eval.workloads.ampd.ampd_like): the table's means, reproducible seeds,
registration as trace names."""

from __future__ import annotations

import numpy as np
import pytest

from cli.bench import DEFAULT_JPS
from eval.bench.traces import TRACE_NAMES, make_trace
from eval.workloads.ampd import AMPD_MAX_CONTEXT, AMPD_TABLE, _ampd_spec, ampd_like
from eval.workloads.registry import load_or_generate

ROWS = {row.name: row for row in AMPD_TABLE}


def test_table_1_numbers():
    got = {r.name: (r.rounds, r.prefill, r.decode) for r in AMPD_TABLE}
    assert got == {
        "toolbench": (3.96, 703.79, 50.39),
        "gaia": (11.32, 6161.02, 528.76),
        "hotpotqa": (3.0, 1569.8, 80.03),
        "dureader": (3.0, 3081.23, 150.10),
    }


@pytest.mark.parametrize("name", sorted(ROWS))
def test_distributions_have_the_table_means_exactly(name):
    row = ROWS[name]
    spec = _ampd_spec(row)
    assert spec.turns.moment(lambda n: n) == pytest.approx(row.rounds, rel=1e-6)
    assert spec.prompt.mean == spec.tool_return.mean == row.prefill
    assert spec.output.mean == row.decode


@pytest.mark.parametrize("name", sorted(ROWS))
def test_generated_means_match_table_1(name):
    row = ROWS[name]
    trace = load_or_generate(name, 400, 2.0, seed=3)
    progs = trace.programs
    rounds = [p.n_turns for p in progs]
    new = [p.new_tokens(i) for p in progs for i in range(p.n_turns)]
    out = [t.output_tokens for p in progs for t in p.turns]
    assert np.mean(rounds) == pytest.approx(row.rounds, rel=0.05)
    assert np.mean(new) == pytest.approx(row.prefill, rel=0.05)
    assert np.mean(out) == pytest.approx(row.decode, rel=0.05)
    if not row.rounds_sd:
        assert set(rounds) == {int(row.rounds)}
    assert max(p.final_context_tokens for p in progs) <= AMPD_MAX_CONTEXT
    assert {p.benchmark for p in progs} == {name}
    assert {t.tool for p in progs for t in p.turns[:-1]} == {row.tool}
    assert trace.stats().arrival_rate_jps == pytest.approx(2.0, rel=0.15)  # Poisson at jps


def test_seeds_reproduce_and_differ():
    a, b, c = (ampd_like(50, 1.0, s, workload="gaia") for s in (5, 5, 6))
    assert a.programs == b.programs
    assert [p.turns for p in a.programs] != [p.turns for p in c.programs]


def test_long_programs_are_redrawn_and_bad_names_refused():
    short = ampd_like(100, 1.0, 0, workload="gaia", max_context=40_000)
    assert max(p.final_context_tokens for p in short.programs) <= 40_000
    with pytest.raises(ValueError, match="too small"):
        ampd_like(2, 1.0, 0, workload="gaia", max_context=100)
    with pytest.raises(ValueError, match="unknown AMPD workload"):
        ampd_like(2, 1.0, 0, workload="webshop")


def test_bench_knows_the_names():
    for name in ROWS:
        assert name in TRACE_NAMES and name in DEFAULT_JPS
        trace = make_trace(name, 5, 1.0, 0)
        assert len(trace.programs) == 5


def test_context_reading_solves_the_new_tokens_so_the_mean_prompt_is_the_tables():
    """Read as the whole prompt, hotpotqa's 1569.8 tokens a round over 3 rounds of new tokens
    m and answers d = 80.03: prompts m, 2m + d, 3m + 2d average 2m + d, so m = 744.885."""
    from eval.workloads.ampd import new_tokens_per_round

    row = ROWS["hotpotqa"]
    assert new_tokens_per_round(row, "new") == row.prefill
    assert new_tokens_per_round(row, "context") == pytest.approx((1569.8 - 80.03) / 2)
    for name in ("hotpotqa", "toolbench"):
        trace = load_or_generate(f"{name}-ctx", 400, 2.0, seed=3)
        prompts = [p.prompt_tokens(i) for p in trace.programs for i in range(p.n_turns)]
        assert np.mean(prompts) == pytest.approx(ROWS[name].prefill, rel=0.05)
        assert trace.params["targets"]["reading"] == "context"
