"""How far one session's gaps sit from its kind's pool, shrunk toward the pool while it has
few (empirical Bayes).

Each gap a session shows gives one residual ``r = ln(gap / median)`` against the median of the
pool it was forecast from (both floored at `gap_floor_s`, so an instant return does not weigh
as minus infinity), centred on the mean residual of every session of the kind (log gaps are
skewed, so the median alone would move the average session). Read the centred residuals as
``r = d_s + e``: a session level ``d_s`` drawn with variance ``tau2`` around the pool, and
noise of variance ``sigma2`` within the session. The session's expected level after ``n``
residuals is then their sum over ``n + kappa`` with ``kappa = sigma2 / tau2``: no shift with
none, their mean with many, and in between as much as the data can tell the session from the
pool. A forecast multiplies the pool's gaps by ``exp(level)`` (`predictor.gaps.forecast`).

``kappa`` is fitted per kind from the sessions themselves (method of moments over sessions
with two residuals or more: ``sigma2`` the pooled within-session variance, ``tau2`` the
variance of the session means less what their noise explains), refitted every
`refit_every` residuals of the kind; until `MIN_SESSIONS` sessions can say, it is
`DEFAULT_KAPPA` (four gaps of the session weigh as much as the pool). Over the public Claude
Code sessions (trace_0001..0400) the fit gives about 3.3 for tool gaps and 2.6 for a
person's.

Why a scale on the pool and not a distribution per session: a session has tens of gaps, too
few for a tail of its own, and its gaps look like the pool's at another pace (a session that
runs test suites waits longer on every tool, a person who answers at once answers at once
again); the pool keeps the shape and the tail, the session sets the pace. What a scale cannot
say: gaps fixed in seconds whatever the pace, such as a tool's timeout (the Claude Code
sessions have piles at about 125 s and 305 s), are moved with it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

#: kappa until enough sessions can say (a session's four gaps weigh as much as the pool).
DEFAULT_KAPPA = 4.0
#: Sessions with two residuals or more that a fit of kappa needs.
MIN_SESSIONS = 5
#: kappa's range: from a session that is nearly all its own gaps to one that is the pool.
KAPPA_RANGE = (0.25, 1000.0)
#: Residuals of a kind between two fits of its kappa.
DEFAULT_REFIT_EVERY = 256
#: Sessions remembered (least recently seen forgotten first).
DEFAULT_MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class SessionLevel:
    """A session's level against its kind's pool: its gaps are ``exp(log_shift)`` times the
    pool's; learnt from `n` residuals."""

    log_shift: float = 0.0
    n: int = 0


NO_SESSION = SessionLevel()


@dataclass
class _Residuals:
    n: int = 0
    total: float = 0.0
    squares: float = 0.0


class SessionShifts:
    """Residuals per (kind, session) and the shrinkage of each kind (module docstring)."""

    def __init__(self, refit_every: int = DEFAULT_REFIT_EVERY,
                 max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        if refit_every < 1 or max_sessions < 1:
            raise ValueError("refit_every and max_sessions must be at least 1")
        self.refit_every = refit_every
        self.max_sessions = max_sessions
        self._residuals: OrderedDict[tuple[str, str], _Residuals] = OrderedDict()
        self._kappa: dict[str, float] = {}
        self._since_fit: dict[str, int] = {}
        self._kinds: dict[str, _Residuals] = {}  # every residual of a kind, for its centre

    def add(self, kind: str, session: str, residual: float) -> None:
        """One residual ``ln(gap / pool median)`` of `session`'s gaps of `kind`."""
        key = (kind, session)
        stats = self._residuals.pop(key, None) or _Residuals()
        stats.n += 1
        stats.total += residual
        stats.squares += residual * residual
        self._residuals[key] = stats
        pooled = self._kinds.setdefault(kind, _Residuals())
        pooled.n += 1
        pooled.total += residual
        while len(self._residuals) > self.max_sessions:
            self._residuals.popitem(last=False)
        self._since_fit[kind] = self._since_fit.get(kind, 0) + 1
        if self._since_fit[kind] >= self.refit_every:
            self._fit(kind)

    def kappa(self, kind: str) -> float:
        return self._kappa.get(kind, DEFAULT_KAPPA)

    def level(self, kind: str, session: str) -> SessionLevel:
        """The session's shrunk level for its next gap of `kind`."""
        stats = self._residuals.get((kind, session))
        if stats is None or stats.n == 0:
            return NO_SESSION
        kappa = self.kappa(kind)
        n = stats.n
        pooled = self._kinds[kind]
        centred = stats.total - n * pooled.total / pooled.n
        return SessionLevel(centred / (n + kappa), n)

    def _fit(self, kind: str) -> None:
        self._since_fit[kind] = 0
        rows = [s for (k, _), s in self._residuals.items() if k == kind and s.n >= 2]
        if len(rows) < MIN_SESSIONS:
            return
        n = np.array([s.n for s in rows], dtype=float)
        means = np.array([s.total for s in rows]) / n
        within = np.array([s.squares for s in rows]) - n * means**2
        sigma2 = float(max(within.sum(), 0.0) / (n - 1.0).sum())
        tau2 = float(means.var(ddof=1) - np.mean(sigma2 / n))
        low, high = KAPPA_RANGE
        self._kappa[kind] = high if tau2 <= sigma2 / high else max(low, sigma2 / tau2)
