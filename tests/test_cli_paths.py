"""Every file and folder option of every `harness` command answers bad input in one line that
names the option, exit status 2, never a traceback (`cli.paths`).

The path options are found, not listed: every action of every command's parser (the nested
ones too, and `harness profile`'s own two parsers) that is a `PathAction`; and an option that
looks like a path (its dest, metavar or type) but is not one fails the test unless
`NOT_PATHS` says why. Each option gets each bad input its kind can get, in-process: the check
fires while the command line is parsed, so no command runs, no engine starts.

Unreadable as root: root reads a chmod-000 file, so the unreadable input is /proc/self/mem, a
regular file whose read fails (EIO at offset 0) for every user, beside a FIFO (a path that
exists but is not a regular file: reading it would block) and a dangling symlink.
"""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import profile as profile_cli
from cli.main import build_parser, main
from cli.paths import (
    GIVEN,
    Kind,
    PathAction,
    PathError,
    PathSpec,
    about,
    check_path,
    naming_path_options,
)
from common.errors import UserError

ROOT = Path(__file__).resolve().parents[1]

#: Options that look like paths by name and are not, and why.
NOT_PATHS = {
    ("plan", "--profile"): "GPU-MODEL without a TP size: the planner adds each TP, no table",
    ("bench", "--model"): "with --url: the served model's name",
    ("eval langchain-example", "--model"): "the served model's name",
    ("sandbox build", "--name"): "a Docker image name",
    ("eval bash-overhead", "--image"): "a Docker image name",
    ("model add", "--name"): "the name to add a model under",
    ("profile", "profile_args"): "the arguments `harness profile` passes on to its own parsers",
}
PATH_WORDS = {"out", "trace", "cluster", "file", "table", "cache", "data", "model", "init", "json",
              "tasks", "log_dir", "step_log", "predictor", "profile", "profiles", "source",
              "config", "dir", "path", "image", "name"}


def parsers() -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    """(the words that reach it, parser) for every parser of every command."""
    def walk(words: list[str], parser: argparse.ArgumentParser) -> Iterator[
            tuple[list[str], argparse.ArgumentParser]]:
        yield words, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk([*words, name], child)

    yield from walk([], build_parser())
    yield ["profile"], profile_cli.gpu_parser()
    yield ["profile", "--device", "cpu"], profile_cli.cpu_parser()


def options() -> list[tuple[list[str], argparse.Action]]:
    return [(words, a) for words, p in parsers() for a in p._actions
            if not isinstance(a, argparse._SubParsersAction | argparse._HelpAction)]


def flag(action: argparse.Action) -> str:
    return max(action.option_strings, key=len) if action.option_strings else action.dest


PATH_OPTIONS = [(words, a) for words, a in options() if isinstance(a, PathAction)]


def looks_like_a_path(action: argparse.Action) -> bool:
    if action.nargs == 0:  # a flag
        return False
    return (action.dest in PATH_WORDS or action.type is Path
            or str(action.metavar) in ("FILE", "DIR", "PATH")
            or action.dest.endswith(("_file", "_dir", "_path", "_log")))


def test_every_option_that_looks_like_a_path_is_a_checked_path_option():
    unchecked = sorted((" ".join(words), flag(a)) for words, a in options()
                       if looks_like_a_path(a) and not isinstance(a, PathAction)
                       and (" ".join(words), flag(a)) not in NOT_PATHS)
    assert not unchecked, (
        f"path options without cli.paths.add_path_argument: {unchecked} (or say in NOT_PATHS "
        "why they are not paths)")


def test_the_walk_finds_the_path_options_of_every_command():
    found = {(" ".join(words), flag(a)) for words, a in PATH_OPTIONS}
    assert {("bench", "--trace"), ("bench", "--out"), ("bench", "--cluster"), ("run", "--tasks"),
            ("run", "--model"), ("compare", "--out"), ("serve", "--step-log"),
            ("cluster serve", "file"), ("cluster serve", "--log-dir"), ("cluster check", "file"),
            ("cluster bench", "--out"), ("plan", "--table"), ("plan", "--cache"),
            ("predictor train", "--data"), ("predictor eval", "--json"),
            ("predictor predict", "--model"), ("eval fidelity", "--table"),
            ("eval served-vs-virtual", "--cluster"), ("eval real-model", "--model"),
            ("eval perf-table", "profiles"), ("model add", "source"),
            ("profile", "--out"), ("profile --device cpu", "--model")} <= found
    assert len(found) >= 45


