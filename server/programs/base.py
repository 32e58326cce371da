"""The program scheduler interface: which programs hold memory, which run, and what happens
to a paused program's KV cache.

Why a layer above the policies: a policy (`server.policies`) decides per request — which
waiting turn goes first, whether a finished turn's KV is pinned. That is measured to be at its
limit (docs/results-programs.md): on a burst of long programs, admitting fewer programs at once
beats every per-request order, the clairvoyant one included. A program scheduler decides per
program: a program is *active* (its turns may run) or *paused* (its next turn waits even while
memory is free), and when it is paused its KV is kept, offloaded to the host tier or dropped.

One decision layer, carried out in two places: the engine (`server.policies.programs`: the
scheduler holds back a paused program's turns and keeps, offloads or drops its KV) and the
router (`cluster`: a program queue over the replicas, placement at start and resume). Neither
imports vLLM; the engine and the router only tell a scheduler facts (a turn arrived, was
admitted, finished; a tool started with its predicted duration; a tool ended; a program
ended; the engine's shape, its KV capacity and host tier in tokens (`configure`), and its count
of what it holds (`observe_engine`)) and ask it what to do.

Time is the caller's clock (seconds): the engine's virtual or real clock, the router's.

The callers use the public methods only, never the table's fields: the facts and decisions
above, and a router's ledger (`track`, `place`, `replica_of`, `held_by_replica`, `charge`,
`room`, `force_resume`, `forget`, `end_all`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from server.costs import CostModel
from server.programs.state import PER_PROGRAM_TOKENS, Kv, Phase, ProgramState, ProgramTable


@dataclass(frozen=True)
class Room:
    """A replica as placement sees it: its KV capacity and what its active programs hold."""

    name: str
    capacity_tokens: int
    used_tokens: int

    @property
    def free_tokens(self) -> int:
        return self.capacity_tokens - self.used_tokens


def roomiest(rooms: Sequence[Room]) -> Room:
    """The room with the most free KV; ties to the one listed first."""
    return max(rooms, key=lambda r: (r.free_tokens, -rooms.index(r)))


class ProgramScheduler:
    """Base: every program active at once, KV as the engine leaves it (vLLM's behaviour).

    Subclasses decide in `rebalance` (who is active) and `on_turn_end` (what a finished turn's
    KV does while its tool runs); `victim` answers which pinned program gives way when an
    allocation would fail."""

    name = "all-active"
    #: seconds between decisions; None: at every fact (ours). ThunderAgent decides on a tick.
    tick_s: float | None = None
    #: whether `prefetch_due` may name programs (the engine then keeps the prefetch books)
    prefetches = False
    #: the share of the capacity active programs are resumed up to (what a router counts as a
    #: replica's room, `room`); a scheduler with thresholds of its own sets it
    resume_to = 1.0

    def __init__(self, capacity_tokens: int = 0, cost_model: CostModel | None = None,
                 host_tier: bool = False) -> None:
        self.table = ProgramTable()
        self.capacity_tokens = capacity_tokens
        self.cost_model = cost_model
        self.host_tier = host_tier
        #: what the host tier holds, in tokens (None: not told; taken as unbounded)
        self.host_tier_tokens: int | None = None
        self._next_tick = 0.0
        self._dirty = True

    # -- facts -------------------------------------------------------------------------
    def configure(self, capacity_tokens: int, host_tier: bool,
                  host_tier_tokens: int | None = None) -> None:
        """The engine's shape: its KV capacity, whether it keeps a host tier and, when it
        does, the tier's size in tokens (MORI drops a demoted context that does not fit)."""
        self.capacity_tokens = capacity_tokens
        self.host_tier = host_tier
        self.host_tier_tokens = host_tier_tokens if host_tier else None

    def turn_arrived(self, program_id: str, prompt_tokens: int, now: float,
                     turn: int | None = None) -> None:
        st = self.table.turn_arrived(program_id, prompt_tokens, now, turn)
        if st.phase is Phase.NEW and not st.active:
            self.on_new(st, now)
        self._dirty = True

    def turn_admitted(self, program_id: str, now: float) -> None:
        self.table.turn_admitted(program_id, now)

    def turn_finished(self, program_id: str, context_tokens: int, now: float,
                      tool: str | None = None, predicted_s: float | None = None) -> Kv:
        """A turn ended (its program is now in a tool call; `tool` and `predicted_s` when the
        request's hints named them): where its KV stays meanwhile. `Kv.GPU` keeps it resident
        (the engine pins it)."""
        st = self.table.get(program_id)
        if st is None:
            return Kv.NONE
        self.table.turn_finished(program_id, context_tokens, now)
        if predicted_s is not None:
            self.table.tool_started(program_id, tool, predicted_s, now)
        self._dirty = True
        if st.pause_on_finish:
            self.pause(st, now)
        if not st.active:
            return st.kv
        st.kv = self.on_turn_end(st, now)
        return st.kv

    def tool_started(self, program_id: str, tool: str | None, predicted_s: float | None,
                     now: float, predicted_q: dict[str, float] | None = None) -> None:
        """The tool call began: with its predicted duration or the gap's quantiles, a kept
        KV is decided again (the prediction may say the memory is better released)."""
        self.table.tool_started(program_id, tool, predicted_s, now, predicted_q)
        st = self.table.get(program_id)
        if (st is not None and st.active and st.phase is Phase.ACTING and st.kv is Kv.GPU
                and (predicted_s is not None or st.gap is not None)):
            st.kv = self.on_turn_end(st, now)

    def tool_ended(self, program_id: str, now: float) -> None:
        self.table.tool_ended(program_id, now)

    def program_ended(self, program_id: str, now: float) -> None:
        self.table.program_ended(program_id, now)
        self._dirty = True

    def program_left(self, program_id: str, now: float) -> None:
        """A cluster router moved the program to another replica: forget it here, slot and
        memory account with it, without taking it for an ended program (the turns it ran here
        are not its length, which a subclass may learn from `program_ended`). Left in the
        table it stayed active, pinned and counted, on the replica that was too full to
        keep it, until the program ended elsewhere."""
        ProgramScheduler.program_ended(self, program_id, now)

    def observe_engine(self, in_use_tokens: int,
                       ahead: Callable[[], Mapping[str, int]]) -> None:
        """The engine's own count of memory, at each step: the tokens it holds that cannot
        be evicted (running turns, pins), and `ahead()`, per program, the tokens its turns
        have still to take blocks for (computed when called: ask it only when deciding, in
        the same step). A router tells its replica's KV usage times its capacity and an
        empty `ahead`. ThunderAgent's books take the count for their shared-token term
        (`server.programs.capacity`); the default ignores it."""

    # -- decisions -----------------------------------------------------------------------
    def may_run(self, program_id: str | None) -> bool:
        """Whether this program's waiting turn may be admitted now (unknown programs may)."""
        st = self.table.get(program_id)
        return st is None or st.active

    def kv_of(self, program_id: str) -> Kv:
        st = self.table.get(program_id)
        return Kv.NONE if st is None else st.kv

    def decide(self, now: float, *, idle: bool = False) -> None:
        """Bring the active set up to date: at every fact, or on the tick (`tick_s`), and
        whenever the caller is `idle` (nothing runs: a tick would only waste the time)."""
        if self.tick_s is not None and now < self._next_tick and not idle:
            return
        if self.tick_s is None and not self._dirty and not idle:
            return
        self.reap(now)
        self.rebalance(now)
        self._dirty = False
        if self.tick_s is not None:
            self._next_tick = now + self.tick_s

    def forget_silent_after(self, seconds: float) -> None:
        """The silent-program bound (`ProgramTable.reap`): the deployment's, an engine's
        `ServeSettings.stale_after_s` or a cluster's `router.stale_after_s`."""
        self.table.stale_after_s = seconds

    def reap(self, now: float) -> list[str]:
        """Forget the programs silent for the table's `stale_after_s` (`ProgramTable.reap`);
        their ids, for a caller that keeps books of its own (a router)."""
        forgotten = self.table.reap(now)
        for st in forgotten:
            st.active = False
        return [st.program_id for st in forgotten]

    def rebalance(self, now: float) -> None:
        for st in self.table.inactive():
            self.resume(st, now)

    def on_new(self, st: ProgramState, now: float) -> None:
        """A program's first turn arrived (it is queued until `rebalance` admits it)."""

    def on_turn_end(self, st: ProgramState, now: float) -> Kv:
        """An active program's turn ended: where its KV waits for the tool (default: as
        vLLM leaves it: freed to the prefix cache, or to the host tier)."""
        return Kv.CPU if self.host_tier else Kv.NONE

    def victim(self, pinned: Sequence[str], now: float) -> str:
        """Which pinned program gives up its KV when an allocation would fail."""
        return pinned[-1]

    def prefetch_due(self, now: float) -> list[str]:
        """Programs whose offloaded KV should start coming back now."""
        return []

    def reloads(self, program_id: str | None) -> bool:
        """Whether a waiting turn's context found in the host tier is loaded (True) or
        recomputed: False for a program whose KV the scheduler dropped (MORI's last rung)."""
        return True

    def order_key(self, program_id: str | None, now: float) -> tuple[float, ...]:
        """Order of the waiting turns of active programs, smallest first."""
        st = self.table.get(program_id)
        return (st.arrival if st is not None else now,)

    def place(self, program_id: str, rooms: Sequence[Room]) -> str:
        """Where a program starts or resumes: the room with the most free KV (ThunderAgent's
        and ours), kept where it is when it still fits (sticky, MORI's) and when it fits
        nowhere else either: a move re-prefills the context, which buys nothing on a
        replica as full as its home (under overload every replica is, and programs bounced
        from full to full). The choice is recorded as the program's `replica`."""
        st = self.table.get(program_id)
        need = self.charge(program_id)
        home = None
        if st is not None and st.replica is not None:
            home = next((r for r in rooms if r.name == st.replica), None)
            if home is not None and home.free_tokens >= need:
                return home.name
        best = roomiest(rooms)
        if home is not None and best.free_tokens < need:
            return home.name
        if st is not None:
            st.replica = best.name
        return best.name

    def kv_released(self, program_id: str) -> None:
        """The engine gave up the KV it kept for a program in a tool call (memory pressure, or
        the pin expired): it went where a released KV goes, the host tier or nowhere."""
        st = self.table.get(program_id)
        if st is not None and st.kv is Kv.GPU and st.phase is Phase.ACTING:
            st.kv = Kv.CPU if self.host_tier else Kv.NONE

    # -- a router's ledger ----------------------------------------------------------------
    def knows(self, program_id: str) -> bool:
        return program_id in self.table

    def context_of(self, program_id: str) -> int:
        """The program's context in tokens (0 for a program not known here)."""
        st = self.table.get(program_id)
        return 0 if st is None else st.context_tokens

    def charge(self, program_id: str) -> int:
        """What the program is charged here (`ProgramState.held_tokens`; the allowance alone
        for a program not known here: what its first turn is charged beyond its prompt)."""
        st = self.table.get(program_id)
        return PER_PROGRAM_TOKENS if st is None else st.held_tokens()

    def track(self, program_id: str, now: float, context_tokens: int | None = None) -> None:
        """A turn of the program passed through a router keeping this ledger: a program not
        known starts; its context is the turn's prompt when given (the latest, not the
        largest: the ledger follows what the turn sends); it was seen now."""
        st = self.table.get(program_id) or self.table.turn_arrived(program_id, 0, now)
        if context_tokens is not None:
            st.context_tokens = context_tokens
        st.last_seen = now

    def replica_of(self, program_id: str) -> str | None:
        """Where `place` put the program (None: not placed, or not known)."""
        st = self.table.get(program_id)
        return None if st is None else st.replica

    def held_by_replica(self, excluding: str | None = None) -> dict[str, int]:
        """Per replica, what the programs placed there are charged (leaving `excluding` out:
        the program being placed is not in its own way)."""
        held: dict[str, int] = {}
        for st in self.table:
            if st.replica is not None and st.program_id != excluding:
                held[st.replica] = held.get(st.replica, 0) + st.held_tokens()
        return held

    def room(self, name: str) -> Room:
        """This scheduler's replica as placement sees it: what it may hold up to a resume
        (`resume_to` of the capacity), what its active programs are charged."""
        return Room(name, int(self.resume_to * self.capacity_tokens), self.active_usage())

    def force_resume(self, program_id: str, now: float) -> None:
        """Make the program active whatever the rules say (a router resumed it here)."""
        st = self.table.get(program_id)
        if st is not None and not st.active:
            self.resume(st, now)

    def forget(self, program_id: str) -> None:
        """Drop the program without ending it (a ledger keeps no time accounts)."""
        self.table.forget(program_id)

    def end_all(self, now: float) -> None:
        """Every program ends here (the replica these books are for is lost)."""
        for st in list(self.table):
            self.program_ended(st.program_id, now)

    # -- helpers for subclasses ----------------------------------------------------------
    def active_usage(self) -> int:
        return sum(st.held_tokens() for st in self.table.active())

    def pause(self, st: ProgramState, now: float, kv: Kv | None = None) -> None:
        """Pause `st`: its next turn waits; its KV goes to the host tier if there is one
        (else it is dropped), unless `kv` says otherwise."""
        self.table.set_active(st, False, now)
        st.kv = kv if kv is not None else (Kv.CPU if self.host_tier else Kv.NONE)

    def resume(self, st: ProgramState, now: float) -> None:
        self.table.set_active(st, True, now)

    # -- reports ---------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Per-state seconds summed over programs, pauses and resumes (live and ended)."""
        return {key: total + float(sum(getattr(st, key) for st in self.table))
                for key, total in self.table.ended_totals.items()}

    def occupancy(self) -> dict[str, int]:
        """The occupancy-over-time plot's sample now: KV tokens by program state, the active
        and inactive programs, and the capacity (the engine and the router sample the same)."""
        out = {"reasoning": 0, "acting": 0, "paused": 0, "active": 0, "inactive": 0,
               "capacity": self.capacity_tokens}
        for st in self.table:
            out["active" if st.active else "inactive"] += 1
            if not st.active:
                out["paused"] += st.context_tokens if st.kv is Kv.GPU else 0
            elif st.phase is Phase.ACTING:
                out["acting"] += st.context_tokens if st.kv is Kv.GPU else 0
            else:
                out["reasoning"] += st.context_tokens
        return out
