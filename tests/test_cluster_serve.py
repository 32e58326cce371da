"""`harness cluster serve`: the router app, the launcher, and a real 2-replica cluster.

Fast tests drive the router app against fake replicas (an httpx mock transport) and the
launcher with fake replica processes. The `server` tests start a real colocated cluster of two
emulated `harness serve` replicas (~60 s on 2 cores) once for the module, drive it with the
`openai` package through the router, kill a replica, and stop the launcher with SIGTERM; one
more single-replica cluster is killed with SIGKILL. In both cases no replica process may be
left behind. `RouterProxy` is also driven directly (no FastAPI), against fake replicas and
against the real clusters' replicas.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cluster_helpers import nixl_bytes, offload_store_bytes, pd_turn
from fastapi.testclient import TestClient

from cluster import served_turns
from cluster.config import ClusterConfigError, RouterSpec, load_cluster, parse_cluster
from cluster.launcher import (
    Launcher,
    LauncherError,
    group_members,
    replica_command,
    replica_ports,
)
from cluster.router_app import create_app
from cluster.router_proxy import RouterProxy
from cluster.router_state import (
    KV_USAGE_METRIC,
    ReplicaEndpoint,
    engine_gauges,
    parse_metrics,
)
from cluster.router_wire import PREFILL_HEADER, REPLICA_HEADER, prefill_body, program_of, turn_of
from cluster.served_turns import StreamClock, TurnBook, completion_tokens_of, prompt_tokens_of
from common.processes import free_port
from eval.experiments.served_vs_virtual import ranking

MODEL = "llama-3.1-8b"
PARAGRAPH = ("The repository keeps its parser in a single module, and the failing test shows "
             "that nested brackets are closed in the wrong order when a quote appears inside. ")
ROOT = Path(__file__).resolve().parent.parent


# -- helpers without servers -----------------------------------------------------------------

def test_parse_metrics_reads_vllm_gauges():
    text = textwrap.dedent("""\
        # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
        # TYPE vllm:kv_cache_usage_perc gauge
        vllm:kv_cache_usage_perc{engine="0",model_name="llama-3.1-8b"} 0.25
        vllm:kv_cache_usage_perc{engine="1",model_name="llama-3.1-8b"} 0.5
        vllm:num_requests_running{engine="0",model_name="llama-3.1-8b"} 3.0
        vllm:num_requests_running{engine="1",model_name="llama-3.1-8b"} 2.0
        vllm:kv_cache_usage_perc_other 0.9
        """)
    values = parse_metrics(text)
    assert values[KV_USAGE_METRIC] == 0.5  # the fullest engine
    assert values["vllm:num_requests_running"] == 5.0
    assert "vllm:num_requests_waiting" not in values
    # what the router keeps of a replica: ours (the events plugin's) beside vLLM's
    text += textwrap.dedent("""        # TYPE harness:pins_total counter
        harness:pins_total 7.0
        harness:pins_released_total{reason="handoff"} 5.0
        harness:pinned_programs 2.0
        harness:agent_events_total 31.0
        """)
    assert engine_gauges(text) == {"kv_usage": 0.5, "running": 5.0, "pins": 7.0,
                                   "pinned_now": 2.0, "events_taken": 31.0}


def test_request_fields():
    assert program_of({"session_id": "p1"}, {"X-Session-ID": "p2"}) == "p1"
    assert program_of({}, {"X-Session-ID": "p2"}) == "p2"
    assert program_of({}, {}) is None
    assert turn_of({"vllm_xargs": {"turn": 3}}) == 3
    assert turn_of({"vllm_xargs": {"turn": "x"}}) == 0 and turn_of({}) == 0
    body = {"messages": [], "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": 50, "max_completion_tokens": 50, "min_tokens": 5}
    first = prefill_body(body, {"do_remote_decode": True}, chat=True)
    assert first["max_tokens"] == 1 and first["max_completion_tokens"] == 1
    assert first["stream"] is False and "stream_options" not in first
    assert "min_tokens" not in first and first["kv_transfer_params"] == {"do_remote_decode": True}
    assert body["max_tokens"] == 50  # the original is untouched


# -- the router app against fake replicas ----------------------------------------------------

class FakeReplicas:
    """Replicas behind an httpx mock transport: records what each got; `dead` refuse."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names  # port -> name
        self.got: list[tuple[str, str, Any]] = []  # (replica, path, body)
        self.dead: set[str] = set()
        self.stream_breaks: set[str] = set()  # replicas whose stream dies after 2 chunks
        self.kv: dict[str, float] = {}

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        name = self.names[request.url.port]
        if name in self.dead:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        path = request.url.path
        if path == "/metrics":
            return httpx.Response(200, text=f'{KV_USAGE_METRIC}{{engine="0"}} '
                                            f'{self.kv.get(name, 0.0)}\n')
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": MODEL, "replica": name}]})
        raw = request.content.decode()
        if path == "/v1/agent/events":
            lines = [json.loads(line) for line in raw.splitlines()]
            self.got.append((name, path, lines))
            return httpx.Response(200, json={"accepted": len(lines), "forwarded": len(lines)})
        body = json.loads(raw)
        self.got.append((name, path, body))
        params = body.get("kv_transfer_params")
        if params and params.get("do_remote_decode"):  # a prefill replica's answer
            return httpx.Response(200, json={"choices": [], "kv_transfer_params": {
                "do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": name, "remote_request_id": "r1",
                "remote_block_ids": [1, 2], "remote_host": "127.0.0.1", "remote_port": 1}})
        if body.get("stream"):
            breaks = name in self.stream_breaks

            async def chunks():
                for i in range(4):
                    if breaks and i == 2:
                        raise httpx.ReadError("connection reset")
                    yield f"data: {json.dumps({'i': i, 'replica': name})}\n\n".encode()
                yield b"data: [DONE]\n\n"

            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=chunks())
        return httpx.Response(200, json={"replica": name, "usage": {"prompt_tokens": 1}})


