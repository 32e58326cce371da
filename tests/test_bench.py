"""The trace-replay benchmark: deterministic, sane metrics, and the `harness bench` outputs."""

from __future__ import annotations

import json
from contextlib import closing
from dataclasses import replace

import pytest

from cli.main import main
from common.metrics import MACHINE_DEPENDENT, replay_metrics
from eval.bench.runs import BenchSpec, Workload
from eval.bench.specs import BenchError, check_engine
from eval.bench.sweep import bench
from eval.bench.traces import make_trace
from eval.bench.virtual import SingleEngine
from server.engine_spec import EngineSpec
from server.policies.spec import PolicySpec
from sim.engines import make_engine
from sim.replay import isolated_jcts, replay

PROFILE = "h100-llama-3.1-8b"
# a small KV cache (~1.1k blocks = 18k tokens) so that six programs contend for memory
BLOCKS = 1100
VLLM = PolicySpec.named("vllm")
ENGINE = EngineSpec(profile=PROFILE, num_gpu_blocks=BLOCKS)


def _replay(policy: str, trace):
    with closing(make_engine(PolicySpec.parse(policy), ENGINE)) as engine:
        return replay(trace, engine)


@pytest.fixture(scope="module")
def trace():
    return make_trace("swe", 6, 2.0, seed=3)


@pytest.fixture(scope="module")
def isolated(trace):
    with closing(make_engine(VLLM, ENGINE)) as engine:
        return isolated_jcts(trace, engine)


@pytest.fixture(scope="module")
def results(trace):
    return {policy: _replay(policy, trace) for policy in ("vllm", "continuum")}


@pytest.mark.engine
def test_every_program_and_turn_completes(trace, results):
    for result in results.values():
        assert set(result.programs) == {p.id for p in trace.programs}
        for program in trace.programs:
            record = result.programs[program.id]
            assert record.finished is not None
            assert [t.turn for t in record.turns] == list(range(program.n_turns))
            for i, turn in enumerate(record.turns):
                assert turn.prompt_tokens == program.context_before(i)
                assert turn.output_tokens == program.turns[i].output_tokens


@pytest.mark.engine
def test_metrics_are_sane(trace, results, isolated):
    for policy, result in results.items():
        metrics = replay_metrics(result, isolated)
        for pid, record in result.programs.items():
            assert record.jct >= isolated[pid] - 1e-9, (policy, pid)
            for turn in record.turns:
                assert turn.admitted is not None and turn.admitted >= turn.arrival - 1e-12
                assert turn.first_token >= turn.admitted
                assert turn.finished >= turn.first_token
                assert 0 <= turn.cached_tokens <= turn.prompt_tokens
        assert metrics["makespan_s"] >= max(r.jct for r in result.programs.values())
        assert metrics["queue_mean_s"] >= 0 and metrics["normalised_latency_mean"] >= 1.0
        assert 0.0 <= metrics["pin_memory_share"] <= 1.0
        assert metrics["sched_steps"] > 0
    # later turns extend earlier prompts, so the prefix cache hits even without pins
    assert replay_metrics(results["vllm"])["prefix_hit_tokens"] > 0
    assert results["continuum"].pin_stats["pinned"] > 0
    assert results["vllm"].pin_stats["pinned"] == 0


@pytest.mark.engine
def test_same_seed_gives_identical_replay(trace, results):
    again = _replay("continuum", trace)
    first = replay_metrics(results["continuum"])
    second = replay_metrics(again)
    for key in MACHINE_DEPENDENT:
        first.pop(key, None)
        second.pop(key, None)
    assert first == second
    assert results["continuum"].programs == again.programs


