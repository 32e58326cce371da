"""How well gap forecasts hold: an online pass over a trace's gaps, each forecast made before
its gap is learnt, scored against what happened.

The pass meets programs in the trace's order and each program's gaps in turn order, as one
client that ran the sessions one after another would: a model forecasts a gap, then observes
it. Programs are the sessions (a sub-agent is one of its own). For each model, gap kind and
elapsed time ``e`` (a forecast for a program gone ``e`` seconds, over the gaps longer than
``e``) the report gives:

* reliability: for each horizon ``t`` of `DEFAULT_GRID_S`, the mean forecast probability of
  being back within ``t`` more seconds against the share of gaps that were (``gap <= e + t``);
  a calibrated model has the two equal at every ``t``;
* pinball losses at `DEFAULT_LEVELS` and the CRPS, on ``ln(1 + gap)``: gaps span five orders
  of magnitude, and in seconds the score would be the few longest gaps' alone. The CRPS is
  twice the pinball loss averaged over `CRPS_LEVELS` quantile levels (its quantile form), which
  needs no density: the empirical body has none. Lower is better for both.

Models compared (`default_models`): the gap model (`predictor.gaps.model`), the pooled
empirical CDF per kind (no session level, no tail: `POOLED`) and today's point estimate
(`PointEstimate`: the mean of `predictor.durations.ToolDurationModel` under the turn's tool
key, the figure the harness sends as ``predicted_s``, read as an exponential).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from common.trace import GAP_KINDS, Trace
from predictor.durations import ToolDurationModel
from predictor.gaps.forecast import GapForecast
from predictor.gaps.model import POOLED, GapModel
from predictor.gaps.shapes import Exponential

#: Horizons of the reliability table, seconds.
DEFAULT_GRID_S = (1.0, 10.0, 60.0, 300.0, 1800.0)
#: Quantile levels of the pinball losses.
DEFAULT_LEVELS = (0.1, 0.5, 0.9)
#: Quantile levels the CRPS averages over (midpoints of 50 equal slices of [0, 1]).
CRPS_LEVELS = (np.arange(50) + 0.5) / 50
#: The smallest mean an exponential baseline is given (a tool whose calls all took 0 s).
MIN_POINT_MEAN_S = 1e-3
#: What the report's rows over every kind are called.
ALL_KINDS = "all"


@dataclass(frozen=True)
class Gap:
    """One gap of a trace: whose (`session`), what kind, after which tool key, how long."""

    session: str
    kind: str
    tool_key: str
    seconds: float


def trace_gaps(trace: Trace) -> list[Gap]:
    """The trace's gaps in the order the online pass meets them (module docstring)."""
    return [Gap(program.id, turn.gap_kind, turn.tool or turn.gap_kind, turn.tool_seconds)
            for program in trace.programs for turn in program.turns[:-1]]


class Forecaster(Protocol):
    """What the pass compares: a model that forecasts a gap, then learns it."""

    def predict(self, session: str, kind: str, tool_key: str | None = None,
                elapsed_s: float = 0.0) -> GapForecast: ...

    def observe(self, session: str, kind: str, tool_key: str | None, gap_s: float) -> None: ...


class PointEstimate:
    """Today's client prediction as a distribution: the tool-duration chain's mean under the
    turn's tool key (what `predicted_s` carries; its prior's 1 s before any data), read as an
    exponential with that mean. It knows no kinds nor sessions beyond the tool key."""

    def __init__(self) -> None:
        self.durations = ToolDurationModel()

    def predict(self, session: str, kind: str, tool_key: str | None = None,
                elapsed_s: float = 0.0) -> GapForecast:
        key = tool_key or kind
        shape = Exponential(max(self.durations.mean(key), MIN_POINT_MEAN_S))
        return GapForecast(shape, elapsed_s=elapsed_s, source="point")

    def observe(self, session: str, kind: str, tool_key: str | None, gap_s: float) -> None:
        self.durations.observe(tool_key or kind, gap_s)


def default_models() -> dict[str, Forecaster]:
    """The gap model and the two baselines, fresh."""
    return {"gap model": GapModel(), "pooled": GapModel(POOLED), "point (exp)": PointEstimate()}