def fake_cluster(roles: dict[str, str], strategy: str = "session", **router: Any):
    ports = {name: 9100 + i for i, name in enumerate(roles)}
    fake = FakeReplicas({port: name for name, port in ports.items()})
    endpoints = [ReplicaEndpoint(name, role, f"http://127.0.0.1:{ports[name]}")
                 for name, role in roles.items()]
    app = create_app(endpoints, RouterSpec(strategy=strategy, **router), name="fake",
                     transport=httpx.MockTransport(fake), poll_interval_s=0.05)
    return app, fake


def chat(client: TestClient, program: str | None, turn: int = 0, **extra: Any) -> httpx.Response:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 8, "vllm_xargs": {"turn": turn}, **extra}
    if program is not None:
        body["session_id"] = program
    return client.post("/v1/chat/completions", json=body)


def test_router_keeps_a_program_on_one_replica_and_routes_its_events():
    app, fake = fake_cluster({"a": "colocated", "b": "colocated", "c": "colocated"})
    with TestClient(app) as client:
        first = {p: chat(client, p).headers["x-harness-replica"] for p in map(str, range(12))}
        assert len(set(first.values())) > 1  # programs spread over the replicas
        for p, replica in first.items():
            again = chat(client, p, turn=1)
            assert again.status_code == 200 and again.headers["x-harness-replica"] == replica
            assert again.json()["replica"] == replica
        # the body reaches the replica unchanged, the program id also as a header
        assert fake.got[-1][2]["session_id"] == "11"
        answer = client.post("/v1/agent/events", content=(
            '{"type": "tool_start", "program_id": "3", "tool": "bash", "predicted_s": 2}\n'
            '{"type": "program_end", "program_id": "3"}'))
        assert answer.status_code == 200
        assert answer.json()["accepted"] == 2 and answer.json()["forwarded"] == 2
        assert list(answer.json()["replicas"]) == [first["3"]]
        assert fake.got[-1][0] == first["3"] and len(fake.got[-1][2]) == 2
        assert app.state.cluster.router.bound("3") is None  # program_end ended the binding
        bad = client.post("/v1/agent/events", json={"type": "tool_stop", "program_id": "3"})
        assert bad.status_code == 400 and "type" in bad.json()["error"]
        state = client.get("/v1/cluster").json()
        assert state["counters"]["requests"] == 24 and state["counters"]["programs_ended"] == 1
        assert sum(r["routed"] for r in state["replicas"]) == 24
        assert client.get("/v1/models").json()["data"][0]["id"] == MODEL
        assert client.get("/health").json()["alive"] == ["a", "b", "c"]


def test_events_follow_the_program_across_replicas_under_round_robin():
    """`cluster.placement`'s rule, served: program_start is held and reaches each replica just
    before the program's first turn there; tool events go where the latest turn ran;
    program_end goes to every replica the program touched."""
    app, fake = fake_cluster({"a": "colocated", "b": "colocated"}, strategy="round_robin")
    with TestClient(app) as client:
        start = client.post("/v1/agent/events", json={"type": "program_start",
                                                      "program_id": "p"})
        assert start.json()["forwarded"] == 0 and start.json()["held"] == 1
        served = [chat(client, "p", turn=t).headers["x-harness-replica"] for t in range(3)]
        assert set(served) == {"a", "b"}
        seen = [(name, path) for name, path, _ in fake.got]
        first, second = served[0], served[1]
        assert seen == [(first, "/v1/agent/events"), (first, "/v1/chat/completions"),
                        (second, "/v1/agent/events"), (second, "/v1/chat/completions"),
                        (served[2], "/v1/chat/completions")]
        assert fake.got[0][2] == [{"type": "program_start", "program_id": "p"}]
        tool = client.post("/v1/agent/events",
                           json={"type": "tool_end", "program_id": "p", "seconds": 1.0})
        assert list(tool.json()["replicas"]) == [served[2]]
        end = client.post("/v1/agent/events", json={"type": "program_end", "program_id": "p"})
        assert set(end.json()["replicas"]) == {"a", "b"} and end.json()["forwarded"] == 1
        counters = client.get("/v1/cluster").json()["counters"]
        assert counters["events_received"] == 3 and counters["events_dropped"] == 0
        assert chat(client, None).status_code == 200  # no program id: routed all the same


def _fill_home_then_move(carry: bool):
    """p's first two turns at its home; the home fills up (KV usage gauge 0.95); turn 2 moves.
    What the replicas got for turn 2, and the two replicas."""
    app, fake = fake_cluster({"a": "colocated", "b": "colocated"}, strategy="programs",
                             carry_kv=carry)
    with TestClient(app) as client:
        home = chat(client, "p").headers["x-harness-replica"]
        assert chat(client, "p", turn=1).headers["x-harness-replica"] == home
        assert not any(path == "/v1/agent/events" for _, path, _ in fake.got)
        fake.kv[home] = 0.95
        deadline = time.monotonic() + 5
        while (time.monotonic() < deadline
               and app.state.cluster.replicas[home].kv_usage < 0.95):
            time.sleep(0.05)
        before = len(fake.got)
        moved = chat(client, "p", turn=2).headers["x-harness-replica"]
        assert client.get("/v1/cluster").json()["counters"]["rebinds"] == 1
    return fake.got[before:], home, moved


def test_the_replica_a_program_moves_away_from_hears_it_before_the_turn_goes_elsewhere():
    """`programs` routing, served: when p's home fills up, p's next turn moves to the other
    replica and the replica it left is told `program_moved` first (so it releases p's pin and
    program slot now, not when p ends); a turn that stays home tells nobody. With `carry_kv`
    the move's turn is prefilled at the old home, which is told once its prefill is answered,
    and decoded at the new home with the prefill's KV-transfer parameters."""
    got, home, moved = _fill_home_then_move(carry=False)
    assert moved != home
    assert [(name, path) for name, path, _ in got] == [
        (home, "/v1/agent/events"), (moved, "/v1/chat/completions")]
    assert got[0][2] == [{"type": "program_moved", "program_id": "p"}]
    got, home, moved = _fill_home_then_move(carry=True)
    assert moved != home
    assert [(name, path) for name, path, _ in got] == [
        (home, "/v1/chat/completions"), (home, "/v1/agent/events"),
        (moved, "/v1/chat/completions")]
    assert got[0][2]["kv_transfer_params"]["do_remote_decode"] is True
    assert got[0][2]["max_tokens"] == 1
    assert got[1][2] == [{"type": "program_moved", "program_id": "p"}]
    assert got[2][2]["kv_transfer_params"]["remote_engine_id"] == home


