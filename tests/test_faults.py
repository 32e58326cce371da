"""Faults mid-run, with real processes: the model server killed (SIGKILL to its process group)
and the run's Docker containers removed under it (what an engine restart or a user's `docker
rm -f` does to running programs; restarting the shared engine itself would break other runs on
the machine). Every running program ends with a message saying what happened, every finished
result is kept, and `--resume` against a fresh server finishes the rest with nothing run or
graded twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import psutil
import pytest
from subprocess_helpers import finish

ROOT = Path(__file__).resolve().parent.parent


def start_run(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "cli", "run", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(predicate: Any, what: str, run: subprocess.Popen[str], timeout: float = 400) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if run.poll() is not None:
            pytest.fail(f"the run ended before {what}:\n{run.stdout.read() if run.stdout else ''}")
        time.sleep(0.2)
    run.kill()
    pytest.fail(f"timed out waiting for {what}")


def results(out: Path) -> dict[str, dict[str, Any]]:
    folder = out / "results"
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")} \
        if folder.is_dir() else {}


def mtimes(out: Path, names: set[str]) -> dict[str, int]:
    return {n: (out / "results" / f"{n}.json").stat().st_mtime_ns for n in names}


def serve_child(pid: int) -> psutil.Process | None:
    """The `harness serve` a run started: its child leading a process group of its own."""
    for child in psutil.Process(pid).children():
        try:
            if os.getpgid(child.pid) == child.pid:
                return child
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return None


@pytest.mark.server
@pytest.mark.slow
def test_server_killed_mid_run_then_resume_on_a_fresh_server(server, tmp_path):
    out = tmp_path / "gsm8k"
    run = start_run("gsm8k", "--out", str(out), "--concurrency", "3")  # its own server
    wait_for(lambda: len(results(out)) >= 2, "two programs finished", run)
    serve = serve_child(run.pid)
    if serve is None:
        run.kill()
        pytest.fail("found no harness serve under the run")
    os.killpg(serve.pid, signal.SIGKILL)  # the whole server: API process and engine core
    output = finish(run)
    assert run.returncode == 1, output
    assert "unfinished" in output and "--resume" in output

    first = results(out)
    finished = {n for n, r in first.items() if not r.get("retryable")}
    stopped = {n for n, r in first.items() if r.get("retryable")}
    assert len(finished) >= 2 and stopped, first
    assert all(first[n]["status"] == "submitted" and first[n]["passed"] for n in finished)
    for name in stopped:
        error = first[name]["error"]
        assert first[name]["status"] == "model_error" and not first[name]["passed"]
        assert "model server stopped answering mid-run" in error, error
        assert "killed by SIGKILL" in error and "harness serve (pid" in error, error
    summary = json.loads((out / "summary.json").read_text())
    assert summary["retryable"] == len(stopped)
    assert summary["not_started"] == 10 - len(first)  # none started once the server was gone
    before = mtimes(out, finished)

    rest = start_run("gsm8k", "--out", str(out), "--resume", "--server", server.base_url)
    output = finish(rest)
    assert rest.returncode == 0, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 10 and summary["passed"] == 10 and summary["retryable"] == 0
    assert mtimes(out, finished) == before  # finished results were kept, not run again
    after = results(out)
    rerun = set(after) - finished
    # this run's events are exactly those of the programs it ran: nothing ran twice
    assert summary["events_sent"] == sum(2 + 2 * after[n]["steps"] for n in rerun)


def run_containers(docker_client: Any, pid: int) -> list[Any]:
    # ignore_removed: the run removes its containers while this polls (list, then inspect each)
    return docker_client.containers.list(all=True, filters={"label": f"harness.pid={pid}"},
                                         ignore_removed=True)


@pytest.mark.docker
@pytest.mark.server
@pytest.mark.slow
def test_containers_removed_mid_run_then_resume(server, docker_client, tmp_path):
    out = tmp_path / "swe"
    run = start_run("swe-bench", "--server", server.base_url, "--out", str(out), "--limit", "4",
                    "--concurrency", "2")

    def ready() -> list[Any]:
        if not results(out):
            return []
        return [c for c in run_containers(docker_client, run.pid)
                if c.labels.get("harness.tool") == "bash"]

    wait_for(ready, "a finished program and a running sandbox", run)
    # Remove the run's containers (sandboxes and graders) until a program has stopped for it:
    # one sweep can miss, when the sandbox it finds belongs to a program that is just ending
    # (a fast run, task images reused) and the next program has not made its own yet.
    while run.poll() is None and not any(r.get("retryable") for r in results(out).values()):
        for container in run_containers(docker_client, run.pid):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
        time.sleep(0.2)
    output = finish(run)
    assert run.returncode == 1, output
    first = results(out)
    finished = {n for n, r in first.items() if not r.get("retryable")}
    stopped = {n for n, r in first.items() if r.get("retryable")}
    assert finished and stopped, first
    for name in stopped:
        assert first[name]["status"] == "sandbox_error", first[name]
        assert "Docker sandbox failed" in first[name]["error"]
        assert "container" in first[name]["error"]
    # stopped programs were neither graded nor predicted
    predicted = [json.loads(line)["instance_id"]
                 for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(predicted) == sorted(finished)
    assert {p.stem for p in (out / "reports").glob("*.json")} == finished
    assert not run_containers(docker_client, run.pid)  # nothing left behind
    before = mtimes(out, finished)

    rest = start_run("swe-bench", "--server", server.base_url, "--out", str(out), "--limit",
                     "4", "--resume")
    output = finish(rest)
    assert rest.returncode == 0, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 4 and summary["retryable"] == 0 and summary["not_started"] == 0
    assert mtimes(out, finished) == before
    predicted = [json.loads(line)["instance_id"]
                 for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(predicted) == 4 and len(set(predicted)) == 4  # each graded once
    assert not run_containers(docker_client, rest.pid)


def test_an_engine_that_stops_answering_ends_the_program_as_sandbox_error(tmp_path):
    """A dead engine socket: the bash tool raises SandboxError and the agent ends the
    program as `sandbox_error` (retryable) instead of feeding the model error text."""
    import docker

    from harness.agent import Agent, Limits, ToolBox
    from harness.events_client import EventClient
    from harness.model_client import ChatClient
    from harness.tools.base import SandboxError
    from harness.tools.bash import BashTool
    from predictor.durations import ToolDurationModel

    gone = docker.DockerClient(base_url=f"unix://{tmp_path}/docker.sock", version="1.44")
    tool = BashTool("p-gone", client=gone)

    async def direct() -> None:
        with pytest.raises(SandboxError, match="Docker engine stopped answering"):
            await tool.run("ls")

    asyncio.run(direct())

    class OneReply(ChatClient):
        async def complete(self, messages: Any, **kw: Any) -> Any:
            from harness.model_client import Completion

            text = "THOUGHT: look\n\n```bash\nls\n```"
            return Completion(text, "stop", 10, 5, 0, 0.01,
                              {"choices": [{"message": {"content": text}}]})

    async def program() -> Any:
        async with EventClient("http://127.0.0.1:9") as events:
            agent = Agent(OneReply("http://127.0.0.1:9", "m"), events, ToolDurationModel(),
                          tmp_path, Limits(max_steps=3))
            return await agent.run("t", "p-gone", "swe-bench", [], ToolBox(
                {"bash": BashTool("p-gone2", client=gone).run}), None)

    trajectory = asyncio.run(program())
    assert trajectory.status == "sandbox_error" and trajectory.info["retryable"]
    assert "stopped answering" in trajectory.info["error"]
    assert len(trajectory.steps) == 1  # no second turn on a dead sandbox


def test_a_server_that_never_answers_is_a_clear_error_before_any_program(tmp_path):
    from common.processes import free_port

    run = subprocess.run([sys.executable, "-m", "cli", "run", "gsm8k", "--server",
                          f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "o")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "no server answers there" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "o" / "results").exists()
