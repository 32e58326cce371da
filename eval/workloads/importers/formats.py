"""The registry of trajectory formats: name -> importer and detector, and the dispatch by it.

A new format is a module that defines its importer and a `Format` (`shared.Format`), imported
here and named in `FORMATS`. Detection asks the formats in that order and takes the first that
matches.
"""

from __future__ import annotations

from typing import Any

from common.trace import Program, TraceFormatError
from eval.workloads.importers.claude_code import FORMAT as CLAUDE_CODE
from eval.workloads.importers.harness_trajectory import FORMAT as HARNESS
from eval.workloads.importers.mini_swe_agent import FORMAT as MINI_SWE_AGENT
from eval.workloads.importers.shared import Format
from eval.workloads.importers.swe_agent import FORMAT as SWE_AGENT

FORMATS: dict[str, Format] = {f.name: f for f in (HARNESS, SWE_AGENT, MINI_SWE_AGENT,
                                                   CLAUDE_CODE)}


def detect_format(data: Any) -> str:
    """The name of the first format in `FORMATS` whose detector matches ``data``: ``harness``
    (has ``steps``), ``swe-agent`` (``trajectory`` / ``attempts``), ``mini-swe-agent``
    (``messages``) or ``claude-code`` (``requests`` and ``block_size``)."""
    if isinstance(data, dict):
        for fmt in FORMATS.values():
            if fmt.detect(data):
                return fmt.name
    expected = [fmt.expects for fmt in FORMATS.values()]
    listed = ", ".join(expected[:-1]) + " or " + expected[-1] if len(expected) > 1 else expected[0]
    raise TraceFormatError(f"unknown trajectory format: expected a JSON object with {listed}")


def import_trajectory(data: Any, fmt: str = "auto", **kwargs: Any) -> Program:
    """Dispatch to the importer for ``fmt`` (or the detected format)."""
    chosen, kwargs = _chosen(data, fmt, kwargs)
    return chosen.importer(data, **kwargs)


def import_programs(data: Any, fmt: str = "auto", **kwargs: Any) -> list[Program]:
    """Every program ``data`` holds: its format's ``programs`` when it has them (a session and
    its sub-agents), else the one program `import_trajectory` gives."""
    chosen, kwargs = _chosen(data, fmt, kwargs)
    if chosen.programs is not None:
        return chosen.programs(data, **kwargs)
    return [chosen.importer(data, **kwargs)]


def _chosen(data: Any, fmt: str, kwargs: dict[str, Any]) -> tuple[Format, dict[str, Any]]:
    """The format ``fmt`` (or the detected one) and the options of ``kwargs`` it takes."""
    name = detect_format(data) if fmt == "auto" else fmt
    if name not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose auto or one of {sorted(FORMATS)}")
    chosen = FORMATS[name]
    if chosen.options is not None:
        kwargs = {k: v for k, v in kwargs.items() if k in chosen.options}
    return chosen, kwargs
