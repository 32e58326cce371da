"""AMPD's deployment planner (cluster/planner.py, sim/planning.py, `harness plan`): the ILP
against brute force on hand-made tau tables, clear errors, the simulated provider's grid and
cache (with the simulation itself stubbed), and the command."""

from __future__ import annotations

import json
import math
from functools import partial

import numpy as np
import pytest

from cli.main import main
from cluster import plan_bounds
from cluster.planner import (
    Curve,
    Objective,
    PlanError,
    TableTau,
    brute_force,
    candidates,
    plan,
    solve_ilp,
)
from eval.ampd import plan_check
from eval.bench.traces import make_trace
from eval.workloads.registry import load_or_generate
from sim import planning as plan_sim

SLO = {"prefill": 2.0, "decode": 0.1}


def random_table(rng: np.random.Generator, rate: float, max_count: int,
                 degrees=(1, 2, 4, 8)) -> TableTau:
    """tau at each load rate / c: falls with the load (more replicas) and with the degree,
    plus noise so that no two plans tie."""
    table: dict = {}
    for role, base in (("prefill", 1.0), ("decode", 0.05)):
        table[role] = {}
        for d in degrees:
            points = {}
            for c in range(1, max_count + 1):
                load = rate / c
                points[load] = base * (0.3 + load / d) * rng.uniform(0.8, 1.2)
            table[role][d] = points
    return TableTau(table)


@pytest.mark.parametrize("kind", ["max", "sum"])
@pytest.mark.parametrize("gpus", [2, 3, 5, 8, 13, 16])
def test_ilp_equals_brute_force(kind, gpus):
    rng = np.random.default_rng(gpus)
    provider = random_table(rng, rate=4.0, max_count=16)
    objective = Objective(SLO, kind)
    cands = candidates(provider, gpus, 4.0)
    ilp = solve_ilp(cands, gpus, objective, top=3)
    brute = brute_force(cands, gpus, objective, top=3)
    assert ilp[0].key() == brute[0].key()
    assert [p.score for p in ilp] == pytest.approx([p.score for p in brute], rel=1e-9)
    assert all(p.gpus <= gpus and p.prefill.count >= 1 and p.decode.count >= 1 for p in ilp)
    assert len({p.key() for p in ilp}) == len(ilp)


def test_hand_worked_optimum():
    # 6 GPUs, rate 2: prefill TP2 x 2 (load 1 each, 0.5 s) + decode TP1 x 2 (40 ms) scores
    # max(0.25, 0.4); every other pair that fits is worse.
    table = TableTau({
        "prefill": {1: {2: 9.0, 1: 3.0, 0.5: 1.0}, 2: {2: 4.0, 1: 0.5}},
        "decode": {1: {2: 0.2, 1: 0.04, 0.5: 0.035}, 2: {2: 0.05, 1: 0.03}},
    })
    objective = Objective(SLO, "max")
    best = plan(table, 6, 2.0, objective, top=1)[0]
    assert best.key() == (2, 2, 1, 2)
    assert best.score == pytest.approx(0.4 + 1e-3 * (0.25 + 0.4))
    assert plan(table, 6, 2.0, objective, solver="brute")[0].key() == best.key()


def test_256_gpus_with_a_table_agree():
    provider = random_table(np.random.default_rng(0), rate=32.0, max_count=256)
    objective = Objective(SLO, "max")
    ilp = plan(provider, 256, 32.0, objective)
    brute = plan(provider, 256, 32.0, objective, solver="brute")
    assert ilp[0].key() == brute[0].key() and len(ilp) == 3


def test_infeasible_gpu_counts_say_why():
    table = TableTau({"prefill": {2: {1: 0.1, 5: 0.5}}, "decode": {4: {1: 0.01}}})
    objective = Objective(SLO)
    with pytest.raises(PlanError, match="at least 6 GPUs"):
        plan(table, 5, 1.0, objective)
    with pytest.raises(PlanError, match="integer >= 2"):
        plan(table, 1, 1.0, objective)
    with pytest.raises(PlanError, match="no decode replica"):  # beyond the table: overloaded
        plan(table, 6, 5.0, objective)
    with pytest.raises(PlanError, match="positive number"):
        plan(table, 6, -1.0, objective)


