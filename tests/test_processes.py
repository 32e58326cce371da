"""Stopping a server's process group: its leader is asked first, and whatever of the group
outlives the grace period (an engine core that ignores Ctrl-C) is killed; SIGTERM inside
`sigterm_unwinds` reaches the caller's `finally`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from common.processes import free_port, open_server_log, sigterm_unwinds, stop_process_group

# a leader that exits on Ctrl-C, and a child of its group that ignores it (and SIGTERM); the
# leader sets Python's Ctrl-C handler itself: started from a background job (`pytest &`) it
# would inherit SIGINT ignored, and Python keeps an ignored SIGINT ignored
LEADER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('child', flush=True); time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_the_whole_group_goes_including_a_child_that_ignores_ctrl_c():
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    assert leader.stdout.readline().strip() == "child" and alive(child)
    started = time.monotonic()
    code = stop_process_group(leader, grace_s=5)
    assert code == -signal.SIGINT  # the leader took Ctrl-C at once
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child) and time.monotonic() - started < 5


def test_sigterm_unwinds_through_finally_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    stopped = []
    with pytest.raises(KeyboardInterrupt):
        with sigterm_unwinds():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            finally:
                stopped.append(True)
    assert stopped == [True] and signal.getsignal(signal.SIGTERM) is before


def test_a_free_port_can_be_listened_on():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))


def test_wait_until_answers_tells_ready_exited_and_timeout_apart(tmp_path):
    """A real HTTP server answers (ready); a process that ends first (exited); one that never
    answers (timeout, within the limit given)."""
    from common.processes import wait_until_answers

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                               "127.0.0.1", "--directory", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until_answers(server, f"http://127.0.0.1:{port}/", 20, 0.1) == "ready"
    finally:
        server.kill()
        server.wait()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_until_answers(gone, f"http://127.0.0.1:{free_port()}/", 20, 0.1) == "exited"
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = time.monotonic()
        state = wait_until_answers(silent, f"http://127.0.0.1:{free_port()}/", 0.5, 0.1)
        assert state == "timeout" and time.monotonic() - started < 5
    finally:
        silent.kill()
        silent.wait()


def test_a_server_log_keeps_every_life(tmp_path):
    # a restart opens the log again: the first life's lines (where its errors are) stay
    path = tmp_path / "serve.log"
    for life in ("first", "second"):
        with open_server_log(path, "harness serve") as log:
            subprocess.run([sys.executable, "-c", f"print('{life} life')"], stdout=log,
                           check=True)
    lines = path.read_text().splitlines()
    assert [line for line in lines if "life" in line] == ["first life", "second life"]
    assert sum(line.startswith("--- harness serve started ") for line in lines) == 2
