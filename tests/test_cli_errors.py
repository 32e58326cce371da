"""The command line's one error path (`cli.errors`): a user's mistake found in any layer is
`harness: error: MSG` on stderr and status 2, without a traceback; anything else raises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli import demo as demo_cli
from cli import sandbox as sandbox_cli
from cli.main import main
from common.errors import UserError
from harness.benchmarks import BenchmarkError
from harness.run import RunError
from harness.server_process import ServerStartError
from harness.tools.sandbox_image import SandboxImageError
from predictor.data import DataError
from predictor.lengths import PredictorError
from server.cpu.engine import ModelFolderError
from server.launch import ServeError
from server.profilers.gpu import ProfileError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv,message", [
    (["serve", "--policy", "nope"], "unknown policy 'nope'; choose one of: "),
    (["serve", "--device", "emulated", "--model", "x"], "--device emulated takes --profile"),
    (["run", "nope"], "unknown benchmark 'nope'; choose one of: "),
    (["run", "gsm8k", "--limit", "0"], "--limit must be at least 1"),
    (["run", "gsm8k", "--model-retries", "-1"], "--model-retries must be at least 0"),
    (["cluster", "serve", "colocated-2-tiny", "--transport", "http"],
     "--transport chooses how the router reaches the replicas on Ray"),
    (["compare", "gsm8k", "--server", "http://127.0.0.1:9"],
     "harness compare starts one co-located server per policy"),
    (["demo", "--programs", "0"], "--programs must be at least 1"),
    (["predictor", "train", "--data", "MISSING", "--out", "OUT"], "MISSING: no such file"),
    (["predictor", "eval", "--model", "TMP"], "not a predictor directory"),
    (["profile", "--tp", "0", "--device", "torch-cpu"], "--tp must be >= 1"),
    (["profile", "--model", "gpt-5", "--device", "torch-cpu"], "unknown model 'gpt-5'"),
    (["profile", "--served", "--model", "nope"], "model 'nope': no such folder"),
])
def test_a_user_mistake_is_one_line_and_status_2(argv, message, tmp_path, capsys):
    paths = {"MISSING": str(tmp_path / "missing.jsonl"), "OUT": str(tmp_path / "m"),
             "TMP": str(tmp_path)}
    argv = [paths.get(a, a) for a in argv]
    message = message.replace("MISSING", paths["MISSING"])
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("harness: error: ") and message in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_no_docker_engine_for_prune_is_a_user_error(monkeypatch, capsys):
    def no_engine():
        raise SandboxImageError("no Docker engine answers (test)")

    monkeypatch.setattr(sandbox_cli, "shared_client", no_engine)
    assert main(["sandbox", "prune"]) == 2
    assert capsys.readouterr().err == "harness: error: no Docker engine answers (test)\n"


def test_the_installed_command_prints_no_traceback():
    done = subprocess.run([sys.executable, "-m", "cli", "run", "nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("harness: error: unknown benchmark 'nope'")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("error", [RuntimeError("boom"), ValueError("a bug, not a mistake")])
def test_any_other_error_keeps_its_traceback(error, monkeypatch):
    def broken(**_: object) -> int:
        raise error

    monkeypatch.setattr(demo_cli, "run_demo", broken)
    with pytest.raises(type(error), match=str(error)):
        main(["demo"])


def test_ctrl_c_is_status_130(monkeypatch):
    def interrupted(**_: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(demo_cli, "run_demo", interrupted)
    assert main(["demo"]) == 130


@pytest.mark.parametrize("error", [
    RunError, BenchmarkError, ServeError, ServerStartError, ModelFolderError, PredictorError,
    DataError, ProfileError])
def test_each_layers_user_mistakes_are_user_errors(error):
    assert issubclass(error, UserError)
