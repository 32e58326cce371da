"""AMPD on the real virtual-time cluster: what the replay tells the router (D4: each token gap
as it comes, every prefill's TTFT at its first token), what a replica's prefill queue looks
like to Eq. 1-2 (D2: each task on top of its cached prefix), and AMPD's prefill replicas
running one prefill at a time (D5, Eq. 3's assumption)."""

from __future__ import annotations

import pytest

from cluster.ampd import AMPDRouter, Costs
from common.metrics import SLO
from eval.ampd.bench import STRATEGIES, RunConfig, _engine_factory, cluster_config
from eval.workloads.registry import load_or_generate
from server.engine_spec import EngineSpec
from server.policies.spec import PolicySpec
from sim.engines import make_engine
from sim.loop import Simulation
from sim.virtual_cluster import VirtualCluster

PROFILE = "h100-llama-3.1-8b"
pytestmark = pytest.mark.engine


class Recording(AMPDRouter):
    """AMPD, keeping every observation it is told."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: dict[str, list[tuple[str, float, float]]] = {"ttft": [], "itl": []}

    def observe_ttft(self, replica, seconds, now):
        self.seen["ttft"].append((replica, seconds, now))
        super().observe_ttft(replica, seconds, now)

    def observe_itl(self, replica, seconds, now):
        self.seen["itl"].append((replica, seconds, now))
        super().observe_itl(replica, seconds, now)


class OneAtATime(Simulation):
    """The replay, counting the most prefills a prefill replica's step finished, and its
    configured max_num_seqs."""

    most: dict[str, tuple[int, int]]

    def step(self, replica):
        before = replica.stats.prefills
        super().step(replica)
        if replica.spec.role == "prefill":
            done = replica.stats.prefills - before
            seqs = replica.engine.vllm_config.scheduler_config.max_num_seqs
            self.most[replica.name] = (max(self.most.get(replica.name, (0, 0))[0], done), seqs)


def _replay(strategy: str, slo: SLO):
    trace = load_or_generate("hotpotqa", 8, 4.0, 1)
    run = RunConfig(STRATEGIES[strategy], (1, 1))
    config = cluster_config(run, replicas=2, profile=PROFILE, slo=slo, seed=1,
                            num_gpu_blocks=4096)
    router = Recording(Costs.from_cluster(config), ttft_slo_s=slo.ttft_s,
                       itl_slo_s=slo.tpot_s, seed=1)
    cluster = VirtualCluster(config, seed=1, router=router,
                             make_engine=_engine_factory(config, 1, "pull", run.strategy))
    try:
        sim = OneAtATime(trace, cluster)
        sim.most = {}
        result = sim.run()
        # every export was read or released: none is left holding blocks for its TTL
        assert cluster.by_name["d0"].engine.next_wakeup() is None
    finally:
        cluster.close()
    return router, result, sim.most


def test_windows_get_every_token_gap_as_it_comes_and_every_prefills_ttft():
    router, result, _ = _replay("ampd", SLO(0.04, 0.1))
    turns = [t for p in result.programs.values() for t in p.turns]
    # D4, ITL: one sample per token gap (not one mean per turn), under the decode replica,
    # told step by step (many distinct times, not one per finished turn)
    assert len(router.seen["itl"]) == sum(t.output_tokens - 1 for t in turns)
    assert {r for r, _, _ in router.seen["itl"]} == {"d0"}
    assert len({now for _, _, now in router.seen["itl"]}) > len(turns)
    # D4, TTFT: every prefill, remote or local, initial or incremental, as the client saw it
    ttfts = sorted(round(s, 9) for _, s, _ in router.seen["ttft"])
    assert ttfts == sorted(round(t.first_token - t.arrival, 9) for t in turns)
    where = {r for r, _, _ in router.seen["ttft"]}
    local = [t for t in turns if t.prefill_replica is None]
    assert ("d0" in where) == bool(local) and "p0" in where
    assert any(t.turn == 0 for t in local) or router.decisions.get("initial_remote_slack")


def test_ampd_prefill_replicas_run_one_prefill_at_a_time():
    """D5: Eq. 3 prices the window's prefills one after another; AMPD's prefill replica is
    built with vLLM's max_num_seqs 1, so it never runs two. `pd`'s keeps vLLM's default."""
    _, result, most = _replay("ampd", SLO(0.04, 0.1))
    assert most == {"p0": (1, 1)}  # one prefill a step at most, one request at a time
    _, _, most = _replay("pd", SLO(0.04, 0.1))
    assert most["p0"][1] > 1  # vLLM's default batches prefills when it can


def test_the_prefill_queue_prices_each_task_on_top_of_its_cached_prefix():
    """D2: a program's next turn waits on the replica that ran its last one. The replica's
    load shows it as one task whose cached part (the last turn's full blocks, found in the
    prefix cache) is not priced again; the new tokens are."""
    engine = make_engine(PolicySpec.named("vllm"), EngineSpec(profile=PROFILE,
                                                             num_gpu_blocks=4096))
    cluster = VirtualCluster.around(engine)
    try:
        first = list(range(100, 2100))  # 2000 tokens
        engine.add_request("x#0", first, program_id="x", output_tokens=16)
        answer: list[int] = []
        while engine.has_work():
            for fin in engine.step():
                answer = fin.token_ids
        assert len(answer) == 16
        second = first + answer + list(range(5000, 5500))  # +500 new tokens
        engine.add_request("x#1", second, program_id="x", output_tokens=4)
        (load,) = cluster.loads()
        ((cached, new),) = load.queued_prefills
        # 2015 tokens have KV (the answer's last token was sampled, never computed): 125 full
        # blocks of 16 are found in the prefix cache
        assert cached == 2000 and new == len(second) - 2000
        router = AMPDRouter(Costs.from_cluster(cluster.config), ttft_slo_s=1.0, itl_slo_s=0.1)
        profile = engine.spec.profile_name
        from server.perf.registry import load_profile

        full = load_profile(profile).prefill_seconds(len(second), cached=2000)
        assert router.queue_s(load) == pytest.approx(full)
        scratch = load_profile(profile).prefill_seconds(len(second))
        assert router.queue_s(load) < scratch / 3  # the old lump priced it from scratch
    finally:
        engine.close()
