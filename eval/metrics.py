"""The one metrics module: latency summaries every report uses (JCT, TTFT, queueing)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values: Sequence[float], prefix: str) -> dict[str, float]:
    """`{prefix}_mean_s, _p50_s, _p95_s, _p99_s` for a list of seconds."""
    mean = sum(values) / len(values) if values else math.nan
    return {f"{prefix}_mean_s": mean, f"{prefix}_p50_s": percentile(values, 50),
            f"{prefix}_p95_s": percentile(values, 95), f"{prefix}_p99_s": percentile(values, 99)}