def test_curve_interpolates_and_refuses_beyond_its_points():
    curve = Curve([(1.0, 2.0), (0.5, 1.0)])
    assert curve(0.75) == pytest.approx(1.5)
    assert curve(0.1) == 1.0  # less load: the lowest point
    assert curve(2.0) == math.inf  # above the table: unknown, treated as overloaded
    with pytest.raises(PlanError, match="load > 0"):
        Curve([(0.0, 1.0)])


def test_table_file_errors(tmp_path):
    with pytest.raises(PlanError, match="no tau table"):
        TableTau.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"prefill": {"3": {"1": 0.1}}, "decode": {}}))
    with pytest.raises(PlanError, match="TP degree 3"):
        TableTau.load(bad)


# --- the simulated provider, its simulation stubbed -------------------------------------------


class FakeSim(plan_sim.SimulatedTau):
    """tau = a queue-like curve of the load; records what it was asked to simulate."""

    asked: list

    def chain_bound(self, role, degree, loads):
        return 0.0  # the fake curve is not the perf model's: no bound holds for it

    def simulate(self, role, degree, load):
        self.asked = getattr(self, "asked", [])
        self.asked.append((role, degree, round(load, 6)))
        self.simulations += 1
        return fake_tau(role, degree, load)


def fake_tau(role: str, degree: int, load: float) -> float:
    return (0.5 if role == "prefill" else 0.02) * (1 + max(0.0, load - 0.5) / degree)


def fake(tmp_path=None, **kw) -> FakeSim:
    """A stubbed provider whose replicas never count as overloaded (the fake curve is not the
    workload's)."""
    sim = FakeSim("h100-llama-3.1-70b", "dureader", 4.0, workload=partial(make_trace, "dureader"),
                  cache_path=None if tmp_path is None else tmp_path / "cache.json", **kw)
    sim.asked = []
    sim.capacity = dict.fromkeys(sim.capacity, math.inf)
    return sim


def test_replicas_above_capacity_are_infeasible_and_not_simulated():
    from server.perf.registry import load_profile

    sim = FakeSim("h100-llama-3.1-70b", "dureader", 4.0, workload=partial(make_trace, "dureader"))
    sim.asked = []
    cap = sim.capacity
    # more GPUs, more capacity; DuReader on 70B: a TP8 prefill replica sustains ~2.3
    # programs/s, a TP2 decode replica's 75k-token KV cache ~1 (a TP8 one's ~60)
    for role in ("prefill", "decode"):
        assert cap[(role, 2)] < cap[(role, 4)] < cap[(role, 8)]
    assert 1.5 < cap[("prefill", 8)] < 3.5
    assert 0.1 < cap[("decode", 2)] < 1.5 and cap[("decode", 8)] > 32
    assert sim.tau("prefill", 8, 0.99 * cap[("prefill", 8)]) < math.inf
    assert sim.tau("prefill", 8, cap[("prefill", 8)]) == math.inf
    assert sim.tau("prefill", 8, 4.0) == math.inf
    assert ("prefill", 8, 4.0) not in sim.asked and ("prefill", 8, 1) in sim.overloaded
    assert sim.tau("decode", 2, 4.0) == math.inf
    assert sim.tau("decode", 8, 4.0) < math.inf
    # the bound: one program's prefill work, by hand, is at least its step-form terms
    one = load_or_generate("dureader", 1, 1.0, 0).programs
    c = load_profile("h100x8-llama-3.1-70b").coefficients()
    n = [one[0].new_tokens(i) for i in range(one[0].n_turns)]
    tp8 = load_profile("h100x8-llama-3.1-70b")
    assert 1 / plan_bounds.prefill_capacity(one, tp8) >= \
        sum((c.c1 + c.c5) * k + c.c2 * k * (k + 1) / 2 for k in n)
    p = one[0]
    held = sum(p.context_before(i) * (t.output_tokens - 1) * tp8.step_seconds([], [1])
               for i, t in enumerate(p.turns))
    assert plan_bounds.decode_capacity(one, tp8) <= tp8.kv_capacity_tokens(1.0) / held


def test_simulated_provider_skips_degrees_the_model_cannot_run():
    sim = fake()
    assert sim.valid == [2, 4, 8] and 1 in sim.skipped
    assert "does not fit" in sim.skipped[1]
    assert sim.partner == "h100x8-llama-3.1-70b"
    assert sim.tau("prefill", 1, 1.0) == math.inf


