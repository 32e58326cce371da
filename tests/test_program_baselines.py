"""The baselines as their released code runs them, on hand-worked cases (pure Python, then one
engine for the host tier's size).

ThunderAgent's released code subtracts the tokens programs share from its used capacity and
admits no new program ahead of a queued one; MORI demotes the most idle programs GPU -> CPU ->
dropped, its host tier as large as the engine's, and promotes the least idle first. Each rule
is checked where the previous rule decided otherwise."""

from __future__ import annotations

from contextlib import closing
from types import SimpleNamespace

import pytest

from cluster.program_queue import ProgramQueueRouter
from cluster.routing import ReplicaLoad, TurnInfo
from server.kv_connectors import host_tier_tokens, offloading_config
from server.policies import RequestView, make_policy
from server.programs import Kv, ProgramScheduler
from server.programs.mori import Mori
from server.programs.thunderagent import ThunderAgent


def _start(s: ProgramScheduler, pid: str, tokens: int, now: float) -> None:
    s.turn_arrived(pid, tokens, now)
    s.decide(now)
    if s.may_run(pid):
        s.turn_admitted(pid, now)


def _turn(s: ProgramScheduler, pid: str, prompt: int, sent: float, done: float,
          context: int) -> None:
    """One turn of an admitted program: sent, taken by the engine, finished at `done`."""
    s.turn_arrived(pid, prompt, sent)
    s.turn_admitted(pid, sent)
    s.turn_finished(pid, context, done)


# -- ThunderAgent: shared tokens -------------------------------------------------------------

def _two_sharing_and_one_acting(observe: bool) -> ThunderAgent:
    """Capacity 1,000. a and b reason over 400-token contexts that share a 300-token prefix:
    the books count 400 + 400 (+ 100 each), the engine holds 500 (the prefix once, then 100
    each). c (200) is in a tool call. At the tick the books count 500 + 500 + 300 = 1,300."""
    s = ThunderAgent(capacity_tokens=1000)
    for pid in "abc":
        _start(s, pid, 100, 0.0)  # 200 each: 600, all admitted
    for pid in "abc":
        s.turn_finished(pid, 150, 1.0)
    s.turn_arrived("c", 200, 2.0)
    s.turn_admitted("c", 2.0)
    s.turn_finished("c", 200, 3.0)  # acting, 300 charged
    for pid in "ab":
        s.turn_arrived(pid, 400, 4.0)
        s.turn_admitted(pid, 4.0)  # the engine took the turns: reasoning
    if observe:
        s.observe_engine(500, dict)
    s.decide(5.0)
    return s


def test_thunderagent_subtracts_the_tokens_programs_share_from_its_usage():
    # without the engine's count (the paper's rule): 1,300 > 1,000, the acting c pauses
    before = _two_sharing_and_one_acting(observe=False)
    assert not before.may_run("c") and before.shared_tokens == 0
    # the released rule: shared = 800 reasoning - 500 held = 300; 1,300 - 300 = 1,000 fits
    after = _two_sharing_and_one_acting(observe=True)
    assert after.shared_tokens == 300
    assert all(after.may_run(p) for p in "abc")
    assert after.active_usage() == 1000


def test_thunderagent_counts_only_turns_the_engine_has_taken_as_sharing():
    # a's turn waits (not taken): its 400 tokens are not in the engine's count, and are not
    # taken for shared either
    s = ThunderAgent(capacity_tokens=1000)
    _start(s, "a", 100, 0.0)
    s.turn_finished("a", 150, 1.0)
    s.turn_arrived("a", 400, 2.0)
    s.observe_engine(0, dict)
    s.decide(5.0)
    assert s.shared_tokens == 0


# -- ThunderAgent: no admission ahead of the queue ---------------------------------------------

def test_thunderagent_admits_no_new_program_ahead_of_a_queued_paused_one():
    s = ThunderAgent(capacity_tokens=1000)
    _start(s, "a", 100, 0.0)
    _start(s, "b", 100, 0.0)
    s.turn_finished("a", 600, 1.0)
    s.turn_finished("b", 300, 1.0)  # 700 + 400 = 1,100 > 1,000
    s.decide(5.0)
    assert s.may_run("a") and not s.may_run("b")  # b, the smallest acting one, pauses
    # new (200 charged) would fit (700 + 200), but b is queued: new waits behind it
    s.turn_arrived("new", 100, 6.0)
    assert not s.may_run("new")
    # at the tick the queue resumes in order: b's turn waits (returning, 950 charged) and
    # goes first; new (200 more) no longer fits
    s.program_ended("a", 8.0)
    s.turn_arrived("b", 850, 9.0)
    s.decide(10.0)
    assert s.may_run("b") and not s.may_run("new")
    # with nothing queued a new program that fits is admitted at once
    s.program_ended("b", 11.0)
    s.decide(11.0, idle=True)
    s.turn_arrived("next", 100, 12.0)
    assert s.may_run("new") and s.may_run("next")


# -- the router's books: the replica's KV usage --------------------------------------------------

