"""`lookahead`'s prompt order: a short turn that arrives while a long prompt is in its prefill
starts at the next step instead of after it (the long prompt computes a quarter of each step
while it waits), and the queue is shortest new prompt first. Checked on vLLM's own scheduler
(the emulated H100) against vLLM's order."""

from __future__ import annotations

import pytest

from server.engine import VirtualEngine
from server.engine_spec import EngineSpec
from server.policies.base import RequestView
from server.policies.lookahead import PREFILL_SHARE, PROMPT_AGING_S, LookaheadPolicy
from server.policies.spec import PolicySpec


def _ttfts(policy: str, autoclose) -> dict[str, float]:
    """A 60,000-token prompt, and a 300-token one arriving two steps into its prefill."""
    engine = autoclose(VirtualEngine(PolicySpec.named(policy), EngineSpec()))
    engine.add_request("long", list(range(1000, 61_000)), program_id="A", output_tokens=4)
    done = engine.step() + engine.step()
    engine.add_request("short", list(range(70_000, 70_300)), program_id="B", output_tokens=4)
    while engine.has_work():
        done += engine.step()
    return {f.request_id: f.first_token - f.arrival for f in done}


@pytest.mark.engine
def test_a_short_turn_does_not_wait_for_a_long_prefill(autoclose):
    vllm, ours = _ttfts("vllm", autoclose), _ttfts("lookahead", autoclose)
    # vLLM: the short turn waits for the rest of the long prefill (seconds on an H100)
    assert vllm["short"] > 1.0
    assert ours["short"] < vllm["short"] / 5
    # the long prompt gives up only what the short one took and the finer chunks cost
    assert ours["long"] < 1.3 * vllm["long"]


def _view(request_id: str, program: str, prompt: int, arrival: float = 0.0) -> RequestView:
    return RequestView(request_id=request_id, program_id=program, arrival_time=arrival,
                       prompt_tokens=prompt)


def test_the_queue_is_shortest_new_prompt_first_with_an_aging_bound():
    policy = LookaheadPolicy()
    programs = policy.programs
    for pid, prompt in (("a", 20_000), ("b", 30_000)):
        programs.turn_arrived(pid, prompt, 0.0)
        programs.decide(0.0)
        programs.turn_admitted(pid, 0.0)
        programs.turn_finished(pid, prompt + 500, 1.0)
    # "a" adds 40,000 new tokens (a large tool output), "b" 300, "c" is a first turn of 9,000;
    # a compaction ("b" rewritten shorter than its context) is new in full
    a, b, c = (_view("a1", "a", 60_500, 2.0), _view("b1", "b", 30_800, 3.0),
               _view("c0", "c", 9_000, 2.5))
    assert [policy.new_tokens(v) for v in (a, b, c)] == [40_000, 300, 9_000]
    assert policy.new_tokens(_view("b2", "b", 12_000)) == 12_000
    assert [v.request_id for v in policy.order_waiting([a, b, c], 4.0)] == ["b1", "c0", "a1"]
    # a turn waiting PROMPT_AGING_S goes first whatever its size
    late = 2.0 + PROMPT_AGING_S
    assert [v.request_id for v in policy.order_waiting([a, b, c], late)][0] == "a1"


def test_a_prompt_shares_its_steps_only_with_a_shorter_one():
    policy = LookaheadPolicy()
    short, long = _view("s", "x", 300), _view("l", "y", 50_000)
    share = int(8192 * PREFILL_SHARE)
    assert policy.prefill_share(8192, [40_000], [short]) == share
    assert policy.prefill_share(8192, [40_000, 500], []) == share
    assert policy.prefill_share(8192, [200], [long]) == 0  # the shortest goes on undivided