def test_streaming_is_relayed_and_a_dead_replica_is_named():
    app, fake = fake_cluster({"a": "colocated", "b": "colocated"})
    with TestClient(app) as client:
        replica = chat(client, "p").headers["x-harness-replica"]
        other = "b" if replica == "a" else "a"
        with client.stream("POST", "/v1/chat/completions", json={
                "model": MODEL, "messages": [], "session_id": "p", "stream": True}) as answer:
            assert answer.headers["content-type"].startswith("text/event-stream")
            events = [line for line in answer.iter_lines() if line.startswith("data: ")]
        assert len(events) == 5 and events[-1] == "data: [DONE]"
        assert json.loads(events[0][6:]) == {"i": 0, "replica": replica}

        fake.stream_breaks.add(replica)  # the replica dies in the middle of a stream
        with client.stream("POST", "/v1/chat/completions", json={
                "model": MODEL, "messages": [], "session_id": "p", "stream": True}) as answer:
            events = [line for line in answer.iter_lines() if line.startswith("data: ")]
        error = json.loads(events[-1][6:])["error"]
        assert error["replica"] == replica and f"replica {replica} at 127.0.0.1:" in \
            error["message"] and "is not answering" in error["message"]

        fake.dead.add(replica)  # gone for good
        app.state.cluster.replicas[replica].alive = True  # as if not noticed yet
        answer = chat(client, "p", turn=1)
        assert answer.status_code == 502
        message = answer.json()["error"]["message"]
        assert message.startswith(f"replica {replica} at 127.0.0.1:") and \
            "is not answering: [Errno 111] Connection refused" in message
        state = {r["name"]: r for r in client.get("/v1/cluster").json()["replicas"]}
        assert state[replica]["alive"] is False and state[replica]["in_flight"] == 0
        # the program and new ones go to the live replica
        assert chat(client, "p", turn=2).headers["x-harness-replica"] == other
        assert all(chat(client, f"new-{i}").headers["x-harness-replica"] == other
                   for i in range(5))
        assert client.get("/v1/cluster").json()["counters"]["rebinds"] == 1
        fake.dead.add(other)
        app.state.cluster.replicas[other].alive = False
        answer = chat(client, "q")
        assert answer.status_code == 503 and "no live replica" in answer.json()["error"]["message"]
        assert client.get("/health").status_code == 503


def test_metrics_poll_marks_dead_and_revives():
    app, fake = fake_cluster({"a": "colocated", "b": "colocated"})
    with TestClient(app) as client:
        fake.kv["a"] = 0.75
        fake.dead.add("b")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            state = {r["name"]: r for r in client.get("/v1/cluster").json()["replicas"]}
            if state["a"]["kv_usage"] == 0.75 and not state["b"]["alive"]:
                break
            time.sleep(0.05)
        assert state["a"]["kv_usage"] == 0.75 and state["b"]["alive"] is False
        fake.dead.discard("b")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not app.state.cluster.replicas["b"].alive:
            time.sleep(0.05)
        assert app.state.cluster.replicas["b"].alive
        app.state.cluster.mark_exited("b", -9)  # the launcher saw its process end: for good
        time.sleep(0.3)
        assert not app.state.cluster.replicas["b"].alive


def test_pd_turn_prefills_remotely_then_decodes_with_the_returned_params():
    pytest.importorskip("cluster.pd")
    app, fake = fake_cluster({"p": "prefill", "d0": "decode", "d1": "decode"}, strategy="pd")
    with TestClient(app) as client:
        answer = chat(client, "prog", max_completion_tokens=64)
        assert answer.status_code == 200 and answer.headers["x-harness-prefill"] == "p"
        decode = answer.headers["x-harness-replica"]
        (p_name, _, first), (d_name, _, second) = fake.got[-2:]
        assert (p_name, d_name) == ("p", decode)
        assert first["max_tokens"] == 1 and first["max_completion_tokens"] == 1
        assert first["kv_transfer_params"]["do_remote_decode"] is True
        assert second["max_completion_tokens"] == 64
        assert second["kv_transfer_params"]["remote_engine_id"] == "p"
        assert second["kv_transfer_params"]["remote_block_ids"] == [1, 2]
        assert chat(client, "prog", turn=1).headers["x-harness-replica"] == decode
        with client.stream("POST", "/v1/chat/completions", json={
                "model": MODEL, "messages": [], "session_id": "prog", "stream": True,
                "stream_options": {"include_usage": True}}) as answer:
            events = [line for line in answer.iter_lines() if line.startswith("data: ")]
        assert answer.headers["x-harness-replica"] == decode and len(events) == 5
        (_, _, first), (_, _, second) = fake.got[-2:]
        assert first["stream"] is False and "stream_options" not in first
        assert second["stream"] is True and second["kv_transfer_params"]["do_remote_prefill"]
        events = client.post("/v1/agent/events", json={"type": "tool_start",
                                                       "program_id": "prog", "tool": "bash"})
        assert list(events.json()["replicas"]) == [decode]  # the program's decode replica
        counters = client.get("/v1/cluster").json()["counters"]
        assert counters["pd_prefills"] == 3 and counters["pd_fallbacks"] == 0


async def relayed(reply) -> list[str]:
    """The `data:` lines of a streamed `Reply`, read as a web framework would."""
    assert reply.stream is not None
    text = b"".join([chunk async for chunk in reply.stream]).decode()
    return [line for line in text.splitlines() if line.startswith("data: ")]


