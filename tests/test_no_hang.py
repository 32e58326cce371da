"""No input hangs a replay: a turn longer than the engine's context fails at once, naming the
program, the turn and the length (or is left out when asked), and an engine whose steps stop
changing anything with work pending raises instead of looping forever."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from common.metrics import SLO
from common.trace import Program, Trace, Turn
from eval.ampd.bench import STRATEGIES, RunConfig, _engine_factory, cluster_config
from eval.workloads.registry import load_or_generate
from server import engine as engine_module
from server.engine import ContextTooLong, NoProgress, VirtualEngine
from server.engine_spec import EngineSpec
from server.max_model_len import context_limit, served_max_model_len
from server.policies.spec import PolicySpec
from sim.conversation import too_long_turns
from sim.engines import make_engine
from sim.loop import Simulation
from sim.replay import replay
from sim.virtual_cluster import VirtualCluster

PROFILE = "h100-llama-3.1-8b"
VLLM = PolicySpec.named("vllm")


def program(pid: str, first: int, arrival: float = 0.0, turns: int = 2) -> Program:
    body = [Turn(input_tokens=first, output_tokens=8, tool="bash", tool_seconds=0.5,
                 tool_return_tokens=64)]
    body += [Turn(input_tokens=16, output_tokens=8, tool="bash", tool_seconds=0.5,
                  tool_return_tokens=64) for _ in range(turns - 2)]
    body.append(Turn(input_tokens=16, output_tokens=8))
    return Program(id=pid, arrival_s=arrival, turns=body, benchmark="test")


def test_context_limit_defaults_to_the_models_and_small_caches_lower_it() -> None:
    assert context_limit(PROFILE, None) == 131072  # Llama-3.1's context, as `vllm serve`
    assert context_limit(PROFILE, 101) == 1600
    assert context_limit(PROFILE, None, 4096) == 4096
    with pytest.raises(ValueError, match="longer than the model's context"):
        context_limit(PROFILE, None, 200_000)


def test_a_served_replica_defaults_to_harness_serves_limit_and_caches_lower_it_alike() -> None:
    assert served_max_model_len(None) == 32768  # `harness serve --max-model-len`'s default
    assert served_max_model_len(101) == context_limit(PROFILE, 101) == 1600  # one cap for both
    assert served_max_model_len(10_000) == 32768


def test_too_long_turns_names_the_first_turn_that_cannot_fit() -> None:
    trace = Trace(name="t", programs=[program("ok", 100), program("long", 1000, turns=3)])
    # "long": turn 0 ends at 1008 tokens, turn 1 at 1008 + 64 + 16 + 8 = 1096, turn 2 at 1184
    assert too_long_turns(trace, 1050) == [("long", 1, 1096)]
    assert too_long_turns(trace, 1100) == [("long", 2, 1184)]
    assert too_long_turns(trace, 1184) == []


@pytest.mark.engine
def test_engine_refuses_a_request_that_can_never_fit_and_replay_names_it(autoclose) -> None:
    small = EngineSpec(profile=PROFILE, num_gpu_blocks=65)  # 1,024 tokens
    engine = autoclose(make_engine(VLLM, small))
    assert engine.context_limit == 1024
    with pytest.raises(ContextTooLong, match=r"1,025 tokens \(1,000 prompt \+ 25 output\)"):
        engine.add_request("r", [7] * 1000, output_tokens=25)
    trace = Trace(name="t", programs=[program("fits", 200), program("long", 1500)])
    with pytest.raises(ContextTooLong, match="first long turn 0 .1,508 tokens"):
        replay(trace, engine)


@pytest.mark.engine
def test_an_engine_that_stops_making_progress_raises(monkeypatch, autoclose) -> None:
    """The replay hang as it was: a prompt longer than max_model_len (here slipped past
    `add_request`'s check, as a caller driving the core directly could) is prefilled up to the
    limit and then sits running, computing nothing, with the clock standing still. After
    NO_PROGRESS_STEPS such steps the engine says so, with what is stuck."""
    monkeypatch.setattr(engine_module, "NO_PROGRESS_STEPS", 50)
    # 4,784 tokens, prefilled in chunks of 2,048 up to the limit
    blocks = EngineSpec(profile=PROFILE, num_gpu_blocks=300, max_num_batched_tokens=2048)
    engine = autoclose(make_engine(VLLM, blocks))
    monkeypatch.setattr(type(engine), "context_limit", property(lambda self: 10**9))
    engine.add_request("stuck", [7] * 6000, output_tokens=4)
    with pytest.raises(NoProgress, match=r"50 engine steps in a row computed nothing.*"
                                         r"running: stuck \(6,000 tokens, 4,783 computed\)"
                                         r".*max_model_len 4,784"):
        for _ in range(1000):
            assert engine.has_work()
            engine.step()


@pytest.mark.engine
def test_a_pd_engine_stuck_for_good_still_raises(monkeypatch, autoclose) -> None:
    """The same stuck prompt on a P/D engine (a prefill replica, no peer at all): its steps may
    let time pass while it waits for peers, but a clock that stands still is a hang too."""
    from cluster import pd  # the P/D connector config: only this test needs it

    monkeypatch.setattr(engine_module, "NO_PROGRESS_STEPS", 50)
    engine = autoclose(VirtualEngine(VLLM, EngineSpec(
        profile=PROFILE, num_gpu_blocks=300, max_model_len=4784, max_num_batched_tokens=2048,
        kv_transfer=pd.kv_transfer_config("p", "prefill", {}, fabric="inproc:no-hang"))))
    monkeypatch.setattr(type(engine), "context_limit", property(lambda self: 10**9))
    engine.add_request("stuck", [7] * 6000, output_tokens=4)
    with pytest.raises(NoProgress, match=r"50 engine steps in a row computed nothing \(for "
                                         r"0.0 s\).*running: stuck"):
        for _ in range(1000):
            assert engine.has_work()
            engine.step()


@pytest.mark.engine
def test_pd_replicas_that_wait_on_each_other_wait_out_the_export_ttl(autoclose) -> None:
    """vLLM's pull mode, short of memory (1P1D, 1,000 blocks a replica, DuReader's long
    prompts at 2 programs/s): the decode replica fills with finished turns' exports held for
    the prefill replica (`decoder_kv_blocks_ttl`, 480 s), while the prefill replica is full of
    prefills leased to the decode replica and cannot admit the next turns that would read the
    exports. Only the TTL breaks that wait, as it would in vLLM: the replay waits it out and
    finishes (it raised `NoProgress` after 10,000 one-millisecond polls), and the loop moves
    the waiting engines' clocks to what can next reach them instead of polling."""
    trace = load_or_generate("dureader", 8, 2.0, 0)
    run = RunConfig(STRATEGIES["pd"], (1, 1))
    config = cluster_config(run, replicas=2, profile="h20x2-llama-3.1-70b", slo=SLO(5, 0.05),
                            seed=0, num_gpu_blocks=1000)
    cluster = autoclose(VirtualCluster(config, seed=0,
                                       make_engine=_engine_factory(config, 0, "pull",
                                                                   run.strategy)))
    sim = Simulation(trace, cluster)
    result = sim.run()
    assert all(p.finished is not None for p in result.programs.values())
    decode = cluster.by_name["d0"].engine
    assert decode.nixl.expired_leases > 0  # exports nobody could read in time: the TTL
    assert max(p.finished for p in result.programs.values()) > 480
    # each stall of up to 480 s costs steps of the other engine's pace, not 1 ms polls
    assert sim.engine_steps < 30_000


