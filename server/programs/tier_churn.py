"""How long the host tier keeps what is written to it: its size over the rate the engine writes.

Why: vLLM's CPU tier copies every block the engine computes (write-through) and evicts the
least recently used when full. A context released to it is there to reload only while less
than the tier's size has been written since; under many long sessions that is seconds to
minutes, and a program back later recomputes. A scheduler that prices a release as a reload
(`lookahead`'s keep horizon) must know that time, and nothing in vLLM reports it, so it is
estimated from the facts the scheduler already hears: each finished turn's context, whose
growth since the program's previous turn is what the engine computed and wrote for it (a
compaction, whose context shrank, writes its whole new prompt).
"""

from __future__ import annotations

import math


class TierChurn:
    """The engine's write rate (tokens a second, over the whole run) and the residence time
    it gives a tier of a given size."""

    def __init__(self) -> None:
        self.written = 0
        self.since: float | None = None

    def turn_finished(self, before: int, context_tokens: int, now: float) -> None:
        """A turn ended with `context_tokens` of context where the program's previous turn
        left `before` (0 for a first turn): what it wrote (all of it on a compaction)."""
        if self.since is None:
            self.since = now
        self.written += context_tokens - before if context_tokens >= before else context_tokens

    def rate(self, now: float) -> float:
        """Tokens written a second so far (0 before two facts a moment apart)."""
        if self.since is None or now <= self.since:
            return 0.0
        return self.written / (now - self.since)

    def residence_s(self, tier_tokens: int | None, now: float) -> float:
        """Seconds a block written now stays in a tier of `tier_tokens` (inf: a tier of
        unknown size, or nothing written yet)."""
        rate = self.rate(now)
        if tier_tokens is None or rate <= 0:
            return math.inf
        return tier_tokens / rate
