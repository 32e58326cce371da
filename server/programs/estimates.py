"""What the `lookahead` scheduler expects of a program: how many turns it has left, how much its
context grows per turn, what a turn writes, and what that work costs the GPU.

Why a class of its own: the scheduler's rules (who is admitted, who gives way) only compare
these figures; they are learnt from the same facts the scheduler is told (a turn arrives, one
finishes, a program ends or leaves) by the estimators the remaining-work policy uses too
(`predictor.programs`), and priced by the engine's cost model (`server.costs.WorkModel`).
"""

from __future__ import annotations

from collections.abc import Mapping

from predictor.means import SlidingMean
from predictor.programs import MIN_PROGRAMS, PromptGrowth, RemainingTurns
from server.costs import CostModel, WorkModel
from server.programs.state import ProgramState

#: Programs ended before the turns left are estimated from their lengths (before: as many again
#: as a program has done).
MIN_ENDED = MIN_PROGRAMS


class ProgramEstimates:
    """Learnt from every turn and program the scheduler is told of (the means are over all of
    them, not a window); a program's told length (`tell_lengths`) overrides the learnt one."""

    def __init__(self, cost_model: CostModel | None = None) -> None:
        #: what a decoded token costs at a context, at exact contexts (`bucket=1`): the order
        #: of programs of near contexts rests on them
        self.work = WorkModel(cost_model, bucket=1)
        #: E[N - k | N > k] over the last ended programs' turn counts
        self.lengths = RemainingTurns()  # the remaining-work policy's window and minimum
        #: a prompt's growth from one turn to the next, and each live program's latest prompt
        self.growth = PromptGrowth(window=None)
        #: a turn's output (its context at the end less its prompt)
        self.output = SlidingMean(None)
        #: program -> its turn count, when told (`lookahead-oracle`, a clairvoyant reference)
        self.known_turns: dict[str, int] | None = None

    # -- learning ----------------------------------------------------------------------------
    def tell_lengths(self, turns: Mapping[str, int]) -> None:
        self.known_turns = dict(turns)

    def turn_arrived(self, program_id: str, prompt_tokens: int) -> None:
        self.growth.prompt(program_id, prompt_tokens)

    def turn_finished(self, program_id: str, context_tokens: int) -> None:
        prompt = self.growth.last_prompt(program_id)
        if prompt is not None and context_tokens > prompt:  # the turn's output
            self.output.add(context_tokens - prompt)

    def program_ended(self, program_id: str, st: ProgramState | None) -> None:
        """The program ended: its length is learnt (from its state here, `st`)."""
        if st is not None and st.turns > 0:
            self.lengths.add(st.turns)
        self.growth.forget(program_id)

    def program_left(self, program_id: str) -> None:
        """The program went to another replica: a return here is not one turn's growth, and
        the turns it ran here are not its length."""
        self.growth.forget(program_id)

    # -- estimates ---------------------------------------------------------------------------
    def lengths_known(self) -> bool:
        """Whether the turns left are told, or learnt from enough ended programs."""
        return self.known_turns is not None or self.lengths.known()

    def turns_left(self, st: ProgramState) -> float:
        """E[N - k | N > k] over ended programs (this turn included); before `MIN_ENDED`
        ended, as many again as it has done (a program seen at age k is as likely to be in
        its first half as its second)."""
        k = st.turns
        if self.known_turns is not None and st.program_id in self.known_turns:
            return float(max(1, self.known_turns[st.program_id] - k))
        left = self.lengths.expected(k)
        if left is None or (left == 1.0 and k >= self.lengths.longest()):
            return float(max(1, k))  # too few ended, or older than every ended program
        return left

    def mean_growth(self) -> float:
        """A turn's mean growth of the context (0 until one is seen)."""
        return self.growth.mean(0.0)

    def expected_work(self, st: ProgramState) -> float:
        """The GPU seconds of decode the program has left: its turns left, each at the
        context it will have on average."""
        left = self.turns_left(st)
        ctx = st.context_tokens + left / 2 * self.mean_growth()
        return left * self.work.decode_seconds_per_token(int(ctx))
