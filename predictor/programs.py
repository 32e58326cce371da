"""What a program will still do, learnt from what a server has seen: how many turns it has left
(`RemainingTurns`, from the lengths of the programs that ended) and how much its prompt grows
from one turn to the next (`PromptGrowth`).

Why here, below the server: the remaining-work policy (`server.policies.remaining_work`) and
the `lookahead` program scheduler (`server.programs.lookahead`) rank programs by the same
estimates, and neither may import the other.

Constants: `LENGTH_WINDOW = 1000` ended programs' turn counts are kept; `MIN_PROGRAMS = 10`
must have ended before the turns left are estimated at all.
"""

from __future__ import annotations

from collections import deque

from predictor.means import SlidingMean

LENGTH_WINDOW = 1000
MIN_PROGRAMS = 10


class RemainingTurns:
    """E[N - k | N > k] from the turn counts N of ended programs (a sliding window): the turns
    a program that reached turn k has left, this one included (expected remaining service
    given attained service, the quantity shortest-remaining-work needs)."""

    def __init__(self, window: int = LENGTH_WINDOW, min_programs: int = MIN_PROGRAMS) -> None:
        self.lengths: deque[int] = deque(maxlen=window)
        self.min_programs = min_programs
        self._table: list[float] | None = None

    def add(self, n: int) -> None:
        if n >= 1:
            self.lengths.append(n)
            self._table = None

    def known(self) -> bool:
        return len(self.lengths) >= self.min_programs

    def longest(self) -> int:
        """The most turns an ended program in the window had (0 with none)."""
        return max(self.lengths, default=0)

    def expected(self, k: int) -> float | None:
        """Turns left, turn k (0-based) included, for a program that reached turn k; None
        before `min_programs` lengths are known."""
        if not self.known():
            return None
        if self._table is None:
            self._table = self._build()
        return self._table[k] if k < len(self._table) else 1.0

    def _build(self) -> list[float]:
        longest = max(self.lengths)
        count = [0] * (longest + 1)
        for n in self.lengths:
            count[n] += 1
        table = [1.0] * longest  # k = 0 .. longest - 1
        above, total = 0, 0  # programs with N > k, and the sum of their N
        for k in range(longest - 1, -1, -1):
            above += count[k + 1]
            total += count[k + 1] * (k + 1)
            table[k] = total / above - k if above else 1.0
        return table


class PromptGrowth:
    """How much a program's prompt grows from one turn to the next (its previous answer and
    the tool's return), averaged over programs: each live program's latest prompt is kept
    until it is `forget`-ten, and a prompt larger than its program's previous one adds the
    difference to the mean (`window` None: over every turn seen)."""

    def __init__(self, window: int | None) -> None:
        self._mean = SlidingMean(window)
        self._last: dict[str, int] = {}

    def prompt(self, program_id: str, tokens: int) -> None:
        """A turn of `program_id` arrived with a prompt of `tokens`."""
        previous = self._last.get(program_id)
        if previous is not None and tokens > previous:
            self._mean.add(tokens - previous)
        self._last[program_id] = tokens

    def last_prompt(self, program_id: str) -> int | None:
        return self._last.get(program_id)

    def forget(self, program_id: str) -> None:
        """The program ended, or left: its next prompt here is not one turn's growth."""
        self._last.pop(program_id, None)

    def seen(self) -> bool:
        """Whether a growth has been seen."""
        return len(self._mean) > 0

    def mean(self, default: float) -> float:
        return self._mean.mean(default)
