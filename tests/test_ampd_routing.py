"""AMPD's binding and adaptive routing (Algorithm 1), each decision worked out by hand.

Costs are exact by construction: prefilling n new tokens takes n ms anywhere (whatever is
cached), moving n tokens' KV takes n / 10 ms on any link, and a decode step of b requests takes
b ms. SLOs: TTFT 1 s, ITL 100 ms, so a prefill replica has slack at a windowed TTFT <= 0.9 s
and a decode replica at an ITL <= 85 ms.
"""

from __future__ import annotations

import pytest

from cluster.ampd import ALPHA, BETA, WINDOW_S, AMPDRouter, Costs, WindowedMean
from cluster.config import ClusterConfigError, parse_cluster
from cluster.routers import make_router
from cluster.routing import ReplicaLoad, Route, TurnInfo

COSTS = Costs(prefill_s=lambda replica, new, cached: new / 1000,
              transfer_s=lambda src, dst, tokens: tokens / 10_000,
              decode_s=lambda replica, batch, tokens: batch / 1000)


def router(seed: int = 0, **options) -> AMPDRouter:
    return AMPDRouter(COSTS, ttft_slo_s=1.0, itl_slo_s=0.1, seed=seed, **options)


def cluster(**queued: int) -> list[ReplicaLoad]:
    """p0, p1 (prefill), d0, d1 (decode; d0 the emptier); `queued`: prefill tokens queued
    (one task from scratch each)."""
    kv = {"d0": 0.2, "d1": 0.5}
    return [ReplicaLoad(n, "prefill" if n[0] == "p" else "decode", kv_usage=kv.get(n, 0.0),
                        queued_prefill_tokens=queued.get(n, 0),
                        queued_prefills=((0, queued[n]),) if queued.get(n) else ())
            for n in ("p0", "p1", "d0", "d1")]


def test_constants_are_the_papers():
    assert (ALPHA, BETA, WINDOW_S) == (0.9, 0.85, 10.0)


def test_windowed_mean_forgets_what_is_older_than_the_window():
    w = WindowedMean(window_s=10.0)
    assert w.mean("a", 0.0) is None
    w.observe("a", 1.0, now=0.0)
    w.observe("a", 3.0, now=5.0)
    assert w.mean("a", 9.0) == 2.0
    assert w.mean("a", 12.0) == 3.0  # the sample at t=0 left the window at t=10
    assert w.mean("a", 15.5) is None
    w.observe("a", 7.0, now=20.0)
    assert w.mean("a", 20.0) == 7.0 and w.mean("b", 20.0) is None


# -- binding (section 3, step 1) --------------------------------------------------------------
def test_first_turn_binds_to_the_least_kv_decode_replica():
    r = router()
    replicas = cluster()
    assert r.route("x", 0, replicas, TurnInfo(now=0.0, prompt_tokens=800)).decode == "d0"
    replicas[2].kv_usage = 0.9  # d0 fills up: x stays, a new program binds to d1
    assert r.route("x", 1, replicas, TurnInfo(now=1.0, prompt_tokens=900,
                                               history_tokens=850)).decode == "d0"
    assert r.route("y", 0, replicas, TurnInfo(now=1.0, prompt_tokens=10)).decode == "d1"
    r.program_end("x")
    assert r.bound("x") is None


# -- D1: an initial prefill goes through Algorithm 1 like an incremental one ------------------
def test_initial_prefill_is_routed_by_algorithm_1():
    """The paper routes "either its initial prefill or an incremental prefill": a first turn
    (no history) takes steps 1, 2 and 3 as a later one does."""
    r = router()
    for p in ("p0", "p1"):
        r.observe_ttft(p, 2.0, now=10.0)  # no TTFT slack anywhere
    r.observe_itl("d0", 0.05, now=10.0)  # d0 has ITL slack (50 <= 85 ms)
    assert r.route("a", 0, cluster(), TurnInfo(now=10.5, prompt_tokens=800)) == Route("d0")
    assert r.decisions["initial_local_slack"] == 1
    r.observe_ttft("p1", 0.5, now=11.0)  # p1's window: (2.0 + 0.5) / 2 = 1.25 s, still none
    r.observe_ttft("p1", 0.2, now=11.0)  # (2.0 + 0.5 + 0.2) / 3 = 0.9 s: slack
    assert r.route("b", 0, cluster(), TurnInfo(now=11.5, prompt_tokens=800)) == Route("d0",
                                                                                     "p1")
    assert r.decisions["initial_remote_slack"] == 1
    # step 3 on a first turn of 1000 tokens: l_hist = 0, so no history moves
    r.observe_ttft("p1", 5.0, now=11.9)
    r.observe_itl("d0", 0.3, now=11.9)  # d0: (0.05 + 0.3) / 2 = 175 ms, no slack
    replicas = cluster(d0=500, p1=200)
    first = TurnInfo(now=12.0, prompt_tokens=1000)
    assert r.local_s(replicas[2], first) == pytest.approx(1.0 + 0.5)
    # p0: queue 0 + T_kv(0) = 0 + prefill 1.0 s + 1000 tokens back 0.1 s
    assert r.remote_s("c", replicas[0], "d0", first) == pytest.approx(1.1)
    assert r.route("c", 0, replicas, first) == Route("d0", "p0")
    assert r.decisions["initial_remote_cost"] == 1
    assert "initial" not in r.decisions