def test_the_routers_books_take_the_replicas_kv_usage_for_shared_tokens():
    # one replica of 1,000 tokens; a and b (400 + 100 each) fill the books. At the tick the
    # replica reports half its cache in use: a and b share 300 tokens (800 - 500), so c (200
    # + 100) is routed at once; reported full, it is held to the next tick
    def ask(usage: float) -> float | None:
        router = ProgramQueueRouter()
        loads = [ReplicaLoad("r0", "colocated", kv_usage=usage, kv_capacity_tokens=1000,
                             running=1)]
        for pid in "ab":
            assert router.hold(pid, 0, loads, TurnInfo(0.0, prompt_tokens=400)) is None
        return router.hold("c", 0, loads, TurnInfo(5.0, prompt_tokens=200))

    assert ask(0.5) is None
    assert ask(1.0) == 10.0


# -- MORI: the idleness ladder --------------------------------------------------------------------

def _idle_programs(s: ProgramScheduler) -> None:
    """a, b, c, each one cycle in: 1 s reasoning, then 9 s (a), 1 s (b), 0.25 s (c) in a tool
    call (idleness 0.9, 0.5, 0.2); all three acting at 11 s, with contexts 300, 300, 600
    (charged 400 + 400 + 700 = 1,500, over a capacity of 1,000 or 1,024)."""
    for pid in "abc":
        _start(s, pid, 10, 0.0)
        s.turn_finished(pid, 20, 1.0)
    _turn(s, "c", 600, 1.25, 2.25, 600)
    _turn(s, "b", 300, 2.0, 3.0, 300)
    _turn(s, "a", 300, 10.0, 11.0, 300)


def test_mori_drops_the_most_idle_context_when_its_host_tier_is_full_and_promotes_the_least_idle():
    policy = make_policy("mori")
    # 1,024 tokens of KV; the host tier holds 500 tokens
    policy.configure(max_batch_tokens=2048, total_blocks=64, block_size=16, host_tier=True,
                     host_tier_tokens=500)
    s = policy.programs
    assert s.host_tier_tokens == 500
    _idle_programs(s)
    s.decide(11.0)
    # most idle first: a (400) leaves 1,100 > 1,024, b (400) 700. a's 300 go to the tier; b's 300 do
    # not fit beside them (600 > 500), and a, more idle, is dropped to make room
    assert not s.may_run("a") and not s.may_run("b") and s.may_run("c")
    assert (s.kv_of("a"), s.kv_of("b"), s.kv_of("c")) == (Kv.NONE, Kv.CPU, Kv.GPU)
    # the engine recomputes a dropped context rather than reload a copy the tier kept
    assert not policy.reload_from_cpu(RequestView("a1", "a", 12.0, 600))
    assert policy.reload_from_cpu(RequestView("b1", "b", 12.0, 600))
    # both return with 600-token turns (700 charged each) after c ends: one fits, and
    # the least idle is promoted first (a 0.9, b (1 + 9) / 12 = 0.83)
    s.program_ended("c", 12.0)
    s.turn_arrived("b", 600, 12.0)
    s.turn_arrived("a", 600, 20.0)
    s.decide(21.0)
    assert s.may_run("b") and not s.may_run("a")


def test_mori_drops_the_demoted_context_when_no_idler_one_makes_room():
    # a tier of 250 fits neither 300-token context: a (0.9) is demoted first and dropped (no
    # idler program in the tier to make room), then b (0.5), which finds none either
    s = Mori(capacity_tokens=1000, host_tier_tokens=250)
    _idle_programs(s)
    s.decide(11.0)
    assert (s.kv_of("a"), s.kv_of("b")) == (Kv.NONE, Kv.NONE)
    assert not s.reloads("a") and not s.reloads("b") and s.reloads("c")


def test_a_new_program_is_not_taken_for_dropped():
    s = Mori(capacity_tokens=1000, host_tier_tokens=100)
    s.turn_arrived("new", 100, 0.0)
    assert s.kv_of("new") is Kv.NONE and s.reloads("new") and s.reloads(None)


# -- the engine tells the host tier's size --------------------------------------------------------

def test_the_host_tiers_tokens_are_its_bytes_in_whole_blocks():
    # Llama-3.1-8B: 32 layers of 16-token blocks of 64 KiB each, 2 MiB a block (128 KiB a token)
    group = SimpleNamespace(kv_cache_spec=SimpleNamespace(page_size_bytes=64 << 10,
                                                          block_size=16),
                            layer_names=[f"l{i}" for i in range(32)])
    cache = SimpleNamespace(kv_cache_groups=[group])
    tier = SimpleNamespace(kv_connector=offloading_config(1.0)["kv_connector"],
                           kv_connector_extra_config=offloading_config(1.0)[
                               "kv_connector_extra_config"])
    assert host_tier_tokens(tier, cache) == 8192  # 1 GiB / 2 MiB = 512 blocks
    assert host_tier_tokens(None, cache) is None


@pytest.mark.engine
def test_a_mori_engine_is_told_its_host_tiers_size():
    from server.engine import VirtualEngine
    from server.engine_spec import EngineSpec
    from server.kv_connectors import OFFLOADING, sub_connector
    from server.policies.spec import PolicySpec

    with closing(VirtualEngine(PolicySpec.named("mori"), EngineSpec(
            profile="h100-llama-3.1-8b", num_gpu_blocks=257, max_model_len=2048,
            offload_gib=1.0))) as engine:
        scheduler = engine.scheduler
        told = scheduler.agent_policy.programs.host_tier_tokens
        # what vLLM's own CPU tier sized itself to (its manager's chunks of blocks)
        connector = sub_connector(scheduler.connector, OFFLOADING).connector_scheduler
        chunks = connector.manager._num_chunks
        assert told == chunks * connector.config.blocks_per_chunk * scheduler.block_size == 8192
