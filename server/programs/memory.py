"""What the `lookahead` scheduler's active programs hold in GPU memory, and what they may hold:
two accounts of the same memory, one estimated from the programs' contexts and one counted by
the engine.

Why two: only the engine counts memory exactly (a prefix that programs share is held once, not
once per program; a turn's blocks are taken as it runs), but it is heard only once it runs and
reports (`observe_engine`), and its limit needs a turn's mean output; until then the account is
estimated from the contexts the scheduler is told. Both answer the same three questions
(`Account`): what the active programs hold, what they may hold, and what admitting a program
adds. What pausing a program frees is its `resident` tokens in both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from predictor.means import SlidingMean
from predictor.programs import PromptGrowth
from server.programs.state import Kv, Phase, ProgramState

#: Active programs' KV stays within this share of the capacity until a turn's growth is known.
MEMORY_SHARE = 0.9


def resident(st: ProgramState) -> int:
    """What a program holds in GPU memory for the memory rule: what it is charged, except an
    acting program whose KV was released to the host tier (a long tool call, until its
    prefetch). One whose KV stays on the GPU counts, with a host tier or without: an account
    that left acting programs out admitted past their pins, and had nothing it could pause."""
    if st.phase is Phase.ACTING and not st.turn_waiting and st.kv is Kv.CPU:
        return 0
    return st.held_tokens()


class Account:
    """The questions the memory rule asks of an account."""

    def balance(self, active: Sequence[ProgramState], capacity: int) -> tuple[int, float]:
        """What the `active` programs hold, and what they may hold, in tokens."""
        raise NotImplementedError

    def need(self, st: ProgramState) -> int:
        """What admitting `st` adds."""
        return resident(st)


class ContextAccount(Account):
    """Estimated from contexts: each active program's `resident` tokens, against the capacity
    less the tokens the reasoning ones add before the next decisions (one turn's mean growth
    each: its output and the tool's return); `MEMORY_SHARE` of the capacity until a growth
    has been seen."""

    def __init__(self, growth: PromptGrowth) -> None:
        self._growth = growth

    def balance(self, active: Sequence[ProgramState], capacity: int) -> tuple[int, float]:
        usage = sum(resident(st) for st in active)
        if not self._growth.seen():
            return usage, MEMORY_SHARE * capacity
        reasoning = sum(1 for st in active if st.phase is not Phase.ACTING)
        return usage, max(0.0, capacity - reasoning * self._growth.mean(0.0))


class EngineCount(Account):
    """Counted by the engine: the tokens it holds that cannot be evicted (running turns, pins)
    plus what the active programs' turns have still to take blocks for, against the capacity
    less the output the running turns have still to write (a turn's mean output each).
    Admitting a program adds what its waiting turn has still to allocate."""

    def __init__(self, output: SlidingMean) -> None:
        self._output = output
        self._in_use: int | None = None  # None until the engine is heard
        self._ahead_of: Callable[[], Mapping[str, int]] = dict
        #: per program, the tokens its turns have still to allocate, as of the latest
        #: `balance` (asked of the engine then: a walk over its queues)
        self.ahead: Mapping[str, int] = {}

    def observe(self, in_use_tokens: int, ahead: Callable[[], Mapping[str, int]]) -> None:
        self._in_use = in_use_tokens
        self._ahead_of = ahead

    def ready(self) -> bool:
        """Whether the count can be used: the engine heard, and an output seen."""
        return self._in_use is not None and len(self._output) > 0

    def balance(self, active: Sequence[ProgramState], capacity: int) -> tuple[int, float]:
        assert self._in_use is not None
        self.ahead = self._ahead_of()
        usage = self._in_use + sum(self.ahead.get(st.program_id, 0) for st in active)
        running = sum(1 for st in active
                      if st.phase is not Phase.ACTING and not st.turn_waiting)
        # (running x sum) / count, not running x mean: the order of the float operations the
        # figures are taken with
        return usage, capacity - running * self._output.total / len(self._output)

    def need(self, st: ProgramState) -> int:
        if st.program_id in self.ahead:
            return self.ahead[st.program_id]
        return resident(st)
