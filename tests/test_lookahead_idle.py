"""`lookahead`'s rule for idle memory: a ready turn takes the place of programs far from their
next turn (by the client's point prediction or gap quantiles), and, told nothing, of programs
idle `IDLE_FAR_S` once it has waited `AGING_S` (the starvation bound)."""

from __future__ import annotations

from predictor.gaps import GapForecast
from server.programs.lookahead import (
    AGING_S,
    CHEAP_IDLE_S,
    IDLE_FAR_S,
    KEEP_RELOADS,
    Lookahead,
)


class _Costs:
    """Recompute 0.1 ms a token, PCIe 4 us a token."""

    def step_seconds(self, prefill, decode):
        return 6e-3

    def swap_seconds(self, tokens):
        return 4e-6 * tokens

    def prefill_seconds(self, tokens):
        return 1e-4 * tokens


def _scheduler(host_tier: bool = False) -> Lookahead:
    # capacity 10,000 x 0.9 = 9,000: "idle" (6,000) is in a tool call, "r" reasons (1,000)
    s = Lookahead(capacity_tokens=10_000, cost_model=_Costs(), host_tier=host_tier)
    for pid, tokens in (("idle", 5900), ("r", 1000)):
        s.turn_arrived(pid, tokens, 0.0)
        s.decide(0.0)
        s.turn_admitted(pid, 0.0)
    s.turn_finished("idle", 6000, 1.0)
    return s


def _arrive(s: Lookahead, now: float) -> None:
    s.turn_arrived("new", 4000, now)  # 6,100 + 1,100 + 4,100 > 9,000: it does not fit
    s.decide(now)


def test_told_nothing_a_ready_turn_waits_for_an_idle_program_until_the_aging_bound():
    s = _scheduler()
    s.tool_started("idle", "bash", None, 1.0)
    _arrive(s, 2.0)
    assert not s.may_run("new") and s.may_run("idle")
    # waited AGING_S, but "idle" has not been idle IDLE_FAR_S yet: still waits
    s.turn_arrived("r", 1100, 2.0 + AGING_S)
    s.decide(2.0 + AGING_S)
    assert not s.may_run("new")
    # both bounds passed: the idle program gives way, the waiting turn runs
    now = 1.0 + IDLE_FAR_S
    s.tool_ended("r", now)
    s.turn_arrived("r", 1200, now)
    s.decide(now)
    assert s.may_run("new") and not s.may_run("idle")


def test_a_point_prediction_past_the_keep_horizon_makes_room_at_once():
    # no host tier: the horizon is KEEP_RELOADS recomputes of 6,000 tokens (6 s); back in 30 s
    # is far, back in 3 s is not
    assert KEEP_RELOADS * 1e-4 * 6000 == 6.0
    for predicted, displaced in ((30.0, True), (3.0, False)):
        s = _scheduler()
        s.tool_started("idle", "bash", predicted, 1.0)
        _arrive(s, 1.5)
        assert s.may_run("new") is displaced
        assert s.may_run("idle") is not displaced


def test_gap_quantiles_make_room_by_the_chance_of_an_early_return():
    # a person's answer (median 2 minutes) is far; a quick tool (median 2 s, p99 20 s) is not
    for hint, displaced in (({"p50": 120.0, "p90": 900.0, "p99": 4000.0}, True),
                            ({"p50": 2.0, "p90": 5.0, "p99": 20.0}, False)):
        s = _scheduler()
        s.tool_started("idle", "bash", None, 1.0, predicted_q=hint)
        _arrive(s, 1.5)
        assert s.may_run("new") is displaced


def test_a_displaced_program_comes_back_first():
    s = _scheduler()
    s.tool_started("idle", "bash", 30.0, 1.0)
    _arrive(s, 1.5)
    assert not s.may_run("idle")
    s.turn_finished("new", 4100, 5.0)
    s.tool_started("new", "bash", 1.0, 5.0)
    s.turn_arrived("late", 100, 20.0)
    s.turn_arrived("idle", 6100, 31.0)  # back: paused, its turn waits beside "late"
    s.program_ended("new", 31.0)
    s.decide(31.0)
    # it arrived before "late": it is resumed ahead of it
    assert s.rank(s.table.get("idle")) < s.rank(s.table.get("late"))
    assert s.may_run("idle")


def test_with_quantiles_the_longer_gone_the_later_expected():
    s = _scheduler()
    s.tool_started("idle", "bash", None, 1.0, predicted_q={"p50": 10.0, "p99": 2000.0})
    st = s.table.get("idle")
    early, late = s.give_way_score(st, 2.0), s.give_way_score(st, 500.0)
    assert late > early > 0


