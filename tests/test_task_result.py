"""A task's result file: one type written and read back (by the summary, by `--resume`), the
benchmark's own fields kept at the top level, files from before a field existed still read;
and the run a task belongs to handed to its benchmark rather than written onto it."""

from __future__ import annotations

import json

from harness.benchmarks import RunContext, Task, get_benchmark
from harness.run import build_summary, is_finished, record
from harness.task_result import TaskResult


def test_a_scored_result_round_trips_with_the_benchmarks_fields_at_the_top(tmp_path):
    result = TaskResult("t1", "r1-t1", "submitted", passed=True, jct_s=2.5, steps=3,
                        resolved=True, token_id_turns=3, prefix_broken_turns=0,
                        score={"grader": "local", "reason": None})
    record(tmp_path, result)
    data = json.loads((tmp_path / "results" / "t1.json").read_text())
    assert data["grader"] == "local" and "reason" in data and "score" not in data
    assert "retryable" not in data and "error" not in data  # unset: not written
    assert TaskResult.from_json(data) == result
    assert is_finished(tmp_path, "t1")


def test_an_interrupted_result_is_run_again_on_resume(tmp_path):
    record(tmp_path, TaskResult.interrupted("t2", "r1-t2", "model_error", "gone", 0.0, 4))
    assert not is_finished(tmp_path, "t2")
    back = TaskResult.from_json(json.loads((tmp_path / "results" / "t2.json").read_text()))
    assert back.retryable and back.steps == 4 and back.error == "gone" and not back.passed


def test_a_result_file_from_before_a_field_existed_reads_with_its_default(tmp_path):
    old = {"task_id": "a", "program_id": "r-a", "status": "setup_error", "error": "no repo",
           "jct_s": 0.0, "steps": 0, "llm_s": 0.0, "tool_s": 0.0, "passed": False}
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.json").write_text(json.dumps(old))
    summary = build_summary(get_benchmark("gsm8k"), "vllm", [Task("a", {}), Task("b", {})],
                            tmp_path, {"sent": 0, "dropped": 0}, "m", 1.0, None)
    assert summary["tasks"] == 1 and summary["not_started"] == 1
    assert summary["output_tokens"] == 0 and summary["statuses"] == {"setup_error": 1}
    assert "resolved" not in summary and "token_id_turns" not in summary


def test_a_benchmark_learns_its_run_from_the_context_it_is_handed():
    bench = get_benchmark("swe-bench")
    task = Task("x__y-1", {})
    assert bench.labels(task, RunContext(run_id="r1"), "r1-x")["harness.run"] == "r1"
    assert bench.labels(task, RunContext(run_id="r2"))["harness.run"] == "r2"
    assert not hasattr(bench, "run_id") and not hasattr(bench, "out_dir")


def test_exemplars_are_chosen_when_the_benchmark_is_made():
    task = get_benchmark("gsm8k").load_tasks()[0]
    assert len(get_benchmark("gsm8k", exemplars=False).messages(task)) == 2
    assert len(get_benchmark("gsm8k").messages(task)) > 2
