"""Grading SWE-bench-format instances in Docker, and the task images they run in.

A task image is the offline sandbox image with the instance's repository at `/testbed` at
`base_commit`, built from `repo_src` (a directory or a tarball, flat or wrapped in one top-level
folder, which is unwrapped) and tagged by content: `harness-task:<instance_id>-<key>`, the key
hashing the repository's bytes, `base_commit` and the sandbox image's id, so a changed
repository or sandbox gives a new image. A `base_commit` the repository cannot check out fails
the build with the reason. Grading runs in a FRESH container of it (no network, user `agent`):

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

import copy as copy_module
import fcntl
import hashlib
import io
import json
import os
import re
import shlex
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.atomic import write_json_atomic
from harness.tools import labels as lb
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
#: `model_name_or_path` of a prediction when the run's served model is not known
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


def _image_name(instance_id: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", instance_id.lower()).strip("-.")[:100] or "task"


def task_image_tag(instance_id: str, key: str) -> str:
    """`harness-task:<instance id>-<first 12 hex of the content key>`."""
    return f"{TASK_IMAGE_PREFIX}:{_image_name(instance_id)}-{key[:12]}"


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


# -- the repository's layout -----------------------------------------------------------
#
# A repository arrives as a directory or a tarball (plain, gzip, bzip2, xz) in one of two
# layouts: flat (`.git`, `setup.py`, ... at the top: `tar -C repo -czf r.tgz .`) or wrapped in
# one top-level folder (`tar -czf r.tgz repo/`, GitHub's downloads, `git archive
# --prefix=repo/`). The build context gets it re-packed flat, owned by `agent`, so /testbed
# is always the repository itself.


def _member_path(name: str) -> str:
    """A member's path without `./` and trailing `/`; raises on absolute or `..` paths."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts:
        raise TaskImageError(f"unsafe path {name!r} in the repository tarball")
    return "/".join(parts)


def _wrapper(paths: list[tuple[str, bool]]) -> str:
    """The single top-level folder that wraps everything, or "" for a flat layout.

    `paths`: (path, is_dir). A tree whose top level holds `.git` is flat even when that is
    its only other entry."""
    tops = {p.split("/", 1)[0] for p, _ in paths if p}
    if len(tops) != 1:
        return ""
    [top] = tops
    if top == ".git":
        return ""
    is_dir = any(p == top and d for p, d in paths) or any(p.startswith(top + "/")
                                                           for p, _ in paths)
    return top if is_dir else ""


def _strip(path: str, prefix: str) -> str:
    if not prefix:
        return path
    return "" if path == prefix else path[len(prefix) + 1:]


def pack_repository(source: Path, out: Any) -> str:
    """Write `source` (directory or tarball) to the file object `out` as a flat, uncompressed
    tar owned by agent; returns the folder that was unwrapped ("" for a flat layout).

    Raises TaskImageError when it is not a readable tarball or holds unsafe paths."""
    if source.is_dir():
        entries = sorted(source.rglob("*"))
        rel = [(e.relative_to(source).as_posix(), e.is_dir() and not e.is_symlink())
               for e in entries]
        prefix = _wrapper(rel)
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for entry, (path, _) in zip(entries, rel, strict=True):
                name = _strip(path, prefix)
                if name:
                    tar.add(entry, arcname=name, recursive=False, filter=_agent_owned)
        return prefix
    try:
        with tarfile.open(source) as src:
            members = src.getmembers()
            paths = [(_member_path(m.name), m.isdir()) for m in members]
            prefix = _wrapper(paths)
            with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for member, (path, _) in zip(members, paths, strict=True):
                    name = _strip(path, prefix)
                    if not name:
                        continue
                    copy = copy_module.copy(member)
                    copy.name = name
                    # a pax header's path wins over the name when written: drop the old ones
                    copy.pax_headers = {k: v for k, v in member.pax_headers.items()
                                        if k not in ("path", "linkpath", "uid", "gid",
                                                     "uname", "gname")}
                    if member.islnk():  # hard links name their target by archive path
                        copy.linkname = _strip(_member_path(member.linkname), prefix)
                    _agent_owned(copy)
                    data = src.extractfile(member) if member.isreg() else None
                    tar.addfile(copy, data)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise TaskImageError(f"repository {source} is not a readable tar archive "
                             f"(plain, gzip, bzip2 or xz): {exc}") from None
    return prefix


