"""The load benchmark, small: 12 programs of all four benchmarks at once (bash in Docker
included) against one real `harness serve` on the emulated GPU, with the replay model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.docker
@pytest.mark.server  # load_bench.py starts its own `harness serve`, out of the check's sight
@pytest.mark.slow
def test_twelve_programs_no_error_nothing_left(docker_client, tmp_path):
    out = tmp_path / "load"
    run = subprocess.run([sys.executable, "-m", "cli", "eval", "load", "--programs", "12",
                          "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    figures = json.loads((out / "load.json").read_text())
    assert figures["programs"] == 12 and figures["by_benchmark"] == {
        "gsm8k": 3, "hotpotqa": 3, "alfworld": 3, "swe-bench": 3}
    assert figures["errors"] == 0 and figures["statuses"] == {"submitted": 12}
    assert figures["containers_left"] == 0
    # every program's start, end and tool calls reached the server, none dropped
    results = [json.loads(p.read_text()) for p in out.glob("*/c*/results/*.json")]
    assert len(results) == 12
    expected = sum(2 + 2 * r["steps"] for r in results)
    assert figures["events_sent"] == expected == figures["events_received_by_server"]
    assert figures["events_dropped"] == 0
    assert figures["peak_rss_mib"] > 0 and figures["wall_s"] > 0
    assert "containers_left" in run.stdout and "peak_rss_mib" in run.stdout
    # hotpotqa's Wikipedia went through the MediaWiki stub over HTTP
    assert figures["wikipedia"].startswith("http://127.0.0.1:")


def test_bad_options_are_clear_errors(tmp_path):
    run = subprocess.run([sys.executable, "-m", "cli", "eval", "load", "--mix", "nosuch",
                          "--out", str(tmp_path / "x")], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "unknown benchmark 'nosuch'" in run.stderr
    assert run.stderr.startswith("harness: error: --mix:")
    assert "Traceback" not in run.stderr
