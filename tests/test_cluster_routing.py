"""Cluster files and routing decisions, worked out by hand (pure Python, no engine)."""

from __future__ import annotations

import pytest

from cluster.config import ClusterConfigError, load_cluster, parse_cluster
from cluster.routing import (
    LeastLoadedRouter,
    NoReplicaError,
    PDRouter,
    ReplicaLoad,
    RoundRobinRouter,
    SessionRouter,
)
from server.engine_spec import EngineSpec
from server.perf.hardware import Link


def colocated(*usages: float) -> list[ReplicaLoad]:
    return [ReplicaLoad(f"r{i}", "colocated", kv_usage=u) for i, u in enumerate(usages)]


# -- session -----------------------------------------------------------------------------------
def test_session_keeps_every_turn_of_a_program_on_one_replica():
    router = SessionRouter(kv_guard=0.9)
    replicas = colocated(0.1, 0.1, 0.1, 0.1)
    for pid in (f"p{i}" for i in range(40)):
        first = router.route(pid, 0, replicas).decode
        # load changes between turns do not move a bound program, even past the guard
        for r in replicas:
            r.kv_usage = 0.99 if r.name == first else 0.0
        assert all(router.route(pid, t, replicas).decode == first for t in range(1, 5))
        for r in replicas:
            r.kv_usage = 0.1
    # and the hash spreads programs over every replica
    assert {router.bound(f"p{i}") for i in range(40)} == {"r0", "r1", "r2", "r3"}


def test_session_guard_moves_new_programs_off_a_full_replica():
    router = SessionRouter(kv_guard=0.9)
    names = ["r0", "r1", "r2"]
    pid = "program-7"
    order = router.ring_order(pid, names)
    full = order[0]  # where the hash would put it
    replicas = [ReplicaLoad(n, "colocated", kv_usage=0.95 if n == full else 0.2) for n in names]
    assert router.route(pid, 0, replicas).decode == order[1]  # the next one clockwise
    # when every replica is past the guard, the hash decides
    crowded = [ReplicaLoad(n, "colocated", kv_usage=0.95) for n in names]
    assert router.route("program-8", 0, crowded).decode == router.ring_order("program-8",
                                                                             names)[0]


def test_session_adding_a_replica_moves_programs_only_to_the_new_one():
    router = SessionRouter()
    before = {f"p{i}": router.ring_order(f"p{i}", ["a", "b", "c", "d"])[0] for i in range(400)}
    after = {f"p{i}": router.ring_order(f"p{i}", ["a", "b", "c", "d", "e"])[0]
             for i in range(400)}
    moved = [p for p in before if before[p] != after[p]]
    assert moved and all(after[p] == "e" for p in moved)
    assert 0.1 < len(moved) / 400 < 0.3  # about 1/5 of them


def test_session_rebinds_a_program_whose_replica_died():
    router = SessionRouter()
    replicas = colocated(0.0, 0.0)
    first = router.route("p", 0, replicas).decode
    for r in replicas:
        r.alive = r.name != first
    assert router.route("p", 1, replicas).decode != first
    for r in replicas:
        r.alive = False
    with pytest.raises(NoReplicaError):
        router.route("q", 0, replicas)


# -- round robin, least loaded -----------------------------------------------------------------
def test_round_robin_scatters_turns_of_one_program():
    router = RoundRobinRouter()
    replicas = colocated(0.0, 0.0, 0.0)
    assert [router.route("p", t, replicas).decode for t in range(4)] == ["r0", "r1", "r2", "r0"]


def test_least_loaded_takes_fewest_in_flight_then_lowest_kv():
    router = LeastLoadedRouter()
    replicas = colocated(0.5, 0.2, 0.1)
    replicas[0].in_flight, replicas[1].in_flight, replicas[2].in_flight = 1, 1, 3
    assert router.route("p", 0, replicas).decode == "r1"  # r0 and r1 tie on 1; r1 has less KV


# -- P/D ---------------------------------------------------------------------------------------
def test_pd_binds_decode_to_lowest_kv_usage_and_prefills_remotely():
    router = PDRouter()
    replicas = [ReplicaLoad("p0", "prefill", in_flight=2),
                ReplicaLoad("p1", "prefill", in_flight=1),
                ReplicaLoad("d0", "decode", kv_usage=0.4), ReplicaLoad("d1", "decode",
                                                                        kv_usage=0.3)]
    route = router.route("x", 0, replicas)
    assert (route.decode, route.prefill, route.remote) == ("d1", "p1", True)
    replicas[3].kv_usage = 0.9  # d1 fills up: x stays bound, a new program goes to d0
    assert router.route("x", 1, replicas).decode == "d1"
    assert router.route("y", 0, replicas).decode == "d0"
    router.program_end("x")
    assert router.bound("x") is None


# -- cluster files -----------------------------------------------------------------------------
def test_count_expands_and_links_follow_nodes():
    config = parse_cluster({
        "router": {"strategy": "pd"},
        "links": {"intra_node": {"latency_us": 2, "bandwidth_gbs": 900},
                  "inter_node": {"latency_us": 10, "bandwidth_gbs": 200}},
        "replicas": [{"name": "p", "role": "prefill", "node": 0},
                     {"name": "d", "role": "decode", "count": 3, "node": 1}]})
    assert [r.name for r in config.replicas] == ["p", "d0", "d1", "d2"]
    assert config.link("p", "d1") == Link(10e-6, 200e9)
    assert config.link("d0", "d2") == Link(2e-6, 900e9)
    # 1 GB over InfiniBand at 200 GB/s: 5 ms plus the latency
    assert config.link("p", "d0").seconds(1e9) == pytest.approx(0.005 + 10e-6)
    assert config.gpus() == 4