# -- content keys -------------------------------------------------------------------------

TASK_IMAGE_RECIPE = "3"  # bump when the build below changes: every task image is rebuilt
KEY_LABEL = "harness.task.key"
SOURCE_LABEL = "harness.task.repo_src"  # the repository's absolute path on the building host
_digests: dict[tuple[str, int, int], str] = {}
_digests_guard = threading.Lock()


def source_digest(source: Path) -> str:
    """sha256 of a tarball's bytes, or of a directory's paths, modes and file contents.

    A tarball's digest is remembered by (path, size, mtime) for the life of the process."""
    if source.is_dir():
        h = hashlib.sha256()
        for entry in sorted(source.rglob("*")):
            rel = entry.relative_to(source).as_posix()
            st = entry.lstat()
            h.update(f"{rel}\0{st.st_mode:o}\0".encode())
            if entry.is_symlink():
                h.update(os.readlink(entry).encode())
            elif entry.is_file():
                h.update(hashlib.sha256(entry.read_bytes()).digest())
        return h.hexdigest()
    st = source.stat()
    cache_key = (str(source.resolve()), st.st_size, st.st_mtime_ns)
    with _digests_guard:
        if cache_key in _digests:
            return _digests[cache_key]
    h = hashlib.sha256()
    with open(source, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    with _digests_guard:
        _digests[cache_key] = h.hexdigest()
    return _digests[cache_key]


def task_image_key(source_sha256: str, base_commit: str, sandbox_id: str) -> str:
    """What a task image is made of: the repository's bytes, base_commit, the sandbox image."""
    text = "\n".join((TASK_IMAGE_RECIPE, source_sha256, base_commit, sandbox_id))
    return hashlib.sha256(text.encode()).hexdigest()


# -- building ----------------------------------------------------------------------------

SETUP_ERROR_MARK = "harness-setup-error:"
# Runs as agent in /testbed while the image is built; $1 = base_commit. A failure prints one
# SETUP_ERROR_MARK line naming the reason and fails the build.
_SETUP_SCRIPT = f"""set -u
fail() {{ echo "{SETUP_ERROR_MARK} $*"; exit 3; }}
cd {TESTBED}
if [ ! -e .git ]; then
  fail "the repository has no .git folder (a git archive or a GitHub download holds no \
history), so base_commit $1 cannot be checked out; pack a clone instead: \
git clone URL name && tar -czf name.tar.gz name"
fi
git rev-parse --git-dir >/dev/null 2>&1 || fail "its .git is not a usable git repository: \
$(git rev-parse --git-dir 2>&1 | head -n 1)"
git rev-parse -q --verify "$1^{{commit}}" >/dev/null 2>&1 || fail "base_commit $1 is not \
in the repository's history (the tarball holds $(git rev-list --all --count 2>/dev/null) \
commits; HEAD is $(git rev-parse -q --verify HEAD 2>/dev/null || echo missing))"
head=$(git rev-parse -q --verify HEAD 2>/dev/null)
if [ "$head" != "$(git rev-parse "$1^{{commit}}")" ]; then
  out=$(git -c advice.detachedHead=false checkout -q --force --detach "$1" 2>&1) || \
    fail "git checkout of base_commit $1 failed: $(echo "$out" | tail -n 1)"
fi
"""

_build_locks: dict[str, threading.Lock] = {}
_build_locks_guard = threading.Lock()


def ensure_task_image(client: Any, instance: dict[str, Any], tasks_dir: Path | None,
                      base_image: str = DEFAULT_IMAGE, *,
                      progress: Callable[[str], Any] | None = None,
                      labels: dict[str, str] | None = None) -> str:
    """The task image: the sandbox image with the repository at /testbed at `base_commit`.

    Its tag is keyed by content (`task_image_key`: the repository's sha256, base_commit and
    the sandbox image's id), so a changed tarball or a rebuilt sandbox gives a new image and a
    cached one is reused only when it was made of the same things. `progress` hears whether
    it was built or reused. `labels` are added to a built image (run id, ...).

    Raises TaskImageError naming the reason when the repository is missing or unreadable,
    when base_commit cannot be checked out in it, or when the build fails.
    """
    import docker.errors  # type: ignore[import-untyped]

    instance_id = instance["instance_id"]
    base_commit = str(instance["base_commit"])
    source = repo_source(instance, tasks_dir)
    try:
        sandbox_id = client.images.get(base_image).id
    except docker.errors.ImageNotFound:
        raise TaskImageError(f"base image {base_image} not found: build it with "
                             "`harness sandbox build`") from None
    digest = source_digest(source)
    key = task_image_key(digest, base_commit, sandbox_id)
    tag = task_image_tag(instance_id, key)
    with _build_locks_guard:
        lock = _build_locks.setdefault(tag, threading.Lock())
    with lock:
        try:
            client.images.get(tag)
            if progress is not None:
                progress(f"{instance_id}: reusing task image {tag}")
            return tag
        except docker.errors.ImageNotFound:
            pass
        started = time.monotonic()
        with tempfile.TemporaryFile() as context:
            _write_context(context, source, instance_id, base_commit, base_image, {
                TASK_LABEL: instance_id, lb.TASK_LABEL: instance_id, KEY_LABEL: key,
                "harness.task.repo_sha256": digest, "harness.task.base_commit": base_commit,
                "harness.task.sandbox_id": sandbox_id, SOURCE_LABEL: str(source.resolve()),
                **lb.process_labels(),
                **(labels or {})})
            context.seek(0)
            try:
                client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True,
                                    forcerm=True, network_mode="none", pull=False)
            except docker.errors.BuildError as exc:
                raise TaskImageError(f"{instance_id}: {_build_failure(exc)}") from None
            except docker.errors.APIError as exc:
                raise TaskImageError(f"{instance_id}: task image build failed: {exc}") from None
        if progress is not None:
            progress(f"{instance_id}: built task image {tag} in "
                     f"{time.monotonic() - started:.1f}s (repository sha256 {digest[:12]}, "
                     f"base_commit {base_commit[:12]}, sandbox {sandbox_id[7:19]})")
        return tag


