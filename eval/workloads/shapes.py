"""The shape of a kind of program, and drawing programs of that shape.

A workload family says how many turns its programs have, how long the first prompt, the outputs
and the tool returns are, and which tools run for how long (a `ShapeSpec`); drawing is the same
for every family, so the token accounting of `common.trace` is honoured in one place. A spec
also knows the exact mean and sd of the tokens per program it produces, which is how the
families solve for the choices a paper does not give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from common.trace import Program, Turn
from eval.workloads.arrivals import arrival_times, round_time, streams
from eval.workloads.distributions import ClippedLogNormal, DiscreteNormal, FixedCount

__all__ = ["ShapeSpec", "ToolSpec", "check_n", "draw_program", "draw_programs"]


def _sig(x: float, digits: int = 4) -> float:
    """Round to significant digits (keeps files small; values survive JSON exactly)."""
    return float(f"{float(x):.{digits}g}")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    weight: float
    seconds: ClippedLogNormal


@dataclass(frozen=True)
class ShapeSpec:
    """How one kind of program is drawn. ``prompt`` is the part of the first prompt *beyond*
    the shared prefix; later turns add only tool returns (``input_tokens = 0``)."""

    benchmark: str
    turns: DiscreteNormal | FixedCount
    prompt: ClippedLogNormal
    output: ClippedLogNormal
    tool_return: ClippedLogNormal
    tools: tuple[ToolSpec, ...]
    shared_prefix_tokens: int = 0
    shared_prefix_id: str | None = None

    def expected_tokens(self) -> tuple[float, float]:
        """Exact mean and sd of ``processed_tokens`` (before rounding to integers).

        Given ``n`` turns, ``T = n*P + sum_j o_j*(n-j) + sum_{j<n-1} r_j*(n-1-j)`` with
        independent draws, so ``E[T|n]`` and ``Var[T|n]`` are closed form; then the law of total
        variance over the pmf of ``n``.
        """
        p_mean = self.prompt.mean + self.shared_prefix_tokens
        om, osd = self.output.mean, self.output.sd
        rm, rsd = self.tool_return.mean, self.tool_return.sd
        n = self.turns.values.astype(float)
        cond_mean = n * p_mean + om * n * (n + 1) / 2 + rm * n * (n - 1) / 2
        cond_var = (
            n * n * self.prompt.sd**2
            + osd**2 * n * (n + 1) * (2 * n + 1) / 6
            + rsd**2 * (n - 1) * n * (2 * n - 1) / 6
        )
        pmf = self.turns.pmf
        mean = float((pmf * cond_mean).sum())
        var = float((pmf * cond_var).sum() + (pmf * cond_mean**2).sum() - mean**2)
        return mean, math.sqrt(var)

    def tool_seconds_moments(self) -> tuple[float, float]:
        """Mean and sd per tool call of the weighted mixture of the tools' distributions."""
        w = np.array([t.weight for t in self.tools], dtype=float)
        w = w / w.sum()
        m = np.array([t.seconds.mean for t in self.tools])
        s = np.array([t.seconds.sd for t in self.tools])
        mean = float((w * m).sum())
        return mean, math.sqrt(float((w * (s * s + m * m)).sum()) - mean * mean)


def draw_program(
    spec: ShapeSpec,
    rng: np.random.Generator,
    pid: str,
    arrival_s: float,
    source: str,
    scale: float = 1.0,
) -> Program:
    """One program of ``spec`` arriving at ``arrival_s``, its contents drawn from ``rng`` (the
    content stream); ``scale`` multiplies every token count."""
    n = int(spec.turns.sample(rng))
    prefix = int(round(spec.shared_prefix_tokens * scale))
    first = prefix + max(1, int(round(float(spec.prompt.sample(rng)) * scale)))
    outputs = spec.output.sample(rng, n)
    returns = spec.tool_return.sample(rng, n - 1) if n > 1 else np.zeros(0)
    weights = np.array([t.weight for t in spec.tools], dtype=float)
    which = rng.choice(len(spec.tools), size=n - 1, p=weights / weights.sum()) if n > 1 else []
    turns = []
    for i in range(n):
        last = i == n - 1
        tool = None if last else spec.tools[int(which[i])]
        turns.append(
            Turn(
                input_tokens=first if i == 0 else 0,
                output_tokens=max(1, int(round(float(outputs[i]) * scale))),
                tool=None if tool is None else tool.name,
                tool_seconds=0.0 if tool is None else _sig(float(tool.seconds.sample(rng))),
                tool_return_tokens=0 if last else max(0, int(round(float(returns[i]) * scale))),
            )
        )
    return Program(
        id=pid,
        arrival_s=round_time(arrival_s),
        turns=turns,
        benchmark=spec.benchmark,
        source=source,
        shared_prefix_tokens=prefix if spec.shared_prefix_id else 0,
        shared_prefix_id=spec.shared_prefix_id if prefix else None,
    )


def draw_programs(spec: ShapeSpec, n: int, jps: float, seed: int, cv: float | None,
                  prefix: str, source: str) -> list[Program]:
    """``n`` programs of one shape with ids ``PREFIX-00000``..., arriving at ``jps``: the
    content stream and the arrival stream are separate, so the load changes only arrivals."""
    check_n(n)
    content, arr = streams(seed)
    times = arrival_times(n, jps, arr, cv)
    return [draw_program(spec, content, f"{prefix}-{i:05d}", times[i], source)
            for i in range(n)]


def check_n(n: int) -> None:
    """Refuse a number of programs that is not a non-negative integer."""
    if not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n (number of programs) must be a non-negative integer, got {n!r}")
