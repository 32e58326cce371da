"""Grading SWE-bench-format instances in Docker, and the task images they run in.

A task image is the offline sandbox image with the instance's repository at `/testbed` at
`base_commit` (`harness-task:<instance_id lowercased>`, built once from `repo_src`). Grading
runs in a FRESH container of it (no network, user `agent`):

1. apply the model patch: `git apply`, then `git apply --reject --whitespace=fix`, then
   `git apply --3way` (the one that worked is recorded; none: "patch does not apply");
2. restore the files `test_patch` touches to `base_commit`, apply `test_patch`;
3. run `python3 -m pytest -p no:cacheprovider -rA --tb=short FAIL_TO_PASS PASS_TO_PASS` under a
   time limit ("tests timed out" past it);
4. parse the `-rA` summary: a test passes only when a `PASSED <id>` line names it; resolved iff
   every FAIL_TO_PASS and PASS_TO_PASS test passed.

The `swebench` package's log parsers are used when it is installed (`grader: "swebench"`);
otherwise ours (`grader: "harness"`), which follow the same rules for pytest repositories.
Results: a per-instance report JSON and `predictions.jsonl` in the SWE-bench predictions
format, appended atomically, one line per instance even across resumed runs.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import shlex
import tarfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from harness.tools.sandbox_image import AGENT_UID, AGENT_USER, DEFAULT_IMAGE, TESTBED

TASK_IMAGE_PREFIX = "harness-task"
TASK_LABEL = "harness.swebench.task"
GRADE_LABEL = "harness.swebench.grade"
DEFAULT_TEST_TIMEOUT = 300.0
RESULT_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)", re.MULTILINE)
DIFF_FILES = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
APPLY_COMMANDS = (
    ("git apply", "git apply --verbose /tmp/model.diff"),
    ("git apply --reject --whitespace=fix",
     "git apply --verbose --reject --whitespace=fix /tmp/model.diff"),
    ("git apply --3way", "git apply --verbose --3way /tmp/model.diff"),
)
MODEL_NAME = "harness"


class TaskImageError(RuntimeError):
    """The task's repository or image cannot be had; the message says why."""


def test_ids(value: Any) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS: a JSON list, or a JSON string holding one (upstream)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    return [str(v) for v in value]


def task_image_tag(instance_id: str) -> str:
    name = re.sub(r"[^a-z0-9_.-]+", "-", instance_id.lower()).strip("-.") or "task"
    return f"{TASK_IMAGE_PREFIX}:{name[:120]}"


def repo_source(instance: dict[str, Any], tasks_dir: Path | None) -> Path:
    src = instance.get("repo_src")
    if not src:
        raise TaskImageError(f"{instance['instance_id']}: no repository: the instance has no "
                             "'repo_src' (offline repository) and this harness does not clone")
    path = Path(src)
    if not path.is_absolute() and tasks_dir is not None:
        path = tasks_dir / path
    if not path.exists():
        raise TaskImageError(f"{instance['instance_id']}: repository {path} not found "
                             "(repo_src is relative to the task file's directory)")
    return path


_build_locks: dict[str, threading.Lock] = {}
_build_locks_guard = threading.Lock()


def ensure_task_image(client: Any, instance: dict[str, Any], tasks_dir: Path | None,
                      base_image: str = DEFAULT_IMAGE) -> str:
    """Build `harness-task:<id>` (FROM the sandbox image, repository at /testbed) unless cached.

    Returns the tag. Raises TaskImageError when the repository is missing or the build fails.
    """
    import docker.errors  # type: ignore[import-untyped]

    tag = task_image_tag(instance["instance_id"])
    with _build_locks_guard:
        lock = _build_locks.setdefault(tag, threading.Lock())
    with lock:
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        source = repo_source(instance, tasks_dir)
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            if source.is_dir():
                tar.add(source, arcname="repo", filter=_agent_owned)
                add = "COPY --chown=1000:1000 repo/ /testbed/"
            else:
                tar.add(source, arcname="repo.tar.gz")
                add = "ADD repo.tar.gz /testbed/"
            dockerfile = (f"FROM {base_image}\nUSER root\n{add}\n"
                          f"RUN chown -R {AGENT_UID}:{AGENT_UID} {TESTBED}\n"
                          f"LABEL {TASK_LABEL}={instance['instance_id']}\n"
                          f"WORKDIR {TESTBED}\n").encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(dockerfile)
            tar.addfile(info, io.BytesIO(dockerfile))
        context.seek(0)
        try:
            client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True,
                                forcerm=True, network_mode="none", pull=False)
        except docker.errors.ImageNotFound as exc:
            raise TaskImageError(f"base image {base_image} not found: build it with "
                                 "`harness sandbox build`") from exc
        except (docker.errors.BuildError, docker.errors.APIError) as exc:
            raise TaskImageError(f"{instance['instance_id']}: task image build failed: "
                                 f"{exc}") from exc
        return tag


def _agent_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = AGENT_UID
    info.uname = info.gname = AGENT_USER
    return info


# --------------------------------------------------------------------------
# Grading
# --------------------------------------------------------------------------


def parse_pytest_summary(log: str) -> dict[str, str]:
    """`node id -> PASSED/FAILED/...` from pytest's `-rA` short summary (last word wins)."""
    try:  # the upstream parser, when the swebench package is installed
        from swebench.harness.log_parsers import parse_log_pytest  # type: ignore

        return dict(parse_log_pytest(log, None))
    except Exception:  # noqa: BLE001 - not installed, or another version's signature
        pass
    return {m.group(2): m.group(1) for m in RESULT_LINE.finditer(log)}


def grader_name() -> str:
    try:
        import swebench.harness.log_parsers  # type: ignore  # noqa: F401
    except Exception:  # noqa: BLE001
        return "harness"
    return "swebench"


