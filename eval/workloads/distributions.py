"""Distributions fitted to published mean / sd.

Papers give a mean and a standard deviation (sometimes a range); a generator needs something to
draw from that has exactly those moments, also after clipping to plausible values. Turn counts
are integers, so they get a discrete distribution whose pmf has the moments exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from scipy import optimize, stats

__all__ = ["ClippedLogNormal", "DiscreteNormal", "FixedCount"]


@dataclass(frozen=True)
class ClippedLogNormal:
    """``clip(X, lo, hi)`` with ``X`` lognormal, its parameters fitted so that the *clipped*
    variable has exactly the given mean and standard deviation (closed-form moments, solved
    numerically once). Clipping keeps a long tail from producing absurd values while the
    published mean / sd still hold."""

    mean: float
    sd: float
    lo: float
    hi: float

    def __post_init__(self) -> None:
        if not (0 < self.lo < self.mean < self.hi):
            raise ValueError(f"need 0 < lo < mean < hi, got {self}")
        if self.sd <= 0:
            raise ValueError(f"sd must be > 0, got {self}")

    @staticmethod
    def _moments(mu: float, sigma: float, lo: float, hi: float) -> tuple[float, float]:
        a, b = math.log(lo), math.log(hi)
        za, zb = (a - mu) / sigma, (b - mu) / sigma
        p_lo, p_hi = stats.norm.cdf(za), stats.norm.sf(zb)

        def partial(k: int) -> float:  # E[X^k ; lo < X < hi]
            shift = k * sigma
            return math.exp(k * mu + k * k * sigma * sigma / 2) * (
                stats.norm.cdf(zb - shift) - stats.norm.cdf(za - shift)
            )

        m1 = lo * p_lo + hi * p_hi + partial(1)
        m2 = lo * lo * p_lo + hi * hi * p_hi + partial(2)
        return m1, math.sqrt(max(m2 - m1 * m1, 0.0))

    @cached_property
    def params(self) -> tuple[float, float]:
        """``(mu, sigma)`` of the underlying lognormal."""
        cv = self.sd / self.mean
        s0 = math.sqrt(math.log1p(cv * cv))
        x0 = np.array([math.log(self.mean) - s0 * s0 / 2, math.log(s0)])

        def residual(x: np.ndarray) -> np.ndarray:
            m, s = self._moments(float(x[0]), math.exp(float(x[1])), self.lo, self.hi)
            return np.array([m / self.mean - 1.0, s / self.sd - 1.0])

        sol = optimize.least_squares(residual, x0, xtol=1e-12, ftol=1e-12, gtol=1e-12)
        err = np.abs(residual(sol.x)).max()
        if err > 1e-4:
            raise ValueError(
                f"cannot fit a lognormal clipped to [{self.lo}, {self.hi}] with mean "
                f"{self.mean} and sd {self.sd} (relative error {err:.2g}); widen the clip range"
            )
        return float(sol.x[0]), math.exp(float(sol.x[1]))

    def sample(self, rng: np.random.Generator, size: int | None = None) -> Any:
        mu, sigma = self.params
        return np.clip(rng.lognormal(mu, sigma, size), self.lo, self.hi)


@dataclass(frozen=True)
class DiscreteNormal:
    """Integers ``lo..hi`` from a rounded, clipped normal whose location and scale are fitted
    so the *discrete* distribution has exactly the given mean and sd (the pmf is exact)."""

    mean: float
    sd: float
    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not (self.lo < self.mean < self.hi) or self.sd <= 0:
            raise ValueError(f"need lo < mean < hi and sd > 0, got {self}")

    def _pmf(self, m: float, s: float) -> np.ndarray:
        ks = np.arange(self.lo, self.hi + 1)
        upper = stats.norm.cdf((ks + 0.5 - m) / s)
        lower = stats.norm.cdf((ks - 0.5 - m) / s)
        upper[-1], lower[0] = 1.0, 0.0
        return upper - lower

    @cached_property
    def pmf(self) -> np.ndarray:
        ks = np.arange(self.lo, self.hi + 1)

        def residual(x: np.ndarray) -> np.ndarray:
            p = self._pmf(float(x[0]), math.exp(float(x[1])))
            mean = float((p * ks).sum())
            sd = math.sqrt(max(float((p * ks * ks).sum()) - mean * mean, 0.0))
            return np.array([mean - self.mean, sd - self.sd])

        sol = optimize.least_squares(
            residual, np.array([self.mean, math.log(self.sd)]), xtol=1e-12, ftol=1e-12
        )
        if np.abs(residual(sol.x)).max() > 1e-6:
            raise ValueError(f"cannot fit {self}; widen lo..hi")
        p = self._pmf(float(sol.x[0]), math.exp(float(sol.x[1])))
        return p / p.sum()

    @property
    def values(self) -> np.ndarray:
        return np.arange(self.lo, self.hi + 1)

    def moment(self, f: Callable[[np.ndarray], np.ndarray]) -> float:
        """``E[f(K)]`` under the fitted pmf."""
        return float((self.pmf * f(self.values.astype(float))).sum())

    def sample(self, rng: np.random.Generator, size: int | None = None) -> Any:
        return rng.choice(self.values, size=size, p=self.pmf)


@dataclass(frozen=True)
class FixedCount:
    """Always ``k``: the turn count of a workload whose programs all have the same number of
    rounds (AMPD's HotpotQA and DuReader, 3 rounds each). Same interface as
    :class:`DiscreteNormal`, so a :class:`ShapeSpec` takes either."""

    k: int

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")

    @property
    def mean(self) -> float:
        return float(self.k)

    @property
    def values(self) -> np.ndarray:
        return np.array([self.k])

    @property
    def pmf(self) -> np.ndarray:
        return np.array([1.0])

    def moment(self, f: Callable[[np.ndarray], np.ndarray]) -> float:
        return float(f(self.values.astype(float))[0])

    def sample(self, rng: np.random.Generator, size: int | None = None) -> Any:
        return self.k if size is None else np.full(size, self.k)