def test_router_proxy_answers_without_a_web_framework():
    """`RouterProxy` alone (no FastAPI) over fake replicas: a P/D turn's reply and its stream,
    an event to the program's decode replica, a bad body, the info endpoints."""
    fake = FakeReplicas({9100: "p", 9101: "d"})
    endpoints = [ReplicaEndpoint("p", "prefill", "http://127.0.0.1:9100"),
                 ReplicaEndpoint("d", "decode", "http://127.0.0.1:9101")]
    proxy = RouterProxy(endpoints, RouterSpec(strategy="pd"), name="fake",
                        transport=httpx.MockTransport(fake), poll_interval_s=0.05)
    body = {"model": MODEL, "messages": [], "stream": True, "vllm_xargs": {"turn": 0}}

    async def scenario() -> None:
        async with proxy:
            reply = await proxy.complete("/v1/chat/completions", json.dumps(body).encode(),
                                         httpx.Headers({"X-Session-ID": "prog"}))
            assert reply.status == 200 and reply.stream is not None
            assert reply.headers == {REPLICA_HEADER: "d", PREFILL_HEADER: "p"}
            assert proxy.state.replicas["d"].in_flight == 1  # until the stream is read
            assert len(await relayed(reply)) == 5
            assert proxy.state.replicas["d"].in_flight == 0
            (p_name, _, first), (d_name, _, second) = fake.got
            assert (p_name, first["stream"], d_name) == ("p", False, "d")
            assert second["kv_transfer_params"]["remote_engine_id"] == "p"
            events = await proxy.post_events(b'{"type": "tool_start", "program_id": "prog"}')
            assert list(events.json()["replicas"]) == ["d"] and fake.got[-1][0] == "d"
            bad = await proxy.complete("/v1/completions", b"[1]", httpx.Headers())
            assert bad.status == 400 and "JSON object" in bad.json()["error"]["message"]
            assert (await proxy.models()).json()["data"][0]["id"] == MODEL
            assert proxy.health().json()["alive"] == ["p", "d"]
            counters = proxy.cluster().json()["counters"]
            assert counters["completed"] == 1 and counters["pd_prefills"] == 1
        with pytest.raises(RuntimeError, match="not started"):
            proxy.client()

    asyncio.run(scenario())


# -- the launcher, with fake and real replicas -----------------------------------------------

def cluster_file(tmp_path: Path, replicas: list[dict[str, Any]], name: str = "t",
                 strategy: str = "session", **router: Any) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "router": {"strategy": strategy, **router},
                                "replicas": replicas}))
    return path


def test_replica_commands_are_separate(tmp_path):
    config = load_cluster(ROOT / "cluster" / "examples" / "colocated-2-tiny.yaml")
    ports = replica_ports(config, 8200)
    assert ports == {"d0": 8200, "d1": 8201}
    (argv0, env0), (argv1, env1) = (replica_command(config, s, ports[s.name])
                                    for s in config.replicas)
    assert argv0[argv0.index("--port") + 1] == "8200"
    assert argv0[argv0.index("--num-gpu-blocks-override") + 1] == "512"
    # what 511 blocks of 16 tokens hold (vLLM's null block is the 512th), below 32768
    assert argv0[argv0.index("--max-model-len") + 1] == "8176"
    assert env0["HARNESS_EVENTS_IPC"] != env1["HARNESS_EVENTS_IPC"]
    clash = parse_cluster({"replicas": [{"name": "a", "port": 8301}, {"name": "b"}]})
    with pytest.raises(LauncherError, match="both use port 8301"):
        replica_ports(clash, 8300)


def test_a_cluster_that_carries_kv_gives_every_colocated_replica_the_nixl_connector():
    """`carry_kv` (the `programs` router moves programs with their KV): each colocated
    replica sends and reads KV (`kv_both`) and advertises its own side channel; without it,
    no connector. A replica that also keeps a CPU tier runs both connectors, stacked."""
    data = {"router": {"strategy": "programs", "carry_kv": True},
            "replicas": [{"name": "r", "count": 2, "policy": "lookahead"}]}
    config = parse_cluster(data)
    argv, env = replica_command(config, config.replicas[0], 8200, side_channel_port=9300)
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_role"] == "kv_both" and kv["engine_id"] == "r0"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "9300"
    plain = parse_cluster({**data, "router": {"strategy": "programs"}})
    assert "--kv-transfer-config" not in replica_command(plain, plain.replicas[0], 8200)[0]
    tier = parse_cluster({**data, "replicas": [{"name": "r", "count": 2, "policy": "mori"}]})
    argv, _ = replica_command(tier, tier.replicas[1], 8200, side_channel_port=9301)
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert (kv["kv_connector"], kv["engine_id"]) == ("MultiConnector", "r1")
    assert [c["kv_connector"] for c in kv["kv_connector_extra_config"]["connectors"]] == [
        "NixlConnector", "OffloadingConnector"]
    with pytest.raises(ClusterConfigError, match="carry_kv"):
        parse_cluster({**data, "router": {"strategy": "session", "carry_kv": True}})


FAKE_REPLICA = textwrap.dedent("""\
    import http.server, os, signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # stubborn: only SIGKILL ends it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import signal, time; "
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """)


@pytest.mark.server
def test_failed_replica_stops_the_others_and_shows_its_log(tmp_path):
    config = load_cluster(cluster_file(tmp_path, [{"name": "good"}, {"name": "bad"}]))
    base = free_port()
    lines: list[str] = []
    launcher = Launcher(config, base_port=base, log_dir=tmp_path / "logs", out=lines.append)
    good, bad = launcher.replicas
    good.argv = [sys.executable, "-c", "import time; time.sleep(600)"]
    bad.argv = [sys.executable, "-c", "import sys, time; time.sleep(0.5); "
                "print('no KV cache for you'); sys.exit(3)"]
    with pytest.raises(LauncherError) as failure:
        launcher.start()
    assert "replica bad exited with code 3" in str(failure.value)
    assert "no KV cache for you" in str(failure.value)
    assert good.process is not None and good.process.poll() is not None  # stopped
    assert any("bad: colocated" in line for line in lines)


