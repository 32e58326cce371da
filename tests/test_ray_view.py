"""The Ray cluster's view of its replicas (`cluster.ray_router.ReplicaView`), without Ray
running: what Serve reports (the running replicas with their metadata and routing stats)
turns the router's replicas alive or dead at once, a dead one's programs rebind by the
strategy's own rule, a restarted one (a new Serve replica id under the same name) is alive
again and counted, and the transport refuses a replica that is not running with the
connection error the router proxy treats as a dead replica."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from cluster import ray_router
from cluster.ray_replica import reap_predecessor
from cluster.ray_router import EngineTransport, ReplicaView, ServeTransport
from cluster.router_state import ClusterState, DownReason, ReplicaEndpoint
from cluster.routing import SessionRouter


def running(name: str, replica_id: str, node: str, **stats: Any) -> SimpleNamespace:
    """A running Serve replica as the request router sees it (`RunningReplica`'s fields)."""
    return SimpleNamespace(
        replica_id=SimpleNamespace(unique_id=replica_id), node_id=node, routing_stats=stats,
        replica_metadata={"name": name, "role": "colocated", "node_ip": "10.0.0.1",
                          "pid": 100, "actor_pid": 99, "engine_url": "http://127.0.0.1:1"})


def test_serve_reports_make_replicas_alive_dead_and_restarted():
    state = ClusterState([ReplicaEndpoint("c0", "colocated", "http://ray/c0"),
                          ReplicaEndpoint("c1", "colocated", "http://ray/c1")], SessionRouter())
    view = ReplicaView()
    view.attach(state)
    assert not any(r.alive for r in state.replicas.values()) and not view.ready.is_set()
    view.update([running("c0", "a", "node-1", kv_usage=0.5, running=2, pins=7, pinned_now=1),
                 running("c1", "b", "node-2")])
    assert all(r.alive for r in state.replicas.values()) and view.ready.is_set()
    assert state.replicas["c0"].kv_usage == 0.5 and state.replicas["c0"].engine_running == 2
    assert state.replicas["c0"].to_json()["pins"] == 7  # its engine's pins, in the router's view
    assert state.replicas["c0"].to_json()["node"] == "node-1"
    home = state.route("p", 0).decode
    other = "c1" if home == "c0" else "c0"
    node = "node-1" if home == "c0" else "node-2"
    view.update([running(other, "b" if other == "c1" else "a", "node-2")])
    assert not state.replicas[home].alive
    # no Ray here, so its node is not alive either: the message names the node
    assert f"its Ray node {node} is gone" in state.replicas[home].last_error
    assert state.replicas[home].down_reason is DownReason.NODE_GONE
    assert state.route("p", 1).decode == other and state.counters["rebinds"] == 1
    view.update([running(home, "c", "node-3"), running(other, "b" if other == "c1" else "a",
                                                      "node-2")])
    assert state.replicas[home].alive and state.replicas[home].last_error is None
    assert state.replicas[home].down_reason is None
    assert state.replicas[home].to_json()["restarts"] == 1
    assert state.replicas[home].to_json()["node"] == "node-3"


def test_a_lost_node_is_named_after_a_failed_call_marked_its_replica_dead():
    """A call that failed first marks the replica dead with what the caller saw; once Serve
    drops the replica and its node is gone, the message and the router's 503 name the node."""
    state = ClusterState([ReplicaEndpoint("c0", "colocated", "http://ray/c0")], SessionRouter())
    view = ReplicaView()
    view.attach(state)
    view.update([running("c0", "a", "node-1")])
    state.replicas["c0"].mark_dead("replica c0's Ray actor died (ActorUnavailableError)")
    assert state.replicas["c0"].down_reason is DownReason.NOT_ANSWERING
    view.update([])
    assert "its Ray node node-1 is gone" in state.replicas["c0"].last_error
    assert state.replicas["c0"].to_json()["down_reason"] == "node_gone"
    assert "node-1" in state.down()


def test_a_replica_dropped_before_its_node_was_declared_dead_is_relabelled(monkeypatch):
    """Serve may drop a replica before the GCS declares its node dead, and then says nothing
    more until the replica runs again: the view asks the GCS again until it knows."""
    alive = {"node-1": True}
    monkeypatch.setattr(ray_router, "node_alive", lambda node: alive[node])
    monkeypatch.setattr(ray_router, "RECHECK_S", 0.05)
    state = ClusterState([ReplicaEndpoint("c0", "colocated", "http://ray/c0")], SessionRouter())
    view = ReplicaView()
    view.attach(state)
    view.update([running("c0", "a", "node-1")])
    view.update([])
    assert "Ray is restarting it" in state.replicas["c0"].last_error
    assert state.replicas["c0"].down_reason is DownReason.RESTARTING
    alive["node-1"] = False  # the GCS declares the node dead
    deadline = time.monotonic() + 10
    while state.replicas["c0"].down_reason is not DownReason.NODE_GONE:
        assert time.monotonic() < deadline, state.replicas["c0"].last_error
        time.sleep(0.05)
    assert "its Ray node node-1 is gone" in state.replicas["c0"].last_error


def test_the_transport_refuses_a_replica_that_is_not_running():
    view = ReplicaView()
    transport = ServeTransport(handle=None, view=view)  # type: ignore[arg-type]
    request = httpx.Request("POST", "http://ray/c9/v1/chat/completions", content=b"{}")
    with pytest.raises(httpx.ConnectError, match="replica c9 is not running"):
        asyncio.run(transport.handle_async_request(request))


class _Engine(BaseHTTPRequestHandler):
    """A stand-in engine: answers every GET with its path."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_engine_transport_goes_straight_to_the_running_replicas_engine():
    """`--transport http`: a request for replica c0 reaches c0's engine at its `engine_url`;
    a replica Serve does not run, or whose engine refuses the connection, is the connection
    error the router proxy treats as a dead replica, naming it."""
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    closed = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    closed_url = f"http://127.0.0.1:{closed.server_address[1]}"
    closed.server_close()
    view = ReplicaView()
    up = running("c0", "a", "node-1")
    up.replica_metadata["engine_url"] = f"http://127.0.0.1:{engine.server_address[1]}"
    down = running("c1", "b", "node-1")
    down.replica_metadata["engine_url"] = closed_url
    view.update([up, down])

    async def get(url: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=EngineTransport(view)) as client:
            return await client.get(url)

    try:
        answer = asyncio.run(get("http://ray/c0/v1/models?x=1"))
        assert answer.status_code == 200 and answer.json() == {"path": "/v1/models?x=1"}
        with pytest.raises(httpx.ConnectError, match="replica c1's engine .* refused"):
            asyncio.run(get("http://ray/c1/v1/models"))
        with pytest.raises(httpx.ConnectError, match="replica c9 is not running"):
            asyncio.run(get("http://ray/c9/v1/models"))
    finally:
        engine.shutdown()


class _StalledEngine(BaseHTTPRequestHandler):
    """A stand-in engine that starts an answer and never finishes it (a lost node's engine)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b"data: {}\n\n")
        self.wfile.flush()
        time.sleep(5)

    def log_message(self, *args: Any) -> None:
        pass


def test_an_answer_from_a_replica_ray_no_longer_runs_fails_instead_of_hanging(monkeypatch):
    monkeypatch.setattr(ray_router, "WATCH_S", 0.05)
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _StalledEngine)
    engine.daemon_threads = True
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    view = ReplicaView()
    up = running("c0", "a", "node-1")
    up.replica_metadata["engine_url"] = f"http://127.0.0.1:{engine.server_address[1]}"
    view.update([up])

    async def read() -> list[bytes]:
        async with httpx.AsyncClient(transport=EngineTransport(view)) as client, \
                client.stream("GET", "http://ray/c0/v1/chat/completions") as answer:
            chunks = []
            async for chunk in answer.aiter_raw():
                chunks.append(chunk)
                view.update([])  # Serve no longer runs c0 (its node is gone)
            return chunks

    try:
        started = time.monotonic()
        with pytest.raises(httpx.ReadError, match="replica c0 stopped running"):
            asyncio.run(read())
        assert time.monotonic() - started < 3  # not the engine's 5 s
    finally:
        engine.shutdown()


def test_a_restarted_replica_reaps_what_its_predecessors_engine_left(tmp_path):
    """The engine core a killed replica's engine leaves behind (a vLLM process of the recorded
    process group) is killed when the replica starts again on that node, not on another."""
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                 "VLLM::EngineCore"], start_new_session=True)
    record = tmp_path / "c0.engine.json"
    record.write_text(json.dumps({"node_id": "node-1", "pgid": leftover.pid}))
    cmdline = Path(f"/proc/{leftover.pid}/cmdline")
    deadline = time.monotonic() + 10
    while b"VLLM" not in cmdline.read_bytes():  # until the child has its command line
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        reap_predecessor(record, "node-2")  # another node: not its process
        assert leftover.poll() is None
        reap_predecessor(record, "node-1")
        assert leftover.wait(timeout=10) == -signal.SIGKILL
    finally:
        leftover.kill()
