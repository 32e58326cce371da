"""Benchmarks, scoring and metrics: pass rate beside job completion time.

Rooms, each importing only those below it (a contract in `pyproject.toml`):
`experiments/` (`harness eval NAME`), `ampd/` (`harness cluster bench`) and `examples/` on
`bench/` (`harness bench`), on `replay/` (trace replay over HTTP, router processes), on
`workloads/` (generated and imported traces). `ExperimentError` is every room's user mistake.
"""

from __future__ import annotations

from common.errors import UserError


class ExperimentError(UserError):
    """A mistake in how an experiment was asked to run (an option, a trace, a cluster); the
    message says what was wrong and what to do. Each experiment's own errors subclass it."""
