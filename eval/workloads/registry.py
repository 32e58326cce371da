"""Traces by name: the registry of generators, loading a trace by name or file, merging traces.

The benchmarks, the planner and the committed traces' builder (`datasets/traces/build.py`)
name workloads (``swe``, ``bfcl``, ``mix``, ``toolbench``, ...) rather than call generators, so
a name means the same programs everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from common.trace import Trace, TraceFormatError, load_trace
from eval.workloads.ampd import AMPD_TABLE, ampd_like
from eval.workloads.arrivals import retime
from eval.workloads.bfcl import bfcl_like
from eval.workloads.importers.files import trace_from_files
from eval.workloads.infercept import infercept_mix
from eval.workloads.shapes import check_n
from eval.workloads.swe import swe_like, swe_long_like

__all__ = ["TRACES", "load_or_generate", "merge"]


def merge(*traces: Trace, name: str | None = None, description: str | None = None) -> Trace:
    """Interleave traces by arrival time (ties keep argument order). Program ids must not
    collide: generate the parts with different names or prefixes."""
    if not traces:
        raise ValueError("merge needs at least one trace")
    tagged = [
        (p.arrival_s, ti, pi, p) for ti, t in enumerate(traces) for pi, p in enumerate(t.programs)
    ]
    tagged.sort(key=lambda x: (x[0], x[1], x[2]))
    seen: dict[str, str] = {}
    for _, ti, _, p in tagged:
        if p.id in seen:
            raise ValueError(
                f"program id {p.id!r} is in both {seen[p.id]!r} and {traces[ti].name!r}; "
                "merge needs unique ids"
            )
        seen[p.id] = traces[ti].name
    return Trace(
        name=name or "+".join(t.name for t in traces),
        description=description or "merge of " + ", ".join(t.name for t in traces),
        params={"merged": [{"name": t.name, "seed": t.seed, "params": t.params} for t in traces]},
        seed=None,
        programs=[x[3] for x in tagged],
    )


Generator = Callable[..., Trace]

#: Generated traces by name (``load_or_generate`` and ``datasets/traces/build.py`` use these).
TRACES: dict[str, Generator] = {
    "swe": swe_like,
    "swe-long": swe_long_like,
    "bfcl": bfcl_like,
    "mix": infercept_mix,
    **{row.name: partial(ampd_like, workload=row.name) for row in AMPD_TABLE},
    # AMPD's Table 1 with "Prefill Length" read as the round's whole prompt (eval.workloads.ampd)
    **{f"{row.name}-ctx": partial(ampd_like, workload=row.name, reading="context")
       for row in AMPD_TABLE},
}


def load_or_generate(
    name_or_path: str | os.PathLike[str],
    n: int | None = None,
    jps: float | None = None,
    seed: int = 0,
    **params: Any,
) -> Trace:
    """A generated trace by registry name (``swe``, ``bfcl``, ``mix``, and AMPD's ``toolbench``,
    ``gaia``, ``hotpotqa``, ``dureader``; ``n`` and ``jps`` needed, ``params`` go to the
    generator, e.g. ``scale`` for ``bfcl``), a trace file, or a folder of recorded runs (every
    ``*.json`` / ``*.traj`` in it through `eval.workloads.importers`, e.g. Claude Code sessions).

    For a file or folder, ``n`` keeps the first ``n`` programs (by arrival; with the sub-agents
    they start) and ``jps`` re-draws the arrivals as a Poisson process with ``seed`` (same
    programs, new load).
    """
    key = str(name_or_path)
    if key in TRACES:
        if n is None or jps is None:
            raise ValueError(f"trace {key!r} is generated: give n (programs) and jps (jobs/s)")
        return TRACES[key](n, jps, seed, **params)
    path = Path(name_or_path)
    if not path.exists():
        raise FileNotFoundError(
            f"{key!r} is neither a trace name ({', '.join(sorted(TRACES))}) nor an existing file"
        )
    if params:
        raise ValueError(f"generator options {sorted(params)} do not apply to a trace file")
    trace = _recorded(path) if path.is_dir() else load_trace(path)
    if n is not None:
        check_n(n)
        trace = trace.head(n)
    if jps is not None:
        trace = retime(trace, jps, seed)
    return trace


def _recorded(folder: Path) -> Trace:
    """A folder of recorded runs as one trace, its files in name order."""
    files = sorted(p for p in folder.iterdir() if p.suffix in (".json", ".traj"))
    if not files:
        raise TraceFormatError(f"{folder}: no recorded runs (*.json, *.traj) in this folder")
    return trace_from_files(files, name=folder.name)