def _put_file(container: Any, path: str, data: str) -> None:
    raw = data.encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(path.rsplit("/", 1)[1])
        info.size, info.mode, info.mtime = len(raw), 0o644, int(time.time())
        info.uid = info.gid = AGENT_UID
        tar.addfile(info, io.BytesIO(raw))
    container.put_archive(path.rsplit("/", 1)[0] or "/", buf.getvalue())


def _sh(container: Any, script: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    rc, out = container.exec_run(["bash", "-c", script], user=AGENT_USER, workdir=TESTBED,
                                 environment=env or {})
    return rc, out.decode("utf-8", errors="replace")


def grade(client: Any, instance: dict[str, Any], model_patch: str | None, image: str,
          timeout: float = DEFAULT_TEST_TIMEOUT) -> dict[str, Any]:
    """Grade one model patch in a fresh container of `image`; returns the report."""
    f2p, p2p = test_ids(instance.get("FAIL_TO_PASS")), test_ids(instance.get("PASS_TO_PASS"))
    base = instance["base_commit"]
    report: dict[str, Any] = {
        "instance_id": instance["instance_id"], "resolved": False, "reason": None,
        "grader": grader_name(), "patch_applied": None, "patch_is_empty": not model_patch,
        "tests_status": None, "test_timeout_s": timeout}
    started = time.monotonic()
    container = client.containers.run(
        image, ["sleep", "infinity"], detach=True, init=True, user="0:0", network_mode="none",
        working_dir=TESTBED, mem_limit="2g", pids_limit=512,
        name=f"harness-grade-{uuid.uuid4().hex[:10]}",
        labels={GRADE_LABEL: instance["instance_id"], "harness.owner": str(os.getpid())})
    try:
        if model_patch and model_patch.strip():
            _put_file(container, "/tmp/model.diff", model_patch if model_patch.endswith("\n")
                      else model_patch + "\n")
            log = []
            for name, command in APPLY_COMMANDS:
                rc, out = _sh(container, command)
                log.append(f"$ {command}\n{out}")
                if rc == 0:
                    report["patch_applied"] = name
                    break
                _sh(container, f"git reset -q --hard {shlex.quote(base)} && git clean -fdq")
            report["apply_log"] = "\n".join(log)[-4000:]
            if report["patch_applied"] is None:
                report["reason"] = "patch does not apply"
                return report
        else:
            report["patch_applied"] = "empty"
        test_patch = instance.get("test_patch") or ""
        if test_patch.strip():
            files = sorted({f for pair in DIFF_FILES.findall(test_patch) for f in pair})
            restore = " ; ".join(
                f"(git cat-file -e {shlex.quote(base)}:{shlex.quote(f)} 2>/dev/null && "
                f"git checkout -q {shlex.quote(base)} -- {shlex.quote(f)}) || rm -f "
                f"{shlex.quote(f)}" for f in files)
            if restore:
                _sh(container, restore)
            _put_file(container, "/tmp/test.diff", test_patch)
            rc, out = _sh(container, "git apply --verbose /tmp/test.diff")
            if rc != 0:
                report["reason"] = "test patch does not apply"
                report["apply_log"] = (report.get("apply_log", "") + "\n" + out)[-4000:]
                return report
        ids = " ".join(shlex.quote(i) for i in f2p + p2p)
        limit = f"{timeout:g}"
        t0 = time.monotonic()
        rc, log = _sh(container, f"timeout -s KILL {limit} python3 -m pytest -p no:cacheprovider "
                      f"-rA --tb=short {ids}", env={"PYTHONDONTWRITEBYTECODE": "1"})
        report["test_s"] = round(time.monotonic() - t0, 3)
        report["test_log_tail"] = log[-4000:]
        if rc == 137 and time.monotonic() - t0 >= timeout - 0.05:
            report["reason"] = "tests timed out"
            return report
        status = parse_pytest_summary(log)
        tests: dict[str, dict[str, list[str]]] = {}
        for key, ids_ in (("FAIL_TO_PASS", f2p), ("PASS_TO_PASS", p2p)):
            ok = [i for i in ids_ if status.get(i) == "PASSED"]
            tests[key] = {"success": ok, "failure": [i for i in ids_ if i not in ok]}
        report["tests_status"] = tests
        report["resolved"] = not tests["FAIL_TO_PASS"]["failure"] and \
            not tests["PASS_TO_PASS"]["failure"]
        report["reason"] = None if report["resolved"] else "tests failed"
        return report
    finally:
        report["grade_s"] = round(time.monotonic() - started, 3)
        try:
            container.remove(force=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


# --------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------

_append_lock = threading.Lock()


def append_prediction(path: Path, instance_id: str, model_patch: str | None,
                      model_name: str = MODEL_NAME) -> bool:
    """Append one SWE-bench prediction line unless the instance already has one.

    One `write` of one line under an exclusive lock: concurrent writers (threads or
    processes) never interleave, a resumed run never duplicates. Returns whether it wrote.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"instance_id": instance_id, "model_name_or_path": model_name,
                       "model_patch": model_patch or ""}) + "\n"
    with _append_lock, open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.seek(0)
            for existing in fh:
                try:
                    if json.loads(existing).get("instance_id") == instance_id:
                        return False
                except json.JSONDecodeError:
                    continue  # a torn line from a crash: ignore it
            end = fh.seek(0, os.SEEK_END)
            if end:
                fh.seek(end - 1)
                if fh.read(1) != "\n":
                    line = "\n" + line  # end a torn line first
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
            return True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_report(out: Path, report: dict[str, Any]) -> Path:
    from harness.atomic import write_json_atomic

    path = out / "reports" / f"{report['instance_id']}.json"
    write_json_atomic(path, report)
    return path