# -- Algorithm 1, steps 1 and 2 -------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))  # whatever order the replicas are visited in
def test_remote_to_the_prefill_replica_with_ttft_slack(seed):
    r = router(seed)
    replicas = cluster()
    r.route("x", 0, replicas, TurnInfo(now=0.0, prompt_tokens=100))
    r.observe_ttft("p0", 0.95, now=50.0)  # above 0.9 s: no slack
    r.observe_ttft("p1", 0.85, now=50.0)
    info = TurnInfo(now=51.0, prompt_tokens=300, history_tokens=200)
    assert r.route("x", 1, replicas, info) == Route("d0", "p1")
    assert r.decisions["remote_slack"] == 1


def test_prefill_replicas_with_slack_are_visited_in_seeded_random_order():
    def choices(seed: int) -> list[str | None]:
        r = router(seed)
        replicas = cluster()
        picks = []
        for i in range(40):
            r.route(f"x{i}", 0, replicas, TurnInfo(now=0.0))
            picks.append(r.route(f"x{i}", 1, replicas, TurnInfo(now=1.0)).prefill)
        return picks

    picks = choices(3)
    assert set(picks) == {"p0", "p1"}  # nothing observed: both have slack, both are taken
    assert choices(3) == picks  # and the same seed takes the same ones


def test_local_when_no_prefill_replica_has_slack_but_the_decode_replica_does():
    r = router()
    replicas = cluster()
    r.route("x", 0, replicas, TurnInfo(now=0.0, prompt_tokens=100))
    r.observe_ttft("p0", 2.0, now=50.0)
    r.observe_ttft("p1", 0.91, now=50.0)
    r.observe_itl("d0", 0.08, now=50.0)
    r.observe_itl("d0", 0.09, now=50.5)  # mean 0.085 = 0.85 * 100 ms: just within
    info = TurnInfo(now=51.0, prompt_tokens=300, history_tokens=200)
    assert r.route("x", 1, replicas, info) == Route("d0")
    assert r.decisions["local_slack"] == 1
    # ten seconds on the slow TTFTs have left the window: p0 and p1 have slack again
    assert r.route("x", 2, replicas, TurnInfo(now=60.5, prompt_tokens=400,
                                              history_tokens=300)).remote


# -- Algorithm 1, step 3: the cheaper of Eq. 1 and Eq. 2 -------------------------------------
def congested(r: AMPDRouter) -> None:
    """No slack anywhere: both prefill replicas slow, both decode replicas slow."""
    for p in ("p0", "p1"):
        r.observe_ttft(p, 2.0, now=100.0)
    for d in ("d0", "d1"):
        r.observe_itl(d, 0.2, now=100.0)


def bound_with_history_on_p1(r: AMPDRouter) -> None:
    """x is bound to d0 and its first turn (1000 tokens) was prefilled on p1."""
    r.observe_ttft("p1", 0.5, now=0.0)  # p1 has TTFT slack; p0's window is empty and its
    replicas = cluster(p0=10_000)  # queue of 10 s stands in for it: no slack, turn 0 -> p1
    assert r.route("x", 0, replicas, TurnInfo(now=0.0, prompt_tokens=1000)) == Route("d0", "p1")


# turn 1: prompt 3000 tokens, of which 2000 are history (on d0; 1000 of them on p1): 1000 new.
TURN1 = TurnInfo(now=100.5, prompt_tokens=3000, history_tokens=2000)