def test_simulated_provider_grid_flat_floor_and_cache(tmp_path):
    sim = fake(tmp_path)
    # on grid points: the simulated value; between them: linear interpolation
    assert sim.tau("prefill", 4, 4.0) == pytest.approx(0.5 * (1 + 3.5 / 4))
    mid = sim.tau("prefill", 4, 3.0)
    lo_load, hi_load = 4.0 / 1.5, 4.0
    lo = 0.5 * (1 + (lo_load - 0.5) / 4)
    hi = 0.5 * (1 + (hi_load - 0.5) / 4)
    assert mid == pytest.approx(lo + (hi - lo) * (3.0 - lo_load) / (hi_load - lo_load))
    # walk down the loads as the planner does: simulations stop once tau stops falling
    for c in range(1, 128):
        sim.tau("decode", 2, 4.0 / c)
    decode_runs = [a for a in sim.asked if a[0] == "decode"]
    assert len(decode_runs) < 12
    assert sim.tau("decode", 2, 4.0 / 1000) == pytest.approx(0.02, rel=0.03)
    # a second provider with the same inputs reads every value from the file
    again = fake(tmp_path)
    for c in range(1, 128):
        assert again.tau("decode", 2, 4.0 / c) == sim.tau("decode", 2, 4.0 / c)
    assert again.asked == []
    # other inputs: the file is not reused
    other = FakeSim("h100-llama-3.1-70b", "dureader", 8.0,
                    workload=partial(make_trace, "dureader"),
                    cache_path=tmp_path / "cache.json")
    other.asked = []
    other.tau("decode", 8, 8.0)
    assert other.asked


def test_simulated_provider_sizes_its_runs_by_littles_law():
    sim = fake()
    assert sim.programs_at(1e-3) == plan_sim.PROGRAMS
    assert sim.programs_at(1e6) == plan_sim.MAX_PROGRAMS
    assert plan_sim.PROGRAMS <= sim.programs_at(4.0) <= plan_sim.MAX_PROGRAMS


def test_prefill_view_keeps_prompt_lengths():
    trace = load_or_generate("toolbench", 5, 1.0, 0)
    view = plan_sim.prefill_view(trace)
    for p, q in zip(trace.programs, view.programs, strict=True):
        assert all(t.output_tokens == 1 for t in q.turns)
        assert [p.context_before(i) for i in range(p.n_turns)] == \
            [q.context_before(i) for i in range(q.n_turns)]


def test_profile_names_are_checked():
    with pytest.raises(PlanError, match="leave the TP size out"):
        plan_sim.split_profile("h100x8-llama-3.1-70b")
    with pytest.raises(PlanError, match="GPU-MODEL"):
        plan_sim.split_profile("tpu-llama")
    with pytest.raises(PlanError, match="--trace"):
        plan_sim.SimulatedTau("h100-llama-3.1-8b", "no-such-trace", 1.0,
                              workload=partial(make_trace, "no-such-trace"))


# --- the command ------------------------------------------------------------------------------


