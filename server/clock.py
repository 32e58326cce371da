"""One injectable clock for everything that reasons about time on the serving side.

Why: the same scheduler and policy code must run against wall time (a served engine that
sleeps through emulated GPU steps) and against virtual time (an in-process engine driven by a
discrete-event loop, thousands of programs replayed in minutes with exact, repeatable results).
Policies never call `time` themselves; the scheduler passes them `clock().now()`.

Real time is `time.time()` because vLLM stamps request arrival with it.
"""

from __future__ import annotations

import time


class RealClock:
    """Wall-clock seconds; emulated GPU steps really sleep."""

    virtual = False

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """Seconds that pass only when the simulation says so (no sleeping)."""

    virtual = True

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def sleep(self, seconds: float) -> None:
        """An emulated GPU step 'takes' `seconds`: advance instead of blocking."""
        if seconds > 0:
            self._now += seconds

    def advance_to(self, t: float) -> None:
        """Jump to the next event time (never backwards)."""
        if t > self._now:
            self._now = t


Clock = RealClock | VirtualClock

_clock: Clock = RealClock()


def clock() -> Clock:
    """The clock in force in this process."""
    return _clock


def use_clock(new: Clock) -> Clock:
    """Install `new` as this process's clock; returns the previous one (for tests)."""
    global _clock
    previous, _clock = _clock, new
    return previous
