"""`program-queue`: ThunderAgent's program scheduler in the router, with a global queue.

The router's decisions on hand-worked cases (pure Python), then the virtual cluster carrying
them out with real engines: a held turn waits in the router, not at a replica, and is charged
for the wait."""

from __future__ import annotations

from contextlib import closing

import pytest

from cluster.config import parse_cluster
from cluster.program_queue import ProgramQueueRouter
from cluster.routing import ReplicaLoad, TurnInfo
from common.trace import Program, Trace, Turn
from sim.loop import replay_cluster
from sim.virtual_cluster import VirtualCluster


def _busy(*replicas: tuple[str, int], alive: tuple[str, ...] | None = None) -> list[ReplicaLoad]:
    """Replicas of these capacities, each running something (an idle replica's books decide
    at once, between ticks: a case of its own below), their KV cache reported full: the
    engine holds at least what the books count, so no tokens are shared (a case of its own
    below)."""
    return [ReplicaLoad(name, "colocated", kv_usage=1.0, kv_capacity_tokens=cap, running=1,
                        alive=alive is None or name in alive) for name, cap in replicas]


def _turn(router: ProgramQueueRouter, pid: str, turn: int, loads, now: float,
          tokens: int) -> tuple[float | None, str | None]:
    """Ask as a caller does: held (the time to ask again), or routed (where)."""
    info = TurnInfo(now, prompt_tokens=tokens)
    again = router.hold(pid, turn, loads, info)
    if again is not None:
        return again, None
    return None, router.route(pid, turn, loads, info).decode


def test_a_turn_no_replica_has_room_for_waits_in_the_router_and_resumes_where_room_frees():
    # two replicas of 1,000 tokens; a program is charged its context + 100
    router = ProgramQueueRouter()
    loads = _busy(("r0", 1000), ("r1", 1000))
    assert _turn(router, "a", 0, loads, 0.0, 400) == (None, "r0")  # 500 on r0 (ties: first)
    assert _turn(router, "b", 0, loads, 0.0, 400) == (None, "r1")  # r1 has 1,000 free
    assert _turn(router, "c", 0, loads, 0.0, 300) == (None, "r0")  # 500 free each: r0, 900
    assert _turn(router, "d", 0, loads, 0.0, 400) == (None, "r1")  # r1: 500 free, now full
    # e (500 with its allowance) fits nowhere (100 and 0 free): held until the next tick
    assert _turn(router, "e", 0, loads, 1.0, 400) == (5.0, None)
    assert router.holds == 1 and router.bound("e") == "r0"
    # b ends: r1 has 500 free; at the tick e is resumed there (its home r0 still has 100)
    router.program_end("b")
    assert _turn(router, "e", 0, loads, 5.0, 400) == (None, "r1")
    assert router.moves == 1 and router.bound("e") == "r1" and router.holds == 1
    assert router.program_stats()["queued_s"] == pytest.approx(4.0)  # e: 1 s -> 5 s


def test_the_tick_pauses_the_smallest_acting_program_and_holds_its_next_turn():
    # one replica of 1,000: a (300) and b (300) run; their turns end with contexts of 500
    # and 450: 600 + 550 = 1,150 > 1,000. At the tick (5 s) ThunderAgent pauses acting
    # programs smallest first: b (550 charged) brings it to 600, so a stays
    router = ProgramQueueRouter()
    loads = _busy(("r0", 1000))
    assert _turn(router, "a", 0, loads, 0.0, 300) == (None, "r0")
    assert _turn(router, "b", 0, loads, 0.0, 300) == (None, "r0")
    router.turn_finished("a", 500, 1.0)
    router.turn_finished("b", 450, 1.0)
    assert _turn(router, "b", 1, loads, 5.0, 460) == (10.0, None)  # paused: held
    assert _turn(router, "a", 1, loads, 6.0, 510) == (None, "r0")  # active: goes at once
    router.program_end("a")
    # asked again before the tick: still held; at the tick b resumes (610 of 1,000)
    assert _turn(router, "b", 1, loads, 9.0, 460) == (10.0, None)
    assert _turn(router, "b", 1, loads, 10.0, 460) == (None, "r0")
    stats = router.program_stats()
    assert (stats["pauses"], stats["resumes"]) == (1, 1)
    assert stats["paused_s"] == pytest.approx(5.0) and router.holds == 1


