"""`remaining-work`: each decision on a small hand-worked case (no cost model: the work is the
fallback's, `server.costs`)."""

from __future__ import annotations

import pytest

from predictor.programs import RemainingTurns
from server.policies import Hints, RequestView, make_policy
from server.policies.continuum import ContinuumPolicy
from server.policies.remaining_work import RemainingWorkPolicy


def _req(pid: str, turn: int, arrival: float, prompt: int = 1000, out: int = 0,
         last: bool = False, tool: str | None = "bash") -> RequestView:
    return RequestView(f"{pid}#{turn}", pid, arrival, prompt, output_tokens=out,
                       hints=Hints(turn=turn, tool=tool, last=last))


def _warm(policy: RemainingWorkPolicy, lengths: list[int], output: int = 100) -> None:
    """Programs that ran and ended: their last turn arrives and finishes with `last`."""
    for n, length in enumerate(lengths):
        req = _req(f"done{n}", length - 1, 0.0, out=output, last=True, tool=None)
        policy.on_arrival(req, 0.0)
        policy.on_finish(req, 1.0)


def test_expected_turns_left_by_hand():
    """Ended programs of 2, 4 and 6 turns. At turn 0 every one is still running: 4 turns
    left on average. At turn 2 the 2-turn program has ended: (4 + 6) / 2 - 2 = 3. At turn 5
    only the 6-turn one: 1 (this turn). Past every length seen: 1."""
    left = RemainingTurns(min_programs=3)
    left.add(2)
    left.add(4)
    assert left.expected(0) is None  # unknown until three lengths are seen
    left.add(6)
    assert [left.expected(k) for k in (0, 2, 4, 5, 9)] == [4.0, 3.0, 2.0, 1.0, 1.0]


def test_heavy_tailed_lengths_make_age_a_bad_sign():
    """Nine programs of 1 turn and one of 100: at turn 0, 10.9 turns left on average; a
    program that reached turn 1 is the long one, 99 left. The expected remainder grows with
    attained service, so the rule ranks older programs last, as Autellix's PLAS does."""
    left = RemainingTurns(min_programs=10)
    for n in [1] * 9 + [100]:
        left.add(n)
    assert left.expected(0) == pytest.approx(10.9)
    assert left.expected(1) == pytest.approx(99.0)


def test_cold_start_is_continuums_order():
    """Before ten programs have ended there is no length distribution: program-level FCFS."""
    policy = make_policy("remaining-work")
    reference = ContinuumPolicy()
    _warm(policy, [4] * 9)
    _warm(reference, [4] * 9)
    y, x = _req("Y", 1, 0.0), _req("X", 6, 5.0)
    for p in (policy, reference):
        p.on_arrival(y, 0.0)
        p.on_arrival(x, 5.0)
    assert policy.queue_key(x, 6.0) == reference.queue_key(x, 6.0)
    assert [r.program_id for r in policy.order_waiting([x, y], 6.0)] == ["Y", "X"]


def test_light_tail_the_program_near_its_end_goes_first():
    """Ten programs ended, five of 4 turns and five of 8. Y (arrived first) is at turn 1:
    (5 * 4 + 5 * 8) / 10 - 1 = 5 turns left; X is at turn 6, so it is an 8-turn program:
    2 left. Same context and output per turn (the mean, 100 tokens): X has less work and is
    admitted first, though Y came first."""
    policy = make_policy("remaining-work")
    _warm(policy, [4] * 5 + [8] * 5)
    y, x = _req("Y", 1, 0.0), _req("X", 6, 5.0)
    policy.on_arrival(y, 0.0)
    policy.on_arrival(x, 5.0)
    assert policy.turns_left.expected(1) == 5.0 and policy.turns_left.expected(6) == 2.0
    assert [r.program_id for r in policy.order_waiting([y, x], 6.0)] == ["X", "Y"]
    assert policy.running_key(x, 6.0) < policy.running_key(y, 6.0)


def test_heavy_tail_the_old_program_waits():
    """Nine programs ended after 2 turns, one after 50. Y at turn 1: (9 * 2 + 50) / 10 - 1 =
    5.8 left; X at turn 6 can only be the long kind: 44 left. Y goes first."""
    policy = make_policy("remaining-work")
    _warm(policy, [2] * 9 + [50])
    y, x = _req("Y", 1, 5.0), _req("X", 6, 0.0)
    policy.on_arrival(x, 0.0)
    policy.on_arrival(y, 5.0)
    assert [r.program_id for r in policy.order_waiting([x, y], 6.0)] == ["Y", "X"]


def test_expected_work_by_hand():
    """Ten ended programs of 3 turns, 100 output tokens per turn. Z is at turn 0 of a
    1,024-token prompt, and the client predicts 200 tokens for this turn: 200 tokens at a
    1,124-token context (1,280 rounded up: 5e-5 + 5e-8 * 1,280 = 1.14e-4 s each), then two
    turns of the mean 100 tokens at 1,024 + 200 + 1 * g, with g = 0 (no growth seen yet:
    1,224 -> 1,280, 1.14e-4 s each): 200 * 1.14e-4 + 2 * 100 * 1.14e-4 = 0.0456 s."""
    policy = make_policy("remaining-work")
    _warm(policy, [3] * 10)
    z = RequestView("Z#0", "Z", 0.0, 1024, hints=Hints(turn=0, predicted_output_tokens=200))
    policy.on_arrival(z, 0.0)
    assert policy.expected_work(z) == pytest.approx(0.0456)


def test_retention_is_continuums():
    """The pin decision and its deadline are Continuum's on the same inputs."""
    policy = make_policy("remaining-work")
    reference = ContinuumPolicy()
    for p in (policy, reference):
        _warm(p, [3] * 10)
        req = _req("W", 0, 0.0, prompt=20_000, out=300)
        p.on_arrival(req, 0.0)
        assert p.on_finish(req, 2.0) is True  # the prior: B = 2 s of prefill > 1 s
    assert policy.deadline("W") == reference.deadline("W")
    assert policy.pin_expired("W", 2.5, False) == reference.pin_expired("W", 2.5, False)
    assert policy.pin_victim(["W"]) == "W"
