"""The shapes a gap forecast is drawn from: the gaps seen so far with a Pareto tail past
them (`TailedEmpirical`), a log-normal (`LogNormal`: the prior, before a kind has gaps
enough) and an exponential (`Exponential`: a point estimate read as a distribution, the
baseline of today's `predicted_s`).

Why an empirical body with a Pareto tail. Gaps between an agent's requests are heavy-tailed:
in the public Claude Code sessions (trace_0001..0400) a tool gap has p50 9 s, p90 68 s, p99
845 s and a maximum of 10,423 s. A log-normal through the median and p90 puts p99 near 350 s,
less than half the data's, so no two-parameter shape in log space is safe in the tail that
eviction cares about; and the body has piles no smooth shape keeps (tool timeouts: about 125 s
and 305 s). The empirical CDF is exact where there are data and says nothing past the largest
sample: a program gone longer than every gap seen would be certainly back by now, the
opposite of what gaps do (the longer a program has been gone, the longer it is likely to stay
gone: a decreasing hazard). So only the top `tail_fraction` of the samples (1%: the piles stay
in the body) is read as a power law: above the threshold ``u`` (the sample with that share
above it) the survival is ``S(t) = p (t / u) ** -alpha``, ``p`` the share of samples above
``u``. A power law is the simplest decreasing hazard (``alpha / t``), its CDF and quantiles
have closed forms, and given ``u`` its exponent has a conjugate estimate: Hill's,
``m / sum(ln(x / u))`` over the ``m`` samples above ``u``, here with a Gamma(2, 2) prior (mean
1, worth two samples: ``alpha = (m + 2) / (sum + 2)``) so a small pool does not fit a tail to
one sample.

Every shape answers `cdf` and `quantile` on numpy arrays (a forecast asks for a grid at once),
and `median`, what a session's gaps are measured against (`predictor.gaps.sessions`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy.special import ndtr, ndtri

#: Share of a pool's samples read as its power-law tail.
DEFAULT_TAIL_FRACTION = 0.01
#: The Gamma prior on the tail exponent: shape and rate (mean 1, worth two samples).
ALPHA_PRIOR = (2.0, 2.0)


class Shape(Protocol):
    """A distribution of gap lengths in seconds, on numpy arrays."""

    def cdf(self, x: np.ndarray) -> np.ndarray: ...

    def quantile(self, q: np.ndarray) -> np.ndarray: ...

    @property
    def median(self) -> float: ...


@dataclass(frozen=True, eq=False)
class TailedEmpirical:
    """The empirical distribution of `values` (sorted) up to `threshold`, a power law above
    it: ``S(t) = tail_p (t / threshold) ** -alpha``. No tail (`tail_p` 0): the plain empirical
    distribution, certain to be back by the largest sample."""

    values: np.ndarray
    threshold: float = math.inf
    tail_p: float = 0.0
    alpha: float = math.inf

    @classmethod
    def fit(cls, samples: Sequence[float],
            tail_fraction: float = DEFAULT_TAIL_FRACTION) -> TailedEmpirical:
        """The body from `samples`, and a tail over their top `tail_fraction` (0: none)."""
        values = np.sort(np.asarray(samples, dtype=float))
        n = values.size
        if n == 0:
            raise ValueError("a gap distribution needs at least one sample")
        if not 0.0 <= tail_fraction < 1.0:
            raise ValueError(f"tail_fraction must be in [0, 1), got {tail_fraction}")
        k = math.ceil(tail_fraction * n)
        if k < 1 or k >= n:
            return cls(values)
        u = float(values[n - k - 1])
        above = values[n - k:]
        above = above[above > u]
        if u <= 0.0 or above.size == 0:  # no scale to measure a power law from
            return cls(values)
        shape, rate = ALPHA_PRIOR
        alpha = (above.size + shape) / (float(np.log(above / u).sum()) + rate)
        return cls(values, u, above.size / n, alpha)

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        body = np.searchsorted(self.values, x, side="right") / self.values.size
        if self.tail_p == 0.0:
            return body
        ratio = np.maximum(x, self.threshold) / self.threshold
        return np.where(x > self.threshold, 1.0 - self.tail_p * ratio ** -self.alpha, body)

    def quantile(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q, dtype=float)
        n = self.values.size
        body = self.values[np.clip(np.ceil(q * n).astype(int) - 1, 0, n - 1)]
        if self.tail_p == 0.0:
            return body
        with np.errstate(divide="ignore"):
            tail = self.threshold * (self.tail_p / np.maximum(1.0 - q, 0.0)) ** (1.0 / self.alpha)
        return np.where(q > 1.0 - self.tail_p, tail, body)

    @property
    def median(self) -> float:
        return float(self.quantile(np.array(0.5)))


@dataclass(frozen=True)
class LogNormal:
    """``ln(gap)`` normal with mean `mu` and deviation `sigma`."""

    mu: float
    sigma: float

    @classmethod
    def from_quantiles(cls, median_s: float, p90_s: float) -> LogNormal:
        """The log-normal with this median and 90th percentile."""
        if not 0 < median_s < p90_s:
            raise ValueError(f"need 0 < median < p90, got {median_s} and {p90_s}")
        return cls(math.log(median_s), math.log(p90_s / median_s) / float(ndtri(0.9)))

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        with np.errstate(divide="ignore"):
            z = (np.log(np.maximum(x, 0.0)) - self.mu) / self.sigma
        return ndtr(z)

    def quantile(self, q: np.ndarray) -> np.ndarray:
        return np.exp(self.mu + self.sigma * ndtri(np.asarray(q, dtype=float)))

    @property
    def median(self) -> float:
        return math.exp(self.mu)


@dataclass(frozen=True)
class Exponential:
    """Memoryless gaps of mean `mean_s`: what a point estimate says when read as a
    distribution (the prior `predictor.durations` assumes too)."""

    mean_s: float

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return -np.expm1(-np.maximum(x, 0.0) / self.mean_s)

    def quantile(self, q: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return -self.mean_s * np.log1p(-np.asarray(q, dtype=float))

    @property
    def median(self) -> float:
        return self.mean_s * math.log(2.0)
