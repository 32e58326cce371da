"""`harness run swe-bench`: task images, grading in Docker, resume, end to end with replay."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from common.tool_keys import command_class, event_tool
from harness.agent import Agent, ToolBox
from harness.benchmarks import BenchmarkError, get_benchmark
from harness.benchmarks import swebench_grading as grading
from harness.server_process import ServerProcess
from harness.tools.base import Observation
from harness.trajectory import Step, Trajectory
from predictor.durations import ToolDurationModel

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "datasets" / "swebench"
SLOW_TEST = """diff --git a/tests/test_slow.py b/tests/test_slow.py
new file mode 100644
--- /dev/null
+++ b/tests/test_slow.py
@@ -0,0 +1,5 @@
+import time
+
+
+def test_slow():
+    time.sleep(60)
"""


def instances() -> list[dict]:
    return [json.loads(line) for line in (DATA / "tasks.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def roman(docker_client):
    instance = next(i for i in instances() if i["instance_id"] == "harness__roman-7")
    return instance, grading.ensure_task_image(docker_client, instance, DATA)


# -- no Docker needed ---------------------------------------------------------------


def test_command_class():
    assert command_class("python3 -m pytest -q tests/") == "pytest"
    assert command_class("cd /testbed && python -m pytest") == "pytest"
    assert command_class("timeout 30 pytest -x") == "pytest"
    assert command_class("ls -la && cat x") == "ls"
    assert command_class("git apply <<'EOF'\ndiff\nEOF") == "git"
    assert command_class("sed -n 1,20p a.py") == "sed"
    assert command_class("python3 - <<'EOF'\nprint(1)\nEOF") == "python"
    assert command_class("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT") == "submit"
    assert command_class("FOO=1 grep -rn x .") == "grep"
    assert event_tool("bash", "cat a") == "bash:cat" and event_tool("finish", "x") == "finish"


def test_events_name_the_command_class(tmp_path):
    class Sink:
        def __init__(self):
            self.events = []

        def emit(self, kind, program_id, **fields):
            self.events.append((kind, fields))

    async def bash(command):
        return Observation("<returncode>0</returncode>")

    sink, durations = Sink(), ToolDurationModel()
    agent = Agent(None, sink, durations, tmp_path)
    step = Step(0.0, 0, 0, 0)
    toolbox = ToolBox({"bash": bash}, event_tool=event_tool)
    asyncio.run(agent._call_tool(Trajectory("t", "p", "swe-bench"), step, toolbox, "bash",
                                 "python3 -m pytest -q"))
    assert [(k, f["tool"]) for k, f in sink.events] == [("tool_start", "bash:pytest"),
                                                         ("tool_end", "bash:pytest")]
    assert durations.count("bash:pytest") == 1 and step.tool == "bash"


def test_task_loading(tmp_path):
    bench = get_benchmark("swe-bench")
    tasks = bench.load_tasks()
    assert len(tasks) == 10 and tasks[0].id == "harness__roman-7"
    as_json = tmp_path / "tasks.json"
    as_json.write_text(json.dumps([dict(instances()[0], FAIL_TO_PASS=json.dumps(
        instances()[0]["FAIL_TO_PASS"]))]))
    [task] = bench.load_tasks(as_json)
    assert grading.test_ids(task.data["FAIL_TO_PASS"]) == instances()[0]["FAIL_TO_PASS"]
    with pytest.raises(BenchmarkError, match="datasets"):  # no `datasets` library here
        bench.load_tasks(Path("princeton-nlp/SWE-bench_Lite"))
    parquet = tmp_path / "t.parquet"
    parquet.write_bytes(b"PAR1")
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(BenchmarkError, match="pandas and pyarrow"):
            bench.load_tasks(parquet)


def test_predictions_are_appended_once(tmp_path):
    path = tmp_path / "predictions.jsonl"
    assert grading.append_prediction(path, "a", "diff a")
    assert not grading.append_prediction(path, "a", "diff a again")
    with open(path, "a") as fh:
        fh.write('{"instance_id": "torn')  # a crash mid-line
    assert grading.append_prediction(path, "b", "")
    ids = [json.loads(line)["instance_id"] for line in path.read_text().splitlines()
           if line.startswith('{"instance_id": "') and line.endswith("}")]
    assert ids == ["a", "b"]


# -- task images: repository layouts, base_commit, content keys ------------------------


def unpack(tarball: Path, into: Path) -> Path:
    with tarfile.open(tarball) as tar:
        tar.extractall(into, filter="tar")
    return into


def pack(tree: Path, tarball: Path, arcname: str) -> Path:
    """`tar -czf tarball` of `tree`'s contents, under the folder `arcname` ("" = flat)."""
    with tarfile.open(tarball, "w:gz") as tar:
        for entry in sorted(tree.iterdir()):
            tar.add(entry, arcname=f"{arcname}/{entry.name}" if arcname else entry.name)
    return tarball


def in_image(client, image: str, script: str) -> str:
    out = client.containers.run(image, ["bash", "-c", script], user="agent", remove=True,
                                network_mode="none")
    return out.decode()


