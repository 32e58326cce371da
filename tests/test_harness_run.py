"""`harness run` end to end: real tools, the real server (emulated GPU), the replay model."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from harness.server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent


def received(server: ServerProcess) -> int:
    return int(httpx.get(server.base_url + "/v1/agent/events", timeout=5).json()["received"])


def harness_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", "run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.server
@pytest.mark.slow
def test_gsm8k_end_to_end_with_resume(server, tmp_path):
    out = tmp_path / "gsm8k"
    before = received(server)
    first = harness_run("gsm8k", "--server", server.base_url, "--out", str(out), "--limit", "3")
    assert first.returncode == 0, first.stderr
    done = {p.name: p.stat().st_mtime_ns for p in (out / "results").iterdir()}
    assert len(done) == 3

    again = harness_run("gsm8k", "--server", server.base_url, "--out", str(out))
    assert again.returncode == 2 and "--resume" in again.stderr  # never overwrite silently

    rest = harness_run("gsm8k", "--server", server.base_url, "--out", str(out), "--resume")
    assert rest.returncode == 0, rest.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 10 and summary["passed"] == 10 and summary["pass_rate"] == 1.0
    assert summary["jct_mean_s"] > 0 and summary["events_dropped"] == 0
    # the first three were not run again
    assert {p.name: p.stat().st_mtime_ns for p in (out / "results").iterdir()
            if p.name in done} == done
    trajectory = json.loads((out / "trajectories" / "gsm-001.traj.json").read_text())
    assert trajectory["info"]["exit_status"] == "submitted"
    assert [s["tool"] for s in trajectory["steps"]] == ["calculator"] * 3 + ["finish"]
    # program_start + (tool_start, tool_end) per step + program_end, all reached the server
    results = [json.loads(p.read_text()) for p in (out / "results").iterdir()]
    assert received(server) - before == sum(2 + 2 * r["steps"] for r in results)


@pytest.mark.server
@pytest.mark.slow
def test_wrong_answer_is_detected(server, tmp_path):
    tasks = tmp_path / "one.jsonl"
    tasks.write_text(next(line for line in (ROOT / "datasets/gsm8k/tasks.jsonl").read_text()
                          .splitlines() if '"gsm-004"' in line) + "\n")
    out = tmp_path / "wrong"
    run = harness_run("gsm8k", "--server", server.base_url, "--out", str(out), "--tasks",
                      str(tasks), "--model", "replay:datasets/gsm8k/trajectories-wrong")
    assert run.returncode == 0, run.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 1 and summary["passed"] == 0


def test_bad_input_is_a_clear_error(tmp_path):
    runs = [("nosuchbench",), ("gsm8k", "--tasks", str(tmp_path / "none.jsonl")),
            ("gsm8k", "--model", f"replay:{tmp_path}", "--out", str(tmp_path / "out"))]
    with ThreadPoolExecutor() as pool:  # at once: each spends about a second starting up
        bad, missing, no_replay = pool.map(lambda args: harness_run(*args), runs)
    assert bad.returncode == 2 and "choose one of" in bad.stderr
    assert missing.returncode == 2 and "--tasks" in missing.stderr \
        and "none.jsonl: no such file" in missing.stderr
    # a missing recording is found before any server is started
    assert no_replay.returncode == 2 and "no recorded trajectory" in no_replay.stderr
    assert "starting harness serve" not in no_replay.stdout


# the parameter is not called `benchmark`: pytest-benchmark owns that fixture name
@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("bench_name", ["hotpotqa", "alfworld"])
def test_benchmark_end_to_end(server, tmp_path, bench_name):
    out = tmp_path / bench_name
    before = received(server)
    run = harness_run(bench_name, "--server", server.base_url, "--out", str(out))
    assert run.returncode == 0, run.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["benchmark"] == bench_name and summary["tasks"] >= 6
    assert summary["passed"] == summary["tasks"], summary  # the recorded agents are competent
    results = [json.loads(p.read_text()) for p in (out / "results").iterdir()]
    assert {r["task_id"] for r in results} == {p.name.removesuffix(".traj.json")
                                               for p in (out / "trajectories").iterdir()}
    assert received(server) - before == sum(2 + 2 * r["steps"] for r in results)


@pytest.mark.server
@pytest.mark.slow
def test_unparseable_replies_end_the_program_with_a_clear_status(server, tmp_path):
    replays = tmp_path / "garbage"
    replays.mkdir()
    messages = [{"role": "assistant", "content": f"I am not sure what to do ({i})."}
                for i in range(6)]
    (replays / "gsm-001.traj.json").write_text(json.dumps({"messages": messages}))
    out = tmp_path / "garbage-run"
    run = harness_run("gsm8k", "--server", server.base_url, "--out", str(out), "--limit", "1",
                      "--model", f"replay:{replays}")
    assert run.returncode == 0, run.stderr
    result = json.loads((out / "results" / "gsm-001.json").read_text())
    assert result["status"] == "format_error" and not result["passed"]
    trajectory = json.loads((out / "trajectories" / "gsm-001.traj.json").read_text())
    assert sum("Format error" in m["content"] for m in trajectory["messages"]) == 3


@pytest.mark.server
@pytest.mark.slow
def test_demo_programs_reuse_their_context(server):
    before = received(server)
    demo = subprocess.run([sys.executable, "-m", "cli", "demo", "--server",
                           server.base_url, "--programs", "2"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert demo.returncode == 0, demo.stderr
    assert "dropped 0" in demo.stdout
    # later turns extend earlier prompts, so the prefix cache serves most of them
    shares = [int(cell.strip().rstrip("%")) for line in demo.stdout.splitlines()
              if "demo-" in line for cell in [line.split("│")[-2]]]
    assert len(shares) == 2 and min(shares) >= 50
    assert received(server) > before