@pytest.mark.engine
def test_bench_cli_writes_summary_report_and_plots(tmp_path, capsys):
    out = tmp_path / "bench"
    args = ["bench", "--trace", "swe", "--programs", "4", "--policies", "vllm,continuum",
            "--jps", "3", "--out", str(out), "--num-gpu-blocks", str(BLOCKS)]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    # every report has the clairvoyant schedule beside the policies, and the floor
    assert [(r["policy"], r["jps"]) for r in summary["results"]] == [
        ("vllm", 3.0), ("continuum", 3.0), ("oracle", 3.0)]
    assert summary["floors"][0]["jps"] == 3.0
    for row in summary["results"]:
        assert row["floor_jct_mean_s"] >= summary["isolated_jct_mean_s"]
        assert row["jct_mean_s"] >= row["floor_jct_mean_s"] - 1e-6
    for row in summary["results"]:
        for key in ("jct_mean_s", "jct_p95_s", "throughput_programs_per_min", "ttft_mean_s",
                    "queue_mean_s", "prefix_hit_tokens", "recomputed_tokens", "preemptions",
                    "pin_memory_share", "sched_cpu_ms_per_step", "normalised_latency_mean",
                    "slo_attainment", "goodput_turns_per_s", "tpot_mean_s"):
            assert key in row
    report = (out / "report.md").read_text()
    assert "| vllm |" in report and "fastest" in report
    assert "gap closed" in report and "## Bounds" in report
    for name in ("jct_vs_load.png", "jct_cdf.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # isolated JCTs are cached: a second sweep reuses them and gives the same JCTs
    assert list(out.glob("isolated-*.json"))
    again = bench(BenchSpec(Workload("swe", 4, (3.0,)), ("vllm",)),
                  SingleEngine(ENGINE, (VLLM,)), out)
    assert again.results[0]["jct_mean_s"] == summary["results"][0]["jct_mean_s"]
    # what was replayed is in the report: the trace's statistics and the engine settings
    assert summary["trace_stats"]["n_programs"] == 4
    assert "## What was replayed" in report and "| turns / program |" in report
    assert "num_gpu_blocks 1,100" in report
    assert summary["offload_copy_model"] == "peak80" and "`peak80` copy model" in report


@pytest.mark.engine
def test_a_program_schedulers_run_records_its_kv_occupancy_beside_the_engines(tmp_path):
    """`lookahead` on the small cache: its run records KV tokens by program state over time,
    with the engine's own count of what it held (never above its capacity, and something at
    some point), and the report draws them."""
    out = tmp_path / "bench"
    args = ["bench", "--trace", "swe", "--programs", "6", "--policies", "lookahead",
            "--concurrency", "6", "--no-bounds", "--out", str(out),
            "--num-gpu-blocks", str(BLOCKS)]
    assert main(args) == 0
    (run,) = (out / "runs").glob("*.json")
    series = json.loads(run.read_text())["occupancy"]
    assert len(series) >= 2
    for sample in series:
        assert {"reasoning", "acting", "paused", "in_use", "capacity"} <= sample.keys()
        assert 0 <= sample["in_use"] <= sample["capacity"] == BLOCKS * 16
    assert max(s["in_use"] for s in series) > 0
    assert (out / "kv_occupancy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.engine
@pytest.mark.slow
def test_jobs_run_replays_in_processes_with_the_same_figures(tmp_path):
    """--jobs 2: the isolated JCTs and each replay in their own process; every figure but the
    wall and CPU times is the serial run's."""
    workload = Workload("swe", 3, (3.0,))
    engine = SingleEngine(ENGINE, (PolicySpec.named("continuum"),))
    serial = bench(BenchSpec(workload, ("continuum",)), engine, tmp_path / "serial")
    parallel = bench(BenchSpec(workload, ("continuum",), jobs=2), engine, tmp_path / "parallel")
    assert parallel.jobs == 2
    timing = set(MACHINE_DEPENDENT)
    for a, b in zip(serial.results, parallel.results, strict=True):
        assert {k: v for k, v in a.items() if k not in timing} == {
            k: v for k, v in b.items() if k not in timing}
    assert (tmp_path / "parallel" / "runs" / "continuum-jps3.json").exists()


@pytest.mark.engine
def test_engine_settings_reach_every_policys_engine(autoclose):
    """--max-num-batched-tokens, --long-prefill-token-threshold and --offload-gib are set once
    for all policies: vllm gets the CPU tier it would not have by default, and every engine the
    same step budget and long-prefill cap."""
    settings = replace(ENGINE, max_num_batched_tokens=2048, offload_gib=2.0,
                       long_prefill_token_threshold=512)
    for policy in ("vllm", "continuum"):
        engine = autoclose(make_engine(PolicySpec.parse(policy), settings))
        assert engine.vllm_config.scheduler_config.max_num_batched_tokens == 2048
        assert engine.vllm_config.scheduler_config.long_prefill_token_threshold == 512
        assert engine.offload_gib == 2.0
        assert engine.vllm_config.kv_transfer_config is not None
    plain = autoclose(make_engine(VLLM, ENGINE))
    assert plain.offload_gib is None and plain.vllm_config.kv_transfer_config is None


@pytest.mark.engine
def test_offload_copy_model_reaches_the_worker_and_the_cost_model(autoclose):
    """--offload-copy-model sourced: the emulated offload worker and the policy's cost model
    both price copies with it; peak80 stays the default; an unknown name is refused."""
    from server.perf.registry import load_profile

    sourced = load_profile(PROFILE, offload_copy_model="sourced")
    continuum = PolicySpec.named("continuum")
    settings = replace(ENGINE, offload_gib=2.0, offload_copy_model="sourced")
    engine = autoclose(make_engine(continuum, settings))
    worker = engine.core.model_executor._offload
    assert worker._load_seconds(2048) == sourced.load_seconds(2048)
    assert worker._store_seconds(2048) == sourced.store_seconds(2048)
    cost = engine.scheduler.agent_policy.cost_model
    assert cost.offload_copy_model == "sourced"
    assert cost.swap_seconds(2048) == sourced.load_seconds(2048)
    engine = autoclose(make_engine(continuum, replace(ENGINE, offload_gib=2.0)))
    # the env of the previous engine does not leak into the next one
    assert engine.scheduler.agent_policy.cost_model.offload_copy_model == "peak80"
    worker = engine.core.model_executor._offload
    assert worker._load_seconds(2048) == load_profile(PROFILE).swap_seconds(2048)
    with pytest.raises(BenchError, match="unknown offload copy model 'fast'"):
        check_engine(EngineSpec(offload_copy_model="fast"))


@pytest.mark.parametrize("args, message", [
    (["--trace", "nope"], "neither a trace name"),
    (["--trace", "swe", "--policies", "vllm,bogus"], "unknown policy 'bogus'"),
    (["--trace", "swe", "--jps", "fast"], "--jps"),
    (["--trace", "swe", "--policies", "continuum@psychic"], "unknown hints"),
    (["--trace", "swe", "--policies", "vllm+gpu"], "only suffix is +offload"),
    (["--trace", "swe", "--policies", "vllm:0.5"], "takes no argument after ':'"),
    (["--trace", "swe", "--policies", "lookahead-oracle:-1"], "lognormal sigma >= 0"),
    (["--trace", "swe", "--policies", "vllm,continuum", "--url", "http://127.0.0.1:9"],
     "one running server"),
    (["--trace", "swe", "--time-scale", "0"], "--time-scale"),
    (["--trace", "swe", "--slo-tpot", "-1"], "--slo-tpot must be a positive"),
    (["--trace", "swe", "--max-num-batched-tokens", "8"], "at least 16 tokens"),
    (["--trace", "swe", "--max-num-seqs", "0"], "--max-num-seqs 0: give at least 1"),
    (["--trace", "swe", "--long-prefill-token-threshold", "0"], "a positive number of tokens"),
    (["--trace", "swe", "--jobs", "0"], "--jobs 0: give at least 1"),
    (["--trace", "swe", "--offload-gib", "0"], "--offload-gib 0.0: give a positive"),
    (["--trace", "swe", "--offload-gib", "2", "--url", "http://127.0.0.1:9",
      "--policies", "vllm"], "own engine settings"),
])
def test_bench_cli_reports_bad_input_clearly(tmp_path, capsys, args, message):
    assert main(["bench", *args, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_unknown_trace_is_a_bench_error():
    with pytest.raises(BenchError, match="neither a trace name"):
        make_trace("no-such-trace", 3, 1.0, 0)


@pytest.mark.engine
def test_client_hints_reach_continuum(trace, autoclose):
    """The client's predictions arrive with tool_start, after the turn finished: continuum
    re-decides the TTL of the pins it holds from them (source "hint"). K = 10 instead of the
    paper's 100: six programs never leave the Exp(1 s) prior, which seldom pins here, and only
    a held pin takes a hint."""
    hinted = {}
    for hints in ("none", "online", "oracle"):
        engine = autoclose(make_engine(PolicySpec.parse("continuum"), ENGINE))
        engine.scheduler.agent_policy.durations.min_samples = 10
        replay(trace, engine, hints=hints)
        hinted[hints] = engine.scheduler.agent_policy.stats()["ttl_sources"].get("hint", 0)
    assert hinted["none"] == 0
    # online: only once a tool has 10 calls seen by the client; oracle: every call
    assert 0 < hinted["online"] < hinted["oracle"]


@pytest.mark.engine
def test_offload_suffix_gives_a_policy_the_cpu_tier(trace, results):
    """`vllm+offload`: the same decisions as `vllm`, plus vLLM's CPU KV offloading, so what
    the small GPU cache evicts comes back over PCIe instead of being recomputed."""
    offloaded = _replay("vllm+offload", trace)
    recomputed = sum(t.recomputed_tokens for p in offloaded.programs.values() for t in p.turns)
    baseline = sum(t.recomputed_tokens for p in results["vllm"].programs.values()
                   for t in p.turns)
    assert recomputed < baseline / 2


def test_slo_attainment_and_goodput_by_hand():
    from common.metrics import SLO, slo_metrics
    from sim.records import ProgramRecord, TurnRecord

    def turn(arrival, first, finished, tokens):
        return TurnRecord("p", 0, arrival, first_token=first, finished=finished,
                          output_tokens=tokens)

    # TTFT 1 s, TPOT (5 - 1) / 40 = 0.1 s: met (bounds are inclusive)
    ok = turn(0.0, 1.0, 5.0, 41)
    # TTFT 3 s: missed; TPOT 0.05 s
    late = turn(10.0, 13.0, 14.0, 21)
    # TTFT 0.5 s, TPOT 2 / 10 = 0.2 s: missed
    slow = turn(20.0, 20.5, 22.5, 11)
    # a one-token answer has no TPOT: only TTFT counts
    single = turn(30.0, 30.2, 30.2, 1)
    a = ProgramRecord("a", 0.0, 14.0, [ok, late])
    b = ProgramRecord("b", 20.0, 30.2, [slow])
    c = ProgramRecord("c", 30.0, 30.2, [single])
    m = slo_metrics([a, b, c], makespan=60.0, slo=SLO(ttft_s=2.0, tpot_s=0.1))
    assert m["slo_attainment"] == 2 / 4  # ok and single
    assert m["program_slo_attainment"] == 1 / 3  # only c met it on every turn
    assert m["goodput_turns_per_s"] == 2 / 60.0
    assert m["goodput_programs_per_min"] == 1.0
    assert m["tpot_mean_s"] == pytest.approx((0.1 + 0.05 + 0.2) / 3)
    # a looser TTFT bound admits `late`
    assert slo_metrics([a, b, c], 60.0, SLO(ttft_s=3.0, tpot_s=0.1))["slo_attainment"] == 3 / 4


def test_replay_commands_rerun_themselves_under_a_fixed_hash_seed(monkeypatch):
    """vLLM's offloading connector walks a set of request ids, so a replay's figures depend on
    the string-hash seed: `harness bench` (and plan, cluster) re-exec under PYTHONHASHSEED=0
    unless the user chose a seed; other commands are left alone."""
    from cli import main as cli

    calls = []
    monkeypatch.setattr(cli.os, "execve", lambda exe, cmd, env: calls.append((cmd, env)))
    monkeypatch.setattr(cli.sys, "argv", ["/venv/bin/harness", "bench", "--trace", "swe"])
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    cli._pin_hash_seed(["bench", "--trace", "swe"])
    assert len(calls) == 1
    cmd, env = calls[0]
    assert cmd[1:] == ["/venv/bin/harness", "bench", "--trace", "swe"]
    assert env["PYTHONHASHSEED"] == "0"
    cli._pin_hash_seed(["serve", "--policy", "vllm"])  # not a replay: no re-exec
    monkeypatch.setattr(cli.sys, "argv", ["/x/cli/__main__.py", "plan", "--gpus", "4"])
    cli._pin_hash_seed(["plan", "--gpus", "4"])
    assert calls[1][0][1:] == ["-m", "cli", "plan", "--gpus", "4"]
    monkeypatch.setenv("PYTHONHASHSEED", "7")  # the user's own seed is kept
    cli._pin_hash_seed(["bench"])
    assert len(calls) == 2


@pytest.mark.engine
def test_the_oracle_is_told_the_future_by_the_engine_factory(trace):
    """`oracle` needs the trace (it is refused without), replays every program to the end,
    and no other policy is given the future."""
    oracle = PolicySpec.parse("oracle")
    with pytest.raises(ValueError, match="future"):
        make_engine(oracle, ENGINE)
    with closing(make_engine(oracle, ENGINE, trace=trace)) as engine:
        result = replay(trace, engine)
        assert engine.scheduler.agent_policy.pins_made > 0
    assert all(p.finished is not None for p in result.programs.values())
    continuum = PolicySpec.parse("continuum")
    with closing(make_engine(continuum, ENGINE, trace=trace)) as engine:
        assert engine.future is None