@pytest.mark.server
def test_sigkilled_launcher_leaves_no_process(tmp_path):
    """PR_SET_PDEATHSIG plus the reaper: stubborn fake replicas and their children go too."""
    script = tmp_path / "launch.py"
    file = str(cluster_file(tmp_path, [{"name": "a"}, {"name": "b"}]))
    logs = str(tmp_path / "logs")
    script.write_text(textwrap.dedent(f"""\
        import sys, time
        from cluster.config import load_cluster
        from cluster.launcher import Launcher
        launcher = Launcher(load_cluster({file!r}), base_port={free_port()}, log_dir={logs!r},
                            reap_grace_s=1.0)
        for r in launcher.replicas:
            r.argv = [sys.executable, "-c", {FAKE_REPLICA!r}, str(r.port)]
        launcher.start()
        print("PIDS", *[r.pid for r in launcher.replicas], flush=True)
        time.sleep(600)
        """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, start_new_session=True)
    try:
        line = ""
        while not line.startswith("PIDS"):
            line = proc.stdout.readline()
            assert line, "the launcher ended before its replicas were up"
        groups = [int(p) for p in line.split()[1:]]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sum(len(group_members(g)) for g in groups) < 4:
            time.sleep(0.1)
        assert sum(len(group_members(g)) for g in groups) == 4  # replicas + their children
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(group_members(g) for g in groups):
            time.sleep(0.2)
        assert not any(group_members(g) for g in groups)
    finally:
        if proc.poll() is None:
            proc.kill()


# -- a real cluster ----------------------------------------------------------------------------

class Cluster:
    """`python -m cli cluster serve FILE` in a subprocess (its own session)."""

    def __init__(self, tmp: Path, replicas: list[dict[str, Any]], name: str,
                 strategy: str = "session", **router: Any) -> None:
        for spec in replicas:
            spec.setdefault("port", free_port())
        self.file = cluster_file(tmp, replicas, name, strategy, **router)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = tmp / f"{name}.out"
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli", "cluster", "serve", str(self.file), "--port",
             str(self.port), "--log-dir", str(tmp / f"{name}-logs")],
            stdout=self.out.open("w"), stderr=subprocess.STDOUT, cwd=ROOT,
            start_new_session=True)
        self.groups: list[int] = []

    def wait_ready(self, timeout_s: float = 420.0) -> Cluster:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the launcher exited with {self.process.returncode}:\n"
                            f"{self.out.read_text()}")
            try:
                state = httpx.get(self.url + "/v1/cluster", timeout=2).json()
                self.groups = [r["pid"] for r in state["replicas"]]
                self.ready_s = time.monotonic() - self.started
                return self
            except httpx.HTTPError:
                time.sleep(1)
        self.kill()
        pytest.fail(f"the cluster did not come up in {timeout_s:.0f} s:\n{self.out.read_text()}")

    def state(self) -> dict[str, Any]:
        return httpx.get(self.url + "/v1/cluster", timeout=5).json()

    def replica(self, name: str) -> dict[str, Any]:
        return next(r for r in self.state()["replicas"] if r["name"] == name)

    def members(self) -> list[int]:
        return [pid for g in self.groups for pid in group_members(g)]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pid in self.groups:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    blocks = {"role": "colocated", "policy": "vllm", "num_gpu_blocks": 512}
    c = Cluster(tmp, [{"name": "d0", **blocks}, {"name": "d1", **blocks}], "two").wait_ready()
    print(f"2-replica cluster ready after {c.ready_s:.0f} s")
    yield c
    c.kill()


def ask(c: Cluster, program: str, messages: list[dict], turn: int, **xargs: Any):
    client = openai.OpenAI(base_url=c.url + "/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=16,
        extra_body={"session_id": program, "vllm_xargs": {"turn": turn, **xargs}})
    return raw.headers["x-harness-replica"], raw.parse()


def cached(response) -> int:
    details = response.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details else 0


@pytest.mark.server
@pytest.mark.slow
def test_two_turns_of_a_program_share_a_replica_and_its_cache(cluster):
    first = [{"role": "system", "content": "You are a careful software engineer."},
             {"role": "user", "content": PARAGRAPH * 12 + " Program two-turns."}]
    where1, r1 = ask(cluster, "two-turns", first, 0, tool="bash")
    second = first + [{"role": "assistant", "content": r1.choices[0].message.content or "ok"},
                      {"role": "user", "content": "Observation: 3 passed, 1 failed."}]
    where2, r2 = ask(cluster, "two-turns", second, 1)
    assert where1 == where2
    assert r1.usage.prompt_tokens > 300
    assert cached(r2) >= r1.usage.prompt_tokens // 16 * 16
    # streamed through as it is made: the first chunk long before the last
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="unused", max_retries=0)
    started = time.monotonic()
    stamps = [time.monotonic() - started for chunk in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "count"}], max_tokens=300,
        stream=True, extra_body={"session_id": "streamer",
                                 "vllm_xargs": {"emulate_output_tokens": 300}})
        if chunk.choices and chunk.choices[0].delta.content]
    assert len(stamps) >= 250 and stamps[0] < stamps[-1] / 2


@pytest.mark.server
@pytest.mark.slow
def test_events_reach_the_serving_replica(cluster):
    serving, _ = ask(cluster, "evented", [{"role": "user", "content": "go"}], 0)
    replicas = {r["name"]: r["url"] for r in cluster.state()["replicas"]}
    before = {n: httpx.get(u + "/v1/agent/events").json()["received"]
              for n, u in replicas.items()}
    events = [{"type": "tool_start", "program_id": "evented", "tool": "bash:pytest",
               "predicted_s": 1.5},
              {"type": "tool_end", "program_id": "evented", "tool": "bash:pytest",
               "seconds": 1.2, "return_tokens": 40}]
    answer = httpx.post(cluster.url + "/v1/agent/events",
                        content="\n".join(json.dumps(e) for e in events))
    assert answer.status_code == 200 and answer.json()["forwarded"] == 2
    assert list(answer.json()["replicas"]) == [serving]
    after = {n: httpx.get(u + "/v1/agent/events").json()["received"]
             for n, u in replicas.items()}
    assert {n: after[n] - before[n] for n in replicas} == {
        n: 2 if n == serving else 0 for n in replicas}


def replica_urls(c: Cluster) -> dict[str, str]:
    return {r["name"]: r["url"] for r in c.state()["replicas"]}


