"""`oracle` (oracle-SRPT, a clairvoyant schedule): each decision on a small hand-worked case.

No cost model is given, so the work is the fallback's (`server.costs`): a decoded token
at context c costs 5e-5 + 5e-8 * c s (c rounded up to 256 tokens), a prefilled token 1e-4 s.
"""

from __future__ import annotations

import math

import pytest

from server.costs import WorkModel
from server.policies import Hints, RequestView, make_policy
from server.policies.base import AgentEvent
from server.policies.oracle import RETURN_SLACK_S, FutureUnknown, OraclePolicy, TurnFuture


def _req(pid: str, turn: int, arrival: float, prompt: int = 1000, out: int = 0,
         last: bool = False) -> RequestView:
    return RequestView(f"{pid}#{turn}", pid, arrival, prompt, output_tokens=out,
                       hints=Hints(turn=turn, last=last))


def _oracle(futures: dict[str, list[TurnFuture]]) -> OraclePolicy:
    policy = make_policy("oracle")
    assert isinstance(policy, OraclePolicy)
    policy.foresee(futures)
    return policy


def _turns(*outs: int, prompt: int = 1000, tool: float = 1.0) -> list[TurnFuture]:
    return [TurnFuture(prompt, 100, out, tool if i < len(outs) - 1 else 0.0)
            for i, out in enumerate(outs)]


def test_shortest_remaining_program_goes_first_not_the_first_come():
    """A arrived first with three turns of 1,000 output tokens left; B came later with one
    turn of 10. Each turn prefills 100 new tokens (0.01 s); a token decoded at a 1.5k context
    costs 5e-5 + 5e-8 * 1,536 = 1.27e-4 s. So A has 3 * (0.01 + 0.127) = 0.41 s of work left,
    B 0.01 + 10 * 1.0e-4 = 0.011 s: B is admitted first, and under memory pressure A's turn is
    preempted first (it sorts last in the running batch)."""
    policy = _oracle({"A": _turns(1000, 1000, 1000), "B": _turns(10)})
    a, b = _req("A", 0, 0.0), _req("B", 0, 5.0)
    for r in (a, b):
        policy.on_arrival(r, r.arrival_time)
    assert [r.program_id for r in policy.order_waiting([a, b], 6.0)] == ["B", "A"]
    assert policy.running_key(b, 6.0) < policy.running_key(a, 6.0)
    assert policy.remaining_work(a) == pytest.approx(0.4104)
    assert policy.remaining_work(b) == pytest.approx(0.011012)


def test_work_is_gpu_seconds_not_tokens():
    """C answers 500 tokens at a 100k-token context: each reads the whole KV cache, about
    5e-5 + 5e-8 * 100,352 = 5.07e-3 s, so 2.5 s. D answers 600 tokens at a 1k context, about
    1.14e-4 s each, 0.07 s. D has more tokens left and less work: it goes first."""
    policy = _oracle({"C": [TurnFuture(100_000, 100, 500, 0.0)],
                      "D": [TurnFuture(1_000, 100, 600, 0.0)]})
    c, d = _req("C", 0, 0.0, prompt=100_000), _req("D", 0, 1.0)
    assert policy.remaining_work(c) == pytest.approx(
        100 * 1e-4 + 500 * (5e-5 + 5e-8 * 100_352), rel=0.02)
    assert [r.program_id for r in policy.order_waiting([c, d], 2.0)] == ["D", "C"]


def test_a_running_turn_counts_only_what_it_has_left_to_answer():
    """E's only turn answers 1,000 tokens; once 900 are out, 100 remain: a tenth of the
    decode (the prefill is done)."""
    policy = _oracle({"E": [TurnFuture(1000, 1000, 1000, 0.0)]})
    work = WorkModel(None)
    start = policy.remaining_work(_req("E", 0, 0.0))
    late = policy.remaining_work(_req("E", 0, 0.0, out=900))
    assert start == pytest.approx(work.turn_seconds(1000, 1000, 1000))
    assert late == pytest.approx(100 * work.decode_seconds_per_token(1000 + 900 + 50))


def test_pins_exactly_what_will_be_reused_until_its_turn_comes():
    """F has two turns, a 3 s tool call between. Turn 0 ends at t=10: its KV will be reused,
    so it is pinned until the tool returns at 13 (plus the slack); while turn 1 waits in the
    queue the pin holds whatever the time. Turn 1 is the last: nothing reuses it, no pin."""
    policy = _oracle({"F": _turns(50, 50, tool=3.0)})
    first = _req("F", 0, 0.0)
    policy.on_arrival(first, 0.0)
    assert policy.on_finish(first, 10.0) is True
    assert policy.pin_expired("F", 12.9, has_waiting=False) is False
    assert policy.pin_expired("F", 13.0 + RETURN_SLACK_S, has_waiting=False) is True
    assert policy.pin_expired("F", 100.0, has_waiting=True) is False
    assert policy.on_finish(_req("F", 1, 13.0, last=True), 20.0) is False


def test_under_pressure_the_pin_used_furthest_in_the_future_goes_first():
    """Belady: G's tool returns at 5, H's at 9, J's turn is already waiting. Give up H's pin
    (read last); with H gone, G's; J's turn is about to read its pin, so it stays."""
    policy = _oracle({p: _turns(50, 50, tool=t) for p, t in (("G", 5.0), ("H", 9.0),
                                                             ("J", 1.0))})
    for pid in ("G", "H", "J"):
        req = _req(pid, 0, 0.0)
        policy.on_arrival(req, 0.0)
        policy.on_scheduled(req, 0.0)
        assert policy.on_finish(req, 0.0)
    policy.on_arrival(_req("J", 1, 1.0), 1.0)  # J's next turn waits
    assert policy.pin_victim(["G", "H", "J"]) == "H"
    assert policy.pin_victim(["G", "J"]) == "G"


def test_program_end_forgets_the_program_and_an_unknown_one_is_an_error():
    policy = _oracle({"K": _turns(5)})
    policy.on_arrival(_req("K", 0, 0.0), 0.0)
    policy.on_event(AgentEvent("program_end", "K"), 1.0)
    assert policy.next_use("K") == (math.inf, 0.0)
    with pytest.raises(FutureUnknown):
        policy.on_arrival(_req("nobody", 0, 0.0), 0.0)
    with pytest.raises(FutureUnknown):
        policy.remaining_work(_req("K", 3, 0.0))


def test_only_the_oracle_is_clairvoyant():
    """The future reaches a policy only through `foresee`, which no other policy has."""
    for name in ("vllm", "continuum", "autellix", "remaining-work"):
        policy = make_policy(name)
        assert not getattr(policy, "clairvoyant", False)
        assert not hasattr(policy, "foresee")
