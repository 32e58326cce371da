"""What a program scheduler knows about each program, kept from the events it is told.

Why a table of its own: every program scheduler (ThunderAgent's, MORI's, ours) decides from the
same facts — is the program reasoning (a turn in flight) or acting (in a tool call), is it
active or paused, how many tokens of context it holds, when its tool is expected back, how idle
it has been — and the engine and the router tell it those facts through the same calls. One
table keeps them, so a scheduler is only its decisions.

Nothing held for ever: a program that sends no `program_end` is forgotten after
`STALE_AFTER_S` of silence (no turn, no event), with its queue slot and its memory account
(`ProgramTable.reap`); an event for a program the table never saw is ignored, except a turn,
which starts the program.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from predictor.gaps.forecast import GapForecast

#: A program silent this long (no turn arrives, none finishes, no event) is forgotten: an
#: agent that died without `program_end`. The longest tool call in our traces is 120 s
#: (swe `python`), and SWE-bench harnesses time a command out at 30 min; 3600 s is above both.
STALE_AFTER_S = 3600.0

#: Tokens a program is charged beyond its context (ThunderAgent's per-program allowance for the
#: tokens its next turn adds before the next accounting).
PER_PROGRAM_TOKENS = 100

#: MORI's idleness window: the share of a program's last cycles (a turn plus its tool call)
#: spent in tool calls.
IDLENESS_CYCLES = 5


#: what `ProgramState` accounts per program and the reports sum (`ProgramScheduler.stats`)
ACCOUNTS = ("active_s", "paused_s", "queued_s", "pauses", "resumes")


class Phase(StrEnum):
    """What a program is doing: a new one has not been admitted yet."""

    NEW = "new"
    REASONING = "reasoning"  # a turn is queued or in flight
    ACTING = "acting"  # in a tool call (its previous turn finished, the next not yet sent)


class Kv(StrEnum):
    """Where a program's KV cache is, as far as the scheduler has arranged it."""

    GPU = "gpu"  # held (pinned between turns, or a running turn's own blocks)
    CPU = "cpu"  # released to the engine's host tier (reloaded over PCIe when it returns)
    NONE = "none"  # released without a host tier: recomputed when it returns


@dataclass
class ProgramState:
    """One program as a scheduler sees it."""

    program_id: str
    arrival: float  # its first turn's arrival
    phase: Phase = Phase.NEW
    active: bool = False  # may its turns run
    context_tokens: int = 0  # the conversation so far (prompt + output of its latest turn)
    finished_context: int = 0  # the context its latest finished turn left
    turns: int = 0  # turns finished
    turn_waiting: bool = False  # a turn has arrived and not yet been admitted
    tool: str | None = None
    tool_started: float | None = None
    predicted_return: float | None = None  # when its tool call is expected to end
    #: the gap's distribution, from the client's quantiles (`tool_start`'s `predicted_q`)
    gap: GapForecast | None = None
    kv: Kv = Kv.NONE
    replica: str | None = None  # where it runs (the router's placement)
    last_seen: float = 0.0
    pause_on_finish: bool = False  # ThunderAgent: pause when the running turn ends
    #: the last cycles' (reasoning seconds, acting seconds), oldest first
    cycles: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=IDLENESS_CYCLES))
    _turn_started: float | None = None
    _reason_s: float = 0.0  # the latest turn's time from arrival to finish
    # time accounting (seconds): active / paused / queued, for the reports
    active_s: float = 0.0
    paused_s: float = 0.0
    queued_s: float = 0.0
    _since: float = 0.0
    pauses: int = 0
    resumes: int = 0

    def held_tokens(self) -> int:
        """What the program is charged while active: its context plus the per-program
        allowance (the schedulers' accounts and the routers' rooms all count this)."""
        return self.context_tokens + PER_PROGRAM_TOKENS

    def waited_s(self, now: float) -> float:
        """How long its ready turn has waited to be admitted (0 with none waiting)."""
        if not self.turn_waiting or self._turn_started is None:
            return 0.0
        return max(0.0, now - self._turn_started)

    def idle_s(self, now: float) -> float:
        """How long it has been in its tool call (0 while it reasons)."""
        if self.phase is not Phase.ACTING or self.tool_started is None:
            return 0.0
        return max(0.0, now - self.tool_started)

    def gap_now(self, now: float) -> GapForecast | None:
        """Its gap's distribution given how long it has been gone (None: none was sent)."""
        return None if self.gap is None else self.gap.given(self.idle_s(now))

    @property
    def idleness(self) -> float:
        """MORI's rank: the share of the last cycles spent in tool calls (0 with none yet)."""
        busy = sum(r for r, _ in self.cycles)
        idle = sum(a for _, a in self.cycles)
        return idle / (busy + idle) if busy + idle > 0 else 0.0

    def account(self, now: float) -> None:
        """Add the time since the last change to the bucket the program was in."""
        spent = max(0.0, now - self._since)
        if self.active:
            self.active_s += spent
        elif self.phase is Phase.NEW:
            self.queued_s += spent
        else:
            self.paused_s += spent
        self._since = now


