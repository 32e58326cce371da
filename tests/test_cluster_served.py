"""`harness cluster serve` for real: clusters of emulated `harness serve` replicas.

A colocated cluster of two replicas (~60 s on 2 cores) is started once for the module, driven
with the `openai` package through the router and with `RouterProxy` directly (no FastAPI)
against its replicas; a replica is killed, and the launcher stopped with SIGTERM; one more
single-replica cluster is killed with SIGKILL. In both cases no replica process may be left
behind. A 1P1D cluster (router strategy `pd`) pulls KV over NIXL, and a `programs` cluster that
carries KV moves a program with its KV.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cluster_helpers import cluster_file, nixl_bytes, offload_store_bytes, pd_turn, relayed

from cluster.config import RouterSpec
from cluster.launcher import group_members
from cluster.router_proxy import RouterProxy
from cluster.router_state import ReplicaEndpoint
from cluster.router_wire import PREFILL_HEADER, REPLICA_HEADER
from common.processes import free_port

MODEL = "llama-3.1-8b"
PARAGRAPH = ("The repository keeps its parser in a single module, and the failing test shows "
             "that nested brackets are closed in the wrong order when a quote appears inside. ")
ROOT = Path(__file__).resolve().parent.parent


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