@pytest.fixture
def roman_tree(tmp_path):
    return unpack(DATA / "repos" / "roman.tar.gz", tmp_path / "roman")


@pytest.fixture
def built(docker_client):
    """Tags of images a test builds from its temporary repositories: removed at its end."""
    tags: list[str] = []
    yield tags
    for tag in tags:
        try:
            docker_client.images.remove(tag)
        except Exception:  # noqa: BLE001 - never built, or in use elsewhere
            pass


@pytest.mark.docker
def test_both_tarball_layouts_give_the_repository_at_testbed(docker_client, roman_tree,
                                                              tmp_path, built):
    instance = next(i for i in instances() if i["instance_id"] == "harness__roman-7")
    flat = pack(roman_tree, tmp_path / "flat.tar.gz", "")
    wrapped = pack(roman_tree, tmp_path / "wrapped.tar.gz", "roman-main")
    tags = []
    for tarball in (flat, wrapped):
        notes: list[str] = []
        tag = grading.ensure_task_image(docker_client, dict(instance, repo_src=str(tarball)),
                                        None, progress=notes.append)
        tags.append(tag)
        built.append(tag)
        assert notes and "built task image" in notes[0]
        labels = docker_client.images.get(tag).labels
        assert labels["harness.task.unwrapped"] == ("roman-main" if tarball == wrapped else "")
        out = in_image(docker_client, tag, "cd /testbed && git rev-parse HEAD && "
                       "git status --porcelain && ls")
        head, *files = out.split()
        assert head == instance["base_commit"] and "roman" in files and "tests" in files
    assert tags[0] != tags[1]  # different bytes, different images
    report = grading.grade(docker_client, instance, instance["patch"], tags[1])
    assert report["resolved"], report  # the unwrapped repository grades like the original


@pytest.mark.docker
def test_base_commit_that_cannot_be_checked_out(docker_client, roman_tree, tmp_path):
    instance = next(i for i in instances() if i["instance_id"] == "harness__roman-7")
    tarball = pack(roman_tree, tmp_path / "roman.tar.gz", "roman")
    with pytest.raises(grading.TaskImageError, match="is not in the repository's history"):
        grading.ensure_task_image(docker_client, dict(instance, repo_src=str(tarball),
                                                      base_commit="0" * 40), None)
    shutil.rmtree(roman_tree / ".git")  # a `git archive` / GitHub download: no history
    no_git = pack(roman_tree, tmp_path / "archive.tar.gz", "roman-91c7d5b")
    with pytest.raises(grading.TaskImageError, match="has no .git folder"):
        grading.ensure_task_image(docker_client, dict(instance, repo_src=str(no_git)), None)
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"not a tarball")
    with pytest.raises(grading.TaskImageError, match="not a readable tar archive"):
        grading.ensure_task_image(docker_client, dict(instance, repo_src=str(garbage)), None)


@pytest.mark.docker
def test_changed_tarball_rebuilds_the_image_and_grades_the_new_code(docker_client,
                                                                    roman_tree, tmp_path,
                                                                    built):
    instance = next(i for i in instances() if i["instance_id"] == "harness__roman-7")
    tarball = tmp_path / "repo.tar.gz"
    task = dict(instance, repo_src=str(tarball))
    pack(roman_tree, tarball, "")
    notes: list[str] = []
    old = grading.ensure_task_image(docker_client, task, None, progress=notes.append)
    built.append(old)
    assert grading.ensure_task_image(docker_client, task, None, progress=notes.append) == old
    assert "built task image" in notes[0] and "reusing task image" in notes[1]
    assert not grading.grade(docker_client, task, "", old)["resolved"]  # the bug is there

    source = roman_tree / "roman" / "convert.py"  # the same base_commit, new code in the tree
    source.write_text(source.read_text().replace("number < MAX_VALUE", "number <= MAX_VALUE"))
    pack(roman_tree, tarball, "")
    new = grading.ensure_task_image(docker_client, task, None, progress=notes.append)
    built.append(new)
    assert new != old and "built task image" in notes[2]
    assert grading.grade(docker_client, task, "", new)["resolved"]


# -- grading --------------------------------------------------------------------------


@pytest.mark.docker
def test_grading_gold_and_wrong(docker_client, roman):
    instance, image = roman
    gold = grading.grade(docker_client, instance, instance["patch"], image)
    assert gold["resolved"] and gold["patch_applied"] == "git apply" and gold["reason"] is None
    assert gold["grader"] == "harness"
    assert not gold["tests_status"]["FAIL_TO_PASS"]["failure"]
    wrong = grading.grade(docker_client, instance,
                          (DATA / "patches" / "roman.wrong.diff").read_text(), image)
    assert not wrong["resolved"] and wrong["reason"] == "tests failed"
    assert wrong["tests_status"]["FAIL_TO_PASS"]["failure"] + \
        wrong["tests_status"]["PASS_TO_PASS"]["failure"]


