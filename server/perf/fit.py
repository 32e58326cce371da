"""Fitting the step-time form to measured steps (a table of `harness profile`, or hand-made).

Why a fit and not the measurements themselves: the emulator prices batches no table holds, so
a table is summarised by the coefficients of the step form (`server.perf.step_form`). They are
found by non-negative least squares (`scipy.optimize.nnls`; a negative cost has no meaning),
the knee by a 1-D search: for a fixed knee the form is linear in the coefficients.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from server.perf.step_form import Coefficients, StepFeatures


@dataclass(frozen=True)
class Fit:
    """Coefficients fitted to `n` measured steps, and how far off they are."""

    coefficients: Coefficients
    rms_relative_error: float
    max_relative_error: float
    n: int


def fit_coefficients(features: Sequence[StepFeatures], seconds: Sequence[float]) -> Fit:
    """Non-negative least squares of t = c0 + c1*max(T, knee) + c2*A + c3*D + c4*S.

    For a fixed knee the form is linear, so nnls is solved for each candidate knee (0, every
    distinct T in the data, and a geometric grid between) and the best one kept. Rows are
    weighted by 1/t so that small decode steps count as much as big prefills (relative error).
    """
    # numpy, scipy: start-up cost (scipy.optimize ~0.9 s); only fitting a table needs them
    import numpy as np
    from scipy.optimize import nnls

    if len(features) != len(seconds):
        raise ValueError("features and seconds differ in length")
    if len(features) < 5:
        raise ValueError(f"need at least 5 measurements to fit 5 coefficients, got {len(features)}")
    y = np.asarray(seconds, dtype=float)
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("measured seconds must be positive numbers")
    rows = np.array([f.as_row() for f in features], dtype=float)
    T, A, D, S = rows.T
    w = 1.0 / y

    def solve(knee: float) -> tuple[float, Any]:
        X = np.column_stack([np.ones_like(T), np.maximum(T, knee), A, D, S])
        scale = np.abs(X).max(axis=0)  # column scaling keeps nnls well conditioned
        scale[scale == 0] = 1.0
        coef = nnls((X / scale) * w[:, None], y * w)[0] / scale
        return float(np.sum(((X @ coef - y) / y) ** 2)), coef

    tmax = float(T.max())
    grid = {0.0, *map(float, np.unique(T))}
    if tmax > 1:
        grid.update(float(x) for x in np.geomspace(1.0, tmax, 64))
    candidates = sorted(grid)
    best: tuple[float, float, Any] | None = None
    for knee in candidates:
        err, coef = solve(knee)
        # Strictly better only: among equal fits keep the smallest knee.
        if best is None or err < best[0] * (1 - 1e-9) - 1e-30:
            best = (err, knee, coef)
    assert best is not None
    # Refine between the neighbours of the best grid knee (golden-section search).
    i = candidates.index(best[1])
    lo, hi = candidates[max(i - 1, 0)], candidates[min(i + 1, len(candidates) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo + (1 - ratio) * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = solve(a), solve(b)
    for _ in range(60):
        if hi - lo < 1e-6 * max(1.0, hi):
            break
        if fa[0] <= fb[0]:
            hi, b, fb = b, a, fa
            a = lo + (1 - ratio) * (hi - lo)
            fa = solve(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = solve(b)
    for knee, (err, coef) in ((a, fa), (b, fb)):
        if err < best[0] * (1 - 1e-9) - 1e-30:
            best = (err, float(knee), coef)
    _, knee, coef = best
    c0, c1, c2, c3, c4 = (float(x) for x in coef)
    c = Coefficients(c0=c0, c1=c1, knee=float(knee), c2=c2, c3=c3, c4=c4)
    rel = np.array([(c.evaluate(f) - t) / t for f, t in zip(features, y, strict=True)])
    return Fit(
        coefficients=c,
        rms_relative_error=float(np.sqrt(np.mean(rel**2))),
        max_relative_error=float(np.max(np.abs(rel))),
        n=len(y),
    )