def test_plan_command_with_a_table(tmp_path, capsys):
    rng = np.random.default_rng(3)
    provider = random_table(rng, rate=2.0, max_count=8, degrees=(1, 2))
    path = tmp_path / "tau.json"
    body = {role: {str(d): {str(load): tau for load, tau in curve.points}
                   for (r, d), curve in provider.curves.items() if r == role}
            for role in ("prefill", "decode")}
    path.write_text(json.dumps(body))
    args = ["plan", "--gpus", "8", "--profile", "h100-llama-3.1-8b", "--trace", "dureader",
            "--rate", "2", "--table", str(path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "| TP" in line]
    assert len(rows) == 3 and rows[0].startswith("| 1 | TP")
    assert "planning took" in out
    expected = plan(provider, 8, 2.0, Objective(SLO))[0]
    assert f"| {expected.prefill.label()} | {expected.decode.label()} |" in rows[0]
    assert main([*args[:2], "1", *args[3:]]) == 2
    assert "harness: error: --gpus must be an integer >= 2" in capsys.readouterr().err


# --- stage two: near-tied plans replayed, the best measured chosen ----------------------------


def plan_of(p: int, d: int, score: float):
    from cluster.planner import Candidate, Plan

    return Plan(Candidate("prefill", 8, p, 0.5), Candidate("decode", 8, d, 0.01), score)


def test_near_ties_are_the_plans_within_the_tolerance_of_the_first():
    from cluster.plan_verify import TIE_TOLERANCE, near_ties

    plans = [plan_of(1, 1, 0.50), plan_of(1, 2, 0.55), plan_of(2, 1, 0.61), plan_of(2, 2, 0.59)]
    assert TIE_TOLERANCE == 0.2
    # 0.50 * 1.2 = 0.60: the third (0.61) is out, the fourth (0.59) in, in the ILP's order
    assert [p.key() for p in near_ties(plans)] == [(8, 1, 8, 1), (8, 1, 8, 2), (8, 2, 8, 2)]
    assert len(near_ties(plans, 0.0)) == 1
    assert len(near_ties(plans, math.inf)) == 4
    with pytest.raises(PlanError, match="tie-tolerance"):
        near_ties(plans, -0.1)


def test_the_choice_is_the_best_measured_and_ties_keep_the_planners_order():
    """Hand-made replays: plan 2 measures best, so it is chosen; equal measurements go to the
    ILP's order."""
    from cluster.plan_verify import choose, measure, ranked, report

    measured_p95 = {(1, 1): (0.9, 0.02), (1, 2): (0.5, 0.01), (2, 1): (0.5, 0.01)}

    def replay(prefill, decode, programs, seed):
        assert programs == 12 and prefill[0] == decode[0] == 8 and seed == 0
        return measured_p95[(prefill[1], decode[1])]

    objective = Objective({"prefill": 1.0, "decode": 0.1})
    plans = [plan_of(1, 1, 0.5), plan_of(1, 2, 0.5), plan_of(2, 1, 0.52)]
    lines = []
    got = measure(replay, plans, objective, 12, progress=lines.append)
    assert [m.planned_rank for m in got] == [1, 2, 3] and len(lines) == 3
    assert got[0].score == pytest.approx(0.9 + 1e-3 * (0.9 + 0.2))
    assert got[1].score == got[2].score  # equal measurements
    assert choose(got).planned_rank == 2
    assert [m.planned_rank for m in ranked(got)] == [2, 3, 1]
    text = report(got, 12)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "TP8" in line]
    assert rows[0].startswith("| 1 | 2 |") and rows[2].startswith("| 3 | 1 |")
    assert "the best measured is the ILP's plan 2" in text
    assert "ILP's first plan is also the best measured" in report(got[:1], 12)
    assert "One replay seed: no estimate of the noise" in text


def test_several_seeds_choose_by_the_mean_and_report_the_wins():
    from cluster.plan_verify import choose, measure, report

    # per seed, the measured P95 TTFT (ITL far below its SLO): plan 1 wins seed 1 only
    ttft = {(1, 1): [0.8, 0.9, 1.8], (1, 2): [0.7, 1.0, 1.4]}

    def replay(prefill, decode, programs, seed):
        return ttft[(prefill[1], decode[1])][seed], 0.001

    objective = Objective({"prefill": 1.0, "decode": 0.1})
    got = measure(replay, [plan_of(1, 1, 0.5), plan_of(1, 2, 0.5)], objective, 12,
                  seeds=[0, 1, 2])
    assert got[0].ttft == pytest.approx(3.5 / 3) and len(got[0].scores) == 3
    assert got[1].score == pytest.approx(sum(got[1].scores) / 3)
    assert choose(got).planned_rank == 2  # mean 1.03 against 1.17
    assert "best under 2 of 3 seeds; the plans are not separated" in report(got, 12)
    with pytest.raises(PlanError, match="verify-seeds"):
        measure(replay, [plan_of(1, 1, 0.5)], objective, 12, seeds=[])


