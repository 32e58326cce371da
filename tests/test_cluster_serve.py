"""`harness cluster serve`'s router without servers: the router app against fake replicas
(an httpx mock transport), `RouterProxy` alone (no FastAPI) against them, the served AMPD
router's own view of turns, and the served-vs-virtual ranking.

The launcher (fake replica processes, replica commands) is tests/test_cluster_launcher.py; real
clusters of emulated replicas are tests/test_cluster_served.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import textwrap
import time
from typing import Any

import httpx
import pytest
from cluster_helpers import relayed
from fastapi.testclient import TestClient

from cluster import served_turns
from cluster.config import RouterSpec, parse_cluster
from cluster.router_app import create_app
from cluster.router_proxy import RouterProxy
from cluster.router_state import KV_USAGE_METRIC, ReplicaEndpoint, engine_gauges, parse_metrics
from cluster.router_wire import PREFILL_HEADER, REPLICA_HEADER, prefill_body, program_of, turn_of
from cluster.served_turns import StreamClock, TurnBook, completion_tokens_of, prompt_tokens_of
from eval.experiments.served_vs_virtual import ranking

MODEL = "llama-3.1-8b"


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

