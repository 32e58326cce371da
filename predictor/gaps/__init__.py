"""When a program will be back: distributions of the gaps between an agent's requests.

`model` learns them online per gap kind (tool, person, sub-agent) and tool key, with a level
per session shrunk toward its kind's pool (`sessions`); a `GapForecast` (`forecast`) answers
CDF, survival, quantiles, a capped mean and what an eviction asks, conditioned on how long the
program has been gone; `shapes` are the distributions under it (an empirical body with a
Pareto tail, the log-normal prior, the exponential of a point estimate); `calibration` scores
forecasts on a trace's gaps against two baselines (`harness predictor gaps`).
"""

from __future__ import annotations

from predictor.gaps.calibration import (
    CalibrationReport,
    CalibrationRow,
    Gap,
    PointEstimate,
    calibrate,
    default_models,
    trace_gaps,
)
from predictor.gaps.forecast import GapForecast
from predictor.gaps.model import POOLED, GapModel, GapModelConfig
from predictor.gaps.shapes import Exponential, LogNormal, TailedEmpirical

__all__ = [
    "POOLED",
    "CalibrationReport",
    "CalibrationRow",
    "Exponential",
    "Gap",
    "GapForecast",
    "GapModel",
    "GapModelConfig",
    "LogNormal",
    "PointEstimate",
    "TailedEmpirical",
    "calibrate",
    "default_models",
    "trace_gaps",
]