@pytest.mark.server
@pytest.mark.slow
def test_router_proxy_drives_real_replicas(cluster):
    """`RouterProxy` driven directly (no FastAPI) in front of the running cluster's replicas:
    a held `program_start` reaches the replica of the program's first turn before it; the
    second turn follows it there (session affinity) and hits its prefix cache; a streamed
    turn is relayed chunk by chunk; tool events reach only that replica, `program_end` ends
    the binding."""
    urls = replica_urls(cluster)
    endpoints = [ReplicaEndpoint(name, "colocated", url) for name, url in urls.items()]
    messages = [{"role": "user", "content": PARAGRAPH * 12 + " Program proxied."}]

    def request(turn: int, **extra: Any) -> bytes:
        return json.dumps({"model": MODEL, "messages": messages, "max_tokens": 16,
                           "session_id": "proxied", "vllm_xargs": {"turn": turn},
                           **extra}).encode()

    async def scenario() -> None:
        async with RouterProxy(endpoints, RouterSpec(strategy="session"), name="direct") as proxy:
            async def received() -> dict[str, int]:
                return {n: (await proxy.client().get(u + "/v1/agent/events")).json()["received"]
                        for n, u in urls.items()}

            def gained(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
                return {n: after[n] - before[n] for n in urls}

            before = await received()
            held = await proxy.post_events(b'{"type": "program_start", "program_id": "proxied"}')
            assert held.json()["held"] == 1 and held.json()["forwarded"] == 0
            first = await proxy.complete("/v1/chat/completions", request(0), httpx.Headers())
            assert first.status == 200, first.content
            where = first.headers[REPLICA_HEADER]
            after = await received()
            assert gained(before, after) == {n: int(n == where) for n in urls}
            r1 = first.json()
            messages.extend([{"role": "assistant",
                              "content": r1["choices"][0]["message"]["content"] or "ok"},
                             {"role": "user", "content": "Observation: 3 passed, 1 failed."}])
            second = await proxy.complete("/v1/chat/completions", request(1), httpx.Headers())
            assert second.headers[REPLICA_HEADER] == where
            details = second.json()["usage"].get("prompt_tokens_details") or {}
            assert (details.get("cached_tokens") or 0) >= r1["usage"]["prompt_tokens"] // 16 * 16
            streamed = await proxy.complete(
                "/v1/chat/completions",
                request(2, stream=True, stream_options={"include_usage": True}),
                httpx.Headers())
            assert streamed.headers[REPLICA_HEADER] == where
            assert streamed.media_type.startswith("text/event-stream")
            lines = await relayed(streamed)
            assert len(lines) > 3 and lines[-1] == "data: [DONE]"
            assert proxy.state.book.info("proxied", 10_000, 0.0).history_tokens > 300
            before = await received()
            tools = await proxy.post_events(
                b'{"type": "tool_start", "program_id": "proxied", "tool": "bash"}\n'
                b'{"type": "tool_end", "program_id": "proxied", "tool": "bash", "seconds": 0.5}')
            assert tools.json()["forwarded"] == 2 and list(tools.json()["replicas"]) == [where]
            after = await received()
            assert gained(before, after) == {n: 2 * (n == where) for n in urls}
            end = await proxy.post_events(b'{"type": "program_end", "program_id": "proxied"}')
            assert list(end.json()["replicas"]) == [where]
            assert proxy.state.router.bound("proxied") is None
            counters = proxy.cluster().json()["counters"]
            assert counters["completed"] == 3 and counters["failed"] == 0
            assert proxy.state.replicas[where].in_flight == 0 and proxy.state.book.queued == {}

    asyncio.run(scenario())


@pytest.mark.server
@pytest.mark.slow
def test_a_dead_replica_fails_clearly_and_programs_move(cluster):
    victim, _ = ask(cluster, "victim", [{"role": "user", "content": "go"}], 0)
    other = "d1" if victim == "d0" else "d0"
    address = cluster.replica(victim)["url"].split("://")[1]
    result: dict[str, httpx.Response] = {}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a long answer"}],
            "max_tokens": 4000, "session_id": "victim",
            "vllm_xargs": {"turn": 1, "emulate_output_tokens": 4000}}
    thread = threading.Thread(target=lambda: result.update(answer=httpx.post(
        cluster.url + "/v1/chat/completions", json=body, timeout=120)))
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and cluster.replica(victim)["engine_running"] < 1:
        time.sleep(0.1)
    assert cluster.replica(victim)["in_flight"] == 1
    pid = cluster.replica(victim)["pid"]
    os.kill(pid, signal.SIGKILL)  # the API server crashes; its engine core would live on
    thread.join(60)
    answer = result["answer"]
    assert answer.status_code == 502
    message = answer.json()["error"]["message"]
    assert message.startswith(f"replica {victim} at {address} is not answering"), message
    state = cluster.replica(victim)
    assert state["alive"] is False and state["in_flight"] == 0
    for program in ("victim", "newcomer-1", "newcomer-2"):
        where, reply = ask(cluster, program, [{"role": "user", "content": "go on"}], 2)
        assert where == other and reply.usage.completion_tokens > 0
    assert cluster.state()["counters"]["rebinds"] >= 1
    deadline = time.monotonic() + 10  # the launcher kills what is left of the replica's group
    while time.monotonic() < deadline and group_members(pid):
        time.sleep(0.2)
    assert group_members(pid) == []


@pytest.mark.server
@pytest.mark.slow
def test_sigterm_stops_every_replica_process(cluster):
    members = cluster.members()
    assert members, "the live replica's processes"
    cluster.process.send_signal(signal.SIGTERM)
    assert cluster.process.wait(timeout=90) == 0
    assert cluster.members() == []
    assert "harness cluster: stopped" in cluster.out.read_text()


@pytest.mark.server
@pytest.mark.slow
def test_sigkill_of_the_launcher_leaves_no_replica(tmp_path):
    c = Cluster(tmp_path, [{"name": "solo", "policy": "vllm", "num_gpu_blocks": 256}],
                "solo").wait_ready()
    try:
        members = c.members()
        assert len(members) >= 2  # vllm serve and its engine core
        c.process.kill()
        c.process.wait()
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and c.members():
            time.sleep(0.5)
        assert c.members() == []
    finally:
        c.kill()


@pytest.fixture(scope="module")
def pd_cluster(tmp_path_factory):
    """A real 1P1D `harness cluster serve` (router strategy `pd`)."""
    spec = {"profile": "h100-llama-3.1-8b", "policy": "vllm", "num_gpu_blocks": 64}
    c = Cluster(tmp_path_factory.mktemp("pd"), [{"name": "p", "role": "prefill", **spec},
                                                {"name": "d", "role": "decode", **spec}],
                "pd", "pd").wait_ready()
    yield c
    c.kill()