def test_argmin_takes_remote_when_eq2_is_cheapest():
    r = router()
    bound_with_history_on_p1(r)
    congested(r)
    replicas = cluster(d0=500, p1=200)
    # Eq. 1, local on d0: prefill 1000 new = 1.0 s, + d0's queue 500 tokens = 0.5 s -> 1.5 s
    assert r.local_s(replicas[2], TURN1) == pytest.approx(1.5)
    # Eq. 2, p0: queue 0 + history 2000 d0->p0 0.2 s + prefill 1.0 s + 1000 back 0.1 s -> 1.3 s
    assert r.remote_s("x", replicas[0], "d0", TURN1) == pytest.approx(1.3)
    # Eq. 2, p1: queue 0.2 s + the whole history 0.2 s (the paper's T_kv(l_hist)) + 1.1 s
    assert r.remote_s("x", replicas[1], "d0", TURN1) == pytest.approx(1.5)
    assert r.route("x", 1, replicas, TURN1) == Route("d0", "p0")
    assert r.decisions["remote_cost"] == 1


# -- D3: T_kv(l_hist) in Eq. 2, charged in full unless the option says otherwise ---------------
def test_eq2_charges_the_whole_history_by_default():
    """Eq. 2's t_kv = T_kv(l_hist; d -> p) + T_kv(l_incr; p -> d), whatever p held before."""
    r = router()
    assert not r.credit_held_history
    bound_with_history_on_p1(r)  # p1 prefilled x's first 1000 tokens
    p1 = cluster()[1]
    # 0 queue + 2000 history 0.2 s + 1000 new 1.0 s + 1000 back 0.1 s
    assert r.remote_s("x", p1, "d0", TURN1) == pytest.approx(1.3)


def test_credit_held_history_counts_only_the_history_the_prefill_replica_lacks():
    r = router(credit_held_history=True)
    bound_with_history_on_p1(r)
    congested(r)
    # p1 lacks 1000 of the 2000 history tokens: 0.2 + 0.1 + 1.0 + 0.1 = 1.4 s
    assert r.remote_s("x", cluster(p1=200)[1], "d0", TURN1) == pytest.approx(1.4)
    # p0 now queues 300 tokens: 0.3 + 1.3 = 1.6 s; p1 still 1.4 s; local 1.5 s
    assert r.route("x", 1, cluster(d0=500, p0=300, p1=200), TURN1) == Route("d0", "p1")
    # p1 now holds that turn's 3000 tokens: turn 2 (4000, history 3500) moves 500 of the
    # history there (0.05 s), prefills 500 (0.5 s) and moves 500 back (0.05 s)
    replicas = cluster(d0=5000, p0=5000)
    turn2 = TurnInfo(now=101.0, prompt_tokens=4000, history_tokens=3500)
    assert r.remote_s("x", replicas[1], "d0", turn2) == pytest.approx(0.5 + 0.05 + 0.05)
    assert r.route("x", 2, replicas, turn2) == Route("d0", "p1")


def test_credit_held_history_comes_from_the_cluster_file():
    config = parse_cluster({
        "router": {"strategy": "ampd", "ampd_credit_held_history": True},
        "replicas": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}]})
    assert make_router(config.router, config).credit_held_history


# -- D2: the queue term sums T_pre(l_hist, l_incr) per queued task ----------------------------
def test_queue_term_prices_each_task_on_top_of_what_is_cached_for_it():
    """Prefill now costs 1 ms a new token plus 0.1 ms a cached token it attends to. Queued:
    a turn with 4000 history tokens cached and 1000 new (1.0 + 0.4 s), a first turn of 500
    (0.5 s), and a request whose KV comes from a peer (0 new: no compute). The paper's sum is
    1.9 s; the whole prompts priced as one prefill from scratch would be 5.5 s."""
    costs = Costs(prefill_s=lambda replica, new, cached: new / 1000 + cached / 10_000,
                  transfer_s=COSTS.transfer_s, decode_s=COSTS.decode_s)
    r = AMPDRouter(costs, ttft_slo_s=1.0, itl_slo_s=0.1)
    load = ReplicaLoad("d0", "decode", queued_prefill_tokens=1500,
                       queued_prefills=((4000, 1000), (0, 500), (3000, 0)))
    assert r.queue_s(load) == pytest.approx(1.9)
    # Eq. 1 of a turn of 200 new tokens on 1000 cached: 0.2 + 0.1 s on top of the queue
    turn = TurnInfo(now=0.0, prompt_tokens=1200, history_tokens=1000)
    assert r.local_s(load, turn) == pytest.approx(0.3 + 1.9)
    # only a total known (the served router's book): one prefill of it from scratch
    assert r.queue_s(ReplicaLoad("d0", "decode", queued_prefill_tokens=1500)) == (
        pytest.approx(1.5))


