"""The gap model: what the client knows about when a program will be back, learnt online.

A program is gone between its requests: a tool runs (``tool``), a person reads and answers
(``person``, after the model hands the turn back) or sub-agents work (``subagent``); the kinds
of `common.trace`'s format version 2. What is known when a gap starts is its kind, the tool's
key (`common.tool_keys`: ``bash:pytest``) and the session's own past gaps. The model keeps:

* a pool per kind: the gaps seen of that kind, with the same cold-start chain over tool keys
  as the tool-duration estimates (`predictor.durations.ToolDurationModel`: command class,
  tool, the whole kind, each level used once it has `min_samples` gaps), read as an empirical
  distribution with a Pareto tail (`predictor.gaps.shapes.TailedEmpirical`, which says why);
  a kind with too few gaps is forecast from a log-normal prior (`DEFAULT_PRIORS`);
* a level per session and kind: how far the session's gaps sit from the pool in log space,
  shrunk toward the pool while it has few (`predictor.gaps.sessions`, empirical Bayes).

`predict(session, kind, tool_key, elapsed_s)` gives a `GapForecast` (the pool's shape moved to
the session, conditioned on the program being gone `elapsed_s`); `observe` learns one gap;
`tool_start_fields` is what a client sends of a forecast when the gap starts. A
forecast made before a gap is observed is an honest one: `predictor.gaps.calibration` runs
that online pass over a trace and reports how well the forecasts hold.

With ``sessions=False`` and ``tail_fraction=0`` the model is the pooled empirical CDF per kind:
the baseline the calibration compares against.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from common.trace import GAP_KINDS
from predictor.durations import DEFAULT_MIN_SAMPLES, ToolDurationModel
from predictor.gaps.forecast import DEFAULT_MEAN_CAP_S, GapForecast
from predictor.gaps.sessions import (
    DEFAULT_REFIT_EVERY,
    NO_SESSION,
    SessionShifts,
)
from predictor.gaps.shapes import DEFAULT_TAIL_FRACTION, LogNormal, Shape, TailedEmpirical

#: Gaps kept per pool level: a sliding window, larger than the tool durations' 1000 because a
#: tail is fitted to the top tenth of it.
DEFAULT_WINDOW = 2000
#: Gaps shorter than this count as this long in a session's level: an instant return says the
#: session is quick, not infinitely so.
DEFAULT_GAP_FLOOR_S = 0.1

#: The prior per kind before a pool has `min_samples` gaps: log-normals through the published
#: medians and 90th percentiles of public Claude Code sessions (tool 9 s / 74 s, person 121 s /
#: 1,506 s); sub-agents, which run their own requests, a few minutes (120 s / 600 s).
DEFAULT_PRIORS: Mapping[str, Shape] = MappingProxyType({
    "tool": LogNormal.from_quantiles(9.0, 74.0),
    "person": LogNormal.from_quantiles(121.0, 1506.0),
    "subagent": LogNormal.from_quantiles(120.0, 600.0),
})


@dataclass(frozen=True)
class GapModelConfig:
    """How a `GapModel` learns: `min_samples` gaps a pool level needs, the `window` of gaps
    it keeps, the `tail_fraction` read as a power law (0: none), whether sessions get their
    own level (`sessions`), how often each kind's shrinkage is refitted, the `gap_floor_s` of a
    session's residuals, the cap on a forecast's mean and the prior per kind."""

    min_samples: int = DEFAULT_MIN_SAMPLES
    window: int = DEFAULT_WINDOW
    tail_fraction: float = DEFAULT_TAIL_FRACTION
    sessions: bool = True
    refit_every: int = DEFAULT_REFIT_EVERY
    gap_floor_s: float = DEFAULT_GAP_FLOOR_S
    mean_cap_s: float = DEFAULT_MEAN_CAP_S
    priors: Mapping[str, Shape] = field(default_factory=lambda: DEFAULT_PRIORS)

    def __post_init__(self) -> None:
        missing = set(GAP_KINDS) - set(self.priors)
        if missing:
            raise ValueError(f"priors lack the gap kinds {sorted(missing)}")
        if not self.gap_floor_s > 0:
            raise ValueError(f"gap_floor_s must be positive, got {self.gap_floor_s}")


#: The pooled baseline: the empirical CDF per kind, no session level, no tail.
POOLED = GapModelConfig(sessions=False, tail_fraction=0.0)


class GapModel:
    """Gap distributions per kind (and tool key) and levels per session (module docstring)."""

    def __init__(self, config: GapModelConfig | None = None) -> None:
        self.config = config = config or GapModelConfig()
        self._pools = {kind: ToolDurationModel(min_samples=config.min_samples,
                                               window=config.window) for kind in GAP_KINDS}
        self._sessions = SessionShifts(config.refit_every)
        #: fitted shapes per (kind, level key), with the kind's count when fitted
        self._shapes: dict[tuple[str, str], tuple[int, TailedEmpirical]] = {}
        self._seen = dict.fromkeys(GAP_KINDS, 0)

    def observe(self, session: str, kind: str, tool_key: str | None, gap_s: float) -> None:
        """Learn one gap of `kind` after a call under `tool_key` (None: the kind's name) in
        `session`; `gap_s` finite and >= 0."""
        gap_s = float(gap_s)
        if not math.isfinite(gap_s) or gap_s < 0:
            raise ValueError(f"a gap must be a finite number of seconds >= 0, got {gap_s!r}")
        key = self._key(kind, tool_key)
        if self.config.sessions:
            _, shape = self._shape(kind, key)
            floor = self.config.gap_floor_s
            residual = math.log(max(gap_s, floor) / max(shape.median, floor))
            self._sessions.add(kind, session, residual)
        self._pools[kind].observe(key, gap_s)
        self._seen[kind] += 1

    def predict(self, session: str, kind: str, tool_key: str | None = None,
                elapsed_s: float = 0.0) -> GapForecast:
        """The forecast of `session`'s gap of `kind` after a call under `tool_key`, given that
        the program has been gone `elapsed_s` seconds."""
        key = self._key(kind, tool_key)
        source, shape = self._shape(kind, key)
        level = self._sessions.level(kind, session) if self.config.sessions else NO_SESSION
        return GapForecast(shape, scale=math.exp(level.log_shift),
                           elapsed_s=elapsed_s, source=source, session_gaps=level.n,
                           mean_cap_s=self.config.mean_cap_s)

    def tool_start_fields(self, session: str, kind: str,
                          tool_key: str | None = None) -> dict[str, Any]:
        """What a client adds to ``tool_start`` for the gap that starts: its kind and the
        forecast's quantiles (``gap_kind``, ``predicted_q``); the one place both clients, the
        agent loop (`harness.agent`) and the replayed one (`sim.client`), take them from."""
        return {"gap_kind": kind,
                "predicted_q": self.predict(session, kind, tool_key).hint()}

    def kappa(self, kind: str) -> float:
        """The shrinkage of `kind`'s session levels: a session's gaps weigh as much as the
        pool after this many (`predictor.gaps.sessions`)."""
        return self._sessions.kappa(kind)

    def count(self, kind: str) -> int:
        """Gaps of `kind` observed."""
        return self._seen[self._checked(kind)]

    # -- internals -------------------------------------------------------------------------
    def _key(self, kind: str, tool_key: str | None) -> str:
        self._checked(kind)
        return tool_key or kind

    @staticmethod
    def _checked(kind: str) -> str:
        if kind not in GAP_KINDS:
            raise ValueError(f"gap kind {kind!r}: choose one of {', '.join(GAP_KINDS)}")
        return kind

    def _shape(self, kind: str, key: str) -> tuple[str, Shape]:
        """The chosen pool level's shape (fitted once per new gap of the kind), or the prior."""
        pool = self._pools[kind]
        source, dist = pool.resolve(key)
        if dist is None:
            return source, self.config.priors[kind]
        level = dict(pool.chain(key))[source]
        seen = self._seen[kind]
        cached = self._shapes.get((kind, level))
        if cached is None or cached[0] != seen:
            cached = (seen, TailedEmpirical.fit(dist.samples(), self.config.tail_fraction))
            self._shapes[(kind, level)] = cached
        return source, cached[1]
