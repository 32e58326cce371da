"""A gap forecast: when a program that has been gone `elapsed_s` will be back.

A forecast is a shape (`predictor.gaps.shapes`: the pool of its kind, or the prior) at the
pace of the session it is for: a gap is ``G = scale * X`` with ``X`` drawn from the shape, and
`scale` the session's level (its gaps run shorter or longer than the pool's by this factor,
`predictor.gaps.sessions`). With ``scale = 1`` the forecast is the shape itself.

Times are counted from the gap's start (the tool call's, or the turn's end): `cdf(t)` is the
probability that the program is back by ``t`` given that it was not back at `elapsed_s`, 0 for
``t <= elapsed_s``; `quantile` and `mean` are gap lengths, at least `elapsed_s`. What an
eviction decision asks is counted from now: `p_back_within(h)`, the probability of a return
within the next ``h`` seconds, and `expected_wait_s`, the expected seconds until it.

A heavy tail may have no finite mean (a power law with exponent at most 1 does not), so
means are of the gap capped at `mean_cap_s` (a day unless said otherwise: a program gone
longer is gone for any cache). They are integrated numerically over a log-spaced grid
(`MEAN_GRID` points), which is within about a percent for these shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy.special import ndtri

from predictor.gaps.shapes import LogNormal, Shape

#: The cap on a forecast's mean gap unless said otherwise: one day.
DEFAULT_MEAN_CAP_S = 86_400.0
#: Points of the log-spaced grid a capped mean is integrated over, and where it starts.
MEAN_GRID = 512
MEAN_GRID_START_S = 1e-3
#: The quantile levels a client sends in ``tool_start`` (``predicted_q``, docs/events.md).
HINT_LEVELS = (0.5, 0.9, 0.99)


@dataclass(frozen=True, eq=False)
class GapForecast:
    """The distribution of one gap, conditioned on the program being gone `elapsed_s`.
    `source`: where the shape came from (``command``, ``tool`` or ``global``: the level of
    the kind's pool, as `predictor.durations` names them; ``prior``; ``point``: a baseline's
    exponential); `session_gaps`: the session's gaps of this kind its level was learnt from."""

    shape: Shape
    scale: float = 1.0
    elapsed_s: float = 0.0
    source: str = "prior"
    session_gaps: int = 0
    mean_cap_s: float = DEFAULT_MEAN_CAP_S
    #: the unconditional probability of being back by `elapsed_s`
    _gone: float = field(init=False, repr=False)

    @classmethod
    def from_hint(cls, quantiles: dict[str, float]) -> GapForecast:
        """The forecast a server rebuilds from a client's hint (`hint`'s ``{"p50": s, ...}``):
        the log-normal through the lowest and highest level given with distinct positive
        values (a server does not know the client's shapes, only these quantiles; the
        log-normal keeps their spread, which is what a keep-or-release decision weighs).
        A ValueError when the hint has no two such levels."""
        points = sorted((float(level.removeprefix("p")) / 100.0, float(seconds))
                        for level, seconds in quantiles.items() if seconds > 0)
        if len(points) < 2 or points[0][1] >= points[-1][1] or points[0][0] >= points[-1][0]:
            raise ValueError(f"a gap hint needs two levels with distinct positive values, "
                             f"got {quantiles}")
        (q_lo, t_lo), (q_hi, t_hi) = points[0], points[-1]
        z_lo, z_hi = float(ndtri(q_lo)), float(ndtri(q_hi))
        sigma = math.log(t_hi / t_lo) / (z_hi - z_lo)
        return cls(LogNormal(math.log(t_lo) - sigma * z_lo, sigma), source="hint")

    def __post_init__(self) -> None:
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError(f"scale must be a positive number, got {self.scale}")
        if not (self.elapsed_s >= 0 and math.isfinite(self.elapsed_s)):
            raise ValueError(f"elapsed_s must be a finite number >= 0, got {self.elapsed_s}")
        object.__setattr__(self, "_gone", float(self._unconditional(np.array(self.elapsed_s))))

    def _unconditional(self, t: np.ndarray) -> np.ndarray:
        return self.shape.cdf(np.asarray(t, dtype=float) / self.scale)

    # -- the conditioned distribution ------------------------------------------------------
    def cdf(self, t: Any) -> Any:
        """P(back by `t` seconds after the gap's start | still gone at `elapsed_s`)."""
        t = np.asarray(t, dtype=float)
        if self._gone >= 1.0:  # past the shape's support (a baseline without a tail)
            out = np.where(t >= self.elapsed_s, 1.0, 0.0)
        else:
            out = np.clip((self._unconditional(t) - self._gone) / (1.0 - self._gone), 0.0, 1.0)
        return _like(out, t)

    def survival(self, t: Any) -> Any:
        """P(still gone at `t` | still gone at `elapsed_s`)."""
        t = np.asarray(t, dtype=float)
        return _like(1.0 - np.asarray(self.cdf(t)), t)

    def quantile(self, q: Any) -> Any:
        """The gap length (from its start) by which the program is back with probability `q`,
        given that it was still gone at `elapsed_s`; `q = 1` may be infinite."""
        q = np.asarray(q, dtype=float)
        if np.any((q < 0) | (q > 1)):
            raise ValueError(f"quantile levels must be in [0, 1], got {q}")
        level = self._gone + q * (1.0 - self._gone)
        out = np.maximum(self.scale * self.shape.quantile(level), self.elapsed_s)
        return _like(out, q)

    def mean(self, cap_s: float | None = None) -> float:
        """E[min(gap, cap)] given still gone at `elapsed_s` (cap: `mean_cap_s`)."""
        cap = self.mean_cap_s if cap_s is None else cap_s
        start = self.elapsed_s
        if cap <= start:
            return float(start)
        grid = np.geomspace(max(start, MEAN_GRID_START_S), cap, MEAN_GRID)
        if start < grid[0]:
            grid = np.concatenate(([start], grid))
        return float(start + np.trapezoid(np.asarray(self.survival(grid)), grid))

    # -- what an eviction asks -------------------------------------------------------------
    def p_back_within(self, horizon_s: float) -> float:
        """P(back within the next `horizon_s` seconds), counted from `elapsed_s`: the chance
        that keeping the program's KV cache that long is used."""
        return float(self.cdf(self.elapsed_s + horizon_s))

    def expected_wait_s(self, cap_s: float | None = None) -> float:
        """Expected seconds from now until the program is back (the gap capped as in `mean`)."""
        return self.mean(cap_s) - self.elapsed_s

    def given(self, elapsed_s: float) -> GapForecast:
        """The same forecast for a program gone `elapsed_s` (a decreasing hazard: the longer
        it has been gone, the later it is expected)."""
        return replace(self, elapsed_s=elapsed_s)

    def hint(self, levels: tuple[float, ...] = HINT_LEVELS) -> dict[str, float]:
        """Quantiles as ``tool_start``'s ``predicted_q`` sends them: ``{"p50": s, ...}``,
        each capped at `mean_cap_s` (an event carries finite numbers only)."""
        values = np.minimum(np.asarray(self.quantile(np.array(levels))), self.mean_cap_s)
        return {f"p{round(q * 100)}": round(float(v), 3) for q, v in zip(levels, values,
                                                                           strict=True)}


def _like(out: np.ndarray, given: np.ndarray) -> Any:
    """A float for a scalar argument, else the array."""
    return float(out) if given.ndim == 0 else out
