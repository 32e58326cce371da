"""Arrivals: when each program of a trace starts.

Poisson by default (what the papers replay), Gamma gaps for bursty load (``cv > 1``). Arrivals
are seeded from a different stream than program contents, so the same seed gives the same
programs at every load (``jps``): sweeps over load compare like with like; ``retime`` gives a
trace (a file, say) new arrivals the same way.
"""

from __future__ import annotations

import math

import numpy as np

from common.trace import Program, Trace

__all__ = ["arrival_times", "gamma_arrivals", "poisson_arrivals", "retime", "round_time",
           "streams"]


def poisson_arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times (s) of a Poisson process of ``rate`` jobs/s: exponential gaps, the
    first arrival one gap after 0."""
    _check_rate(rate)
    return np.cumsum(rng.exponential(1.0 / rate, n))


def gamma_arrivals(n: int, rate: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times with Gamma gaps of mean ``1/rate`` and coefficient of variation
    ``cv`` (``cv = 1`` is Poisson; ``cv > 1`` is bursty)."""
    _check_rate(rate)
    if not cv > 0:
        raise ValueError(f"cv must be > 0, got {cv}")
    shape = 1.0 / (cv * cv)
    return np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), n))


def arrival_times(
    n: int, jps: float, rng: np.random.Generator, cv: float | None = None
) -> np.ndarray:
    """Poisson when ``cv`` is None, else Gamma with that CV."""
    return poisson_arrivals(n, jps, rng) if cv is None else gamma_arrivals(n, jps, cv, rng)


def _check_rate(rate: float) -> None:
    if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
        raise ValueError(
            f"the arrival rate (jobs per second) must be a positive number, got {rate!r}"
        )


def streams(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent generators for program contents and for arrivals."""
    content, arrivals = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(content), np.random.default_rng(arrivals)


def retime(trace: Trace, jps: float, seed: int = 0, cv: float | None = None) -> Trace:
    """The same programs, in the same order, with new arrivals at ``jps`` (Poisson or Gamma)
    for the top-level ones; a sub-agent keeps its delay after its parent's arrival."""
    _, rng = streams(seed)
    top = trace.top_level()
    times = arrival_times(len(top), jps, rng, cv)
    arrival = {p.id: round_time(t) for p, t in zip(top, times, strict=True)}
    by_id = {p.id: p for p in trace.programs}

    def placed(p: Program) -> float:  # a sub-agent: its parent's new arrival plus its delay
        if p.id not in arrival:
            assert p.parent is not None  # the top level has its arrivals
            parent = by_id[p.parent.id]
            arrival[p.id] = round_time(placed(parent) + p.arrival_s - parent.arrival_s)
        return arrival[p.id]

    programs = [p.model_copy(update={"arrival_s": placed(p)}) for p in trace.programs]
    params = {**trace.params, "retimed": {"jps": jps, "seed": seed, "cv": cv}}
    return Trace(
        name=trace.name,
        description=trace.description,
        params=params,
        seed=trace.seed,
        programs=programs,
    )


def round_time(t: float) -> float:
    """An arrival time to the microsecond, as traces store it."""
    return round(float(t), 6)
