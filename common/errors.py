"""The one kind of error a user's mistake raises, at every layer.

Why: a wrong flag, a missing file or an unknown policy name must reach the user as one line
saying what was wrong and what to do, never as a traceback; an internal failure must keep its
traceback. Each layer names its own mistakes (`BenchError`, `ServeError`, `PlanError`, ...)
as subclasses of `UserError`, so the command line (`cli.main`) turns all of them into a
message and exit status 2 in one place, and lets everything else through.
"""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in the user's input; the message says what was wrong and what to do."""