def _write_context(context: Any, source: Path, instance_id: str, base_commit: str,
                   base_image: str, labels: dict[str, str]) -> None:
    with tempfile.TemporaryFile() as repo:
        try:
            unwrapped = pack_repository(source, repo)
        except TaskImageError as exc:
            raise TaskImageError(f"{instance_id}: {exc}") from None
        size = repo.tell()
        repo.seek(0)
        label_args = " ".join(f"{k}={json.dumps(v)}" for k, v in
                              {**labels, "harness.task.unwrapped": unwrapped}.items())
        dockerfile = (f"FROM {base_image}\nUSER root\nADD repo.tar {TESTBED}/\n"
                      f"COPY setup.sh /tmp/harness-setup.sh\n"
                      f"USER {AGENT_USER}\n"
                      f"RUN sh /tmp/harness-setup.sh {shlex.quote(base_commit)}\n"
                      f"USER root\nLABEL {label_args}\nWORKDIR {TESTBED}\n").encode()
        with tarfile.open(fileobj=context, mode="w") as tar:
            info = tarfile.TarInfo("repo.tar")
            info.size = size
            tar.addfile(info, repo)
            for name, data in (("setup.sh", _SETUP_SCRIPT.encode()), ("Dockerfile", dockerfile)):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))


def _build_failure(exc: Any) -> str:
    """The reason a task image build failed: the setup script's own line when it gave one."""
    lines = []
    for chunk in getattr(exc, "build_log", None) or []:
        if isinstance(chunk, dict) and "stream" in chunk:
            lines.extend(chunk["stream"].splitlines())
    for line in lines:
        if line.startswith(SETUP_ERROR_MARK):
            return line[len(SETUP_ERROR_MARK):].strip()
    tail = " | ".join(line.strip() for line in lines[-5:] if line.strip())
    return f"task image build failed: {exc}" + (f" ({tail})" if tail else "")


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
          timeout: float = DEFAULT_TEST_TIMEOUT,
          labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Grade one model patch in a fresh container of `image`; returns the report.

    The container carries this process's labels (`harness.tools.labels`) and `labels`."""
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
        labels={**lb.process_labels(task=instance["instance_id"]), **(labels or {}),
                GRADE_LABEL: instance["instance_id"], "harness.owner": str(os.getpid())})
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
    path = out / "reports" / f"{report['instance_id']}.json"
    write_json_atomic(path, report)
    return path