# -- D4: an empty window is not slack ---------------------------------------------------------
def test_an_empty_ttft_window_stands_for_the_eq2_estimate():
    """Nothing finished on p0 in the window, but 10,000 tokens wait there: its TTFT-hat is this
    task's Eq. 2 estimate (10 s + 0.5 s + 0.05 s), no slack; p1, idle, has slack (0.55 s)."""
    r = router()
    replicas = cluster(p0=10_000)
    info = TurnInfo(now=0.0, prompt_tokens=500)
    r.route("x", 0, replicas, info)
    assert r.windowed_ttft("x", replicas[0], "d0", info) == pytest.approx(10.55)
    assert r.windowed_ttft("x", replicas[1], "d0", info) == pytest.approx(0.55)
    for seed in range(6):  # whatever the visiting order, only p1 has slack
        assert router(seed).route("y", 0, replicas, info) == Route("d0", "p1")


def test_an_empty_itl_window_stands_for_one_decode_step_of_the_batch():
    r = router()
    for p in ("p0", "p1"):
        r.observe_ttft(p, 2.0, now=0.0)
    replicas = cluster()
    replicas[2].running = 40  # d0 decodes 40: a step with x in it is 41 ms <= 85 ms
    assert r.windowed_itl(replicas[2], now=0.5) == pytest.approx(0.041)
    assert r.route("x", 0, replicas, TurnInfo(now=0.5, prompt_tokens=100)) == Route("d0")
    replicas[2].running = 90  # 91 ms: no slack, step 3 decides (local 0.1 s < p0's 0.11 s)
    assert r.route("y", 0, replicas, TurnInfo(now=0.5, prompt_tokens=100)) == Route("d0")
    assert r.decisions == {"initial_local_slack": 1, "initial_local_cost": 1}
    blind = AMPDRouter(Costs(COSTS.prefill_s, COSTS.transfer_s), ttft_slo_s=1.0, itl_slo_s=0.1)
    assert blind.windowed_itl(replicas[2], now=0.5) == float("inf")  # no model: no slack


def test_argmin_takes_local_when_eq1_is_cheapest():
    r = router()
    bound_with_history_on_p1(r)
    congested(r)
    # d0 queues nothing: local 1.0 s beats p0's 1.3 s and p1's 1.4 s
    assert r.route("x", 1, cluster(p1=200), TURN1) == Route("d0")
    assert r.decisions["local_cost"] == 1


def test_argmin_tie_goes_local():
    r = router()
    bound_with_history_on_p1(r)
    congested(r)
    # local 1.0 + 0.3 = 1.3 s = p0's 1.3 s (p1 1.4 s): no transfer wins the tie
    assert r.route("x", 1, cluster(d0=300, p1=200), TURN1) == Route("d0")


# -- built from a cluster file ----------------------------------------------------------------
def test_make_router_builds_ampd_from_the_cluster_profiles_and_links():
    config = parse_cluster({
        "router": {"strategy": "ampd", "ttft_slo_s": 2.0, "itl_slo_s": 0.05, "seed": 4},
        "replicas": [{"name": "p", "role": "prefill", "node": 0},
                     {"name": "d", "role": "decode", "count": 2, "node": 1}]})
    r = make_router(config.router, config)
    assert isinstance(r, AMPDRouter) and (r.ttft_slo_s, r.itl_slo_s) == (2.0, 0.05)
    from server.perf.registry import load_profile

    profile = load_profile("h100-llama-3.1-8b")
    assert r.costs.prefill_s("p", 1000, 0) == pytest.approx(profile.prefill_seconds(1000))
    # an incremental prefill attends to the cached history: dearer than the same tokens alone
    assert r.costs.prefill_s("d0", 1000, 20_000) > r.costs.prefill_s("d0", 1000, 0)
    assert r.costs.transfer_s("d0", "p", 1000) == pytest.approx(
        config.link("d0", "p").seconds(1000 * profile.kv_bytes_per_token))
    with pytest.raises(ValueError, match="make_router"):
        make_router(config.router)  # no cluster: nothing to price the estimates with
    with pytest.raises(ClusterConfigError, match="role: prefill"):
        parse_cluster({"router": {"strategy": "ampd"}, "replicas": [{"name": "a"}]})
