"""Build (and check, and verify) the shipped SWE-bench-format tasks.

Each task carries its own repository: ``repos/<name>/`` is the source tree,
``repos/<name>.tar.gz`` the packed working tree with its ``.git`` (one commit,
``base_commit``), and ``tasks.jsonl`` one SWE-bench instance per line.

Run from anywhere (paths are relative to this file)::

    .venv/bin/python datasets/swebench/build_tasks.py           # (re)build tarballs, tasks.jsonl
    .venv/bin/python datasets/swebench/build_tasks.py --check   # up to date? (exit 1 if not)
    .venv/bin/python datasets/swebench/build_tasks.py --verify  # run each task in the sandbox

Building needs ``git``.  It is deterministic: the commit has a fixed author,
committer and date, ``.git`` is reduced to what a checkout needs (no hooks,
logs or host-specific config; the index is written by ``git read-tree`` so it
holds no stat data), and the tarball has sorted members, fixed mtimes, owner
``agent`` (uid/gid 1000, the sandbox user) and a gzip header with mtime 0.

FAIL_TO_PASS and PASS_TO_PASS are derived, not written by hand: PASS_TO_PASS
is every test function in the base repository, FAIL_TO_PASS every test
function the test patch adds.  ``--verify`` then checks them for real in
fresh ``harness-sandbox:bookworm`` containers (``--network none``, user
``agent``): the base is clean at ``base_commit``; with the test patch the
FAIL_TO_PASS tests fail and the PASS_TO_PASS tests pass; with the gold patch
all pass (and the full suite is exactly FAIL_TO_PASS + PASS_TO_PASS); with the
wrong patch (``patches/<name>.wrong.diff``) at least one of them fails.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOS = HERE / "repos"
PATCHES = HERE / "patches"
PROBLEMS = HERE / "problems"
TASKS_FILE = HERE / "tasks.jsonl"

# (repository name, issue number, issue creation time).  The issue number only
# names the instance: harness__<name>-<number>.
TASKS: list[tuple[str, int, str]] = [
    ("roman", 7, "2025-01-13T09:12:44Z"),
    ("semver", 23, "2025-01-15T16:40:02Z"),
    ("iniconf", 14, "2025-01-20T11:05:37Z"),
    ("wraptext", 9, "2025-01-22T08:51:19Z"),
    ("money", 31, "2025-01-27T14:22:58Z"),
    ("csvsniff", 5, "2025-02-03T10:31:07Z"),
    ("globmatch", 18, "2025-02-05T17:48:26Z"),
    ("ttlcache", 11, "2025-02-10T12:09:50Z"),
    ("daterange", 26, "2025-02-12T07:57:13Z"),
    ("querystr", 8, "2025-02-17T15:14:41Z"),
]

VERSION = "0.1"
AUTHOR_NAME = "Harness Maintainers"
AUTHOR_EMAIL = "maintainers@harness.invalid"
COMMIT_DATE = "2025-01-06T12:00:00+00:00"
COMMIT_EPOCH = 1736164800  # COMMIT_DATE as a Unix time: the mtime of every tar member
OWNER_ID = 1000  # the sandbox image's `agent` user
OWNER_NAME = "agent"
GIT_CONFIG = (
    "[core]\n"
    "\trepositoryformatversion = 0\n"
    "\tfilemode = true\n"
    "\tbare = false\n"
    "\tlogallrefupdates = true\n"
)
SKIP_NAMES = {"__pycache__", ".pytest_cache", ".git"}
SKIP_SUFFIXES = (".pyc", ".pyo")

IMAGE = "harness-sandbox:bookworm"
TESTBED = "/testbed"
PYTEST = ["python3", "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--tb=short"]
_SUMMARY_RE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


class BuildError(RuntimeError):
    pass


# --------------------------------------------------------------------------
# building
# --------------------------------------------------------------------------


def _git_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        HOME=str(home),
        LC_ALL="C",
        TZ="UTC",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_AUTHOR_NAME=AUTHOR_NAME,
        GIT_AUTHOR_EMAIL=AUTHOR_EMAIL,
        GIT_AUTHOR_DATE=COMMIT_DATE,
        GIT_COMMITTER_NAME=AUTHOR_NAME,
        GIT_COMMITTER_EMAIL=AUTHOR_EMAIL,
        GIT_COMMITTER_DATE=COMMIT_DATE,
    )
    return env


def _git(repo: Path, *args: str, env: dict[str, str], stdin: str | None = None) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=repo, env=env, input=stdin, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise BuildError(f"git {' '.join(args)} failed in {repo}:\n{proc.stderr}")
    return proc.stdout


def _copy_source(src: Path, dest: Path) -> None:
    """Copy the repository source, leaving out caches; normalise permissions."""
    dest.mkdir(mode=0o755)
    for entry in sorted(src.iterdir()):
        if entry.name in SKIP_NAMES or entry.name.endswith(SKIP_SUFFIXES):
            continue
        target = dest / entry.name
        if entry.is_symlink():
            raise BuildError(f"symlinks are not supported: {entry}")
        if entry.is_dir():
            _copy_source(entry, target)
        else:
            shutil.copyfile(entry, target)
            target.chmod(0o644)


def _trim_git_dir(git_dir: Path) -> None:
    """Keep only what a checkout needs, in a form that does not depend on the host."""
    for name in ("hooks", "logs", "info", "branches"):
        shutil.rmtree(git_dir / name, ignore_errors=True)
    for name in ("description", "COMMIT_EDITMSG", "ORIG_HEAD", "index", "FETCH_HEAD"):
        (git_dir / name).unlink(missing_ok=True)
    (git_dir / "config").write_text(GIT_CONFIG)
    (git_dir / "HEAD").write_text("ref: refs/heads/main\n")


def _tar_gz(root: Path) -> bytes:
    """A deterministic .tar.gz of everything under ``root`` (members relative to it)."""
    paths = sorted(root.rglob("*"), key=lambda p: p.relative_to(root).parts)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in paths:
            name = path.relative_to(root).as_posix()
            info = tarfile.TarInfo(name)
            info.mtime = COMMIT_EPOCH
            info.uid = info.gid = OWNER_ID
            info.uname = info.gname = OWNER_NAME
            if path.is_dir():
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                data = path.read_bytes()
                info.size = len(data)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return packed.getvalue()


def _collect_tests(root: Path) -> list[str]:
    """Pytest node ids of test functions (and ``Test*`` class methods) under root/tests."""
    ids: list[str] = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                if any(_is_parametrize(d) for d in node.decorator_list):
                    raise BuildError(f"{rel}::{node.name}: parametrized tests are not supported")
                ids.append(f"{rel}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                        ids.append(f"{rel}::{node.name}::{item.name}")
    return ids


def _is_parametrize(decorator: ast.expr) -> bool:
    return "parametrize" in ast.dump(decorator)


def _patched_files(diff: str) -> list[str]:
    return re.findall(r"^diff --git a/(\S+) b/", diff, flags=re.MULTILINE)


def read_text(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


@dataclass
class Built:
    name: str
    record: dict
    tarball: bytes


def build_task(name: str, number: int, created_at: str, scratch: Path) -> Built:
    source = REPOS / name
    if not source.is_dir():
        raise BuildError(f"missing repository source {source}")
    gold = read_text(PATCHES / f"{name}.gold.diff")
    test = read_text(PATCHES / f"{name}.test.diff")
    wrong = read_text(PATCHES / f"{name}.wrong.diff")
    problem = read_text(PROBLEMS / f"{name}.md")
    for kind, diff, want_tests in (("gold", gold, False), ("wrong", wrong, False),
                                   ("test", test, True)):
        files = _patched_files(diff)
        if not files:
            raise BuildError(f"{name}.{kind}.diff changes no file")
        if any(f.startswith("tests/") != want_tests for f in files):
            where = "only" if want_tests else "no"
            raise BuildError(f"{name}.{kind}.diff must touch {where} files under tests/: {files}")

    work = scratch / name
    home = scratch / f"{name}-home"
    home.mkdir()
    env = _git_env(home)
    _copy_source(source, work)
    _git(work, "init", "-q", env=env)
    _git(work, "symbolic-ref", "HEAD", "refs/heads/main", env=env)
    _git(work, "add", "-A", env=env)
    _git(work, "commit", "-q", "--no-verify", "--no-gpg-sign", "-m",
         f"Initial import of {name}", env=env)
    base_commit = _git(work, "rev-parse", "HEAD", env=env).strip()
    _trim_git_dir(work / ".git")
    _git(work, "read-tree", "HEAD", env=env)  # index without stat data: deterministic
    if _git(work, "status", "--porcelain", env=env).strip():
        raise BuildError(f"{name}: working tree not clean after commit")
    (work / ".git" / "index").unlink()
    _git(work, "read-tree", "HEAD", env=env)  # `git status` refreshed it; write it afresh
    tarball = _tar_gz(work)

    # Derive the test lists and check that the patches apply in order.
    pass_to_pass = _collect_tests(work)
    _git(work, "apply", "--check", "-", env=env, stdin=gold)
    _git(work, "apply", "-", env=env, stdin=test)
    after = _collect_tests(work)
    missing = [t for t in pass_to_pass if t not in after]
    if missing:
        raise BuildError(f"{name}: the test patch removes tests {missing}")
    fail_to_pass = [t for t in after if t not in pass_to_pass]
    if not fail_to_pass:
        raise BuildError(f"{name}: the test patch adds no test function")
    _git(work, "apply", "--check", "-", env=env, stdin=gold)
    _git(work, "apply", "--check", "-", env=env, stdin=wrong)

    record = {
        "repo": f"harness/{name}",
        "instance_id": f"harness__{name}-{number}",
        "base_commit": base_commit,
        "patch": gold,
        "test_patch": test,
        "problem_statement": problem,
        "hints_text": "",
        "created_at": created_at,
        "version": VERSION,
        "FAIL_TO_PASS": fail_to_pass,
        "PASS_TO_PASS": pass_to_pass,
        "environment_setup_commit": base_commit,
        "repo_src": f"repos/{name}.tar.gz",
    }
    return Built(name, record, tarball)


def build_all(names: list[str] | None = None) -> list[Built]:
    selected = [t for t in TASKS if names is None or t[0] in names]
    with tempfile.TemporaryDirectory(prefix="swebench-build-") as tmp:
        return [build_task(name, number, created, Path(tmp)) for name, number, created in selected]


def tasks_jsonl(built: list[Built]) -> str:
    return "".join(json.dumps(b.record, ensure_ascii=False) + "\n" for b in built)


def write_outputs(built: list[Built]) -> None:
    for b in built:
        path = REPOS / f"{b.name}.tar.gz"
        if not path.exists() or path.read_bytes() != b.tarball:
            path.write_bytes(b.tarball)
    content = tasks_jsonl(built)
    if not TASKS_FILE.exists() or read_text(TASKS_FILE) != content:
        TASKS_FILE.write_text(content, encoding="utf-8", newline="")


# --------------------------------------------------------------------------
# --check
# --------------------------------------------------------------------------


def _tar_content(data: bytes) -> list[tuple]:
    """Members of a .tar.gz with git's zlib-compressed objects decompressed.

    Two builds that differ only in how zlib compressed the loose objects (a
    different zlib or git build) have the same content by this measure.
    """
    members = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for info in tar.getmembers():
            body = b""
            if info.isfile():
                body = tar.extractfile(info).read()  # type: ignore[union-attr]
                if re.fullmatch(r"\.git/objects/[0-9a-f]{2}/[0-9a-f]{38}", info.name):
                    body = zlib.decompress(body)
            members.append((info.name, info.type, info.mode, info.mtime, info.uid, body))
    return members


def check() -> int:
    built = build_all()
    problems: list[str] = []
    warnings: list[str] = []
    for b in built:
        path = REPOS / f"{b.name}.tar.gz"
        if not path.exists():
            problems.append(f"{path.relative_to(HERE)} is missing")
        elif path.read_bytes() != b.tarball:
            if _tar_content(path.read_bytes()) == _tar_content(b.tarball):
                warnings.append(f"{path.relative_to(HERE)}: same content, different zlib "
                                "compression of git objects (another zlib/git build?)")
            else:
                problems.append(f"{path.relative_to(HERE)} is out of date")
    expected = tasks_jsonl(built)
    if not TASKS_FILE.exists() or read_text(TASKS_FILE) != expected:
        problems.append("tasks.jsonl is out of date")
    known = {f"{name}.tar.gz" for name, _, _ in TASKS}
    for stray in sorted(REPOS.glob("*.tar.gz")):
        if stray.name not in known:
            problems.append(f"{stray.relative_to(HERE)} belongs to no task")
    for line in warnings:
        print("warning:", line)
    for line in problems:
        print("stale:", line)
    if problems:
        print("rebuild with: .venv/bin/python datasets/swebench/build_tasks.py")
        return 1
    print(f"ok: tasks.jsonl and {len(built)} tarballs are up to date")
    return 0


# --------------------------------------------------------------------------
# --verify
# --------------------------------------------------------------------------


def parse_pytest_summary(output: str) -> dict[str, str]:
    """Map node id -> PASSED/FAILED/ERROR/... from the ``-rA`` short test summary."""
    status: dict[str, str] = {}
    for line in output.splitlines():
        match = _SUMMARY_RE.match(line)
        if match:
            status.setdefault(match.group(2), match.group(1))
    return status


@dataclass
class Result:
    instance_id: str
    steps: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


class Sandbox:
    """One fresh container of the sandbox image with a task's repository in /testbed."""

    def __init__(self, client, image: str, tarball: bytes, patches: dict[str, str]) -> None:
        self.container = client.containers.run(
            image,
            ["sleep", "infinity"],
            detach=True,
            init=True,
            user=OWNER_NAME,
            network_mode="none",
            working_dir=TESTBED,
            environment={"PYTHONDONTWRITEBYTECODE": "1"},
            labels={"harness.swebench-verify": "1"},
        )
        try:
            self.container.put_archive(TESTBED, tarball)
            self.container.put_archive("/tmp", _patch_tar(patches))
        except Exception:
            self.close()
            raise

    def run(self, cmd: list[str]) -> tuple[int, str]:
        code, out = self.container.exec_run(cmd, user=OWNER_NAME, workdir=TESTBED)
        return code, out.decode("utf-8", errors="replace")

    def pytest(self, ids: list[str]) -> tuple[dict[str, str], str]:
        _, out = self.run([*PYTEST, *ids])
        return parse_pytest_summary(out), out

    def close(self) -> None:
        try:
            self.container.remove(force=True)
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass


