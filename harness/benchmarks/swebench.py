"""SWE-bench with a bash-only coding agent (the mini-swe-agent approach).

Instances come from JSON / JSONL / parquet files or, with the `datasets` library and a network,
from Hugging Face (`princeton-nlp/SWE-bench_Lite`, `princeton-nlp/SWE-bench_Verified`, optionally
`NAME:SPLIT`). Each program runs in its own container of the task image (the offline sandbox
image with the repository at `/testbed` at `base_commit`, built from the instance's `repo_src`;
see `harness/benchmarks/swebench_grading.py`). Every reply is one fenced bash block; the
observation is the return code and the head and tail of the output. A command whose output
starts with
`COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` submits: the patch is the repository's diff against
`base_commit` (new files included). Scoring grades the patch in a fresh container.

Events name the tool and the command class (`bash:pytest`, `bash:git`, `bash:sed`, ...), so the
duration predictors of harness and server learn per class and fall back to all bash commands
(`predictor.durations`); the action itself stays `bash`.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from common.actions import ActionFormat, ActionSpec
from common.tool_keys import SUBMIT, event_tool
from harness.agent import ToolBox
from harness.benchmarks import swebench_grading as grading
from harness.benchmarks.base import (
    DATASETS,
    NO_RUN,
    Benchmark,
    BenchmarkError,
    RunContext,
    Task,
    TaskSetupError,
    load_jsonl,
)
from harness.tools.base import Observation
from harness.tools.bash import BashTool, CommandLimits
from harness.tools.bash_container import ContainerSpec
from harness.tools.docker_client import engine_failures, shared_client
from harness.tools.labels import PROGRAM_LABEL, RUN_LABEL, TASK_LABEL
from harness.tools.sandbox_image import SandboxImageError
from harness.trajectory import Trajectory

HF_DATASETS = ("princeton-nlp/SWE-bench", "princeton-nlp/SWE-bench_Lite",
               "princeton-nlp/SWE-bench_Verified", "SWE-bench/SWE-bench",
               "SWE-bench/SWE-bench_Lite", "SWE-bench/SWE-bench_Verified")
COMMAND_TIMEOUT = float(os.environ.get("HARNESS_SWEBENCH_COMMAND_TIMEOUT", "120"))
TEST_TIMEOUT = float(os.environ.get("HARNESS_SWEBENCH_TEST_TIMEOUT",
                                    str(grading.DEFAULT_TEST_TIMEOUT)))

SYSTEM = f"""You are a software engineer fixing an issue in a repository, working through a \
bash shell in a sandbox (no network; the repository is at /testbed, the working directory).

Every reply has two parts: a short THOUGHT explaining your reasoning, then exactly ONE fenced \
code block with exactly ONE bash command (commands may be chained with && or ||):

THOUGHT: why this is the next step

```bash
your_command_here
```

A reply with no code block or with more than one is rejected. Each command runs in a fresh \
shell: `cd` and exported variables do not carry over, files do. Commands cannot be \
interactive (no editors, no pagers). You see the return code and the output; a long output \
is cut to its beginning and end. When you are done, run this command on its own, and you can \
no longer act after it:

```bash
echo {SUBMIT}
```"""

FORMAT = ActionFormat(
    "bash", (ActionSpec("bash", "Run one bash command in the sandbox (/testbed); "
                        f"`echo {SUBMIT}` submits.", "command"),),
    "THOUGHT: what to do next and why\n\n```bash\none command\n```")

INSTANCE = """<issue>
{problem_statement}
</issue>

