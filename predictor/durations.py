"""Tool-call duration estimates: empirical distributions per command class and per tool, with
a cold-start chain.

Continuum (arXiv:2511.02230) chooses a KV-cache time-to-live from the *distribution* of a tool's
call durations, not from a point estimate, because agent tools are heavy-tailed and only
partly predictable. It keeps an empirical CDF per tool and, while a tool has too few samples,
falls back to the CDF of all tools and, with no data at all, to a fixed prior. One tool can hide
very different programs, though: a coding agent's `bash` runs `ls` in milliseconds and `pytest`
in tens of seconds. So the chain here starts one level earlier, at the command class:

    (tool, command class) -> tool -> all tools -> prior         e.g. bash:pytest -> bash -> *

This module holds those estimators; the TTL decision itself lives in `server.policies.continuum`.

Keys. A duration key is a plain tool name (`"calculator"`) or `"<tool>:<class>"`
(`"bash:pytest"`); `common.tool_keys` builds and splits them (and says why one string). Callers
that pass a plain tool name get the old two-level chain unchanged.

Point estimate. `mean` (and `median`, for reports) of the level the chain chose; the harness
sends the mean as its `predicted_s`. Pin time and a waiting program's delay add up over calls,
so the expected duration is the figure they trade against; and tool durations are right-skewed,
so the mean sits above the median and a pin sized from it returns in time more often: the
Continuum policy pins a predicted p for 1.2 p, which covers 70% of an exponential tool's calls
from the mean (1 - e^-1.2) but 56% from the median (1 - e^(-1.2 ln 2)).

Constants (all overridable per instance):

* `DEFAULT_WINDOW = 1000`: samples kept per distribution (a sliding window, so the estimate
  follows drift in a tool's behaviour, and memory and per-decision cost stay bounded).
* `DEFAULT_MIN_SAMPLES = 10`: samples a level of the chain needs before it is trusted.
* `DEFAULT_PRIOR_MEAN_S = 1.0`: the prior when nothing has been observed is Exp(mean 1 s), the
  cold-start assumption of Continuum; callers use its closed form (see `ToolDurationModel`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Iterator
from typing import Literal

from common.tool_keys import split_key

DEFAULT_WINDOW = 1000
DEFAULT_MIN_SAMPLES = 10
DEFAULT_PRIOR_MEAN_S = 1.0

#: Where an estimate came from, most specific first: the (tool, command class) key, the tool,
#: all tools, the prior.
Source = Literal["command", "tool", "global", "prior"]

#: Chain levels whose mean a client sends as `predicted_s`: data about this very command class
#: or tool. Not "global" (all tools) nor the prior: the server keeps the same chain over the same
#: keys and decides from the whole distribution, so a coarse point estimate sent as a prediction
#: would only replace a better decision.
PREDICTING_SOURCES: frozenset[str] = frozenset({"command", "tool"})

#: The key under which the all-tools distribution is kept (not a valid tool name to collide
#: with in practice: tool names come from agents' tool registries).
GLOBAL_KEY = "__global__"

class EmpiricalDistribution:
    """The empirical distribution of the last `window` samples.

    Samples are kept twice: in arrival order (to know which one leaves the window) and sorted
    (bisect insertion), so `cdf` and `quantile` are O(log n) and `add` is O(n) list shifting
    at worst, which for n <= 1000 is a few microseconds.
    """

    __slots__ = ("window", "_order", "_sorted")

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1 sample, got {window}")
        self.window = window
        self._order: deque[float] = deque()
        self._sorted: list[float] = []

    def add(self, x: float) -> None:
        """Add one sample; the oldest one leaves when the window is full."""
        x = float(x)
        if not math.isfinite(x):
            raise ValueError(f"sample must be a finite number, got {x!r}")
        if len(self._order) >= self.window:
            old = self._order.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
        self._order.append(x)
        insort(self._sorted, x)

    @property
    def count(self) -> int:
        return len(self._sorted)

    def __len__(self) -> int:
        return len(self._sorted)

    @property
    def mean(self) -> float:
        self._require_samples("mean")
        return math.fsum(self._sorted) / len(self._sorted)

    def cdf(self, tau: float) -> float:
        """P(X <= tau) under the empirical distribution."""
        self._require_samples("cdf")
        return bisect_right(self._sorted, tau) / len(self._sorted)

    def quantile(self, q: float) -> float:
        """The smallest sample x with P(X <= x) >= q (the inverse of the empirical CDF);
        q = 0 gives the minimum, q = 1 the maximum."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile level must be in [0, 1], got {q}")
        self._require_samples("quantile")
        n = len(self._sorted)
        return self._sorted[max(0, math.ceil(q * n) - 1)]

    def samples(self) -> list[float]:
        """The samples in the window, ascending (a copy: what a model fitted to them keeps)."""
        return list(self._sorted)

    def support(self) -> list[float]:
        """The sorted distinct observed values."""
        return [x for x, _ in self.steps()]

    def steps(self) -> Iterator[tuple[float, float]]:
        """(x, P(X <= x)) for each distinct observed x, ascending: the CDF's jump points, in
        one O(n) pass (what an argmax over candidate TTLs needs)."""
        data = self._sorted
        n = len(data)
        i = 0
        while i < n:
            x = data[i]
            j = bisect_right(data, x, i)
            yield x, j / n
            i = j

    def _require_samples(self, what: str) -> None:
        if not self._sorted:
            raise ValueError(f"{what} of an empty distribution: add samples first")

    def __repr__(self) -> str:
        return f"EmpiricalDistribution(count={self.count}, window={self.window})"