@pytest.mark.parametrize("data, words", [
    ({"replicas": []}, "replicas"),
    ({"router": {"strategy": "magic"}, "replicas": [{"name": "a"}]}, "unknown router strategy"),
    ({"replicas": [{"name": "a"}, {"name": "a"}]}, "repeated: a"),
    ({"replicas": [{"name": "a", "profile": "tpu-llama"}]}, "unknown profile"),
    ({"replicas": [{"name": "a", "policy": "fifo"}]}, "policy"),
    ({"replicas": [{"name": "a", "role": "prefill"}, {"name": "b", "role": "decode"}]},
     "strategy 'pd'"),
    ({"router": {"strategy": "pd"}, "replicas": [{"name": "a"}]}, "role: prefill"),
    ({"replicas": [{"name": "a", "colour": "red"}]}, "colour"),
    ("replicas: a", "expected a mapping"),
])
def test_mistakes_name_the_field_and_the_fix(data, words):
    with pytest.raises(ClusterConfigError) as err:
        parse_cluster(data, "c.yaml")
    assert words in str(err.value)


def test_missing_file_lists_the_examples(tmp_path):
    with pytest.raises(ClusterConfigError, match="no cluster file"):
        load_cluster(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("replicas: [\n")
    with pytest.raises(ClusterConfigError, match="not valid YAML"):
        load_cluster(bad)


def test_placement_fans_events_out_to_where_the_kv_is():
    from cluster.placement import Placement
    from cluster.routing import Route

    placement = Placement()
    assert placement.route("x", Route("d0", "p0")) == ["p0", "d0"]  # both start the program
    assert placement.current("x") == "d0"  # tool events: where the turn was decoded
    assert placement.route("x", Route("d0", "p1")) == ["p1"]
    assert placement.route("x", Route("d1")) == ["d1"]
    assert placement.current("x") == "d1"
    placement.forget_replica("p0")
    assert sorted(placement.end("x")) == ["d0", "d1", "p1"]
    assert placement.end("x") == [] and placement.current("x") is None


def test_a_served_replicas_load_keeps_the_routers_count_apart_from_the_engines():
    """What the strategies balance is the router's own in-flight count (exact); the engine's
    queues, from its last metrics poll, are reported beside it under their own names."""
    from cluster.router_state import ReplicaEndpoint, ReplicaState

    replica = ReplicaState(ReplicaEndpoint("r0", "colocated", "http://127.0.0.1:1"))
    replica.in_flight = 3
    replica.apply_gauges({"running": 1.0, "waiting": 0.0, "kv_usage": 0.4})
    load = replica.load()
    assert (load.in_flight, load.running, load.waiting, load.kv_usage) == (3, 1, 0, 0.4)


# -- the programs router forgets a silent program ----------------------------------------------
def test_a_silent_program_leaves_the_programs_routers_books_after_the_bound():
    """A client killed mid-tool sends no `program_end`: the served router (its `programs`
    strategy's ledger, the events fan-out, the kept `program_start`, the turn figures) forgets
    the program after the cluster's silent-program bound, as the replicas do, and says how
    many it holds in `GET /v1/cluster`."""
    from cluster.router_state import ClusterState, ReplicaEndpoint
    from cluster.routers import make_router
    from cluster.routing import TurnInfo

    config = parse_cluster({"router": {"strategy": "programs", "stale_after_s": 30},
                            "replicas": [{"name": "r", "count": 2}]})
    state = ClusterState([ReplicaEndpoint(r.name, r.role, f"http://127.0.0.1:{9100 + i}")
                          for i, r in enumerate(config.replicas)], make_router(config.router))
    state.starts["killed"] = '{"type": "program_start", "program_id": "killed"}'
    route = state.route("killed", 0, TurnInfo(100.0, prompt_tokens=500))
    state.placed("killed", route)
    state.book.turn_done("killed", 500, 10)
    state.route("alive", 0, TurnInfo(110.0, prompt_tokens=500))
    assert state.to_json()["programs_held"] == 2
    # 30 s after its last turn "killed" is still within the bound; "alive" keeps talking
    state.route("alive", 1, TurnInfo(130.0, prompt_tokens=600))
    assert state.router.bound("killed") == route.decode
    state.route("alive", 2, TurnInfo(130.5, prompt_tokens=700))
    assert state.router.bound("killed") is None
    assert state.placement.touched("killed") == [] and "killed" not in state.starts
    assert state.book.info("killed", 900, 131.0).history_tokens == 0
    view = state.to_json()
    assert view["programs_held"] == 1 and view["counters"]["programs_forgotten"] == 1
    assert state.event_targets("killed", "program_end") == []  # nobody holds it any more


def test_the_silent_program_bound_is_the_files_or_the_command_lines():
    from cluster.launcher import replica_command

    config = parse_cluster({"router": {"strategy": "programs"},
                            "replicas": [{"name": "r", "policy": "lookahead"}]})
    assert config.router.stale_after_s == 3600.0
    scaled = config.with_stale_after(36.0)
    assert scaled.engine_spec(scaled.replicas[0], EngineSpec()).stale_after_s == 36.0
    argv, _ = replica_command(scaled, scaled.replicas[0], 8200)
    assert '"stale_after_s": 36.0' in " ".join(argv)  # the replica's additional config
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ClusterConfigError, match=r"--stale-after-s .*positive, finite"):
            config.with_stale_after(bad)
    with pytest.raises(ClusterConfigError, match="stale_after_s"):
        parse_cluster({"router": {"stale_after_s": 0}, "replicas": [{"name": "r"}]})