@pytest.mark.server
@pytest.mark.slow
def test_pd_over_http_second_turn_pulls_only_its_new_blocks(pd_cluster):
    """tests/test_pd_transfer.py's two-turn program, served: a real 1P1D `harness cluster
    serve` (router strategy `pd`), token-id prompts through `/v1/completions`. Turn 1: P
    prefills 64 tokens and D pulls its 4 blocks (4 x 16 tokens x 131,072 bytes = 8,388,608).
    Turn 2 (64 + 80 answered + 48 new = 192 tokens): D holds the history's 8 full blocks and
    pulls only the last 4 of P's 12, another 8,388,608 bytes, as vLLM's NIXL metrics say."""
    c = pd_cluster
    d_url = c.replica("d")["url"]

    prompt1 = list(range(100, 164))
    _, answer1 = pd_turn(c.url, MODEL, prompt1, 0, 80)
    assert len(answer1) == 80
    assert nixl_bytes(d_url) == (4 * 16 * 131_072, 1)
    prompt2 = prompt1 + answer1 + list(range(300, 348))
    reply2, _ = pd_turn(c.url, MODEL, prompt2, 1, 5)
    assert reply2.json()["usage"]["prompt_tokens"] == 192
    assert nixl_bytes(d_url) == (2 * 4 * 16 * 131_072, 2)
    assert nixl_bytes(c.replica("p")["url"]) == (0, 0)  # P only serves reads
    assert c.state()["counters"]["pd_prefills"] == 2


@pytest.mark.server
@pytest.mark.slow
def test_router_proxy_hands_a_pd_turn_from_prefill_to_decode(pd_cluster):
    """`RouterProxy` driven directly in front of the 1P1D replicas: a streamed turn of a new
    program is prefilled on P (one token, no stream), D pulls its 4 blocks over NIXL with the
    returned `kv_transfer_params` and streams the answer, whose usage becomes the program's
    history."""
    urls = replica_urls(pd_cluster)
    endpoints = [ReplicaEndpoint("p", "prefill", urls["p"]),
                 ReplicaEndpoint("d", "decode", urls["d"])]
    pulled, reads = nixl_bytes(urls["d"])
    body = {"model": MODEL, "prompt": list(range(1000, 1064)), "max_tokens": 8, "stream": True,
            "stream_options": {"include_usage": True}, "session_id": "pd-direct",
            "vllm_xargs": {"turn": 0, "emulate_output_tokens": 8}}

    async def scenario() -> None:
        async with RouterProxy(endpoints, RouterSpec(strategy="pd"), name="direct") as proxy:
            reply = await proxy.complete("/v1/completions", json.dumps(body).encode(),
                                         httpx.Headers())
            assert reply.status == 200, reply.content
            assert reply.headers == {REPLICA_HEADER: "d", PREFILL_HEADER: "p"}
            lines = await relayed(reply)
            assert lines[-1] == "data: [DONE]"
            usage = json.loads(lines[-2][6:])["usage"]
            assert (usage["prompt_tokens"], usage["completion_tokens"]) == (64, 8)
            state = proxy.state
            assert state.counters["pd_prefills"] == 1 and state.counters["pd_fallbacks"] == 0
            assert (state.replicas["p"].prefills, state.replicas["d"].routed) == (1, 1)
            assert state.book.info("pd-direct", 100, 0.0).history_tokens == 72
            assert state.book.queued == {}

    asyncio.run(scenario())
    assert nixl_bytes(urls["d"]) == (pulled + 4 * 16 * 131_072, reads + 1)


# -- served AMPD: the router's own view of turns ------------------------------------------------

def test_served_turns_read_prompts_answers_and_queues():
    assert prompt_tokens_of({"prompt": list(range(70))}) == 70  # token ids: exact
    assert prompt_tokens_of({"prompt": "x" * 400}) == 100  # text: 4 characters a token
    assert prompt_tokens_of({"messages": [{"role": "user", "content": "y" * 80},
                                          {"role": "user", "content": [{"text": "z" * 40}]}]}) == 30
    assert completion_tokens_of(b'{"usage": {"prompt_tokens": 5, "completion_tokens": 7}}') == 7
    sse = (b'data: {"choices": [{"text": "a"}]}\n\ndata: {"choices": [], "usage": '
           b'{"prompt_tokens": 5, "completion_tokens": 9}}\n\ndata: [DONE]\n\n')
    assert completion_tokens_of(sse) == 9 and completion_tokens_of(b"data: [DONE]\n\n") is None
    book = TurnBook()
    assert book.info("p", 100, 1.0).history_tokens == 0  # a first turn holds nothing
    book.turn_done("p", 100, 20)
    info = book.info("p", 150, 2.0)
    assert (info.history_tokens, info.new_tokens) == (120, 30)
    assert book.info("p", 90, 3.0).history_tokens == 90  # never more than the prompt
    book.prefill_queued("d0", 30)
    book.prefill_queued("d0", 10)
    book.prefill_done("d0", 30)
    assert book.queued == {"d0": 10}
    book.prefill_done("d0", 10)
    assert book.queued == {}
    small = TurnBook()
    memory, served_turns.HISTORY_MEMORY = served_turns.HISTORY_MEMORY, 2
    try:
        for pid in ("a", "b", "a", "c"):  # "b" is the least recently served when "c" comes
            small.turn_done(pid, 10, 5)
    finally:
        served_turns.HISTORY_MEMORY = memory
    assert [small.info(p, 100, 0.0).history_tokens for p in "abc"] == [15, 0, 15]
    clock = StreamClock()
    assert clock.itl() is None
    for t in (1.0, 1.5, 1.7, 2.0):
        clock.chunk(t)
    assert clock.itl() == pytest.approx(1.0 / 3)