class ProgramTable:
    """Every live program's state, updated from turns and events."""

    def __init__(self, stale_after_s: float = STALE_AFTER_S) -> None:
        self.programs: dict[str, ProgramState] = {}
        self.stale_after_s = stale_after_s
        #: ended programs' time per state, pauses and resumes, summed for the reports (totals,
        #: not the programs: a server that runs for weeks keeps nothing per ended program)
        self.ended_totals: dict[str, float] = dict.fromkeys(ACCOUNTS, 0.0)

    def __contains__(self, program_id: object) -> bool:
        return program_id in self.programs

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.programs.values())

    def __len__(self) -> int:
        return len(self.programs)

    def get(self, program_id: str | None) -> ProgramState | None:
        return None if program_id is None else self.programs.get(program_id)

    # -- facts ---------------------------------------------------------------------------
    def turn_arrived(self, program_id: str, prompt_tokens: int, now: float,
                     turn: int | None = None) -> ProgramState:
        """A program's turn is ready. `turn`, the client's index of it (the `turn` hint), is
        how many turns the program has done, wherever they ran: a program a router moved
        here at its k-th turn has done k, not 0 (its expected remaining work, and the length
        learnt at its end, are the whole program's)."""
        st = self.programs.get(program_id)
        if st is None:
            st = self.programs[program_id] = ProgramState(program_id, arrival=now, _since=now)
        if turn is not None and turn > st.turns:
            st.turns = turn
        if st.phase is Phase.ACTING:
            st.phase = Phase.REASONING
            if st.tool_started is not None:
                self._close_cycle(st, now)
            st.tool_started = None
            st.predicted_return = None
            st.gap = None
        st.turn_waiting = True
        st.context_tokens = max(st.context_tokens, prompt_tokens)
        st._turn_started = now
        st.last_seen = now
        return st

    def turn_admitted(self, program_id: str, now: float) -> None:
        st = self.programs.get(program_id)
        if st is not None:
            st.turn_waiting = False
            st.last_seen = now
            if st.phase is Phase.NEW:
                st.account(now)
                st.phase = Phase.REASONING

    def turn_finished(self, program_id: str, context_tokens: int, now: float) -> None:
        st = self.programs.get(program_id)
        if st is None:
            return
        st.account(now)
        st.context_tokens = context_tokens
        st.turns += 1
        st.phase = Phase.ACTING
        st.tool_started = now
        st.last_seen = now
        st.turn_waiting = False
        if st._turn_started is not None:
            st._reason_s = now - st._turn_started

    def tool_started(self, program_id: str, tool: str | None, predicted_s: float | None,
                     now: float, predicted_q: dict[str, float] | None = None) -> None:
        """A tool call began: its predicted end, and the gap's distribution when the client
        sent quantiles (a hint without two distinct levels is taken as no distribution)."""
        st = self.programs.get(program_id)
        if st is None:
            return
        st.tool = tool or st.tool
        st.last_seen = now
        if st.phase is not Phase.ACTING:
            return
        if predicted_s is not None and predicted_s >= 0:
            st.predicted_return = (st.tool_started or now) + predicted_s
        if predicted_q:
            try:
                st.gap = GapForecast.from_hint(predicted_q)
            except ValueError:
                st.gap = None

    def tool_ended(self, program_id: str, now: float) -> None:
        st = self.programs.get(program_id)
        if st is not None:
            st.last_seen = now
            st.predicted_return = now  # its next turn is due now

    def program_ended(self, program_id: str, now: float) -> ProgramState | None:
        st = self.programs.pop(program_id, None)
        if st is not None:
            st.account(now)
            for key in ACCOUNTS:
                self.ended_totals[key] += getattr(st, key)
        return st

    def forget(self, program_id: str) -> None:
        """Drop a program without accounting it (a ledger that keeps no time accounts)."""
        self.programs.pop(program_id, None)

    def reap(self, now: float) -> list[ProgramState]:
        """Forget programs silent for `stale_after_s` (no `program_end` ever came; a turn
        that waited that long is let run as an unknown program's would)."""
        gone = [st for st in self.programs.values()
                if now - st.last_seen > self.stale_after_s]
        for st in gone:
            self.program_ended(st.program_id, now)
        return gone

    def _close_cycle(self, st: ProgramState, now: float) -> None:
        st.cycles.append((st._reason_s, max(0.0, now - (st.tool_started or now))))

    # -- views -----------------------------------------------------------------------------
    def active(self) -> list[ProgramState]:
        return [st for st in self.programs.values() if st.active]

    def inactive(self) -> list[ProgramState]:
        return [st for st in self.programs.values() if not st.active]

    def set_active(self, st: ProgramState, active: bool, now: float) -> None:
        """Admit / resume (True) or pause (False), keeping the time accounts."""
        if st.active == active:
            return
        st.account(now)
        if active:
            if st.phase is not Phase.NEW:
                st.resumes += 1
        else:
            st.pauses += 1
        st.active = active
        st.pause_on_finish = False