# -- the bad inputs ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every bad input by name, made once."""
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "folder").mkdir()
    (tmp / "folder" / "x.json").write_text("{}\n")
    (tmp / "file.jsonl").write_text('{"a": 1}\n')
    (tmp / "empty.jsonl").write_bytes(b"")
    (tmp / "blank.jsonl").write_text("\n  \n")
    (tmp / "binary.jsonl").write_bytes(bytes(range(256)) * 8)  # NUL at byte 0
    (tmp / "latin1.jsonl").write_bytes('{"text": "caf\u00e9"}\n'.encode("latin-1"))
    (tmp / "broken.jsonl").symlink_to(tmp / "nowhere")
    os.mkfifo(tmp / "fifo.jsonl")
    return {
        "folder": str(tmp / "folder"), "file": str(tmp / "file.jsonl"),
        "missing": str(tmp / "missing.jsonl"), "broken link": str(tmp / "broken.jsonl"),
        "fifo": str(tmp / "fifo.jsonl"), "unreadable": "/proc/self/mem",
        "empty": str(tmp / "empty.jsonl"), "blank": str(tmp / "blank.jsonl"),
        "binary": str(tmp / "binary.jsonl"), "not utf-8": str(tmp / "latin1.jsonl"),
        "parent is a file": str(tmp / "file.jsonl" / "out"),
    }


#: The bad inputs of each kind of path option.
CASES = {
    Kind.FILE: ("folder", "missing", "broken link", "fifo", "unreadable", "empty", "blank",
                "binary", "not utf-8", "parent is a file"),
    Kind.FOLDER: ("file", "missing", "broken link", "fifo", "parent is a file"),
    Kind.FILE_OR_FOLDER: ("missing", "broken link", "fifo", "unreadable", "empty", "binary",
                          "not utf-8", "parent is a file"),
    Kind.OUT_FILE: ("folder", "fifo", "parent is a file"),
    Kind.OUT_FOLDER: ("file", "fifo", "parent is a file"),
}


def cases_of(spec: PathSpec) -> tuple[str, ...]:
    """`CASES` of the spec's kind, less what a binary input may be (a GGUF file is binary:
    random bytes still fail, on its magic; text that is not UTF-8 is not checked)."""
    cases = CASES[spec.kind]
    return cases if spec.text else tuple(c for c in cases if c != "blank")


def argv_of(words: list[str], action: argparse.Action, value: str) -> list[str]:
    return [*words, *(action.option_strings[:1]), value]


def label_of(action: argparse.Action) -> str:
    assert isinstance(action, PathAction)
    return action.label


def assert_one_line_naming(err: str, label: str) -> None:
    assert err.startswith("harness: error: "), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"error: {label} " in err, err


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux's /proc")
@pytest.mark.parametrize("words, action", PATH_OPTIONS,
                         ids=[f"{' '.join(w)} {flag(a)}" for w, a in PATH_OPTIONS])
def test_each_bad_input_is_one_line_naming_the_option(words, action, bad, capsys):
    for case in cases_of(action.spec):
        value = bad[case]
        assert main(argv_of(words, action, value)) == 2, (case, value)
        err = capsys.readouterr().err
        assert_one_line_naming(err, label_of(action))
        assert value in err, (case, err)


def test_replay_needs_a_folder_of_trajectories(bad, capsys):
    assert main(["run", "gsm8k", "--model", f"replay:{bad['file']}"]) == 2
    err = capsys.readouterr().err
    assert_one_line_naming(err, "--model")
    assert "is a file, not a folder; give a folder of recorded trajectories" in err


@pytest.mark.parametrize("argv", [
    ["bench", "--trace", "swe", "--programs", "x"],  # a generated trace's name
    ["plan", "--trace", "hotpotqa", "--gpus", "x"],
    ["run", "gsm8k", "--model", "smollm2-135m-instruct", "--limit", "x"],  # a model's name
    ["run", "gsm8k", "--model", "Org/Model", "--limit", "x"],  # a hub id
    ["run", "swe-bench", "--tasks", "princeton-nlp/SWE-bench_Lite:test", "--limit", "x"],
    ["serve", "--profile", "h100-llama-3.1-8b", "--port", "x"],
    ["cluster", "check", "1p3d", "--base-port", "x"],  # a shipped example
])
def test_names_are_not_checked_as_paths(argv, capsys):
    """A value that is a name passes the path check: the run stops at the next, bad option
    (argparse's own message about it)."""
    with pytest.raises(SystemExit):
        main(argv)
    assert "invalid int value: 'x'" in capsys.readouterr().err


