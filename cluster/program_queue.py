"""`program-queue`: a program scheduler in the router, over every replica, with a global queue:
ThunderAgent as its paper runs it, an HTTP router in front of unmodified engines.

Why beside `programs` (`cluster.program_router`): that router places programs and leaves who
runs at once to each replica's own program scheduler, in the engine, where it holds a paused
program's turns back, pins what it keeps and counts memory by the engine's blocks. ThunderAgent
decides in the router instead: a paused program's next turn waits in the router, at no
replica, and resumes on whichever replica has room for it first. This strategy does that,
with the same scheduler classes as the engine (`server.programs`), so the paper's own
arrangement is measured beside ours (the replicas then run `vllm`: the paper's engines are
unmodified). It is the issue's "thunderagent global queue".

What it does, per turn and on a tick:

* Each live replica has its own program scheduler (ThunderAgent's by default), its capacity
  the replica's KV capacity in tokens (`ReplicaLoad.kv_capacity_tokens`): the router keeps the
  books the paper's router keeps (context tokens of the active programs, reasoning or acting,
  and the per-program allowance), from what passes through it: a turn's prompt when it is
  routed, its context when its answer ends (`turn_finished`), the program's end.
* A program's first turn goes to the replica with the most free room (capacity less what its
  active programs hold); its later turns to the same replica, its home.
* `hold` is asked before `route`: a turn whose program its home's scheduler has not admitted,
  or has paused, waits in the router (`holds` counts such turns). The caller asks again at the
  router's next tick (`TICK_S` of the scheduler, 5 s for ThunderAgent; every held turn at the
  same instant, so one decision serves them all): at a tick every replica's scheduler decides
  (pauses acting programs above capacity, resumes under it, smallest first; its usage less the
  tokens the programs share, from the replica's reported KV usage, and no new program admitted
  ahead of one its books have queued, as ThunderAgent's released code decides over its one
  queue), then each held turn whose program was resumed goes home; one still paused goes to
  the replica with the most free room if its context fits there (`moves`; re-prefilled there,
  as the paper resumes a paused program "on the backend with the most free room", its KV
  assumed lost); else it waits for the next tick. Between ticks a replica with nothing to
  run decides at once (a tick would only idle it), as the paper's scheduler does.

Until every live replica has reported its KV capacity (a served replica's first metrics
poll), no turn is held: there are no books to hold it by.

Nothing held for ever: each scheduler forgets a program silent for `STALE_AFTER_S` (the
router's home for it with it, at the next tick); a replica lost takes its books with it, and
its programs' next turns are placed afresh on the live ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cluster.routing import ReplicaLoad, Route, Router, TurnInfo, _alive
from server.programs import ProgramScheduler, Room, roomiest
from server.programs.state import ACCOUNTS
from server.programs.thunderagent import ThunderAgent

#: The scheduler classes this router can carry (by name); ThunderAgent's is the paper's.
SCHEDULERS: dict[str, type[ProgramScheduler]] = {"thunderagent": ThunderAgent}

#: Seconds between decisions for a scheduler that names no tick of its own.
DEFAULT_TICK_S = 5.0


class ProgramQueueRouter(Router):
    name = "program-queue"

    def __init__(self, scheduler: str = "thunderagent") -> None:
        if scheduler not in SCHEDULERS:
            raise ValueError(f"unknown program scheduler {scheduler!r} for the "
                             f"{self.name!r} router; choose one of {', '.join(SCHEDULERS)}")
        self.scheduler_cls = SCHEDULERS[scheduler]
        self.tick_s = self.scheduler_cls.tick_s or DEFAULT_TICK_S
        #: replica -> its program scheduler (the router's books for it)
        self.backends: dict[str, ProgramScheduler] = {}
        self.home: dict[str, str] = {}  # program -> the replica whose books hold it
        self.held: dict[str, int] = {}  # program -> its turn waiting in the router
        self.moves = 0  # held turns resumed on a replica other than their home
        self.holds = 0  # turns held at least once
        self._origin: float | None = None  # the tick grid's origin (the first turn's time)
        self._last_tick: int | None = None  # the index of the last tick decided
        self._now = 0.0
        #: the time accounts of the books of replicas lost, for the reports
        self._lost_totals: dict[str, float] = dict.fromkeys(ACCOUNTS, 0.0)
        #: (time, KV tokens by program state in the first replica's books, its capacity), at
        #: each tick: the occupancy plot's series, as an engine-side scheduler samples its own
        self.occupancy: list[tuple[float, dict[str, int]]] = []

    # -- the router interface ----------------------------------------------------------
    def hold(self, program_id: str, turn: int, replicas: Sequence[ReplicaLoad],
             info: TurnInfo | None = None) -> float | None:
        now = self._clock(info)
        live = _alive(replicas, "colocated")
        if any(r.kv_capacity_tokens <= 0 for r in live):
            return None  # no books without every replica's capacity (not yet reported)
        self._sync(live, now)
        self._decide(live, now)
        again = self.held.get(program_id) == turn
        home = self.home.get(program_id)
        if home not in self.backends:
            home = self.home[program_id] = self._roomiest(live)
        books = self.backends[home]
        if not again or not books.knows(program_id):
            books.turn_arrived(program_id, info.prompt_tokens if info else 0, now, turn)
        if books.may_run(program_id):
            self._goes(program_id, books, now)
            return None
        elsewhere = self._room_elsewhere(program_id, books, live, home)
        if elsewhere is not None:
            self._move(program_id, turn, books, elsewhere, now)
            return None
        if not again:
            self.holds += 1
        self.held[program_id] = turn
        return self._next_tick(now)

    def route(self, program_id: str, turn: int, replicas: Sequence[ReplicaLoad],
              info: TurnInfo | None = None) -> Route:
        live = _alive(replicas, "colocated")
        home = self.home.get(program_id)
        if home is None or home not in {r.name for r in live}:
            self._sync(live, self._clock(info))
            home = self.home[program_id] = self._roomiest(live)
        return Route(decode=home)

    def turn_finished(self, program_id: str, context_tokens: int, now: float) -> None:
        """The turn's answer ended: the program is in a tool call, holding `context_tokens`
        (ThunderAgent pauses a program marked while reasoning here)."""
        self._now = max(self._now, now)
        books = self.backends.get(self.home.get(program_id, ""))
        if books is not None:
            books.turn_finished(program_id, context_tokens, now)

    def program_end(self, program_id: str) -> None:
        self.held.pop(program_id, None)
        books = self.backends.get(self.home.pop(program_id, ""))
        if books is not None:
            books.program_ended(program_id, self._now)

    def bound(self, program_id: str) -> str | None:
        return self.home.get(program_id)

    def program_stats(self) -> dict[str, float]:
        """Per-state seconds, pauses and resumes over every replica's books (the reports')."""
        out = dict(self._lost_totals)
        for books in self.backends.values():
            for key, value in books.stats().items():
                out[key] = out.get(key, 0.0) + value
        return out

    # -- decisions -----------------------------------------------------------------------
    def _goes(self, program_id: str, books: ProgramScheduler, now: float) -> None:
        """The turn leaves the router now: admitted, as far as the books go."""
        self.held.pop(program_id, None)
        books.turn_admitted(program_id, now)

    def _move(self, program_id: str, turn: int, books: ProgramScheduler, to: str,
              now: float) -> None:
        """Resume a paused program on replica `to` (its KV is re-prefilled there)."""
        context = books.context_of(program_id)
        books.program_left(program_id, now)
        target = self.backends[to]
        target.turn_arrived(program_id, context, now, turn)
        target.force_resume(program_id, now)
        self.home[program_id] = to
        self.moves += 1
        self._goes(program_id, target, now)

    def _room_elsewhere(self, program_id: str, books: ProgramScheduler,
                        live: Sequence[ReplicaLoad], home: str) -> str | None:
        """The live replica other than `home` with the most free room, if the program's
        context fits there."""
        rooms = self._rooms([r for r in live if r.name != home])
        if not rooms:
            return None
        best = roomiest(rooms)
        return best.name if best.free_tokens >= books.charge(program_id) else None

    def _roomiest(self, live: Sequence[ReplicaLoad]) -> str:
        """Where a program starts: the most free room; ties by the order listed."""
        return roomiest(self._rooms(live)).name

    def _rooms(self, live: Sequence[ReplicaLoad]) -> list[Room]:
        """Each replica as its books see it (`ProgramScheduler.room`)."""
        return [self.backends[r.name].room(r.name) for r in live]

    def _decide(self, live: Sequence[ReplicaLoad], now: float) -> None:
        """On the tick every replica's books decide; between ticks an idle replica's do. Each
        decides on its replica's KV usage as last reported (the shared-token term)."""
        tick = self._tick_index(now)
        on_tick = self._last_tick is None or tick > self._last_tick
        for r in live:
            if on_tick or (r.running == 0 and r.waiting == 0):
                books = self.backends[r.name]
                books.observe_engine(int(r.kv_usage * r.kv_capacity_tokens), dict)
                books.decide(now, idle=True)
        if on_tick:
            self._last_tick = tick
            self._forget_reaped()
            self.occupancy.append((now, self.backends[live[0].name].occupancy()))

    def _tick_index(self, now: float) -> int:
        origin = self._origin if self._origin is not None else now
        return math.floor((now - origin) / self.tick_s + 1e-9)

    def _next_tick(self, now: float) -> float:
        """The first tick of the router's grid after `now` (its origin: the first turn)."""
        origin = self._origin if self._origin is not None else now
        return origin + (self._tick_index(now) + 1) * self.tick_s

    # -- books -------------------------------------------------------------------------
    def _clock(self, info: TurnInfo | None) -> float:
        now = info.now if info is not None else self._now
        if self._origin is None:
            self._origin = now
        self._now = max(self._now, now)
        return now

    def _sync(self, live: Sequence[ReplicaLoad], now: float) -> None:
        """A scheduler per live replica, sized to its KV capacity; a lost replica's books
        go (its programs are placed afresh at their next turn)."""
        names = set()
        for r in live:
            names.add(r.name)
            books = self.backends.get(r.name)
            if books is None:
                books = self.backends[r.name] = self.scheduler_cls()
            if r.kv_capacity_tokens > 0 and books.capacity_tokens != r.kv_capacity_tokens:
                books.configure(r.kv_capacity_tokens, host_tier=False)
        for name in [n for n in self.backends if n not in names]:
            books = self.backends.pop(name)
            books.end_all(now)
            for key, value in books.stats().items():
                self._lost_totals[key] += value
            for pid in [p for p, h in self.home.items() if h == name]:
                del self.home[pid]

    def _forget_reaped(self) -> None:
        """Homes of programs no books hold any more (forgotten after their silence)."""
        for pid in [p for p, h in self.home.items()
                    if p not in self.held and h in self.backends
                    and not self.backends[h].knows(p)]:
            del self.home[pid]
