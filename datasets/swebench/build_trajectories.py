"""Build the recorded agent trajectories for the shipped SWE-bench tasks, by replaying them.

For every instance of `tasks.jsonl` the builder writes the turns of a competent bash-only
agent: look at the layout, find and read the code the issue is about, run the test suite,
fix the bug with `git apply` of a diff in a heredoc (the gold patch; `--wrong` uses
`patches/<name>.wrong.diff`), show the diff, run the tests again, submit. It then REPLAYS
every command in a container of the task image (the same bash tool `harness run` uses),
records the real observations, collects the submitted patch the way the benchmark does and
grades it: a gold trajectory must resolve its task, a wrong one must not. Nothing is written
unless that holds.

    .venv/bin/python datasets/swebench/build_trajectories.py             # trajectories/
    .venv/bin/python datasets/swebench/build_trajectories.py --only roman
    .venv/bin/python datasets/swebench/build_trajectories.py --wrong --only roman,money
                                                                          # trajectories-wrong/

Needs the Docker engine and the sandbox image (`harness sandbox build`); about a second or
two per task.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from harness.benchmarks import swebench_grading as grading
from harness.benchmarks.base import Task  # noqa: E402
from common.tool_keys import SUBMIT  # noqa: E402
from harness.benchmarks.swebench import SweBench  # noqa: E402
from harness.tools.bash import BashTool  # noqa: E402
from harness.tools.bash_container import ContainerSpec  # noqa: E402
from harness.tools.docker_client import shared_client  # noqa: E402
from common.atomic import write_json_atomic  # noqa: E402

TESTS = "python3 -m pytest -q -p no:cacheprovider"
HUNK_DEF = re.compile(r"^@@ [^@]* @@.*?\b(?:def|class) (\w+)", re.MULTILINE)
FILES = re.compile(r"^\+\+\+ b/(\S+)$", re.MULTILINE)


def turns(instance: dict[str, Any], patch: str) -> list[tuple[str, str]]:
    """(thought, command) pairs of the agent, derived from the instance and the patch."""
    title = instance["problem_statement"].strip().splitlines()[0]
    files = FILES.findall(patch)
    names = list(dict.fromkeys(HUNK_DEF.findall(patch)))
    package = files[0].split("/")[0] if "/" in files[0] else "."
    steps = [("The issue says: " + title + ". First I look at the repository layout.",
              "ls -F && find . -name '*.py' -not -path './.git/*' | sort")]
    if names:
        pattern = "\\|".join(names[:3])
        steps.append((f"The behaviour lives around {', '.join(names[:3])}; let me find where "
                      "it is defined and used.",
                      f"grep -rn '{pattern}' --include='*.py' {package} | head -40"))
    for file in files:
        steps.append((f"Let me read {file} to understand the current implementation.",
                      f"cat -n {file}"))
    steps.append(("Before changing anything I run the existing tests to see the baseline.",
                  TESTS))
    body = patch if patch.endswith("\n") else patch + "\n"
    steps.append(("I found the cause. I fix it with a minimal change to "
                   f"{', '.join(files)}, applied as a diff, and show the result.",
                   f"git apply <<'PATCH_EOF'\n{body}PATCH_EOF\ngit diff"))
    steps.append(("Now I run the test suite again to check the fix and that nothing else "
                  "broke.", TESTS))
    steps.append(("The change is in place and the tests pass; I submit.", f"echo {SUBMIT}"))
    return steps


def reply(thought: str, command: str) -> str:
    return f"THOUGHT: {thought}\n\n```bash\n{command}\n```"


async def build_one(bench: SweBench, task: Task, patch: str, wrong: bool) -> dict[str, Any]:
    client = shared_client()
    instance = task.data
    image = await asyncio.to_thread(grading.ensure_task_image, client, instance,
                                    bench.tasks_dir)
    messages = bench.messages(task)
    prompt_messages = len(messages)  # the replay takes the replies after the prompt
    tool = BashTool(f"build-{task.id}", container=ContainerSpec(image=image))
    submitted = None
    try:
        for thought, command in turns(instance, patch):
            messages.append({"role": "assistant", "content": reply(thought, command)})
            observation = await tool.run(command)
            if command == f"echo {SUBMIT}":
                submitted = await bench.collect_patch(tool, instance["base_commit"])
                messages.append({"role": "user", "content": "Observation: Submitted."})
                break
            if not observation.ok and TESTS not in command:
                raise RuntimeError(f"{task.id}: `{command.splitlines()[0]}` failed:\n"
                                   f"{observation.text[:2000]}")
            messages.append({"role": "user", "content": f"Observation: {observation.text}"})
    finally:
        await tool.aclose()
    report = await asyncio.to_thread(grading.grade, client, instance, submitted, image)
    if report["resolved"] == wrong:
        raise RuntimeError(f"{task.id}: the {'wrong' if wrong else 'gold'} trajectory "
                           f"{'resolves' if report['resolved'] else 'does not resolve'} the "
                           f"task ({report['reason']})")
    return {"trajectory_format": "mini-swe-agent-1",
            "info": {"instance_id": task.id, "exit_status": "Submitted",
                     "submission": submitted, "resolved": report["resolved"],
                     "prompt_messages": prompt_messages,
                     "recorded_by": "datasets/swebench/build_trajectories.py"
                     + (" --wrong" if wrong else "")},
            "messages": messages}


async def main_async(args: argparse.Namespace) -> int:
    bench = SweBench()
    tasks = bench.load_tasks(bench.tasks_file)
    only = set(args.only.split(",")) if args.only else None
    out = HERE / ("trajectories-wrong" if args.wrong else "trajectories")
    failures = 0
    for task in tasks:
        name = task.data["repo"].split("/")[1]
        if only and name not in only and task.id not in only:
            continue
        patch = (HERE / "patches" / f"{name}.wrong.diff").read_text() if args.wrong \
            else task.data["patch"]
        try:
            data = await build_one(bench, task, patch, args.wrong)
        except Exception as exc:  # noqa: BLE001 - report and go on with the others
            failures += 1
            print(f"FAIL {task.id}: {exc}")
            continue
        write_json_atomic(out / f"{task.id}.traj.json", data)
        print(f"ok   {task.id}: {len(data['messages'])} messages, resolved="
              f"{data['info']['resolved']}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated task names or instance ids")
    parser.add_argument("--wrong", action="store_true",
                        help="apply patches/<name>.wrong.diff; write trajectories-wrong/")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