def test_an_idle_replica_decides_at_once_and_a_lost_one_gives_its_programs_up():
    router = ProgramQueueRouter()
    loads = _busy(("r0", 1000), ("r1", 1000))
    assert _turn(router, "a", 0, loads, 0.0, 800) == (None, "r0")
    assert _turn(router, "b", 0, loads, 0.0, 800) == (None, "r1")
    router.turn_finished("a", 950, 1.0)  # 1,050 > 1,000 on r0, until its books decide
    # r0 reported idle (nothing running or waiting): its books decide now, not at the tick:
    # a, acting and over capacity, is paused
    # c, new, waits behind the queued a (no admission ahead of the queue) and r1 has no
    # room for it; asked again while r0 is still idle, its books decide at once: new before
    # paused acting, c fits (200) and a (1,050) does not
    idle = [ReplicaLoad("r0", "colocated", kv_capacity_tokens=1000),
            ReplicaLoad("r1", "colocated", kv_capacity_tokens=1000, running=1)]
    assert _turn(router, "c", 0, idle, 2.0, 100) == (5.0, None)
    assert router.program_stats()["pauses"] == 1
    assert _turn(router, "c", 0, idle, 2.5, 100) == (None, "r0")
    # r1 is lost: b's next turn is placed afresh on r0, new there, so behind a again; at the
    # tick it fits beside c (200 + 800) and goes
    survivors = _busy(("r0", 1000), ("r1", 1000), alive=("r0",))
    assert _turn(router, "b", 1, survivors, 3.0, 700) == (5.0, None)
    assert "r1" not in router.backends and router.bound("b") == "r0"
    assert _turn(router, "b", 1, survivors, 5.0, 700) == (None, "r0")


def test_without_every_replicas_capacity_nothing_is_held():
    # a served replica that has not reported its KV capacity yet: no books, no holding
    router = ProgramQueueRouter()
    loads = [ReplicaLoad("r0", "colocated", running=1)]
    for pid in "abc":
        assert _turn(router, pid, 0, loads, 0.0, 10**6) == (None, "r0")
    assert router.holds == 0


def test_an_unknown_program_scheduler_is_refused_by_name():
    with pytest.raises(ValueError, match="thunderagent"):
        ProgramQueueRouter("nope")


@pytest.mark.engine
def test_the_virtual_cluster_holds_turns_in_the_router_and_charges_the_wait():
    """Two vLLM replicas of 96 blocks (1,536 tokens) and four programs of 600-token turns:
    two fit at once per replica only while their contexts are small, so the router holds
    turns (its books say no room) while the engines run unmodified vLLM. Every program ends,
    and a held turn's record starts when the client sent it (its wait is in its latency)."""
    turns = [Turn(input_tokens=600, output_tokens=20, tool="bash", tool_seconds=1.0,
                  tool_return_tokens=200),
             Turn(input_tokens=30, output_tokens=20)]
    trace = Trace(name="queue", programs=[Program(id=f"p{k}", arrival_s=0.1 * k, turns=turns)
                                          for k in range(6)])
    config = parse_cluster({"router": {"strategy": "program-queue"}, "replicas": [
        {"name": "r", "count": 2, "profile": "h100-llama-3.1-8b", "policy": "vllm",
         "num_gpu_blocks": 96}]})
    with closing(VirtualCluster(config)) as cluster:
        result = replay_cluster(trace, cluster)
        router = cluster.router
        assert router.holds >= 1
        assert all(p.finished is not None for p in result.programs.values())
        waited = [t for p in result.programs.values() for t in p.turns
                  if t.admitted is not None and t.admitted - t.arrival >= 4.0]
        assert waited  # held to a tick at least once, counted from when it was sent
        assert result.program_stats["queued_s"] + result.program_stats["paused_s"] > 0
        # the occupancy plot's series: the first replica's books at each tick
        assert result.program_occupancy and all(
            held["capacity"] == 96 * 16 for _, held in result.program_occupancy)
        assert any(held["reasoning"] + held["acting"] > 0 for _, held in result.program_occupancy)
        assert not router.home and not router.held  # nothing kept after the programs ended


# -- served: the router proxy holds the turn, the engines never see it -------------------------