Fix the issue by changing non-test source files in /testbed so that the described behaviour \
is correct; do not edit the tests. A good way to work:
1. find and read the code involved (ls, find, grep, cat, sed -n);
2. reproduce the problem with a small script or the test suite;
3. edit the source (for example with a `python3 - <<'EOF'` script, sed -i, or `git apply` of \
a diff in a heredoc);
4. check the fix and run the tests (`python3 -m pytest -q`);
5. submit with `echo {submit}`."""


def _read_output(text: str) -> str:
    """The raw output in a bash observation (`<output>\\n...</output>`)."""
    start = text.find("<output>\n")
    end = text.rfind("</output>")
    return text[start + len("<output>\n"):end] if start >= 0 and end >= 0 else text


class SweBench(Benchmark):
    name = "swe-bench"
    tasks_file = DATASETS / "swebench" / "tasks.jsonl"
    replay_dir = DATASETS / "swebench" / "trajectories"
    uses_docker = True
    exemplars_file = DATASETS / "swebench" / "exemplars.json"
    system = SYSTEM
    action_format = FORMAT

    def __init__(self) -> None:
        self.tasks_dir: Path | None = None
        self.test_timeout = TEST_TIMEOUT
        self.command_timeout = COMMAND_TIMEOUT
        self._images_reported: set[str] = set()

    # -- tasks -----------------------------------------------------------------

    def load_tasks(self, path: Path | None = None) -> list[Task]:
        source = str(path) if path is not None else str(self.tasks_file)
        name, _, split = source.partition(":")
        if not Path(source).exists() and (name in HF_DATASETS or name.count("/") == 1
                                          and not name.endswith((".json", ".jsonl",
                                                                 ".parquet"))):
            rows = load_hf(name, split or "test")
            self.tasks_dir = None
        else:
            file = Path(source)
            rows = load_instances(file)
            self.tasks_dir = file.resolve().parent
        tasks = []
        for number, row in enumerate(rows, start=1):
            for key in ("instance_id", "base_commit", "problem_statement"):
                if key not in row:
                    raise BenchmarkError(f"instance {number} of {source} has no {key!r} field")
            tasks.append(Task(str(row["instance_id"]), row))
        return tasks

    # -- one program -------------------------------------------------------------

    @staticmethod
    def labels(task: Task, run: RunContext, program_id: str | None = None) -> dict[str, str]:
        """Labels of the task's containers and images: the run, the program, the task."""
        found = {RUN_LABEL: run.run_id, PROGRAM_LABEL: program_id, TASK_LABEL: task.id}
        return {k: v for k, v in found.items() if v}

    def messages(self, task: Task) -> list[dict[str, Any]]:
        return self.prompt(INSTANCE.format(
            problem_statement=task.data["problem_statement"].strip(), submit=SUBMIT))

    async def image(self, task: Task, run: RunContext) -> str:
        """The task's image (built, or reused when one of the same content exists); the run's
        output says which, once per image."""
        def progress(message: str) -> None:
            if task.id not in self._images_reported:
                self._images_reported.add(task.id)
                run.log(message)

        labels = self.labels(task, run)
        # the engine going away is a SandboxError: the task may run again
        with engine_failures(f"the image of {task.id} was looked up or built"):
            try:
                client = shared_client()
                return await asyncio.to_thread(grading.ensure_task_image, client, task.data,
                                               self.tasks_dir, progress=progress, labels=labels)
            except (grading.TaskImageError, SandboxImageError) as exc:
                raise TaskSetupError(str(exc)) from None

    async def toolbox(self, task: Task, program_id: str, run: RunContext = NO_RUN) -> ToolBox:
        image = await self.image(task, run)
        tool = BashTool(program_id, container=ContainerSpec(image=image),
                        commands=CommandLimits(timeout=self.command_timeout),
                        labels=self.labels(task, run, program_id))
        base = task.data["base_commit"]

        async def bash(command: str) -> Observation:
            observation = await tool.run(command)
            if not _read_output(observation.text).lstrip().startswith(SUBMIT):
                return observation
            patch = await self.collect_patch(tool, base)
            return Observation("Submitted.", done=True, answer=patch,
                               info={"patch_chars": len(patch)})

        return ToolBox({"bash": bash}, owned=[tool], event_tool=event_tool)

    @staticmethod
    async def collect_patch(tool: BashTool, base_commit: str) -> str:
        def diff() -> str:
            container = tool.sandbox.ensure_started()  # the program's own container
            container.exec_run(["git", "-C", "/testbed", "add", "-A"], user="agent")
            rc, out = container.exec_run(["git", "-C", "/testbed", "diff", "--cached",
                                          base_commit], user="agent")
            return out.decode("utf-8", errors="replace") if rc == 0 else ""

        # a lost container must not submit an empty patch
        with engine_failures(f"the patch of program {tool.program_id} was collected"):
            return await asyncio.to_thread(diff)

    # -- scoring -----------------------------------------------------------------

    async def score(self, task: Task, trajectory: Trajectory,
                    run: RunContext = NO_RUN) -> dict[str, Any]:
        patch = (trajectory.answer or "") if trajectory.status == "submitted" else ""
        # the engine failing under the grader is a SandboxError: no report, no verdict
        with engine_failures(f"the patch of {task.id} was graded"):
            try:
                if trajectory.status != "submitted":
                    raise TaskSetupError(f"no patch submitted ({trajectory.status})")
                image = await self.image(task, run)
                report = await asyncio.to_thread(grading.grade, shared_client(), task.data,
                                                 patch, image, self.test_timeout,
                                                 self.labels(task, run, trajectory.program_id))
            except TaskSetupError as exc:
                report = {"instance_id": task.id, "resolved": False, "reason": str(exc),
                          "grader": grading.grader_name()}
        if run.out_dir is not None:
            grading.write_report(run.out_dir, report)
            grading.append_prediction(run.out_dir / "predictions.jsonl", task.id, patch,
                                      run.model_name or grading.MODEL_NAME)
        return {"passed": bool(report["resolved"]), "resolved": bool(report["resolved"]),
                "reason": report.get("reason"), "patch_applied": report.get("patch_applied"),
                "grader": report.get("grader"), "grade_s": report.get("grade_s")}


# --------------------------------------------------------------------------
# Loading instances
# --------------------------------------------------------------------------


def load_instances(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise BenchmarkError(f"task file {path} does not exist (or give a Hugging Face "
                             f"dataset name: {', '.join(HF_DATASETS[1:3])})")
    if path.suffix == ".parquet":
        try:
            import pandas  # type: ignore[import-untyped]
            import pyarrow  # type: ignore[import-untyped]  # noqa: F401
        except ImportError:
            raise BenchmarkError(f"{path}: reading parquet needs pandas and pyarrow "
                                 "(`pip install pandas pyarrow`), or convert it to JSONL"
                                 ) from None
        return [dict(r) for r in pandas.read_parquet(path).to_dict(orient="records")]
    text = path.read_text()
    if path.suffix == ".json" or text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BenchmarkError(f"{path}: not JSON ({exc.msg})") from None
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list):
            raise BenchmarkError(f"{path}: expected a list of instances")
        return data
    return load_jsonl(path)


def load_hf(name: str, split: str) -> list[dict[str, Any]]:
    try:
        import datasets as hf  # type: ignore[import-untyped]

        load_dataset = hf.load_dataset  # our own datasets/ folder is a namespace package
    except (ImportError, AttributeError):
        raise BenchmarkError(f"{name}: loading a Hugging Face dataset needs the `datasets` "
                             "library (`pip install datasets`) and a network; or pass a "
                             "JSON / JSONL / parquet file with --tasks") from None
    try:
        return [dict(r) for r in load_dataset(name, split=split)]
    except Exception as exc:  # noqa: BLE001 - offline, unknown name, bad split
        raise BenchmarkError(f"{name} (split {split}): cannot load it: {exc}") from None