@dataclass(frozen=True)
class CalibrationRow:
    """One model's figures over one kind's gaps (`ALL_KINDS`: every kind) at one elapsed
    time: `n` gaps; per horizon the mean `predicted` probability of being back within it and
    the `observed` share; per quantile level the mean `pinball` loss, and the `crps`, both on
    ``ln(1 + gap)``."""

    model: str
    kind: str
    elapsed_s: float
    n: int
    predicted: tuple[float, ...]
    observed: tuple[float, ...]
    pinball: tuple[float, ...]
    crps: float

    @property
    def reliability_error(self) -> float:
        """Mean absolute difference of predicted and observed over the horizons."""
        return float(np.mean(np.abs(np.subtract(self.predicted, self.observed))))


@dataclass(frozen=True)
class CalibrationReport:
    """The rows of a pass, and what they were computed over."""

    grid_s: tuple[float, ...]
    levels: tuple[float, ...]
    elapsed_s: tuple[float, ...]
    n_gaps: int
    n_sessions: int
    rows: tuple[CalibrationRow, ...]

    def row(self, model: str, kind: str = ALL_KINDS, elapsed_s: float = 0.0) -> CalibrationRow:
        for r in self.rows:
            if (r.model, r.kind, r.elapsed_s) == (model, kind, elapsed_s):
                return r
        raise KeyError(f"no row for {model!r}, {kind!r}, elapsed {elapsed_s}")


class _Sums:
    """Running sums of one row."""

    def __init__(self, horizons: int, levels: int) -> None:
        self.n = 0
        self.predicted = np.zeros(horizons)
        self.observed = np.zeros(horizons)
        self.pinball = np.zeros(levels)
        self.crps = 0.0

    def add(self, predicted: np.ndarray, observed: np.ndarray, pinball: np.ndarray,
            crps: float) -> None:
        self.n += 1
        self.predicted += predicted
        self.observed += observed
        self.pinball += pinball
        self.crps += crps


def pinball(quantiles: np.ndarray, levels: np.ndarray, actual: float) -> np.ndarray:
    """The pinball (quantile) loss of each forecast quantile of ``ln(1 + gap)`` at its level,
    for the gap `actual`; quantiles in seconds."""
    diff = np.log1p(actual) - np.log1p(quantiles)
    return np.maximum(levels * diff, (levels - 1.0) * diff)


def calibrate(gaps: Sequence[Gap], models: Mapping[str, Forecaster] | None = None, *,
              grid_s: Sequence[float] = DEFAULT_GRID_S,
              levels: Sequence[float] = DEFAULT_LEVELS,
              elapsed_s: Sequence[float] = (0.0,)) -> CalibrationReport:
    """The online pass over `gaps` (module docstring) for each of `models` (default:
    `default_models`); rows per model, kind present and elapsed time, then over all kinds."""
    if not gaps:
        raise ValueError("no gaps to forecast: no program has two turns")
    models = default_models() if models is None else models
    grid = np.asarray(grid_s, dtype=float)
    level_array = np.asarray(levels, dtype=float)
    asked = np.concatenate((level_array, CRPS_LEVELS))
    present = {g.kind for g in gaps}
    kinds = [k for k in GAP_KINDS if k in present]
    sums = {(m, k, e): _Sums(grid.size, level_array.size)
            for m in models for k in (*kinds, ALL_KINDS) for e in elapsed_s}
    for gap in gaps:
        for name, model in models.items():
            for e in elapsed_s:
                if e and gap.seconds <= e:
                    continue
                forecast = model.predict(gap.session, gap.kind, gap.tool_key, e)
                losses = pinball(np.asarray(forecast.quantile(asked)), asked, gap.seconds)
                scores = (np.asarray(forecast.cdf(e + grid)),
                          (gap.seconds <= e + grid).astype(float),
                          losses[:level_array.size],
                          2.0 * float(losses[level_array.size:].mean()))
                sums[(name, gap.kind, e)].add(*scores)
                sums[(name, ALL_KINDS, e)].add(*scores)
            model.observe(gap.session, gap.kind, gap.tool_key, gap.seconds)
    rows = tuple(_row(key, s) for key, s in sums.items() if s.n)
    return CalibrationReport(tuple(float(t) for t in grid), tuple(float(q) for q in levels),
                             tuple(float(e) for e in elapsed_s), len(gaps),
                             len({g.session for g in gaps}), rows)


def _row(key: tuple[str, str, float], s: _Sums) -> CalibrationRow:
    model, kind, elapsed = key
    return CalibrationRow(model, kind, float(elapsed), s.n,
                          tuple(float(x) for x in s.predicted / s.n),
                          tuple(float(x) for x in s.observed / s.n),
                          tuple(float(x) for x in s.pinball / s.n), s.crps / s.n)
