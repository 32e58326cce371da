"""The marker check (tests/marker_check.py) on a handful of tests written for it, run by a pytest
of their own: a test that starts a server without the `server` marker fails at teardown and
says why, also when the server came from a fixture another test set up; a marked one passes;
a marker nothing accounts for is listed when asked."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# `python -c "" serve` exits at once; the check goes by the command line (a `serve` word)
CONFTEST = 'pytest_plugins = ("marker_check",)\n'
CASES = textwrap.dedent("""\
    import subprocess
    import sys

    import pytest

    SERVE = [sys.executable, "-c", "", "serve"]


    @pytest.fixture(scope="module")
    def started():
        subprocess.run(SERVE, check=True)


    def test_pure():
        subprocess.run([sys.executable, "-c", ""], check=True)


    def test_unmarked():
        subprocess.run(SERVE, check=True)


    @pytest.mark.server
    def test_marked():
        subprocess.run(SERVE, check=True)


    @pytest.mark.server
    def test_first_user_of_the_fixture(started):
        pass


    def test_second_user_of_the_fixture(started):
        pass


    @pytest.mark.engine
    def test_marked_but_idle():
        pass
    """)


def test_unmarked_servers_fail_and_idle_markers_are_listed(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    engine\n    server\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "HARNESS_MARKER_REPORT": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rE",
                          "--strict-markers", "test_cases.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert "6 passed, 2 errors" in out, out  # the two fail at teardown, after passing
    errors = {line.split()[1] for line in out.splitlines() if line.startswith("ERROR ")}
    assert errors == {"test_cases.py::test_unmarked",
                      "test_cases.py::test_second_user_of_the_fixture"}, out
    assert "not marked `server`, but it started" in out and "in fixture `started`" in out
    assert "test_cases.py::test_marked_but_idle: engine" in out