def _write_trace(path, programs) -> None:
    trace = Trace(name="mixed-lengths", programs=programs)
    trace.save(path)


@pytest.mark.engine
def test_bench_stops_at_once_or_skips_programs_longer_than_the_context(tmp_path, capsys):
    """A 128k-context program next to two that fit (one past the old fixed 32,768 limit)."""
    path = tmp_path / "trace.jsonl"
    _write_trace(path, [program("short", 300), program("past-32k", 40_000, arrival=0.5),
                        program("past-128k", 131_000, arrival=1.0)])
    argv = ["bench", "--trace", str(path), "--policies", "vllm", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "past-128k: turn 0 needs 131,008 tokens > max_model_len 131,072" not in err
    assert "past-128k: turn 1 needs 131,096 tokens > max_model_len 131,072" in err
    assert "--too-long skip" in err and "past-32k" not in err

    assert main([*argv, "--too-long", "skip"]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["programs"] == 2
    assert summary["skipped_too_long"] == [
        "past-128k: turn 1 needs 131,096 tokens > max_model_len 131,072"]
    run = json.loads((tmp_path / "o" / "runs" / "vllm-jpstrace.json").read_text())
    assert {p["id"]: p["finished_s"] is not None for p in run["programs"]} == {
        "short": True, "past-32k": True}

    assert main([*argv, "--max-model-len", "200000"]) == 2
    assert "longer than the model's context (131,072 tokens)" in capsys.readouterr().err
