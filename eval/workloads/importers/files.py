"""Trajectory files: one file as a program (or as the programs it holds), many as a trace."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from common.trace import Program, Trace, TraceFormatError
from eval.workloads.arrivals import retime
from eval.workloads.importers.formats import import_programs, import_trajectory
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
    return _from_file(Path(path), import_trajectory, fmt, kwargs)


def import_file_programs(path: str | Path, fmt: str = "auto", **kwargs: Any) -> list[Program]:
    """Every program one file holds (a Claude Code session: the session, then its
    sub-agents), else the one `import_file` gives. Errors name the file."""
    return _from_file(Path(path), import_programs, fmt, kwargs)


def _from_file(path: Path, read: Callable[..., Any], fmt: str, kwargs: dict[str, Any],
               data: Any = None) -> Any:
    if data is None:
        data = _load(path)
    kwargs.setdefault("program_id", _stem(path))
    try:
        return read(data, fmt, **kwargs)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None
    except ValueError as exc:  # pydantic validation of the built program
        raise TraceFormatError(f"{path}: the trajectory gives an invalid program: {exc}") from None


def _load(path: Path) -> Any:
    """The file's JSON; errors name the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: not a JSON trajectory ({exc})") from None


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
    """A trace of recorded trajectories, every program each file holds. Arrivals: a Poisson
    process at ``jps`` when given (in the order of ``paths``; a sub-agent keeps its place after
    its parent's start); else harness trajectories arrive at their ``started_at`` relative to
    the earliest, and others at 0 (a sub-agent at its recorded start in its session)."""
    files = [Path(p) for p in paths]
    if not files:
        raise ValueError("no trajectory files given")
    groups: list[list[Program]] = []
    starts: list[float | None] = []
    for path in files:  # each file read once: its programs and its recorded start
        data = _load(path)
        groups.append(_from_file(path, import_programs, fmt, dict(kwargs), data))
        starts.append(seconds(data.get("started_at")) if isinstance(data, dict) else None)
    if jps is None:
        groups = _at_recorded_starts(groups, starts)
    programs = [p for group in groups for p in group]
    trace = Trace(
        name=name,
        description=description or f"{len(programs)} recorded trajectories",
        params={"imported": [str(p) for p in files], "fmt": fmt},
        programs=programs,
    )
    return retime(trace, jps, seed) if jps is not None else trace


def _at_recorded_starts(groups: list[list[Program]],
                        starts: list[float | None]) -> list[list[Program]]:
    """Each file's programs moved by its recorded start relative to the earliest, when every
    file has a start; else unchanged."""
    if not all(s is not None for s in starts):
        return groups
    t0 = min(s for s in starts if s is not None)
    return [
        [p.model_copy(update={"arrival_s": round(p.arrival_s + (s or 0.0) - t0, 6)})
         for p in group]
        for group, s in zip(groups, starts, strict=True)
    ]