def _patch_tar(patches: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in patches.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"patches/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, COMMIT_EPOCH
            info.uid = info.gid = OWNER_ID
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _count(status: dict[str, str], ids: list[str], want: str) -> int:
    return sum(1 for t in ids if status.get(t) == want)


def verify_task(client, image: str, record: dict) -> Result:
    name = record["repo"].split("/", 1)[1]
    result = Result(record["instance_id"])
    f2p, p2p = record["FAIL_TO_PASS"], record["PASS_TO_PASS"]
    tarball = (TASKS_FILE.parent / record["repo_src"]).read_bytes()
    patches = {
        "test.diff": record["test_patch"],
        "gold.diff": record["patch"],
        "wrong.diff": read_text(PATCHES / f"{name}.wrong.diff"),
    }
    steps, errors = result.steps, result.errors

    box = Sandbox(client, image, tarball, patches)
    try:
        code, out = box.run(["git", "status", "--porcelain"])
        head = box.run(["git", "rev-parse", "HEAD"])[1].strip()
        clean = code == 0 and not out.strip() and head == record["base_commit"]
        steps["clean"] = "yes" if clean else "NO"
        if not clean:
            errors.append(f"base not clean at base_commit (head {head}): {out.strip()[:300]}")
        code, out = box.run(["git", "apply", "-v", "/tmp/patches/test.diff"])
        if code != 0:
            errors.append(f"test patch does not apply: {out[-300:]}")
            return result
        status, out = box.pytest(f2p + p2p)
        failing = len(f2p) - _count(status, f2p, "PASSED")
        steps["f2p_before"] = f"{failing}/{len(f2p)} fail"
        steps["p2p_before"] = f"{_count(status, p2p, 'PASSED')}/{len(p2p)} pass"
        if failing != len(f2p):
            errors.append("some FAIL_TO_PASS tests pass before the gold patch")
        if _count(status, p2p, "PASSED") != len(p2p):
            errors.append("some PASS_TO_PASS tests fail before the gold patch:\n" + out[-1500:])
        code, out = box.run(["git", "apply", "-v", "/tmp/patches/gold.diff"])
        if code != 0:
            errors.append(f"gold patch does not apply: {out[-300:]}")
            return result
        status, out = box.pytest(f2p + p2p)
        steps["f2p_gold"] = f"{_count(status, f2p, 'PASSED')}/{len(f2p)} pass"
        steps["p2p_gold"] = f"{_count(status, p2p, 'PASSED')}/{len(p2p)} pass"
        if _count(status, f2p + p2p, "PASSED") != len(f2p + p2p):
            errors.append("tests fail with the gold patch:\n" + out[-1500:])
        full, _ = box.pytest([])
        if set(full) != set(f2p + p2p) or any(s != "PASSED" for s in full.values()):
            extra = sorted(set(full) - set(f2p + p2p))
            errors.append(f"full suite differs from FAIL_TO_PASS + PASS_TO_PASS: extra {extra}")
    finally:
        box.close()

    box = Sandbox(client, image, tarball, patches)
    try:
        box.run(["git", "apply", "/tmp/patches/test.diff"])
        code, out = box.run(["git", "apply", "-v", "/tmp/patches/wrong.diff"])
        if code != 0:
            errors.append(f"wrong patch does not apply: {out[-300:]}")
            return result
        status, _ = box.pytest(f2p + p2p)
        bad_f2p = len(f2p) - _count(status, f2p, "PASSED")
        bad_p2p = len(p2p) - _count(status, p2p, "PASSED")
        if bad_f2p or bad_p2p:
            steps["wrong"] = f"rejected (F2P {bad_f2p} fail, P2P {bad_p2p} fail)"
        else:
            steps["wrong"] = "ACCEPTED"
            errors.append("the wrong patch passes every test")
    finally:
        box.close()
    return result


def verify(image: str, names: list[str] | None, jobs: int) -> int:
    try:
        import docker  # type: ignore[import-untyped]
    except ImportError:
        print("--verify needs the docker SDK (pip install docker); run it with .venv/bin/python")
        return 2
    client = docker.from_env(timeout=120)
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        print(f"image {image} not found: build it with "
              "`sudo .venv/bin/harness sandbox build`")
        return 2
    records = [json.loads(line) for line in read_text(TASKS_FILE).splitlines() if line.strip()]
    if names:
        records = [r for r in records if r["repo"].split("/", 1)[1] in names]
    started = time.monotonic()

    def run_one(record: dict) -> Result:
        try:
            return verify_task(client, image, record)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            failed = Result(record["instance_id"])
            failed.errors.append(f"{type(exc).__name__}: {exc}")
            return failed

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(run_one, records))

    columns = [("instance", 22), ("clean", 5), ("F2P before", 11), ("P2P before", 11),
               ("F2P gold", 9), ("P2P gold", 9), ("wrong patch", 34), ("result", 6)]
    print("  ".join(title.ljust(width) for title, width in columns))
    for r in results:
        cells = [r.instance_id, r.steps.get("clean", "-"), r.steps.get("f2p_before", "-"),
                 r.steps.get("p2p_before", "-"), r.steps.get("f2p_gold", "-"),
                 r.steps.get("p2p_gold", "-"), r.steps.get("wrong", "-"),
                 "ok" if r.ok else "FAIL"]
        print("  ".join(str(c).ljust(w) for c, (_, w) in zip(cells, columns, strict=True)))
    for r in results:
        for error in r.errors:
            print(f"\n{r.instance_id}: {error}")
    passed = sum(r.ok for r in results)
    print(f"\n{passed}/{len(results)} tasks verified in {time.monotonic() - started:.0f}s "
          f"(image {image})")
    return 0 if passed == len(results) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="rebuild in memory and fail if tasks.jsonl or a tarball differs")
    mode.add_argument("--verify", action="store_true",
                      help="run every task's tests in fresh sandbox containers")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="with --verify: only this repository (repeatable)")
    parser.add_argument("--image", default=IMAGE, help=f"sandbox image (default {IMAGE})")
    parser.add_argument("--jobs", type=int, default=4, help="tasks verified in parallel")
    args = parser.parse_args(argv)
    if args.check:
        return check()
    if args.verify:
        return verify(args.image, args.only, args.jobs)
    built = build_all()
    write_outputs(built)
    total = sum(len(b.tarball) for b in built)
    for b in built:
        r = b.record
        print(f"{r['instance_id']:<22} {r['base_commit'][:12]}  {len(b.tarball):>6} bytes  "
              f"F2P {len(r['FAIL_TO_PASS'])}  P2P {len(r['PASS_TO_PASS'])}")
    print(f"wrote {TASKS_FILE.relative_to(HERE.parents[1])} ({len(built)} tasks) and "
          f"{len(built)} tarballs ({total} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
