"""Statistics of a trace (`common.trace`): what a report table says about a set of programs.

Why a module of its own: the format (`common.trace`) is the contract every replayer reads; the
statistics only read it, through a program's accounting helpers (``n_turns``, ``turns``,
``contexts()``, ``processed_tokens``, ``final_context_tokens``, ``arrival_s``, ``parent``), so
they import nothing from it and `common.trace` gives them on (``summarize``, ``summarize_by``,
``Trace.stats()``).

The rows of a version-1 trace are what they always were; a trace that uses the fields of
version 2 adds its longest prompt, its turns that keep only part of the conversation, its
sub-agents and the quantiles of the gaps of each kind (``tool``, ``person``, ``subagent``).
Those fields are left out of a version-1 trace's ``model_dump()`` too, so a saved summary of one
is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, model_serializer

from common.metrics import percentile

__all__ = ["GapQuantiles", "TraceStats", "summarize", "summarize_by"]

#: The fields only a trace that uses version 2 of the format reports.
_VERSION_2_FIELDS = ("version", "max_prompt", "kept_turns", "subagents", "gap_s")


class GapQuantiles(BaseModel):
    """The gaps (seconds after a turn's answer until the next request) of one kind."""

    n: int
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> GapQuantiles:
        return cls(n=len(values), p50=percentile(values, 50), p90=percentile(values, 90),
                   p99=percentile(values, 99), max=max(values) if values else math.nan)


class TraceStats(BaseModel):
    """Summary of a set of programs (per-call tool statistics, per-program token statistics)."""

    n_programs: int
    turns_mean: float
    turns_sd: float
    tool_calls: int
    tool_s_mean: float
    tool_s_sd: float
    tool_s_p50: float
    tool_s_p95: float
    tokens_per_program_mean: float
    tokens_per_program_sd: float
    tokens_total: int
    first_prompt_mean: float
    final_context_mean: float
    final_context_max: int
    output_tokens_per_turn_mean: float
    tool_return_tokens_mean: float
    arrival_span_s: float
    arrival_rate_jps: float
    # version 2 of the format: reported (and dumped) only when the programs use it
    version: int = 1
    max_prompt: int = 0
    kept_turns: int = 0
    subagents: int = 0
    gap_s: dict[str, GapQuantiles] = {}

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if self.version < 2:  # a version-1 trace's summary is what it always was
            for key in _VERSION_2_FIELDS:
                data.pop(key, None)
        return data

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs for a report table."""
        rows = [
            ("programs", f"{self.n_programs}"),
            ("turns / program", f"{self.turns_mean:.2f} ± {self.turns_sd:.2f}"),
            ("tool calls", f"{self.tool_calls}"),
            ("tool s (mean ± sd)", f"{self.tool_s_mean:.3f} ± {self.tool_s_sd:.3f}"),
            ("tool s p50 / p95", f"{self.tool_s_p50:.3f} / {self.tool_s_p95:.3f}"),
            (
                "tokens / program",
                f"{self.tokens_per_program_mean:,.0f} ± {self.tokens_per_program_sd:,.0f}",
            ),
            ("tokens total", f"{self.tokens_total:,}"),
            ("first prompt (mean)", f"{self.first_prompt_mean:,.0f}"),
            (
                "final context mean / max",
                f"{self.final_context_mean:,.0f} / {self.final_context_max:,}",
            ),
            ("output tokens / turn", f"{self.output_tokens_per_turn_mean:.1f}"),
            ("tool return tokens / call", f"{self.tool_return_tokens_mean:.1f}"),
            ("arrival rate (jobs/s)", f"{self.arrival_rate_jps:.3f}"),
        ]
        if self.version >= 2:
            rows += [
                ("longest prompt", f"{self.max_prompt:,}"),
                ("turns keeping part of the conversation", f"{self.kept_turns}"),
                ("sub-agents", f"{self.subagents}"),
            ]
            rows += [(f"{kind} gap s p50 / p90 / p99 / max (n)",
                      f"{q.p50:.2f} / {q.p90:.2f} / {q.p99:.2f} / {q.max:.2f} ({q.n})")
                     for kind, q in self.gap_s.items()]
        return rows

    def markdown(self) -> str:
        lines = ["| statistic | value |", "|---|---:|"]
        lines += [f"| {k} | {v} |" for k, v in self.rows()]
        return "\n".join(lines)


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    arr = np.asarray(values, dtype=float)
    sd = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return float(arr.mean()), sd


def _programs(programs: Any) -> list[Any]:
    """The programs of a trace, or the programs given."""
    return list(getattr(programs, "programs", programs))


def summarize(programs: Any) -> TraceStats:
    """Statistics of a trace (or of programs): turns per program, per-call tool seconds (the
    gaps of kind ``tool``), tokens per program (``Program.processed_tokens``), contexts and the
    arrival rate; for a trace that uses version 2, the longest prompt, kept-prefix turns,
    sub-agents and the gaps of each kind."""
    progs = _programs(programs)
    calls = [t for p in progs for t in p.turns[:-1] if t.gap_kind == "tool"]
    tool_s = [t.tool_seconds for t in calls]
    ret = [t.tool_return_tokens for t in calls]
    outs = [t.output_tokens for p in progs for t in p.turns]
    tokens = [p.processed_tokens for p in progs]
    finals = [p.final_context_tokens for p in progs]
    arrivals = sorted(p.arrival_s for p in progs)
    span = arrivals[-1] - arrivals[0] if arrivals else 0.0
    turns_mean, turns_sd = _mean_sd([p.n_turns for p in progs])
    tool_mean, tool_sd = _mean_sd(tool_s)
    tok_mean, tok_sd = _mean_sd(tokens)
    return TraceStats(
        n_programs=len(progs),
        turns_mean=turns_mean,
        turns_sd=turns_sd,
        tool_calls=len(tool_s),
        tool_s_mean=tool_mean,
        tool_s_sd=tool_sd,
        tool_s_p50=percentile(tool_s, 50),
        tool_s_p95=percentile(tool_s, 95),
        tokens_per_program_mean=tok_mean,
        tokens_per_program_sd=tok_sd,
        tokens_total=int(sum(tokens)),
        first_prompt_mean=_mean_sd([p.turns[0].input_tokens for p in progs])[0],
        final_context_mean=_mean_sd(finals)[0],
        final_context_max=max(finals) if finals else 0,
        output_tokens_per_turn_mean=_mean_sd(outs)[0],
        tool_return_tokens_mean=_mean_sd(ret)[0],
        arrival_span_s=span,
        arrival_rate_jps=(len(progs) - 1) / span if span > 0 else math.nan,
        **_version_2(progs),
    )


def _version_2(progs: list[Any]) -> dict[str, Any]:
    """The statistics of version 2's fields, when a program uses them ({} otherwise)."""
    version = max((p.version for p in progs), default=1)
    if version < 2:
        return {}
    gaps: dict[str, list[float]] = {}
    for p in progs:
        for t in p.turns[:-1]:
            gaps.setdefault(t.gap_kind, []).append(t.tool_seconds)
    return {
        "version": version,
        "max_prompt": max(before for p in progs for before, _ in p.contexts()),
        "kept_turns": sum(t.kept_tokens is not None for p in progs for t in p.turns),
        "subagents": sum(p.parent is not None for p in progs),
        "gap_s": {kind: GapQuantiles.of(gaps[kind]) for kind in sorted(gaps)},
    }


def summarize_by(programs: Any, key: str = "benchmark") -> dict[str, TraceStats]:
    """:func:`summarize` per value of a program field (``benchmark`` or ``source``)."""
    groups: dict[str, list[Any]] = {}
    for p in _programs(programs):
        groups.setdefault(str(getattr(p, key)), []).append(p)
    return {k: summarize(v) for k, v in sorted(groups.items())}