@pytest.mark.docker
def test_patch_that_does_not_apply(docker_client, roman):
    instance, image = roman
    bad = instance["patch"].replace("number < MAX_VALUE", "number < MAXIMUM")
    report = grading.grade(docker_client, instance, bad, image)
    assert not report["resolved"] and report["reason"] == "patch does not apply"
    assert report["patch_applied"] is None and "--3way" in report["apply_log"]


@pytest.mark.docker
def test_test_run_timeout(docker_client, roman):
    instance, image = roman
    slow = dict(instance, test_patch=instance["test_patch"] + SLOW_TEST,
                FAIL_TO_PASS=instance["FAIL_TO_PASS"] + ["tests/test_slow.py::test_slow"])
    report = grading.grade(docker_client, slow, instance["patch"], image, timeout=3)
    assert not report["resolved"] and report["reason"] == "tests timed out"
    assert report["test_s"] < 30


# -- harness run swe-bench --------------------------------------------------------------


@pytest.fixture(scope="module")
def server(docker_client):
    with ServerProcess(policy="continuum") as s:
        yield s


def harness_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", "run", "swe-bench", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def task_file(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(dict(r, repo_src=str(DATA / r["repo_src"]))) + "\n"
                            for r in rows))
    return path


@pytest.mark.docker
@pytest.mark.server
@pytest.mark.slow
def test_run_resume_and_missing_repository(server, tmp_path):
    rows = instances()[:3]
    missing = dict(rows[0], instance_id="harness__missing-1", repo_src="repos/missing.tar.gz")
    bad_commit = dict(rows[0], instance_id="harness__badcommit-1", base_commit="f" * 40,
                      repo_src=str(DATA / rows[0]["repo_src"]))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(dict(r, repo_src=str(DATA / r["repo_src"]))) + "\n"
                             for r in rows) + json.dumps(missing) + "\n"
                     + json.dumps(bad_commit) + "\n")
    replays = tmp_path / "replays"
    shutil.copytree(DATA / "trajectories", replays)
    for extra in ("harness__missing-1", "harness__badcommit-1"):
        shutil.copy(replays / "harness__roman-7.traj.json", replays / f"{extra}.traj.json")
    out = tmp_path / "out"
    common = ("--server", server.base_url, "--tasks", str(tasks), "--out", str(out),
              "--model", f"replay:{replays}")

    first = harness_run(*common, "--limit", "2")  # interrupted after two tasks
    assert first.returncode == 0, first.stderr
    assert "task image harness-task:harness__roman-7-" in first.stdout  # built or reused
    done = {p.name: p.stat().st_mtime_ns for p in (out / "results").iterdir()}
    assert len(done) == 2

    second = harness_run(*common, "--limit", "3", "--resume")
    assert second.returncode == 0, second.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 3 and summary["resolved"] == 3 and summary["pass_rate"] == 1.0
    assert summary["jct_mean_s"] > 0 and summary["jct_p95_s"] > 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / "results").iterdir()
            if p.name in done} == done  # nothing graded twice
    predictions = [json.loads(line) for line in
                   (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["instance_id"] for p in predictions) == sorted(r["instance_id"]
                                                                   for r in rows)
    assert all(p["model_patch"].startswith("diff --git") and p["model_name_or_path"]
               for p in predictions)
    report = json.loads((out / "reports" / "harness__roman-7.json").read_text())
    assert report["resolved"] and report["grader"] == "harness"
    trajectory = json.loads((out / "trajectories" / "harness__roman-7.traj.json").read_text())
    assert trajectory["info"]["exit_status"] == "submitted"
    assert all(s["tool"] == "bash" for s in trajectory["steps"])

    third = harness_run(*common, "--resume")  # a missing repository, a missing base_commit
    assert third.returncode == 0, third.stderr
    result = json.loads((out / "results" / "harness__missing-1.json").read_text())
    assert result["status"] == "setup_error" and not result["passed"]
    assert "repository" in result["error"] and "not found" in result["error"]
    result = json.loads((out / "results" / "harness__badcommit-1.json").read_text())
    assert result["status"] == "setup_error" and result["steps"] == 0
    assert f"base_commit {'f' * 40} is not in the repository's history" in result["error"]
    assert not (out / "trajectories" / "harness__badcommit-1.traj.json").exists()  # no model
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 5 and summary["resolved"] == 3
    assert summary["statuses"] == {"submitted": 3, "setup_error": 2}
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 3


@pytest.mark.docker
@pytest.mark.server
@pytest.mark.slow
def test_wrong_trajectory_is_not_resolved(server, tmp_path):
    roman = next(r for r in instances() if r["instance_id"] == "harness__roman-7")
    out = tmp_path / "wrong"
    run = harness_run("--server", server.base_url, "--tasks", str(task_file(tmp_path, [roman])),
                      "--out", str(out), "--model",
                      f"replay:{DATA / 'trajectories-wrong'}")
    assert run.returncode == 0, run.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 1 and summary["resolved"] == 0 and summary["passed"] == 0
    result = json.loads((out / "results" / "harness__roman-7.json").read_text())
    assert result["reason"] == "tests failed" and result["patch_applied"] == "git apply"