def test_served_ampd_routes_by_what_the_router_observes():
    """`ampd` behind the served router: the first turn goes remote (through Algorithm 1, as
    every prefill: both replicas idle, the prefill replica has the slack); the prefill's round trip
    becomes the prefill replica's TTFT and the decode stream's chunk gaps the decode replica's
    ITL; each turn's prompt and history reach Algorithm 1; with the prefill replica over its
    TTFT slack, a turn is prefilled locally. Nothing stays queued."""
    config = parse_cluster({"router": {"strategy": "ampd"}, "replicas": [
        {"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}]})
    fake = FakeReplicas({9100: "p0", 9101: "d0"})
    endpoints = [ReplicaEndpoint("p0", "prefill", "http://127.0.0.1:9100"),
                 ReplicaEndpoint("d0", "decode", "http://127.0.0.1:9101")]
    config = config.model_copy(update={"replicas": [
        r.model_copy(update={"name": n}) for r, n in zip(config.replicas, ("p0", "d0"),
                                                         strict=True)]})
    app = create_app(endpoints, config.router, name="fake", cluster=config,
                     transport=httpx.MockTransport(fake), poll_interval_s=0.05)
    router = app.state.cluster.router
    seen = []
    route = router.route
    router.route = lambda *a, **k: seen.append(a[3]) or route(*a, **k)  # type: ignore[method-assign]

    def turn(client: TestClient, t: int, tokens: int) -> httpx.Response:
        return client.post("/v1/completions", json={
            "model": MODEL, "prompt": list(range(tokens)), "max_tokens": 4, "stream": True,
            "session_id": "p", "vllm_xargs": {"turn": t}})

    with TestClient(app) as client:
        first = turn(client, 0, 50)
        assert first.status_code == 200 and first.headers["x-harness-prefill"] == "p0"
        now = time.monotonic()
        assert router.ttft.mean("p0", now) is not None  # the prefill's round trip
        assert router.itl.mean("d0", now) is not None  # the decode stream's chunk gaps
        second = turn(client, 1, 80)
        assert second.headers["x-harness-prefill"] == "p0"  # TTFT well within slack
        router.observe_ttft("p0", 10 * config.router.ttft_slo_s, time.monotonic())
        third = turn(client, 2, 95)
        assert third.status_code == 200 and "x-harness-prefill" not in third.headers  # local
        state = client.get("/v1/cluster").json()
    assert [(i.prompt_tokens, i.history_tokens) for i in seen] == [(50, 0), (80, 50), (95, 80)]
    assert state["decisions"] == {"initial_remote_slack": 1, "remote_slack": 1, "local_slack": 1}
    assert app.state.cluster.book.queued == {}


def test_served_vs_virtual_ranks_with_ties():
    rows = {"pd": {"jct_mean_s": 4.0}, "ampd": {"jct_mean_s": 4.3},
            "session": {"jct_mean_s": 6.0}, "rr": {"jct_mean_s": math.nan}}
    assert ranking(rows, "jct_mean_s", False, 0.1) == [["pd", "ampd"], ["session"], ["rr"]]
    assert ranking(rows, "jct_mean_s", False, 0.05) == [["pd"], ["ampd"], ["session"], ["rr"]]
    slo = {"pd": {"slo": 0.5}, "ampd": {"slo": 0.9}}
    assert ranking(slo, "slo", True, 0.0) == [["ampd"], ["pd"]]


def _completion(c: Cluster, program: str, prompt: list[int], turn: int) -> httpx.Response:
    reply = httpx.post(c.url + "/v1/completions", timeout=120, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 8, "session_id": program,
        "return_token_ids": True, "vllm_xargs": {"turn": turn, "emulate_output_tokens": 8}})
    assert reply.status_code == 200, reply.text
    return reply


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("tier", [False, True], ids=["nixl", "nixl+cpu-tier"])
def test_a_served_move_carries_the_programs_kv_over_nixl(tmp_path, tier):
    """A real `harness cluster serve` of two `lookahead` replicas of 160 blocks (2,560 tokens;
    the `programs` router places up to 0.9 of it) with `carry_kv`. a (600 tokens) goes to d0,
    b (600) to d1, c (800) to d0 (a tie: the first); b ends. c's next turn (1,600 tokens)
    needs 1,700 of room, d0 has 2,304 - 700 = 1,604: c moves to d1, its turn prefilled on d0
    (which holds c's first 800 tokens) and decoded on d1, which reads all 100 blocks over
    NIXL (100 x 16 tokens x 131,072 bytes); d0 is told `program_moved`. c's next turn stays
    on d1 and reads nothing. With a CPU tier on each replica too (both connectors stacked in
    vLLM's MultiConnector) the same move reads the same blocks."""
    spec = {"role": "colocated", "policy": "lookahead", "num_gpu_blocks": 160,
            **({"offload_gib": 1} if tier else {})}
    c = Cluster(tmp_path, [{"name": "d0", **spec}, {"name": "d1", **spec}], "carry",
                "programs", carry_kv=True).wait_ready()
    try:
        urls = replica_urls(c)
        first = {p: _completion(c, p, list(range(base, base + n)), 0)
                 for p, base, n in (("a", 1000, 600), ("b", 2000, 600), ("c", 3000, 800))}
        assert {p: r.headers[REPLICA_HEADER] for p, r in first.items()} == {
            "a": "d0", "b": "d1", "c": "d0"}
        httpx.post(c.url + "/v1/agent/events", json={"type": "program_end", "program_id": "b"})
        told = httpx.get(urls["d0"] + "/v1/agent/events").json()["received"]
        c1 = list(range(3000, 3800)) + first["c"].json()["choices"][0]["token_ids"]
        c1 += list(range(5000, 5000 + 1600 - len(c1)))
        moved = _completion(c, "c", c1, 1)
        assert (moved.headers[PREFILL_HEADER], moved.headers[REPLICA_HEADER]) == ("d0", "d1")
        assert nixl_bytes(urls["d1"]) == (100 * 16 * 131_072, 1)
        assert httpx.get(urls["d0"] + "/v1/agent/events").json()["received"] == told + 1
        stays = _completion(c, "c", c1 + list(range(7000, 7040)), 2)
        assert stays.headers[REPLICA_HEADER] == "d1" and PREFILL_HEADER not in stays.headers
        assert nixl_bytes(urls["d1"]) == (100 * 16 * 131_072, 1)
        assert c.state()["counters"]["rebinds"] == 1
        # the tier ran beside NIXL: d0 stored its finished turns' KV in host memory
        assert (offload_store_bytes(urls["d0"]) > 0) == tier
    finally:
        c.kill()
