"""Trajectory files: one file as a program, many as a trace."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from common.trace import Program, Trace, TraceFormatError
from eval.workloads.arrivals import retime
from eval.workloads.importers.formats import import_trajectory
from eval.workloads.importers.shared import seconds


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".traj.json", ".traj", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def import_file(path: str | Path, fmt: str = "auto", **kwargs: Any) -> Program:
    """One trajectory file; the program id defaults to the file name without its suffix.
    Errors name the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: not a JSON trajectory ({exc})") from None
    kwargs.setdefault("program_id", _stem(path))
    try:
        return import_trajectory(data, fmt, **kwargs)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None
    except ValueError as exc:  # pydantic validation of the built program
        raise TraceFormatError(f"{path}: the trajectory gives an invalid program: {exc}") from None


def trace_from_files(
    paths: Iterable[str | Path],
    *,
    name: str,
    fmt: str = "auto",
    jps: float | None = None,
    seed: int = 0,
    description: str = "",
    **kwargs: Any,
) -> Trace:
    """A trace of recorded trajectories. Arrivals: a Poisson process at ``jps`` when given
    (in the order of ``paths``); else harness trajectories arrive at their ``started_at``
    relative to the earliest, and others all at 0."""
    files = [Path(p) for p in paths]
    if not files:
        raise ValueError("no trajectory files given")
    programs = [import_file(p, fmt, **kwargs) for p in files]
    if jps is None:
        programs = _at_recorded_starts(programs, [_started_at(p) for p in files])
    trace = Trace(
        name=name,
        description=description or f"{len(programs)} recorded trajectories",
        params={"imported": [str(p) for p in files], "fmt": fmt},
        programs=programs,
    )
    return retime(trace, jps, seed) if jps is not None else trace


def _started_at(path: Path) -> float | None:
    """The file's recorded ``started_at`` (harness trajectories), or None."""
    try:
        started = json.loads(path.read_text(encoding="utf-8")).get("started_at")
    except (AttributeError, json.JSONDecodeError):
        started = None
    return seconds(started)


def _at_recorded_starts(programs: list[Program], starts: list[float | None]) -> list[Program]:
    """The programs arriving at their recorded starts relative to the earliest, when every
    one has a start; else unchanged."""
    if not all(s is not None for s in starts):
        return programs
    t0 = min(s for s in starts if s is not None)
    return [
        p.model_copy(update={"arrival_s": round((s or 0.0) - t0, 6)})
        for p, s in zip(programs, starts, strict=True)
    ]