def _served_queue(blocks: int):
    """The router app with `program-queue` over one fake replica of `blocks` KV blocks (its
    metrics name them, as vLLM's `cache_config_info` does); the chat turns it got, by program."""
    import json

    import httpx
    from fastapi.testclient import TestClient

    from cluster.config import RouterSpec
    from cluster.router_app import create_app
    from cluster.router_state import KV_USAGE_METRIC, ReplicaEndpoint

    got: list[str] = []

    async def replica(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/metrics":
            return httpx.Response(200, text=(
                f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{blocks}"}} 1.0\n'
                f'{KV_USAGE_METRIC}{{engine="0"}} 0.0\n'))
        if path == "/v1/agent/events":
            n = len(request.content.decode().splitlines())
            return httpx.Response(200, json={"accepted": n, "forwarded": n})
        got.append(json.loads(request.content)["session_id"])
        return httpx.Response(200, json={"choices": [], "usage": {
            "prompt_tokens": 1, "completion_tokens": 4}})

    app = create_app([ReplicaEndpoint("r0", "colocated", "http://127.0.0.1:9100")],
                     RouterSpec(strategy="program-queue"), name="queue",
                     transport=httpx.MockTransport(replica), poll_interval_s=0.02)
    return app, TestClient, got


def _chat(client, program: str, chars: int):
    return client.post("/v1/chat/completions", json={
        "model": "m", "session_id": program, "vllm_xargs": {"turn": 0}, "max_tokens": 4,
        "messages": [{"role": "user", "content": "x" * chars}]})


def test_the_served_router_holds_a_turn_until_a_program_ends_and_frees_its_room():
    """One replica of 64 blocks (1,024 tokens): p's first turn (~600 tokens with its
    allowance) goes at once; q's (~600) does not fit beside it and waits in the router (the
    replica never sees it) until p's `program_end` frees the room; then it goes at the next
    tick (shortened to 0.1 s here; 5 s is ThunderAgent's)."""
    import threading
    import time

    app, TestClient, got = _served_queue(64)
    with TestClient(app) as client:
        state = app.state.cluster
        deadline = time.monotonic() + 5
        while state.replicas["r0"].kv_capacity_tokens == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        state.router.tick_s = 0.1
        assert _chat(client, "p", 2000).status_code == 200  # 500 tokens + 100
        answers: dict[str, int] = {}
        waiting = threading.Thread(target=lambda: answers.update(q=_chat(client, "q", 2000)
                                                                 .status_code))
        waiting.start()
        time.sleep(0.5)  # five ticks: q is still held, the replica has not seen it
        assert got == ["p"] and state.counters["held"] == 1 and "q" in state.router.held
        ended = client.post("/v1/agent/events", json={"type": "program_end", "program_id": "p"})
        assert ended.status_code == 200
        waiting.join(timeout=5)
        assert answers == {"q": 200} and got == ["p", "q"]
        assert not state.router.held
        view = client.get("/v1/cluster").json()  # the books, for a comparison's report
        assert view["counters"]["held"] == 1 and view["programs"]["moves"] == 0
        assert view["programs"]["queued_s"] > 0.4  # q waited five ticks and more


def test_a_held_turn_whose_client_goes_away_leaves_the_routers_books():
    """Nothing held for ever: the client of a held turn disconnects; it gets 499 and its
    program leaves the router's books (its slot in the queue, its memory account)."""
    import asyncio
    import time

    from cluster.router_state import ClusterState, ReplicaEndpoint
    from cluster.router_turns import TurnForwarder

    router = ProgramQueueRouter()
    state = ClusterState([ReplicaEndpoint("r0", "colocated", "http://127.0.0.1:9100")], router)
    state.replicas["r0"].kv_capacity_tokens = 1000
    state.replicas["r0"].engine_running = 1
    forwarder = TurnForwarder(state, client=lambda: None, events=None)
    now = time.monotonic()  # the served router's clock
    assert router.hold("p", 0, state.loads(), TurnInfo(now, prompt_tokens=800)) is None

    async def gone() -> None:
        return None

    async def held() -> object:
        return await forwarder._while_held("q", 0, TurnInfo(now, prompt_tokens=800), gone)

    reply = asyncio.run(held())
    assert reply is not None and reply.status == 499
    assert state.counters["held"] == 1 and state.counters["cancelled"] == 1
    assert "q" not in router.held and router.bound("q") is None
    assert all("q" not in books.table for books in router.backends.values())
