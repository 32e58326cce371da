"""`harness sandbox prune` against the real Docker engine: a harness process is killed with
SIGKILL after starting a sandbox container and building two versions of a task image; prune
removes its container and the superseded image, keeps what live processes use, and says
what it removed. Everything here carries a run id of its own, so prune is scoped to it."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
from rich.console import Console

from harness.run import warn_leftovers
from harness.tools import labels as lb
from harness.tools.bash import BashTool

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "datasets" / "swebench"

# A harness process that dies without cleaning up: container + two image versions, SIGKILL.
CRASHING = """
import asyncio, io, json, os, signal, sys, tarfile
from harness.benchmarks import swebench_grading as grading
from harness.tools.bash import BashTool
from harness.tools.docker_client import shared_client
instance, run_id, tarball = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
client = shared_client()
labels = {"harness.run": run_id}
v1 = grading.ensure_task_image(client, instance, None, labels=labels)
with tarfile.open(tarball, "a") as tar:  # the task's repository changes
    info = tarfile.TarInfo("NOTES")
    info.size = 6
    tar.addfile(info, io.BytesIO(b"notes!"))
v2 = grading.ensure_task_image(client, instance, None, labels=labels)
tool = BashTool("crashing-program", client=client, labels={**labels, "harness.task": "t1"})
asyncio.run(tool.start())
print(json.dumps({"container": tool.container.name, "v1": v1, "v2": v2}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def prune_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", "sandbox", "prune", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.docker
def test_prune_removes_what_a_killed_run_left(docker_client, tmp_path):
    run_id = f"pytest-prune-{uuid.uuid4().hex[:8]}"
    tarball = tmp_path / "repo.tar"  # uncompressed, so the crashing process can append
    with tarfile.open(DATA / "repos" / "roman.tar.gz") as src, \
            tarfile.open(tarball, "w") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member) if member.isreg() else None)
    instance = json.loads((DATA / "tasks.jsonl").read_text().splitlines()[0])
    instance["repo_src"] = str(tarball)
    crashed = subprocess.run([sys.executable, "-c", CRASHING, json.dumps(instance), run_id,
                              str(tarball)], cwd=ROOT, capture_output=True, text=True,
                             timeout=180, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert crashed.returncode == -9, crashed.stderr
    left = json.loads(crashed.stdout)
    assert left["v1"] != left["v2"]
    container = docker_client.containers.get(left["container"])
    labels = container.labels
    assert labels[lb.RUN_LABEL] == run_id and labels[lb.TASK_LABEL] == "t1"
    assert labels[lb.PROGRAM_LABEL] == "crashing-program" and lb.process_alive(labels) is False
    image_labels = docker_client.images.get(left["v2"]).labels
    assert image_labels[lb.RUN_LABEL] == run_id and image_labels[lb.TASK_LABEL] == instance[
        "instance_id"]

    live = BashTool("live-program", client=docker_client, labels={lb.RUN_LABEL: run_id})
    try:
        asyncio.run(live.start())
        # a run that starts says so
        out = io.StringIO()
        warn_leftovers(Console(file=out, width=300))
        assert "container(s)" in out.getvalue() and "harness sandbox prune" in out.getvalue()

        listed = prune_cli("--run", run_id, "--dry-run")
        assert listed.returncode == 0 and f"would remove container {left['container']}" \
            in listed.stdout
        docker_client.containers.get(left["container"])  # a dry run removes nothing

        pruned = prune_cli("--run", run_id)
        assert pruned.returncode == 0, pruned.stderr
        assert f"removed container {left['container']}: process" in pruned.stdout
        assert f"removed image {left['v1']}: {left['v2']} is newer" in pruned.stdout
        assert "removed 1 container(s) and 1 image(s)" in pruned.stdout
        names = {c.name for c in docker_client.containers.list(
            all=True, filters={"label": f"{lb.RUN_LABEL}={run_id}"})}
        assert names == {live.container.name}  # the live process's container stays
        docker_client.images.get(left["v2"])  # the newest image of the task stays

        tarball.unlink()  # the task set is gone: its image is stale now
        pruned = prune_cli("--run", run_id)
        assert f"removed image {left['v2']}: its repository {tarball} no longer exists" \
            in pruned.stdout
        assert prune_cli("--run", run_id).stdout.startswith("nothing to remove")
    finally:
        asyncio.run(live.aclose())
        for tag in (left["v1"], left["v2"]):
            try:
                docker_client.images.remove(tag)
            except Exception:  # noqa: BLE001 - already pruned
                pass


def test_labels_tell_live_from_dead_processes():
    mine = lb.process_labels(run_id="r1", program_id="p1", task="t1")
    assert lb.process_alive(mine) is True
    assert mine[lb.RUN_LABEL] == "r1" and mine[lb.PROGRAM_LABEL] == "p1"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert lb.process_alive({**mine, lb.PID_LABEL: dead}) is False
    reused = {**mine, lb.STARTED_LABEL: "another-boot:1"}  # our pid, another process's start
    assert lb.process_alive(reused) is False
    assert lb.process_alive({**mine, lb.HOST_LABEL: "elsewhere"}) is None  # cannot tell