class ToolDurationModel:
    """Duration distributions per command class, per tool and for all tools; the cold-start
    chain over them.

    Every method takes a duration key (see the module docstring: `"bash:pytest"` or a plain
    `"ls"`). The chain (`chain(key)`) lists the levels to try, most specific first; `resolve`
    takes the first level with at least `min_samples` samples, else the prior. `observe` feeds
    every level of the chain, so one `bash:pytest` call counts for `bash:pytest`, for `bash` and
    for all tools: a coarser level always holds at least the samples of the finer ones, and a
    new class starts from its tool's distribution instead of from nothing.
    """

    def __init__(
        self,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        window: int = DEFAULT_WINDOW,
        prior_mean_s: float = DEFAULT_PRIOR_MEAN_S,
    ) -> None:
        if min_samples < 1:
            raise ValueError(f"min_samples must be at least 1, got {min_samples}")
        if not prior_mean_s > 0:
            raise ValueError(f"prior_mean_s must be positive, got {prior_mean_s}")
        self.min_samples = min_samples
        self.window = window
        self.prior_mean_s = prior_mean_s
        self._dists: dict[str, EmpiricalDistribution] = {}

    # -- the chain ---------------------------------------------------------------------
    def chain(self, key: str) -> list[tuple[Source, str]]:
        """The levels for `key`, most specific first, as (source, distribution key):
        `bash:pytest` -> command `bash:pytest`, tool `bash`, global; `ls` -> tool `ls`, global."""
        tool, command = split_key(key)
        levels: list[tuple[Source, str]] = [("tool", tool), ("global", GLOBAL_KEY)]
        return [("command", key), *levels] if command is not None else levels

    def resolve(self, key: str) -> tuple[Source, EmpiricalDistribution | None]:
        """The first level of the chain with enough samples, or ("prior", None)."""
        for source, level in self.chain(key):
            dist = self._dists.get(level)
            if dist is not None and dist.count >= self.min_samples:
                return source, dist
        return "prior", None

    def source_for(self, key: str) -> Source:
        return self.resolve(key)[0]

    # -- data --------------------------------------------------------------------------
    def observe(self, key: str, seconds: float) -> None:
        """Record one call under `key` that took `seconds` (finite, >= 0), at every level of
        its chain (each level keeps its own sliding window)."""
        seconds = float(seconds)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"a tool duration must be a finite number >= 0, got {seconds!r}")
        for _, level in self.chain(key):
            dist = self._dists.get(level)
            if dist is None:
                dist = self._dists[level] = EmpiricalDistribution(self.window)
            dist.add(seconds)

    def count(self, key: str) -> int:
        """Samples held for `key` itself (not the chain): `count("bash:pytest")` is the pytest
        calls, `count("bash")` all bash calls."""
        dist = self._dists.get(key)
        return dist.count if dist is not None else 0

    @property
    def global_count(self) -> int:
        dist = self._dists.get(GLOBAL_KEY)
        return dist.count if dist is not None else 0

    def counts(self) -> dict[str, int]:
        """Samples per distribution key (command classes, tools, and `GLOBAL_KEY`)."""
        return {key: dist.count for key, dist in sorted(self._dists.items())}

    # -- estimates from the chosen level -----------------------------------------------
    def cdf(self, key: str, tau: float) -> float:
        """P(duration <= tau) at the chosen level; under the prior, 1 - exp(-tau / prior_mean_s)."""
        _, dist = self.resolve(key)
        if dist is None:
            return 0.0 if tau <= 0 else 1.0 - math.exp(-tau / self.prior_mean_s)
        return dist.cdf(tau)

    def candidates(self, key: str) -> list[float]:
        """TTL candidates: 0 plus the distinct observed durations of the chosen level.

        Empty under the prior: there is no sample to try, and the caller uses the prior's
        closed form instead (`prior_mean_s * ln(B / prior_mean_s)`, see the Continuum policy).
        """
        _, dist = self.resolve(key)
        if dist is None:
            return []
        values = dist.support()
        return values if values and values[0] == 0.0 else [0.0, *values]

    def client_prediction(self, key: str) -> tuple[Source, float | None]:
        """What a client sends as `predicted_s` for a call under `key`, and the level it came
        from: the mean of the chosen level when that level is the command class or the tool
        (`PREDICTING_SOURCES`), else None."""
        source, dist = self.resolve(key)
        if dist is None or source not in PREDICTING_SOURCES:
            return source, None
        return source, dist.mean

    def mean(self, key: str) -> float:
        """Mean duration from the chosen level (the prior's mean when it is the prior): the
        point estimate the harness sends, see the module docstring for why the mean."""
        _, dist = self.resolve(key)
        return self.prior_mean_s if dist is None else dist.mean

    def median(self, key: str) -> float:
        """Median duration from the chosen level (the prior's, m ln 2, under the prior): the
        typical call, robust to the tail, for reports."""
        _, dist = self.resolve(key)
        return self.prior_mean_s * math.log(2) if dist is None else dist.quantile(0.5)

    def own(self, key: str) -> EmpiricalDistribution | None:
        """The key's own distribution whatever its size (None: never observed)."""
        return self._dists.get(key)

    def distribution(self, key: str) -> EmpiricalDistribution | None:
        """The chosen level's distribution (None under the prior)."""
        return self.resolve(key)[1]