def test_good_paths_pass(tmp_path):
    table = tmp_path / "t.json"
    table.write_text("{}\n")
    check_path("--table", str(table), PathSpec(Kind.FILE, "a table"))
    check_path("--out", str(tmp_path / "new" / "deeper"), PathSpec(Kind.OUT_FOLDER, "a folder"))
    check_path("--json", str(tmp_path / "new.json"), PathSpec(Kind.OUT_FILE, "a file"))
    check_path("--trace", str(tmp_path), PathSpec(Kind.FILE_OR_FOLDER, "a trace"))


def test_the_message_says_what_is_wrong_and_what_to_give(bad):
    with pytest.raises(PathError) as raised:
        check_path("--table", bad["folder"], PathSpec(Kind.FILE, "a JSON tau table"))
    assert str(raised.value) == f"--table {bad['folder']}: is a folder; give a JSON tau table"
    with pytest.raises(PathError, match=r"cannot be made: .*file\.jsonl is not a folder"):
        check_path("--out", bad["parent is a file"], PathSpec(Kind.OUT_FOLDER, "a folder"))
    with pytest.raises(PathError, match="is a FIFO, not a regular file"):
        check_path("--data", bad["fifo"], PathSpec(Kind.FILE, "examples"))
    with pytest.raises(PathError, match="is a broken link"):
        check_path("--data", bad["broken link"], PathSpec(Kind.FILE, "examples"))
    with pytest.raises(PathError, match="a NUL byte at byte 0"):
        check_path("--data", bad["binary"], PathSpec(Kind.FILE, "examples"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod-000 file")
def test_a_file_without_read_permission_cannot_be_read(tmp_path):
    path = tmp_path / "secret.json"
    path.write_text("{}")
    path.chmod(0)
    with pytest.raises(PathError, match=r"cannot be read \(Permission denied\)"):
        check_path("--table", str(path), PathSpec(Kind.FILE, "a table"))
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)


# -- a loader's mistakes about the file ---------------------------------------------------------


def test_a_loaders_error_about_the_file_gets_the_option_in_front():
    args = argparse.Namespace(**{GIVEN: [("--trace", "t.jsonl"), ("--cluster", "c.yaml")]})
    with pytest.raises(PathError, match=r"^--trace t\.jsonl: t\.jsonl:1: not valid JSON$"):
        with naming_path_options(args):
            raise UserError("t.jsonl:1: not valid JSON")
    for message in ("--trace t.jsonl: already named", "unknown policy 'nope'",
                    "nt.jsonl is elsewhere"):
        with pytest.raises(UserError, match=f"^{message}$"):
            with naming_path_options(args):
                raise UserError(message)
    with pytest.raises(PathError, match=r"^--table x\.json: roles missing$"):
        with about("--table", "x.json"):
            raise UserError("roles missing")


@pytest.mark.parametrize("argv, text, label", [
    (["bench", "--trace", "FILE", "--out", "OUT"], "hello\n", "--trace"),
    (["plan", "--table", "FILE", "--gpus", "2", "--profile", "h100-llama-3.1-8b",
      "--trace", "swe", "--rate", "1"], "{}\n", "--table"),
    (["predictor", "train", "--data", "FILE", "--out", "OUT", "--baseline-only"], "{}\n",
     "--data"),
    (["run", "gsm8k", "--tasks", "FILE", "--concurrency", "0"], "{}\n", "--tasks"),
    (["eval", "perf-table", "FILE"], '{"gpu": "h100"}\n', "PROFILE"),
    (["cluster", "check", "FILE"], "a: [1\n", "FILE"),
])
def test_a_bad_files_content_is_one_line_naming_the_option(argv, text, label, tmp_path,
                                                           capsys):
    suffix = ".yaml" if label == "FILE" else ".json" if "table" in label or label == "PROFILE" \
        else ".jsonl"
    path = tmp_path / f"bad{suffix}"
    path.write_text(text)
    argv = [str(path) if a == "FILE" else str(tmp_path / "out") if a == "OUT" else a
            for a in argv]
    assert main(argv) == 2
    assert_one_line_naming(capsys.readouterr().err, label)


def test_the_installed_command_answers_a_folder_for_a_file_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "cli", "plan", "--table", str(tmp_path),
                           "--gpus", "2", "--profile", "h100-llama-3.1-8b", "--trace", "swe",
                           "--rate", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == (f"harness: error: --table {tmp_path}: is a folder; give a JSON tau "
                           "table {role: {degree: {load: tau_seconds}}}\n")


def test_a_shipped_cluster_example_is_a_name_and_is_described(capsys):
    assert main(["cluster", "check", "1p3d"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cluster ") and " vllm " in out  # a replica's policy, as text
