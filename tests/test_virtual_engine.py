"""The in-process engine on a virtual clock: the real EngineCore, no sleeping, exact results."""

from __future__ import annotations

from contextlib import closing

import pytest

from server.engine import VirtualEngine
from server.engine_spec import EngineSpec
from server.perf.registry import load_profile
from server.policies.spec import PolicySpec

PROFILE = "h100-llama-3.1-8b"
pytestmark = pytest.mark.engine


def two_turn_program(policy: str) -> list:
    with closing(VirtualEngine(PolicySpec.named(policy), EngineSpec(profile=PROFILE))) as engine:
        first = list(range(8, 2008))
        engine.add_request("a0", first, program_id="A", output_tokens=50, tool="bash")
        done = []
        while engine.has_work():
            done += engine.step()
        engine.advance_to(engine.clock.now() + 0.5)  # the tool runs for 0.5 s
        engine.add_request("a1", first + list(range(100, 250)), program_id="A",
                           output_tokens=20)
        while engine.has_work():
            done += engine.step()
        return done


@pytest.fixture(scope="module")
def runs():
    return two_turn_program("continuum"), two_turn_program("continuum")


def test_identical_runs_give_identical_times(runs):
    first, second = runs
    assert first == second


def test_time_is_the_modelled_step_time(runs):
    a0, a1 = runs[0]
    profile = load_profile(PROFILE)
    # the whole 2000-token prompt is one prefill step, which also samples the first token
    assert a0.first_token - a0.arrival == pytest.approx(profile.step_seconds([(2000, 0)], []))
    # 49 more single-sequence decode steps follow
    decodes = sum(profile.step_seconds([], [2000 + i]) for i in range(1, 50))
    assert a0.finished - a0.first_token == pytest.approx(decodes, rel=1e-6)
    assert a0.output_tokens == 50 and a0.finish_reason == "stop"
    # the second turn reuses the first turn's prompt from the prefix cache
    assert a1.cached_tokens == 2000 and a1.arrival == pytest.approx(a0.finished + 0.5)


def test_emulated_ids_are_numpys_scalar_draws(runs):
    """The emulated model draws its random ids 4096 at a time; they must be the ids that one
    `rng.integers` call per token gives (numpy draws an array with the same calls, in order),
    so replays keep their token ids and with them every prefix-cache figure."""
    import numpy as np

    from server.emulated.executor import FIRST_ORDINARY_TOKEN

    for limit in (1000, 32000):
        one, many = np.random.default_rng(0), np.random.default_rng(0)
        scalars = [int(one.integers(FIRST_ORDINARY_TOKEN, limit)) for _ in range(10_000)]
        arrays: list[int] = []
        while len(arrays) < len(scalars):
            arrays += many.integers(FIRST_ORDINARY_TOKEN, limit, size=4096).tolist()
        assert arrays[:len(scalars)] == scalars
    a0 = runs[0][0]  # what the engine answered: ids in range, the last one EOS
    assert all(FIRST_ORDINARY_TOKEN <= t < 32000 for t in a0.token_ids[:-1])