def test_a_hint_without_two_levels_is_no_distribution():
    s = _scheduler()
    s.tool_started("idle", "bash", None, 1.0, predicted_q={"p50": 10.0})
    assert s.table.get("idle").gap is None
    s.tool_started("idle", "bash", None, 1.0, predicted_q={"p50": 10.0, "p90": 10.0})
    assert s.table.get("idle").gap is None


def test_a_forecast_from_a_hint_keeps_the_hinted_quantiles():
    f = GapForecast.from_hint({"p50": 9.0, "p99": 845.0})
    assert abs(f.quantile(0.5) - 9.0) < 1e-6 and abs(f.quantile(0.99) - 845.0) < 1e-3
    # conditioned on being gone a while, the chance of an early return falls (a heavy tail)
    assert f.given(300.0).p_back_within(5.0) < f.p_back_within(5.0)


def test_a_tier_that_churns_prices_a_release_as_a_recompute():
    # host tier: reload 4 us a token, recompute 100 us. "idle" writes 6,000 tokens in the
    # run's first second: 6,000 tokens a second. A tier of 600,000 keeps a context 100 s: back
    # in 5 s it is reloaded (0.024 s), the horizon is 1 s (at least DEFAULT_TOOL_S): far, so
    # released. A tier of 6,000 keeps it 1 s: back in 5 s it recomputes (0.6 s), the horizon is
    # ten of those, 6 s: kept on the GPU. Back in 30 s it is far either way.
    for tier, predicted, far in ((600_000, 5.0, True), (6_000, 5.0, False),
                                 (6_000, 30.0, True)):
        s = Lookahead(capacity_tokens=10_000, cost_model=_Costs(), host_tier=True)
        s.configure(10_000, True, host_tier_tokens=tier)
        s.turn_arrived("idle", 5900, 0.0)
        s.decide(0.0)
        s.turn_admitted("idle", 0.0)
        s.turn_finished("idle", 6000, 0.0)  # the churn's clock starts at the first write
        s.tool_started("idle", "bash", predicted, 0.0)
        assert s.tier.rate(1.0) == 6000.0
        assert s.far(s.table.get("idle"), 1.0) is far, (tier, predicted)


def test_the_tier_churn_counts_growth_and_whole_prompts_after_a_compaction():
    from server.programs.tier_churn import TierChurn
    churn = TierChurn()
    assert churn.residence_s(1_000, 0.0) == float("inf")  # nothing written yet
    churn.turn_finished(0, 20_000, 0.0)        # a first turn: all of it
    churn.turn_finished(20_000, 23_000, 5.0)   # grew by 3,000
    churn.turn_finished(23_000, 8_000, 10.0)   # compacted: its whole new prompt
    assert churn.written == 31_000 and churn.rate(10.0) == 3_100
    assert churn.residence_s(31_000, 10.0) == 10.0
    assert churn.residence_s(None, 10.0) == float("inf")


def test_with_a_host_tier_a_program_gone_a_while_gives_way_for_a_reload():
    # told nothing, "idle" finished its turn at 1 s; "back" ran a turn and was paused for
    # memory. With a host tier that keeps what is written long enough, "back"'s next turn takes
    # "idle"'s place once "idle" has been gone CHEAP_IDLE_S (its return costs a reload), not
    # before (it is likely back at once); without a tier, or with one that has overwritten its
    # context since, the turn waits (the aging bound above). A new program's first turn waits
    # either way (program-level FCFS).
    for host_tier, tier_tokens, gone, displaced in (
            (True, None, CHEAP_IDLE_S, True), (True, None, CHEAP_IDLE_S / 2, False),
            (False, None, CHEAP_IDLE_S, False), (True, 1_000, CHEAP_IDLE_S, False)):
        s = _scheduler(host_tier=host_tier)
        s.configure(16_000, host_tier, host_tier_tokens=tier_tokens)
        s.turn_arrived("back", 2000, 0.0)
        s.decide(0.0)
        s.turn_admitted("back", 0.0)
        s.turn_finished("back", 2100, 0.5)
        s.pause(s.table.get("back"), 0.5)
        now = 1.0 + gone
        s.turn_arrived("new", 6000, now)
        s.turn_arrived("back", 6000, now)
        s.decide(now)
        assert s.may_run("back") is displaced, (host_tier, tier_tokens, gone)
        assert s.may_run("idle") is not displaced
        assert not s.may_run("new")


def test_a_new_programs_first_turn_does_not_displace_for_a_reload():
    # program-level FCFS for newcomers: the same idle program, gone CHEAP_IDLE_S with the tier
    # holding it, keeps its memory against a program that has not run yet
    s = _scheduler(host_tier=True)
    _arrive(s, 1.0 + CHEAP_IDLE_S)
    assert not s.may_run("new") and s.may_run("idle")