def test_plan_command_replays_near_ties_and_reports_the_best_measured(monkeypatch, capsys):
    """`harness plan` simulating (stubbed): stage two is on by default, replays the near-tied
    plans among the top 3 and prints the best measured as the choice; `--verify 0` keeps the
    ILP's first plan."""
    replayed = []

    class Stub(FakeSim):
        def deployment(self, prefill, decode, programs, seed=None):
            replayed.append((prefill, decode))
            # the more decode GPUs, the better the measured TTFT: the ILP cannot see it
            return 1.0 / (decode[0] * decode[1]), 0.01

    monkeypatch.setattr(plan_sim, "SimulatedTau", Stub)
    args = ["plan", "--gpus", "16", "--profile", "h100-llama-3.1-70b", "--trace", "dureader",
            "--rate", "4", "--quiet"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert 2 <= len(replayed) <= 3
    best = max(replayed, key=lambda r: r[1][0] * r[1][1])
    (pd, pc), (dd, dc) = best
    assert f"choice: prefill TP{pd} x {pc}, decode TP{dd} x {dc}" in out
    assert "the best measured of" in out
    replayed.clear()
    assert main([*args, "--verify", "0"]) == 0
    out = capsys.readouterr().out
    assert replayed == [] and "the ILP's first plan (--verify 0)" in out


def test_parallel_chains_simulate_what_the_serial_walk_does(tmp_path):
    """`--jobs 2`: each (role, degree) chain walked in a worker process fills the cache with
    exactly the serial walk's simulations and values, so the plans are the same."""
    objective = Objective(SLO)
    serial = fake()
    serial_plans = plan(serial, 16, 4.0, objective)
    parallel = fake(tmp_path)
    parallel.prefetch(16, objective, top=3, jobs=2)
    assert parallel.simulations == serial.simulations > 0
    assert parallel._cache == serial._cache
    asked_before = parallel.simulations
    assert [p.key() for p in plan(parallel, 16, 4.0, objective)] == \
        [p.key() for p in serial_plans]
    assert parallel.simulations == asked_before  # the planner found everything cached
    assert json.loads((tmp_path / "cache.json").read_text())["tau"] == serial._cache


def test_chains_that_cannot_beat_the_top_plans_are_not_simulated():
    """A chain whose bound scores worse than the 3rd best plan found is skipped, and the plans
    are those of the walk that simulates everything."""
    from sim.planning import SimulatedTau

    objective = Objective(SLO)
    full = fake()
    expected = [p.key() for p in plan(full, 16, 4.0, objective)]
    bounded = fake()
    # a tight, valid bound: the least tau of the chain (the fake curve rises with the load)
    bounded.chain_bound = lambda role, d, loads: min(fake_tau(role, d, x) for x in loads)
    bounded.prefetch(16, objective, top=3)
    assert bounded.pruned  # some chains could not make a top-3 plan
    for role, d in bounded.pruned:
        assert not any(a[:2] == (role, d) for a in bounded.asked)
        assert bounded.tau(role, d, 4.0) == math.inf
    assert bounded.simulations < full.simulations
    assert [p.key() for p in plan(bounded, 16, 4.0, objective)] == expected
    # the best score a plan with a candidate can reach: the other role at tau 0
    assert plan_bounds.bound_score(objective, "prefill", 1.0) == pytest.approx(0.5 * 1.001)
    assert plan_bounds.bound_score(objective, "decode", 0.05) == pytest.approx(0.5 * 1.001)
    # the real bound is below what the perf model's idle replica shows: P95 of turns alone
    real = SimulatedTau.chain_bound(full, "prefill", 8, [4.0, 2.0])
    assert 0 < real < math.inf
    assert SimulatedTau.chain_bound(full, "decode", 8, [4.0]) < \
        SimulatedTau.chain_bound(full, "decode", 2, [4.0])


def test_a_chain_that_turns_flat_does_not_simulate_below_it():
    """Once two grid points agree within `flat`, lower loads reuse the lower one's tau, so the
    grid point under the load asked is not simulated."""

    class Flat(FakeSim):
        def simulate(self, role, degree, load):
            self.asked = getattr(self, "asked", [])
            self.asked.append(round(load, 6))
            return 0.02

    sim = Flat("h100-llama-3.1-70b", "dureader", 4.0, workload=partial(make_trace, "dureader"))
    sim.asked = []
    sim.capacity = dict.fromkeys(sim.capacity, math.inf)
    assert sim.tau("decode", 8, 4.0) == 0.02 and sim.tau("decode", 8, 2.0) == 0.02
    assert sim.asked == [4.0, round(4.0 / 1.5, 6)]  # not 4 / 1.5^2, under 2.0


# --- planning for AMPD: its routing, predicted attainment, the bench's engines ------------------


class AttSim(FakeSim):
    """FakeSim that also reports a share within the SLO: 1 - load / 8 (made up, linear)."""

    def simulate(self, role, degree, load):
        tau = super().simulate(role, degree, load)
        self._last_att = 1 - load / 8
        return tau


def test_predicted_attainment_is_the_product_of_the_roles_shares_on_the_grid():
    """Rate 4, grid 4, 4/1.5 = 2.667, ...: at a grid load the simulated share (1 - 4/8 = 0.5
    at 4); between grid points linear (at 3: 0.5 + (3 - 4) * (0.5 - 0.6667) / (4 - 2.667) ...
    = 1 - 3/8 = 0.625, as the made-up share is linear); a plan's prediction multiplies its
    prefill share at 4/1 by its decode share at 4/2 (0.5 x 0.75 = 0.375)."""
    sim = AttSim("h100-llama-3.1-70b", "dureader", 4.0, workload=partial(make_trace, "dureader"),
                 options=plan_sim.SimOptions(slo=(2.0, 0.05)))
    sim.asked = []
    sim.capacity = dict.fromkeys(sim.capacity, math.inf)
    assert sim.attainment("prefill", 4, 4.0) == pytest.approx(0.5)
    assert sim.attainment("prefill", 4, 3.0) == pytest.approx(0.625)
    from cluster.planner import Candidate, Plan
    plan = Plan(Candidate("prefill", 4, 1, 0.0), Candidate("decode", 8, 2, 0.0), 0.0)
    assert sim.predicted_attainment(plan) == pytest.approx(0.5 * (1 - 2.0 / 8))
    sim.capacity[("decode", 2)] = 1.0  # above capacity: tau inf, nothing within the SLO
    assert sim.attainment("decode", 2, 2.0) == 0.0


def test_ampd_planning_needs_the_slo_and_pulls_history_by_default():
    with pytest.raises(PlanError, match="AMPD routes against the SLO"):
        FakeSim("h100-llama-3.1-70b", "dureader", 4.0, workload=partial(make_trace, "dureader"),
                options=plan_sim.SimOptions(router="ampd"))
    with pytest.raises(PlanError, match="--router 'sglang'"):
        FakeSim("h100-llama-3.1-70b", "dureader", 4.0, workload=partial(make_trace, "dureader"),
                options=plan_sim.SimOptions(router="sglang"))
    sim = FakeSim("h100-llama-3.1-70b", "dureader", 4.0, workload=partial(make_trace, "dureader"),
                  options=plan_sim.SimOptions(router="ampd", slo=(2.0, 0.05)))
    assert (sim.router, sim.history) == ("ampd", "pull")
    assert fake().history == "recompute"  # pd planning as before


def test_the_bench_and_the_planner_build_pd_replicas_by_one_rule():
    """`sim.engines.pd_spec`: an AMPD prefill replica runs one prefill at a time (Eq. 3),
    Dynamo's prefill replicas cache nothing, and every replica is the cluster file's (its
    profile and the cluster's TTFT SLO) started with what its KV cache holds."""
    from cluster.config import ClusterConfig, parse_cluster
    from sim.engines import fitting_context, pd_spec

    def replicas(policy: str) -> ClusterConfig:
        return parse_cluster({"router": {"strategy": "pd", "ttft_slo_s": 2.5}, "replicas": [
            {"name": "p", "role": "prefill", "policy": policy, "profile": "h20x2-llama-3.1-70b"},
            {"name": "d", "role": "decode", "policy": policy}]})

    ampd, vllm = replicas("ampd"), replicas("vllm")
    prefill = pd_spec(ampd.replicas[0], ampd, 7)
    assert (prefill.max_num_seqs, prefill.enable_prefix_caching) == (1, True)
    assert (prefill.seed, prefill.ttft_slo_s, prefill.profile) == (7, 2.5, "h20x2-llama-3.1-70b")
    assert prefill.max_model_len == fitting_context("h20x2-llama-3.1-70b", None) is not None
    assert pd_spec(ampd.replicas[1], ampd, 7).max_num_seqs is None
    plain = pd_spec(vllm.replicas[0], vllm, 0, prefill_cache=False)
    assert (plain.max_num_seqs, plain.enable_prefix_caching) == (None, False)
    assert pd_spec(vllm.replicas[1], vllm, 0, prefill_cache=False).enable_prefix_caching


@pytest.mark.engine
@pytest.mark.slow
def test_ampd_planning_routes_prefills_locally_in_its_simulations():
    """One real whole-plan replay under `ampd` routing (6 dureader programs, TP8 P + TP8 D on
    H100s, a TTFT SLO no remote prefill meets): AMPD's router takes some prefills local, which
    `pd` routing never does, and the share within the SLO is kept for the plan."""
    sim = plan_sim.SimulatedTau("h100-llama-3.1-70b", "dureader", 2.0,
                                workload=partial(make_trace, "dureader"),
                                options=plan_sim.SimOptions(router="ampd", slo=(0.05, 0.1)))
    turns = sim._turns("t", [{"name": "p", "role": "prefill", "profile": sim.profile(8)},
                             {"name": "d", "role": "decode", "profile": sim.profile(8)}],
                       sim._workload(6, 2.0))
    assert any(t.prefill_replica is None for t in turns)  # local: no remote prefill replica
    sim.deployment((8, 1), (8, 1), 6)
    assert 0.0 <= sim.replayed[((8, 1), (8, 1), 0)] <= 1.0


def test_the_bench_replays_other_programs_than_the_prediction_and_averages_its_seeds():
    """The bench's seeds start after the planner's verify seeds (with 3 verify seeds, seed + 1
    was one of the programs the prediction was made on); with several bench seeds the error
    is the mean's, each seed's replay shown beside it."""
    assert plan_check.bench_seeds(0, 1, None, 1) == [1]
    assert plan_check.bench_seeds(0, 3, None, 2) == [3, 4]
    assert plan_check.bench_seeds(5, 0, None, 1) == [6]
    assert plan_check.bench_seeds(0, 3, 10, 3) == [10, 11, 12]
    with pytest.raises(ValueError, match="--bench-seeds"):
        plan_check.bench_seeds(0, 1, None, 0)
    c = plan_check.Checked("P TP4 x1 + D TP4 x1", 1.0, 0.70, 0.66, {}, (0.60, 0.72))
    assert c.error() == pytest.approx(0.04 / 0.66)
    text = plan_check.report([c], programs=80, seeds=[3, 4])
    assert "seeds 3, 4" in text and "0.600 / 0.720 |" in text and "| 6.1 % | yes |" in text
    one = plan_check.report([plan_check.Checked("x", 1.0, 0.825, 0.596, {})], programs=80,
                            seeds=[1])
    assert "| 38.4 % | no |" in one and "--bench-seeds N" in one
    many = plan_check.Checked("y", 1.0, 0.6, 0.6, {}, tuple(0.5 + 0.01 * i for i in range(21)))
    text = plan_check.report([many], programs=80, seeds=list(range(40, 61)))
    assert "seeds 40-60" in text and "0.500-0.700, sd 0.062 (21 seeds) |" in text


def test_plan_command_replays_each_plan_under_every_bench_seed(monkeypatch, capsys):
    """`harness plan --bench 80 --bench-seeds 3` (simulations stubbed, the bench's replay too):
    each printed plan is replayed under the three seeds after the planner's own, and the
    report compares their mean with the prediction, each seed's figure beside it."""
    asked = []

    def replay(plan, *, seed, **kw):
        asked.append((plan.prefill, plan.decode, seed))
        return {"slo_attainment": 0.5 + 0.1 * (seed - 1), "wall_s": 0.0}

    monkeypatch.setattr(plan_sim, "SimulatedTau", FakeSim)
    monkeypatch.setattr(plan_check, "replay_plan", replay)
    assert main(["plan", "--gpus", "16", "--profile", "h100-llama-3.1-70b", "--trace",
                 "dureader", "--rate", "4", "--quiet", "--verify", "0", "--top", "1",
                 "--bench", "80", "--bench-seeds", "3"]) == 0
    out = capsys.readouterr().out
    assert [seed for _, _, seed in asked] == [1, 2, 3]  # --seed 0, no verify seeds
    assert "seeds 1, 2, 3" in out and "| 0.600 |" in out and "0.500 / 0.600 / 0.700 |" in out
