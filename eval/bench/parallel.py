"""Where a sweep's calls run: in this process, one after another, or in `jobs` worker
processes at once (`harness bench --jobs N`).

Why both behind `submit`/`result`: the sweep (`eval.bench.sweep`) is one loop that submits the
isolated JCTs and every replay and then takes their results in order; only here does it matter
whether they ran in this process (where a progress bar can follow each one) or in a worker.
The figures do not change: every replay is deterministic and alone on its own engine, so
running them side by side changes only the wall and CPU times; the engines are Python under one
interpreter lock, so only processes use more than one core. Workers are spawned, not forked:
the parent runs the live progress bar's thread, and a fork of a process with threads may
deadlock.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Protocol


class Pending(Protocol):
    def result(self) -> Any: ...


class Deferred:
    """A call run in this process when its result is first asked for, so that calls
    submitted together still run one at a time, in the order their results are taken."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._call: Callable[[], Any] | None = call
        self._value: Any = None

    def result(self) -> Any:
        if self._call is not None:
            self._value, self._call = self._call(), None
        return self._value


class Serial:
    """Every call in this process; `progress` callbacks reach the bars live."""

    live: bool = True

    def submit(self, fn: Callable[..., Any], *args: Any) -> Pending:
        return Deferred(lambda: fn(*args))

    def __enter__(self) -> Serial:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class Processes:
    """Every call in one of `jobs` spawned worker processes; the callable and its arguments
    are pickled, so a progress callback cannot follow (`live` is False: pass None)."""

    live: bool = False

    def __init__(self, jobs: int) -> None:
        self._pool = ProcessPoolExecutor(max_workers=jobs,
                                         mp_context=multiprocessing.get_context("spawn"))

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return self._pool.submit(fn, *args)

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown()


def executor(jobs: int) -> Serial | Processes:
    """`jobs` > 1: worker processes; else this process."""
    return Processes(jobs) if jobs > 1 else Serial()
