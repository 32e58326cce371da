"""eval.experiments.agreement: turn-by-turn comparison of two runs' trajectories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.experiments.agreement import AgreementError, compare_runs


def write_run(root: Path, programs: dict[str, list[tuple[list[int], str, int]]],
              status: str = "submitted") -> Path:
    """A run folder whose programs' turns are (output ids, text, cached tokens); prompts grow
    by two tokens a turn, stored as `harness.trajectory` stores them."""
    folder = root / "trajectories"
    folder.mkdir(parents=True)
    for task, turns in programs.items():
        steps, messages = [], [{"role": "user", "content": "q"}]
        for i, (ids, text, cached) in enumerate(turns):
            step = {"llm_s": 0.1, "prompt_tokens": 3, "output_tokens": len(ids),
                    "cached_tokens": cached, "output_token_ids": ids}
            if i == 0:
                step["prompt_token_ids"] = [1, 2, 3]
            else:
                step["prompt_added_token_ids"] = [7, 8]
            steps.append(step)
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": "Observation: ok"}]
        (folder / f"{task}.traj.json").write_text(json.dumps(
            {"task_id": task, "steps": steps, "messages": messages, "status": status,
             "answer": "42"}))
    return root


def test_identical_runs_agree_fully(tmp_path: Path) -> None:
    turns = {"t1": [([5, 6], "a", 0), ([9], "b", 32)], "t2": [([4], "c", 0)]}
    a = write_run(tmp_path / "a", turns)
    b = write_run(tmp_path / "b", turns)
    result = compare_runs(a, b)
    assert (result.turns, result.identical, result.identical_programs) == (3, 3, 2)
    assert result.share == 1.0 and result.divergences == [] and result.same_outcome == 2


def test_first_difference_ends_the_comparable_turns(tmp_path: Path) -> None:
    """t1 differs at turn 1, token 1: turn 0 identical; turns 1 and 2 count as different
    (after a difference the prompts differ). The cache path differs at that turn (32 vs 0
    tokens read from the prefix cache), so the divergence is not blamed on the batch alone."""
    a = write_run(tmp_path / "a", {"t1": [([5, 6], "a", 0), ([9, 1], "b", 32), ([3], "c", 64)]})
    b = write_run(tmp_path / "b", {"t1": [([5, 6], "a", 0), ([9, 2], "x", 0), ([3], "c", 64)]})
    result = compare_runs(a, b)
    assert (result.turns, result.identical) == (3, 1)
    (d,) = result.divergences
    assert (d.task_id, d.turn, d.token, d.cached_a, d.cached_b) == ("t1", 1, 1, 32, 0)
    assert not d.same_cache_path


def test_a_run_that_stops_early_differs_where_it_stopped(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", {"t1": [([5], "a", 0), ([6], "b", 0)]})
    b = write_run(tmp_path / "b", {"t1": [([5], "a", 0)], "t2": [([1], "z", 0)]})
    result = compare_runs(a, b)
    assert (result.turns, result.identical, result.only_in_one) == (2, 1, ["t2"])
    assert result.divergences[0].turn == 1 and result.divergences[0].token is None


def test_a_folder_without_trajectories_is_refused(tmp_path: Path) -> None:
    write_run(tmp_path / "a", {"t1": [([5], "a", 0)]})
    with pytest.raises(AgreementError, match="no trajectories"):
        compare_runs(tmp_path / "a", tmp_path / "empty")
