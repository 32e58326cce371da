"""Do two runs of a benchmark say the same thing, turn by turn?

Why: a retention or scheduling policy decides *when* a request runs and whether its KV cache is
kept, rebuilt or recomputed; it must never decide *what* the model says. Under greedy decoding
two runs of the same tasks against the same model should therefore give the same replies, and
the share of identical turns makes "the same pass rate" checkable. Where they differ, the cause
is either the policy (a bug) or floating point: the same prompt computed through a different
path (its prefix read from the KV cache in one run and prefilled afresh in the other, or batched
beside different requests) can round differently, and under greedy decoding one flipped token
changes everything after it. Each differing turn is reported with what each run did at that turn
(tokens read from the prefix cache), and running one policy twice measures how often the second
cause alone changes a reply.

Input: two `harness run --out` folders (their `trajectories/*.traj.json`). A turn is identical
when its output token ids (or, without token ids, its text) are equal in both runs and every
earlier turn of the program was identical too (after the first difference the prompts differ, so
later turns are not comparable and count as different).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.trajectory import token_ids


class AgreementError(ValueError):
    """A run folder without trajectories to compare."""


@dataclass(frozen=True)
class Divergence:
    """The first turn where a program's two runs differ."""

    task_id: str
    turn: int
    #: index of the first differing output token (None: compared as text, or a run ended)
    token: int | None
    cached_a: int | None  # prompt tokens read from the prefix cache at this turn, run A
    cached_b: int | None
    text_a: str
    text_b: str

    @property
    def same_cache_path(self) -> bool:
        """Both runs read the same number of prompt tokens from the cache at this turn: the
        difference then comes from the batch the turn ran in, not from KV rebuilt or kept."""
        return self.cached_a == self.cached_b


@dataclass
class Agreement:
    turns: int = 0  # turns of the longer run of each program, summed
    identical: int = 0
    programs: int = 0
    identical_programs: int = 0
    same_outcome: int = 0  # programs with the same status and answer in both runs
    divergences: list[Divergence] = field(default_factory=list)
    only_in_one: list[str] = field(default_factory=list)  # tasks one run lacks

    @property
    def share(self) -> float:
        return self.identical / self.turns if self.turns else 1.0

    def to_json(self) -> dict[str, Any]:
        return {"turns": self.turns, "identical_turns": self.identical,
                "identical_share": round(self.share, 4), "programs": self.programs,
                "identical_programs": self.identical_programs,
                "same_outcome": self.same_outcome, "only_in_one": self.only_in_one,
                "divergences": [
                    {"task_id": d.task_id, "turn": d.turn, "token": d.token,
                     "cached_a": d.cached_a, "cached_b": d.cached_b,
                     "same_cache_path": d.same_cache_path,
                     "text_a": d.text_a[:200], "text_b": d.text_b[:200]}
                    for d in self.divergences]}


def load_trajectories(run_dir: Path) -> dict[str, dict[str, Any]]:
    folder = Path(run_dir) / "trajectories"
    files = sorted(folder.glob("*.traj.json"))
    if not files:
        raise AgreementError(f"{run_dir}: no trajectories (expected {folder}/*.traj.json from "
                             "`harness run --out`)")
    return {f.name.removesuffix(".traj.json"): json.loads(f.read_text()) for f in files}


def replies(data: dict[str, Any]) -> list[tuple[list[int] | None, str, int | None]]:
    """Each turn's (output token ids or None, reply text, cached prompt tokens)."""
    texts = [m.get("content") or "" for m in data.get("messages", [])
             if m.get("role") == "assistant"]
    steps = data.get("steps", [])
    try:
        ids: list[list[int] | None] = [out for _, out in token_ids(data)]
    except (ValueError, KeyError):
        ids = [None] * len(steps)
    return [(ids[i] if i < len(ids) else None, texts[i] if i < len(texts) else "",
             steps[i].get("cached_tokens")) for i in range(len(steps))]


def first_token_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_program(task_id: str, a: dict[str, Any], b: dict[str, Any]
                    ) -> tuple[int, int, Divergence | None]:
    """(turns, identical turns, first divergence) of one program's two runs."""
    turns_a, turns_b = replies(a), replies(b)
    total = max(len(turns_a), len(turns_b))
    for i in range(total):
        if i >= len(turns_a) or i >= len(turns_b):
            ra = turns_a[i] if i < len(turns_a) else (None, "", None)
            rb = turns_b[i] if i < len(turns_b) else (None, "", None)
            return total, i, Divergence(task_id, i, None, ra[2], rb[2], ra[1], rb[1])
        (ids_a, text_a, cached_a), (ids_b, text_b, cached_b) = turns_a[i], turns_b[i]
        if ids_a is not None and ids_b is not None:
            token = first_token_difference(ids_a, ids_b)
            same = token is None
        else:
            token, same = None, text_a == text_b
        if not same:
            return total, i, Divergence(task_id, i, token, cached_a, cached_b, text_a, text_b)
    return total, total, None


def compare_runs(run_a: Path, run_b: Path) -> Agreement:
    a, b = load_trajectories(run_a), load_trajectories(run_b)
    result = Agreement(only_in_one=sorted(set(a) ^ set(b)))
    for task_id in sorted(set(a) & set(b)):
        turns, identical, divergence = compare_program(task_id, a[task_id], b[task_id])
        result.turns += turns
        result.identical += identical
        result.programs += 1
        result.identical_programs += divergence is None
        outcome = (a[task_id].get("status"), a[task_id].get("answer"))
        result.same_outcome += outcome == (b[task_id].get("status"), b[task_id].get("answer"))
        if divergence is not None:
            result.divergences.append(divergence)
    return result
