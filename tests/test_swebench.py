"""`harness run swe-bench`: task images, grading in Docker, resume, end to end with replay."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eval import swebench_grading as grading
from harness.agent import Agent, ToolBox
from harness.benchmarks import BenchmarkError, get_benchmark
from harness.benchmarks.swebench import command_class, event_tool
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


# -- grading --------------------------------------------------------------------------


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


def test_patch_that_does_not_apply(docker_client, roman):
    instance, image = roman
    bad = instance["patch"].replace("number < MAX_VALUE", "number < MAXIMUM")
    report = grading.grade(docker_client, instance, bad, image)
    assert not report["resolved"] and report["reason"] == "patch does not apply"
    assert report["patch_applied"] is None and "--3way" in report["apply_log"]


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
    return subprocess.run([sys.executable, "-m", "harness.cli", "run", "swe-bench", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def task_file(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(dict(r, repo_src=str(DATA / r["repo_src"]))) + "\n"
                            for r in rows))
    return path


@pytest.mark.server
def test_run_resume_and_missing_repository(server, tmp_path):
    rows = instances()[:3]
    missing = dict(rows[0], instance_id="harness__missing-1", repo_src="repos/missing.tar.gz")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(dict(r, repo_src=str(DATA / r["repo_src"]))) + "\n"
                             for r in rows) + json.dumps(missing) + "\n")
    replays = tmp_path / "replays"
    shutil.copytree(DATA / "trajectories", replays)
    shutil.copy(replays / "harness__roman-7.traj.json", replays / "harness__missing-1.traj.json")
    out = tmp_path / "out"
    common = ("--server", server.base_url, "--tasks", str(tasks), "--out", str(out),
              "--model", f"replay:{replays}")

    first = harness_run(*common, "--limit", "2")  # interrupted after two tasks
    assert first.returncode == 0, first.stderr
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

    third = harness_run(*common, "--resume")  # the task whose repository is missing
    assert third.returncode == 0, third.stderr
    result = json.loads((out / "results" / "harness__missing-1.json").read_text())
    assert result["status"] == "setup_error" and not result["passed"]
    assert "repository" in result["error"] and "not found" in result["error"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 4 and summary["resolved"] == 3
    assert summary["statuses"] == {"submitted": 3, "setup_error": 1}
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 3


@pytest.mark.server
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
