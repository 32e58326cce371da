"""The `programs` router, served, when a replica dies: a program placed on it is placed afresh
on a live replica and its next turn answered there, as tests/test_cluster_served.py checks
for the `session` router with real `harness serve` replicas.

The replicas here are fake processes (a few lines of `http.server` that answer what the router
asks of a vLLM replica: `/health`, `/metrics` with its KV capacity, completions and events), so
the test takes seconds, not the minute real replicas take; they are started and watched by the
cluster's own launcher, and the router is the app `harness cluster serve` runs, talking to them
over HTTP."""

from __future__ import annotations

import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cluster_helpers import cluster_file
from fastapi.testclient import TestClient

from cluster.config import load_cluster
from cluster.launcher import Launcher
from cluster.router_app import create_app
from cluster.router_state import ReplicaEndpoint
from common.processes import free_port

pytestmark = pytest.mark.server

#: A replica: argv[1] its port, argv[2] its name; 1,000 blocks of 16 tokens of KV.
FAKE_REPLICA = textwrap.dedent("""\
    import http.server, json, sys
    port, name = int(sys.argv[1]), sys.argv[2]
    METRICS = ('vllm:kv_cache_usage_perc{engine="0"} 0.0\\n'
               'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0\\n')
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def answer(self, payload, content_type="application/json"):
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            if self.path == "/metrics":
                return self.answer(METRICS.encode(), "text/plain")
            self.answer({"status": "ok"})
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path == "/v1/agent/events":
                return self.answer({"forwarded": len(body.splitlines())})
            self.answer({"replica": name, "choices": [{"message": {"content": "ok"}}],
                         "usage": {"prompt_tokens": 100, "completion_tokens": 1}})
        def log_message(self, *a): pass
    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """)


@pytest.fixture
def launched(tmp_path) -> Iterator[Launcher]:
    """Two fake replicas behind a `programs` router's cluster file, started by the launcher."""
    config = load_cluster(cluster_file(tmp_path, [{"name": "r0"}, {"name": "r1"}],
                                       strategy="programs"))
    launcher = Launcher(config, base_port=free_port(), log_dir=tmp_path / "logs",
                        out=lambda line: None, reap_grace_s=1.0)
    for replica in launcher.replicas:
        replica.argv = [sys.executable, "-c", FAKE_REPLICA, str(replica.port), replica.name]
    launcher.start()
    try:
        yield launcher
    finally:
        launcher.stop(grace_s=2.0)


def router(launcher: Launcher, poll_interval_s: float | None) -> Any:
    """The router app of `harness cluster serve` over the launched replicas."""
    endpoints = [ReplicaEndpoint(name=r.name, role=r.spec.role, url=r.url, pid=r.pid)
                 for r in launcher.replicas]
    return create_app(endpoints, launcher.config.router, name=launcher.config.name,
                      cluster=launcher.config, poll_interval_s=poll_interval_s)


def turn(client: TestClient, program: str, index: int) -> httpx.Response:
    return client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": f"turn {index}"}],
        "session_id": program, "vllm_xargs": {"turn": index}})


def kill(launcher: Launcher, name: str) -> None:
    process = next(r.process for r in launcher.replicas if r.name == name)
    assert process is not None
    process.send_signal(signal.SIGKILL)
    process.wait(10)


def test_a_program_whose_replica_dies_is_placed_afresh_once_the_launcher_sees_it(launched):
    """As `harness cluster serve` runs: the launcher sees the process end and the router
    takes the replica out; the program's next turn goes to the live one, and is answered."""
    app = router(launched, poll_interval_s=0.1)
    state = app.state.cluster
    launched.watch(lambda replica, code: state.mark_exited(replica.name, code), interval_s=0.1)
    with TestClient(app) as client:
        first = turn(client, "p", 0)
        assert first.status_code == 200, first.text
        home = first.headers["x-harness-replica"]
        other = "r1" if home == "r0" else "r0"
        assert turn(client, "p", 1).headers["x-harness-replica"] == home  # it follows home
        assert client.post("/v1/agent/events", json={
            "type": "tool_start", "program_id": "p", "tool": "bash"}).json()["replicas"] == {
            home: {"sent": 1, "forwarded": 1}}
        kill(launched, home)
        deadline = time.monotonic() + 10
        while state.replicas[home].alive:
            assert time.monotonic() < deadline, "the router never saw the replica go"
            time.sleep(0.05)
        answer = turn(client, "p", 2)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-harness-replica"] == other == answer.json()["replica"]
        assert state.router.bound("p") == other and state.router.moves == 1
        assert turn(client, "p", 3).headers["x-harness-replica"] == other  # its new home
        assert turn(client, "newcomer", 0).headers["x-harness-replica"] == other
        ended = client.post("/v1/agent/events", json={"type": "program_end",
                                                      "program_id": "p"}).json()
        assert ended["replicas"] == {other: {"sent": 1, "forwarded": 1}}  # the dead one: not
        counters = client.get("/v1/cluster").json()["counters"]
    assert counters["rebinds"] == 1 and counters["failed"] == 0


def test_a_turn_sent_to_a_replica_that_just_died_fails_clearly_and_the_next_is_placed_afresh(
        launched):
    """Before anything told the router (no metrics poll, no launcher watch): the turn sent to
    the dead home fails with a 502 naming it, the replica is marked down, and the program's
    next turn is placed on the live replica and answered."""
    app = router(launched, poll_interval_s=None)
    with TestClient(app) as client:
        home = turn(client, "p", 0).headers["x-harness-replica"]
        other = "r1" if home == "r0" else "r0"
        kill(launched, home)
        failed = turn(client, "p", 1)
        assert failed.status_code == 502
        error = failed.json()["error"]
        assert error["replica"] == home and "is not answering" in error["message"]
        answer = turn(client, "p", 1)  # the client's retry
        assert answer.status_code == 200 and answer.json()["replica"] == other
        assert app.state.cluster.router.bound("p") == other
