"""The prefill-decode interference check of the emulated step
(`eval.experiments.step_interference`): computed step times, no engine."""

from __future__ import annotations

import pytest

from eval.experiments import step_interference as si
from server.perf.registry import load_profile


def test_inflation_grows_with_the_chunk_and_is_one_without_it():
    prof = load_profile("h20x4-llama-3.1-70b")
    ratios = [si.inflation(prof, c, 32, 4096) for c in (0, 256, 1024, 4096)]
    assert ratios[0] == pytest.approx(1.0)
    assert ratios == sorted(ratios) and ratios[-1] > 50  # a compute-bound chunk dominates


def test_the_emulated_h100_step_is_within_2x_of_the_published_mixed_steps():
    # The published figures are round ("~") lab-handout numbers: the check is coarse on
    # purpose, to catch an emulator that is kinder to a mixed step by a large factor.
    for p in si.PUBLISHED:
        prof = load_profile(p.profile)
        emulated = si.inflation(prof, p.chunk, p.decodes, p.decode_context)
        assert 0.5 < emulated / (p.mixed_ms / p.decode_ms) < 2.0, p


def test_a_non_positive_chunk_is_a_user_error():
    with pytest.raises(si.StepInterferenceError):
        si.sweep_table(["h20x4-llama-3.1-70b"], [0], 32, 4096)
