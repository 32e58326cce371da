"""The program schedulers' decisions on hand-worked cases (pure Python: no engine).

Each test states a rule of the paper (ThunderAgent, MORI) or of ours (`lookahead`) and checks
it on a few programs whose numbers are worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest

from server.policies import make_policy
from server.policies.base import AgentEvent, Hints, RequestView
from server.programs import Kv, Phase, ProgramScheduler, Room
from server.programs.lookahead import Lookahead
from server.programs.mori import Mori
from server.programs.state import STALE_AFTER_S
from server.programs.thunderagent import ThunderAgent


def _start(s: ProgramScheduler, pid: str, tokens: int, now: float) -> None:
    s.turn_arrived(pid, tokens, now)
    s.decide(now)
    if s.may_run(pid):
        s.turn_admitted(pid, now)


def _act(s: ProgramScheduler, pid: str, tokens: int, now: float, predicted: float | None = None,
         tool: str = "bash") -> Kv:
    kv = s.turn_finished(pid, tokens, now)
    s.tool_started(pid, tool, predicted, now)
    return kv


# -- ThunderAgent ------------------------------------------------------------------------------

def test_thunderagent_admits_new_programs_while_they_fit_and_queues_the_rest():
    # capacity 1000 tokens; each program charged context + 100: 300 + 300 + 300 = 900 fit, a
    # fourth (300 more: 1200) does not and waits for a tick
    s = ThunderAgent(capacity_tokens=1000)
    for i in range(4):
        _start(s, f"p{i}", 200, now=0.0)
    assert [s.may_run(f"p{i}") for i in range(4)] == [True, True, True, False]


def test_thunderagent_pauses_acting_programs_smallest_first_at_the_tick():
    # usage after the turns: a 500 + 100, b 200 + 100, c 300 + 100 = 1300 > 1000; pausing the
    # smallest acting one (b: -300) brings it to 1000 <= 1000: only b pauses
    s = ThunderAgent(capacity_tokens=1000)
    for pid in "abc":
        _start(s, pid, 100, now=0.0)
    _act(s, "a", 500, now=1.0)
    _act(s, "b", 200, now=1.0)
    _act(s, "c", 300, now=1.0)
    s.decide(now=2.0)  # before the tick (5 s after the first decision): nothing changes
    assert all(s.may_run(p) for p in "abc")
    s.decide(now=5.0)
    assert [s.may_run(p) for p in "abc"] == [True, False, True]
    assert s.kv_of("b") is Kv.NONE  # assumed lost: ThunderAgent holds no pins


def test_thunderagent_marks_reasoning_programs_to_pause_at_their_turn_end():
    # both reasoning (turns in flight), usage 700 + 100 + 600 + 100 = 1500 > 1000; no acting
    # program to pause, so the smaller (b) is marked and pauses when its turn ends
    s = ThunderAgent(capacity_tokens=1000)
    _start(s, "a", 100, 0.0)
    _start(s, "b", 100, 0.0)
    s.turn_arrived("a", 700, 1.0)
    s.turn_arrived("b", 600, 1.0)
    s.decide(now=5.0)
    assert s.may_run("a") and s.may_run("b")
    assert s.turn_finished("b", 650, 6.0) is Kv.NONE
    assert not s.may_run("b") and s.may_run("a")


def test_thunderagent_resumes_returning_programs_before_new_ones_smallest_first():
    s = ThunderAgent(capacity_tokens=1000)
    _start(s, "big", 100, 0.0)
    _start(s, "small", 100, 0.0)
    _act(s, "big", 600, 1.0)
    _act(s, "small", 400, 1.0)  # usage 700 + 500 = 1200: small pauses at the tick
    s.decide(5.0)
    assert not s.may_run("small")
    s.turn_arrived("new", 300, 6.0)  # 700 + 400 = 1100 > 1000: queued
    s.decide(6.0)
    assert not s.may_run("new")
    s.turn_arrived("small", 450, 7.0)  # its tool returned: a turn waits
    s.program_ended("big", 8.0)  # room: 0 used
    s.decide(10.0)
    # returning first (small: 550), then new (400): 950 <= 1000, both resume
    assert s.may_run("small") and s.may_run("new")


def test_thunderagent_dynamo_thresholds_are_checked():
    with pytest.raises(ValueError):
        ThunderAgent(1000, pause_above=0.8, pause_to=0.95)


# -- MORI ---------------------------------------------------------------------------------

def test_mori_demotes_the_most_idle_acting_program_to_the_host_tier():
    # idle: a spent 1 s reasoning, 9 s in tools (0.9); b 5 s and 5 s (0.5). Over capacity,
    # the most idle (a) is demoted GPU -> CPU; active programs keep KV on the GPU meanwhile
    s = Mori(capacity_tokens=1000, host_tier=True)
    for pid in "ab":
        _start(s, pid, 100, 0.0)
    assert _act(s, "a", 300, 1.0) is Kv.GPU
    _act(s, "b", 300, 5.0)
    s.turn_arrived("a", 300, 10.0)
    s.turn_arrived("b", 300, 10.0)
    _act(s, "a", 500, 11.0)
    _act(s, "b", 500, 11.0)  # usage 600 + 600 = 1200 > 1000
    s.decide(11.0)
    assert not s.may_run("a") and s.may_run("b")
    assert s.kv_of("a") is Kv.CPU


def test_mori_drops_when_the_host_tier_is_full():
    s = Mori(capacity_tokens=1000, host_tier=True, host_tier_tokens=100)
    for pid in "ab":
        _start(s, pid, 100, 0.0)
    _act(s, "a", 600, 1.0)
    _act(s, "b", 500, 1.0)
    s.decide(5.0)  # the tick
    paused = [p for p in "ab" if not s.may_run(p)]
    assert len(paused) == 1 and s.kv_of(paused[0]) is Kv.NONE


# -- lookahead (ours) ------------------------------------------------------------------------

class _Costs:
    """A step of a + b_seq x sequences + b_tok x context tokens: a = 6 ms, one sequence at
    context c adds 0.05 ms + 40 ns x c."""

    def step_seconds(self, prefill, decode):
        return 6e-3 + sum(5e-5 + 4e-8 * c for c in decode)

    def swap_seconds(self, tokens):
        return 4e-6 * tokens

    def prefill_seconds(self, tokens):
        return 1e-4 * tokens


def test_lookahead_admits_every_program_that_fits_while_memory_is_free():
    # a burst of 100 programs at 2,000 tokens with room for all (10^7 tokens): no rule of
    # batch size holds any back (the square-root rule did, 68 of 100 here: removed, it lost
    # more than it gained on every setting measured)
    s = Lookahead(capacity_tokens=10**7, cost_model=_Costs())
    for i in range(100):
        s.turn_arrived(f"p{i}", 2000, 0.0)
    s.decide(0.0)
    assert all(s.may_run(f"p{i}") for i in range(100))


def test_lookahead_memory_bounds_the_active_set():
    # capacity 10,000 tokens x 0.9 = 9,000; each program 2,000 + 100: four fit (8,400)
    s = Lookahead(capacity_tokens=10_000, cost_model=_Costs())
    for i in range(10):
        s.turn_arrived(f"p{i}", 2000, 0.0)
    s.decide(0.0)
    assert sum(s.may_run(f"p{i}") for i in range(10)) == 4


def test_lookahead_admits_by_the_engines_count_once_it_is_heard():
    # capacity 10,000. Four programs ran a turn of 2,000 tokens, wrote 100 each (the mean
    # output) and act, pinned: by contexts they hold 4 x (2,100 + 100) = 8,800, but they share
    # a 1,500-token prefix, which the engine holds once: 1,500 + 4 x 600 = 3,900. A fifth
    # program's first turn (2,000 tokens, of which the shared 1,500 are cached: 500 to
    # allocate) waits while p0's next turn (2,200; 2,100 pinned: 100 to allocate) runs.
    # By contexts: 8,800 + 2,100 > 10,000 - 1 x growth: e waits. By the engine's count:
    # 3,900 + 100 (p0) + 500 (e) <= 10,000 - 0 running x 100 (p0's turn has not started yet)
    s = Lookahead(capacity_tokens=10_000, cost_model=_Costs())
    for i in range(4):
        _start(s, f"p{i}", 2000, 0.0)
    for i in range(4):
        _act(s, f"p{i}", 2100, 1.0)  # told nothing: none is known to be far
    s.turn_arrived("p0", 2200, 2.0)
    s.turn_arrived("e", 2000, 2.0)
    s.decide(2.0)
    assert not s.may_run("e")  # the estimate: no room
    s.observe_engine(3900, lambda: {"p0": 100, "e": 500})
    s.turn_arrived("p1", 2200, 2.5)  # a fact: the next decision is on the engine's count
    s.decide(2.5)
    assert s.may_run("e")
    # and it binds: a running prefill with 6,000 tokens still to allocate leaves no room
    t = Lookahead(capacity_tokens=10_000, cost_model=_Costs())
    for i in range(4):
        _start(t, f"p{i}", 2000, 0.0)
        _act(t, f"p{i}", 2100, 1.0)
    t.turn_arrived("p0", 2200, 2.0)
    t.turn_admitted("p0", 2.0)
    t.turn_arrived("e", 2000, 2.0)
    t.observe_engine(3900, lambda: {"p0": 6000, "e": 500})
    t.decide(2.5)
    assert not t.may_run("e")  # 3,900 + 6,000 + 500 > 10,000 - 1 running x 100


def test_lookahead_pauses_the_program_whose_next_turn_is_furthest_weighted_by_size():
    # capacity 10,000; outputs seen 2,000 / 1,000 / 3,000 (mean 2,000) and d's turn runs:
    # the limit is 10,000 - 1 x 2,000 = 8,000. The engine counts 12,000 held (the pins grew):
    # acting programs give way, the cheapest pause first, until the count fits. Scores
    # (return - now) x context: a 2 s x 3,000 = 6,000; b 30 s x 2,000 = 60,000; c 10 s x
    # 4,000 = 40,000 -> b pauses (12,000 - 2,100 = 9,900, still over), then c (5,800): a
    # stays (d reasons: never paused mid-turn)
    s = Lookahead(capacity_tokens=10_000, cost_model=_Costs())
    for pid in "abcd":
        _start(s, pid, 1000, 0.0)
    _act(s, "a", 3000, 1.0, predicted=2.0)
    _act(s, "b", 2000, 1.0, predicted=30.0)
    _act(s, "c", 4000, 1.0, predicted=10.0)
    s.observe_engine(12_000, dict)
    s.decide(1.0)
    assert [s.may_run(p) for p in "abcd"] == [True, False, False, True]
    assert s.kv_of("b") is Kv.NONE  # no host tier: dropped
    # the same score picks the pin to give up under an allocation failure
    assert s.victim(["a", "c"], 1.0) == "c"


def _ended(s: Lookahead, programs: int, turns: int) -> None:
    """`programs` programs of `turns` turns each run and end by t = 1 s."""
    for i in range(programs):
        pid = f"old{i}"
        _start(s, pid, 100, 0.0)
        for k in range(turns):
            _act(s, pid, 200 + k, 0.1 * k)
            s.turn_arrived(pid, 200 + k, 0.1 * k + 0.05)
        s.program_ended(pid, 1.0)


def test_lookahead_orders_by_expected_remaining_work_once_programs_ended():
    s = Lookahead(capacity_tokens=10**7, cost_model=_Costs())
    _ended(s, 12, 4)  # 12 programs of 4 turns end: E[N - k | N > k] = 4 - k
    young, aged = (s.table.turn_arrived(p, 500, 2.0) for p in ("young", "aged"))
    aged.turns = 3  # one turn left, against four for young
    assert s.rank(aged) < s.rank(young)


def test_lookahead_prefetches_an_offloaded_context_ahead_of_the_predicted_return():
    # host tier; a 50 s tool (predicted) is worth releasing: 50 > max(10 x 0.02 s, 1 s).
    # reload of 5,000 tokens = 0.02 s: the prefetch is due at 51 - 0.02 = 50.98 s
    s = Lookahead(capacity_tokens=10**6, cost_model=_Costs(), host_tier=True)
    _start(s, "a", 1000, 0.0)
    assert s.turn_finished("a", 5000, 1.0) is Kv.GPU  # no prediction yet: kept
    s.tool_started("a", "python", 50.0, 1.0)  # the prediction: released to the host tier
    assert s.kv_of("a") is Kv.CPU
    # a short tool keeps it: 0.5 s <= max(10 x 0.02 s, 1 s)
    _start(s, "b", 1000, 0.0)
    assert s.turn_finished("b", 5000, 1.0, "bash", 0.5) is Kv.GPU
    assert s.prefetch_due(50.9) == []
    assert s.prefetch_due(50.99) == ["a"]
    assert s.prefetch_due(51.0) == []  # once per interception


# -- what every scheduler shares -----------------------------------------------------------

def test_a_program_that_never_ends_is_forgotten_with_its_slot():
    s = ThunderAgent(capacity_tokens=1000)
    _start(s, "gone", 800, 0.0)
    _act(s, "gone", 800, 1.0)
    s.turn_arrived("next", 300, 2.0)  # 900 + 400 > 1000: queued behind the silent program
    s.decide(5.0)
    assert not s.may_run("next")
    s.decide(1.0 + STALE_AFTER_S + 5.0)
    assert "gone" not in s.table and s.may_run("next")


@pytest.mark.parametrize("cls", [ThunderAgent, Lookahead])
def test_a_program_moved_to_another_replica_frees_its_slot_here_at_once(cls):
    # the program's later turns went to another replica (`program_left`, the `program_moved`
    # event): its 800 + 100 tokens stop counting here at once, not after the silence rule,
    # and nothing is learnt from it as if it had ended (it ran one turn here). ThunderAgent
    # admits `next` (300 + 100) only then: 900 + 400 > 1000 before
    s = cls(capacity_tokens=1000)
    _start(s, "moved", 800, 0.0)
    _act(s, "moved", 800, 1.0)
    s.turn_arrived("next", 300, 2.0)
    s.decide(5.0)
    assert s.active_usage() >= 900
    if cls is ThunderAgent:
        assert not s.may_run("next")
    s.program_left("moved", 6.0)
    s.decide(10.0)
    assert "moved" not in s.table and s.may_run("next")
    assert s.active_usage() == 400
    assert s.table.ended_totals["active_s"] > 0  # its time here is still accounted
    if cls is Lookahead:
        assert not s.estimates.lengths.lengths


def test_a_program_first_seen_at_its_kth_turn_counts_the_turns_it_did_elsewhere():
    # 12 programs of 6 turns ended here: E[N - k | N > k] = 6 - k. A program moved here at
    # its 4th turn (the client's `turn` hint: 4 done elsewhere) has 2 left, not 6; when it ends
    # after 2 turns here, the length learnt is 6, not 2
    s = Lookahead(capacity_tokens=10**7, cost_model=_Costs())
    _ended(s, 12, 6)
    s.turn_arrived("moved", 5000, 2.0, turn=4)
    s.turn_arrived("new", 5000, 2.0, turn=0)
    moved, new = s.table.get("moved"), s.table.get("new")
    assert (moved.turns, new.turns) == (4, 0)
    assert s.estimates.turns_left(moved) == 2.0 and s.estimates.turns_left(new) == 6.0
    assert s.rank(moved) < s.rank(new)
    s.decide(2.0)
    for k in (4, 5):
        s.turn_admitted("moved", 2.0 + k)
        _act(s, "moved", 5100 + k, 2.5 + k)
        s.turn_arrived("moved", 5100 + k, 2.6 + k, turn=k + 1)
    s.program_ended("moved", 9.0)
    assert s.estimates.lengths.lengths[-1] == 6


def test_events_for_unknown_programs_are_ignored():
    s = Lookahead(capacity_tokens=1000)
    s.tool_started("ghost", "bash", 1.0, 0.0)
    s.tool_ended("ghost", 0.0)
    s.program_ended("ghost", 0.0)
    assert s.turn_finished("ghost", 10, 0.0) is Kv.NONE
    assert len(s.table) == 0 and s.may_run("ghost")


def test_placement_prefers_the_home_replica_then_the_most_free_room():
    s = ThunderAgent(capacity_tokens=1000)
    s.turn_arrived("p", 300, 0.0)
    rooms = [Room("r0", 1000, 800), Room("r1", 1000, 100)]
    assert s.place("p", rooms) == "r1"
    rooms = [Room("r0", 1000, 100), Room("r1", 1000, 500)]
    assert s.place("p", rooms) == "r1"  # home still fits (500 free >= 400)
    rooms = [Room("r0", 1000, 100), Room("r1", 1000, 900)]
    assert s.place("p", rooms) == "r0"  # home full: moved
    rooms = [Room("r0", 1000, 700), Room("r1", 1000, 950)]
    assert s.place("p", rooms) == "r0"  # home too small (300 < 400) but still the roomiest
    rooms = [Room("r0", 1000, 990), Room("r1", 1000, 700)]
    assert s.place("p", rooms) == "r0"  # fits nowhere: stays home, its KV may still be there


def test_time_is_accounted_per_state():
    s = ThunderAgent(capacity_tokens=300)
    _start(s, "a", 100, 0.0)
    s.turn_arrived("b", 150, 0.0)  # 200 + 250 > 300: queued
    s.decide(0.0)
    s.program_ended("a", 4.0)
    s.decide(5.0)
    assert s.may_run("b")
    s.program_ended("b", 9.0)
    stats = s.stats()
    assert stats["queued_s"] == pytest.approx(5.0)
    assert stats["active_s"] == pytest.approx(4.0 + 4.0)


# -- the engine adapter ----------------------------------------------------------------------

def test_the_policy_holds_back_turns_of_paused_programs_and_releases_their_pins():
    policy = make_policy("thunderagent")
    policy.configure(max_batch_tokens=2048, total_blocks=64, block_size=16)  # 1,024 tokens
    views = [RequestView(f"r{i}", f"p{i}", 0.0, 400) for i in range(3)]
    for v in views:
        policy.on_arrival(v, 0.0)
    # 500 + 500 fit in 1,024, the third (1,500) does not
    held = policy.held_back(views, running=0, now=0.0)
    assert held == {"r2"}
    policy.on_scheduled(views[0], 0.0)
    done = RequestView("r0", "p0", 0.0, 400, output_tokens=100, hints=Hints(turn=0))
    assert policy.on_finish(done, 1.0) is False  # ThunderAgent pins nothing
    policy.on_event(AgentEvent("program_end", "p0"), 2.0)
    policy.on_event(AgentEvent("program_end", "p1"), 2.0)
    assert policy.held_back(views[2:], running=0, now=10.0) == set()


def test_lookahead_policy_pins_while_active_and_releases_when_paused():
    policy = make_policy("lookahead")
    policy.configure(max_batch_tokens=2048, total_blocks=640, block_size=16)  # 10,240 tokens
    view = RequestView("r0", "p0", 0.0, 1000)
    policy.on_arrival(view, 0.0)
    assert policy.held_back([view], 0, 0.0) == set()
    policy.on_scheduled(view, 0.0)
    done = RequestView("r0", "p0", 0.0, 1000, output_tokens=50)
    assert policy.on_finish(done, 1.0) is True
    assert policy.pin_expired("p0", 1.0, has_waiting=False) is False
    policy.programs.pause(policy.programs.table.get("p0"), 2.0)
    assert policy.pin_expired("p0", 2.0, has_waiting=False) is True
    assert policy.programs.table.get("p0").phase is Phase.ACTING


# -- the router ------------------------------------------------------------------------------

def _loads(*used: tuple[str, int]) -> list:
    from cluster.routing import ReplicaLoad
    return [ReplicaLoad(name, "colocated", kv_capacity_tokens=cap) for name, cap in used]


def test_program_router_places_by_room_and_follows_the_program_home():
    from cluster.program_router import ProgramRouter
    from cluster.routing import TurnInfo
    router = ProgramRouter()
    replicas = _loads(("r0", 10_000), ("r1", 10_000))
    # room is 0.9 x 10,000 = 9,000 each; a takes 5,000 + 100 on r0 (ties: first listed)
    assert router.route("a", 0, replicas, TurnInfo(0.0, prompt_tokens=5000)).decode == "r0"
    # b goes where the room is: r1 (9,000 free against r0's 3,900)
    assert router.route("b", 0, replicas, TurnInfo(0.0, prompt_tokens=1000)).decode == "r1"
    # c (2,000) fits r1 (7,900 free) best
    assert router.route("c", 0, replicas, TurnInfo(0.0, prompt_tokens=2000)).decode == "r1"
    # a grows to 8,000: r0 still holds it alone (8,100 <= 9,000): it stays home
    assert router.route("a", 1, replicas, TurnInfo(1.0, prompt_tokens=8000)).decode == "r0"
    assert router.moves == 0


def test_program_router_moves_a_program_whose_home_is_full():
    from cluster.program_router import ProgramRouter
    from cluster.routing import TurnInfo
    router = ProgramRouter()
    replicas = _loads(("r0", 10_000), ("r1", 10_000))
    router.route("a", 0, replicas, TurnInfo(0.0, prompt_tokens=4000))  # r0
    router.route("b", 0, replicas, TurnInfo(0.0, prompt_tokens=4000))  # r1
    router.route("c", 0, replicas, TurnInfo(0.0, prompt_tokens=3000))  # r0: 4,900 free
    # b ends (r1 empty); c grows to 6,000: at home it would need 6,100 of r0's 4,900 free
    # (9,000 - a's 4,100): it moves to r1, which has 9,000
    router.program_end("b")
    assert router.route("c", 1, replicas, TurnInfo(1.0, prompt_tokens=6000)).decode == "r1"
    assert router.moves == 1 and router.bound("c") == "r1"
    router.program_end("c")
    assert router.bound("c") is None


def test_program_router_carrying_kv_routes_a_move_as_a_prefill_at_the_old_home():
    # the same move with `carry_kv`: c's turn is prefilled at its old home r0 (which holds its
    # context) and decoded at r1, which reads the KV; a turn that stays home is colocated
    from cluster.program_router import ProgramRouter
    from cluster.routing import Route, TurnInfo
    router = ProgramRouter(carry_kv=True)
    replicas = _loads(("r0", 10_000), ("r1", 10_000))
    for pid, tokens in (("a", 4000), ("b", 4000), ("c", 3000)):
        router.route(pid, 0, replicas, TurnInfo(0.0, prompt_tokens=tokens))
    assert router.route("c", 1, replicas, TurnInfo(0.5, prompt_tokens=3200)) == Route("r0")
    router.program_end("b")
    moved = router.route("c", 2, replicas, TurnInfo(1.0, prompt_tokens=6000))
    assert moved == Route(decode="r1", prefill="r0") and router.moves == 1
    assert router.route("c", 3, replicas, TurnInfo(2.0, prompt_tokens=6100)) == Route("r1")
    # a home that is gone sends nothing: the program is placed afresh and recomputed
    router.route("d", 0, replicas, TurnInfo(3.0, prompt_tokens=100))
    home = router.bound("d")
    alive = [r for r in replicas if r.name != home]
    assert router.route("d", 1, alive, TurnInfo(4.0, prompt_tokens=200)) == Route(
        alive[0].name)


def test_the_served_router_reads_kv_capacity_from_vllms_cache_config():
    from cluster.router_state import engine_gauges
    text = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
            'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",'
            'num_gpu_blocks="28851",num_cpu_blocks="None"} 1.0\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n')
    gauges = engine_gauges(text)
    assert gauges["kv_capacity_tokens"] == 28851 * 16
    assert gauges["kv_usage"] == 0.25
    assert "kv_capacity_tokens" not in engine_gauges("vllm:cache_config_info{x=\"1\"} 1.0\n")


def test_lookahead_oracle_ranks_by_known_remaining_turns_from_the_start():
    # told the lengths (5 and 50 turns), before any program ended: the short one ranks first
    policy = make_policy("lookahead-oracle")
    policy.configure(max_batch_tokens=2048, total_blocks=10**5, block_size=16)
    policy.foresee({"short": [None] * 5, "long": [None] * 50})
    s = policy.programs
    for pid in ("long", "short"):
        s.turn_arrived(pid, 1000, 0.0)
    assert s.estimates.turns_left(s.table.get("short")) == 5.0
    assert s.rank(s.table.get("short")) < s.rank(s.table.get("long"))
    assert not hasattr(make_policy("lookahead"), "foresee")


def test_lookahead_oracle_told_lengths_with_an_error_is_one_draw_per_program_scaled():
    # `lookahead-oracle:E`: each program's told turn count is off by exp(E z), z drawn from
    # its id, so two errors move a program's estimate the same way, the larger one further
    futures = {f"p{i}": [None] * 40 for i in range(200)}
    told = {}
    for error in (0.0, 0.25, 1.0):
        policy = make_policy(f"lookahead-oracle:{error}")
        assert policy.length_error == error
        policy.foresee(futures)
        told[error] = policy.programs.estimates.known_turns
    assert set(told[0.0].values()) == {40}  # no error: the truth
    for pid in futures:
        small, large = told[0.25][pid] - 40, told[1.0][pid] - 40
        assert small * large >= 0 and abs(large) >= abs(small)
    logs = [math.log(t / 40) for t in told[1.0].values()]
    mean = sum(logs) / len(logs)
    sd = (sum((x - mean) ** 2 for x in logs) / len(logs)) ** 0.5
    assert abs(mean) < 0.2 and 0.8 < sd < 1.2  # a lognormal error of sigma 1, unbiased in log
    again = make_policy("lookahead-oracle:1")
    again.foresee(futures)
    assert again.programs.estimates.known_turns == told[1.0]  # the same draw in every run
    with pytest.raises(ValueError, match="lognormal sigma >= 0"):
        make_policy("lookahead-oracle:often")
    with pytest.raises(ValueError, match="takes no argument"):
        make_policy("lookahead:0.5")


def test_lookahead_resumes_a_paused_program_only_with_a_band_to_spare():
    # capacity 10,000 x 0.9 = 9,000 (no growth seen yet). a (2,900 + 100) and r (100 + 100)
    # reason; p asks for 4,900 + 100: 8,200 <= 9,000 fits, so a program never paused is
    # admitted, but one paused before needs 10% of the capacity (1,000) to spare: 8,200 >
    # 8,000, it waits. Once a ends, 5,200 <= 8,000 and it resumes while r still reasons (the
    # band admits it, not the escape for an engine where nothing reasons)
    for resumed in (True, False):
        s = Lookahead(capacity_tokens=10_000, cost_model=_Costs())
        _start(s, "a", 2900, 0.0)
        _start(s, "r", 100, 0.0)
        s.turn_arrived("p", 4900, 1.0)
        if resumed:
            s.table.get("p").pauses = 1
        s.decide(1.0)
        assert s.may_run("p") is not resumed
        s.program_ended("a", 2.0)
        s.decide(2.0)
        assert s.may_run("r") and s.table.get("r").phase is not Phase.ACTING
        assert s.may_run("p")  # 200 + 5,000 <= 8,000


@pytest.mark.parametrize("long_turns, known, preempted", [
    (50, True, True),    # told the lengths: long's 49 turns at 6,000 > 2 x short's 3 at 4,000
    (50, False, False),  # learned (none ended yet): nobody is paused for it
    (5, True, False),    # long has 4 turns left: a near tie is not worth a pause
])
def test_lookahead_with_known_lengths_lets_a_short_program_take_a_long_ones_place(
        long_turns, known, preempted):
    # capacity 10,000 x 0.9 = 9,000. "long" is in a tool call holding 6,100; "r" reasons
    # (200). "short" (3 turns) is ready with 4,000 (4,100): 10,400 > 9,000, it does not fit.
    # It takes long's place only when its remaining work is under 1/PREEMPT_MARGIN of long's
    s = Lookahead(capacity_tokens=10_000, cost_model=_Costs())
    if known:
        s.tell_lengths({"long": long_turns, "short": 3, "r": 10})
    _start(s, "long", 1000, 0.0)
    _start(s, "r", 100, 0.0)
    _act(s, "long", 6000, 1.0)  # told nothing of its return: only its length can displace it
    s.turn_arrived("short", 4000, 2.0)
    s.decide(2.0)
    assert s.may_run("short") is preempted
    assert s.may_run("long") is not preempted
    assert s.may_run("r")


def test_lookahead_lets_a_ready_turn_in_while_nothing_reasons():
    # capacity 10,000 x 0.9 = 9,000; a (6,000) is acting. Without a host tier its pin counts
    # (6,100), so b (4,100 more) does not fit, but nothing reasons: b is let in (a's pin makes
    # room) rather than leave the GPU idle; c (5,100 more) then waits, as b reasons. With a
    # host tier a's pin does not count at all: b fits, c does not (4,100 + 5,100 > 9,000)
    for host in (False, True):
        s = Lookahead(capacity_tokens=10_000, cost_model=_Costs(), host_tier=host)
        _start(s, "a", 1000, 0.0)
        _act(s, "a", 6000, 1.0, predicted=30.0)
        s.turn_arrived("b", 4000, 2.0)
        s.turn_arrived("c", 5000, 2.0)
        s.decide(2.0)
        assert s.may_run("b") and not s.may_run("c")


def test_lookahead_with_a_host_tier_counts_an_acting_program_whose_kv_stays_on_the_gpu():
    # host tier, capacity 10,000 x 0.9 = 9,000. r reasons (1,100); a is in a tool call with
    # 5,000 tokens (5,100). A short tool (0.5 s <= max(10 x 0.02 s, 1 s)) keeps a's KV on the
    # GPU, so it counts: b (3,100 more) makes 9,300 > 9,000 and waits. A long one (30 s)
    # releases it to the host tier, where it does not count: 4,200, b is admitted
    for predicted, admitted in ((0.5, False), (30.0, True)):
        s = Lookahead(capacity_tokens=10_000, cost_model=_Costs(), host_tier=True)
        _start(s, "r", 1000, 0.0)
        _start(s, "a", 1000, 0.0)
        _act(s, "a", 5000, 1.0, predicted=predicted)
        assert s.kv_of("a") is (Kv.CPU if admitted else Kv.GPU)
        s.turn_arrived("b", 3000, 2.0)
        s.decide(2.0)
        assert s.may_run("b") is admitted


def test_lookahead_with_a_host_tier_keeps_the_kv_of_a_call_the_client_did_not_predict():
    # no prediction from the client: its last cycle's tool took 20 s, longer than max(10
    # reloads of 5,000 tokens = 0.2 s, 1 s), but no prefetch could be timed on it, and an
    # agent's next call may come back at once: kept (pressure may still give it up). The
    # same call predicted at 20 s is released to the host tier and prefetched: reload of
    # 5,000 tokens = 4 us x 5,000 = 0.02 s, due at 42 - 0.02
    s = Lookahead(capacity_tokens=10**6, cost_model=_Costs(), host_tier=True)
    _start(s, "a", 1000, 0.0)
    assert s.turn_finished("a", 2000, 1.0) is Kv.GPU
    s.turn_arrived("a", 2100, 21.0)  # its tool took 20 s
    s.turn_admitted("a", 21.0)
    assert s.turn_finished("a", 5000, 22.0) is Kv.GPU
    assert s.prefetch_due(60.0) == []
    s.tool_started("a", "bash", 20.0, 22.0)  # now predicted: released
    assert s.kv_of("a") is Kv.CPU
    assert s.prefetch_due(41.97) == []
    assert s.prefetch_due(41.99) == ["a"]
