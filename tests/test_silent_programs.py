"""A program that pins its KV and then never sends anything again (no turn, no event, no
`program_end`: an agent that died) has its pin released by the engine itself, within the
stated bound, through the real vLLM scheduler on a virtual clock (`vllm_driver`):

* `continuum`: the pin lasts its TTL, which is never longer than what the pin is worth (its
  benefit B: the reload it saves plus the queueing wait, `ContinuumPolicy.ttl_for`), whatever
  the client predicted: a prediction over B makes no pin at all;
* a program scheduler (`lookahead`): a silent program is forgotten after
  `server.programs.state.STALE_AFTER_S` (3,600 s), and its pin with it.

An engine steps only while it has work, so other programs' turns keep it stepping here; an
engine left with no work at all keeps the pin (nothing else wants the memory: docs/events.md).
The class-level rules are tests/test_program_schedulers.py's and tests/test_continuum.py's."""

from __future__ import annotations

import random

import pytest
from vllm_driver import Driver, make_scheduler

from server.engine_spec import EngineSpec
from server.launch import ServeError, build_command, serve_policy
from server.policies.continuum import ContinuumPolicy
from server.programs.state import STALE_AFTER_S
from server.settings import ServeSettings

pytestmark = pytest.mark.engine


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(8, 30000) for _ in range(n)]


class Traffic:
    """Another program's short turns, one whenever asked: what keeps an engine stepping."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.turns = 0

    def turn(self) -> None:
        request = f"other-{self.turns}"
        self.driver.submit(request, prompt(1000 + self.turns, 20), f"other-{self.turns}",
                           max_tokens=2, last=1)
        self.driver.run_until_finished(request)
        self.turns += 1


def test_continuum_releases_a_silent_programs_pin_at_its_ttl_never_later_than_its_worth():
    scheduler = make_scheduler("continuum", num_blocks=64)
    policy = ContinuumPolicy(cost_model=scheduler.agent_policy.cost_model,
                             t_wait_default_s=60.0)  # an evicted turn waits a minute
    scheduler.agent_policy = policy
    d = Driver(scheduler)
    traffic = Traffic(d)
    # A says its tool takes 20 s (a request hint), then never comes back
    d.submit("A-0", prompt(1, 160), "A", max_tokens=2, tool="bash", predicted_s=20.0)
    d.run_until_finished("A-0")
    pin = scheduler.pins["A"]
    ttl = policy.deadline("A") - pin.pinned_at
    worth = policy.ttl_for("bash", 162).benefit
    assert ttl == pytest.approx(20.0 * 1.2) and ttl < worth
    d.advance(ttl - 1.0)
    traffic.turn()
    assert "A" in scheduler.pins  # not before its TTL
    d.advance(1.5)
    traffic.turn()
    assert "A" not in scheduler.pins and scheduler.pin_stats.expired == 1
    assert d.free_blocks == d.total_blocks
    # a client cannot make a pin outlast what it is worth: a prediction over B pins nothing
    d.submit("B-0", prompt(2, 160), "B", max_tokens=2, tool="bash", predicted_s=worth)
    d.run_until_finished("B-0")
    assert "B" not in scheduler.pins and scheduler.pin_stats.pinned == 1


def test_a_program_scheduler_forgets_a_silent_program_and_its_pin_after_stale_after_s():
    d = Driver(make_scheduler("lookahead", num_blocks=64))
    scheduler = d.scheduler
    programs = scheduler.agent_policy.programs
    traffic = Traffic(d)
    d.submit("A-0", prompt(1, 320), "A", max_tokens=2)
    d.run_until_finished("A-0")
    assert "A" in scheduler.pins and programs.table.get("A").active
    assert scheduler.status()["programs_tracked"] == len(programs.table) == 1
    silent_since = d.clock.now()
    # other programs come and go every ten minutes; A stays silent
    while d.clock.now() - silent_since < STALE_AFTER_S - 600.0:
        d.advance(600.0)
        traffic.turn()
        assert "A" in scheduler.pins, d.clock.now() - silent_since
    d.advance(silent_since + STALE_AFTER_S - d.clock.now() + 1.0)
    traffic.turn()
    assert "A" not in scheduler.pins and scheduler.pin_stats.expired == 1
    assert programs.table.get("A") is None
    assert scheduler.status()["programs_tracked"] == len(programs.table)  # the soak's figure
    assert d.total_blocks - d.free_blocks == sum(len(p.blocks) for p in scheduler.pins.values())


def test_a_shorter_silent_program_bound_reaches_the_program_table():
    """`harness serve --stale-after-s S` (what a soak uses to see the table drain within its
    run) reaches the engine's program scheduler through the settings, and is refused when not
    a positive number before any engine starts."""
    config = ServeSettings(policy="lookahead", stale_after_s=60.0).to_additional_config()
    d = Driver(make_scheduler("lookahead", num_blocks=64, additional_config=config))
    scheduler = d.scheduler
    traffic = Traffic(d)
    d.submit("A-0", prompt(1, 320), "A", max_tokens=2)
    d.run_until_finished("A-0")
    d.advance(30.0)
    traffic.turn()
    assert scheduler.agent_policy.programs.table.get("A") is not None
    d.advance(31.0)
    traffic.turn()
    assert scheduler.agent_policy.programs.table.get("A") is None
    assert "A" not in scheduler.pins
    with pytest.raises(ServeError, match="--stale-after-s 0"):
        build_command(serve_policy("lookahead"), EngineSpec(stale_after_s=0.0))
