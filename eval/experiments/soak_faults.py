"""The soak's fault plan: what goes wrong on the client side, and the replay driver that makes
it go wrong.

Why these faults: the program schedulers and the KV pins hold memory and queue slots for
programs that say they will come back. Real clients break that promise in a few ways, each
one here: a person closes the laptop in a tool call (``kill_mid_tool``: the client vanishes
after ``tool_start``, never sending ``tool_end`` or ``program_end``), a client is killed while
its turn streams (``kill_mid_turn``: the connection drops, the engine aborts the request, no
event follows), a lossy network (``drop_events``: `DROP_SHARE` of events never sent), a
confused or hostile client (``unknown_events``: bursts of events for programs nobody started),
an agent framework that never says goodbye (``no_program_end``), the server itself going
away (``restart``: killed and started again mid-run; sessions in flight start over), and, for a
cluster, one replica dying (``kill_replica``, `eval.experiments.soak_cluster`).

Which session gets which fault is drawn from the run's seed and the session's number, so a
resumed run draws the same plan for the sessions it has left.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from common.errors import UserError
from common.trace import Trace
from eval.replay.http_replay import Driver, DriverFactory, HttpReplayError
from harness.events_client import EventClient
from sim.conversation import ProgramState

#: every fault, in the order the docs list them
FAULTS = ("kill_mid_tool", "kill_mid_turn", "drop_events", "unknown_events", "no_program_end",
          "restart", "kill_replica")
#: share of sessions whose client is killed in a tool call / while a turn streams / that never
#: sends program_end (each drawn apart)
KILL_TOOL_SHARE = 0.1
KILL_TURN_SHARE = 0.1
NO_END_SHARE = 0.1
#: share of events dropped (``drop_events``)
DROP_SHARE = 0.1
#: how long a killed turn streams before its client goes (wall seconds)
KILL_TURN_AFTER_S = 0.2
#: a burst of events for unknown programs (``unknown_events``): this many, every so often
BURST_EVENTS = 200
BURST_EVERY_S = 30.0
#: where in the run (share of its driving time) the server is killed and started again
RESTART_AT = 0.5


class FaultsError(UserError):
    pass


def parse_faults(text: str) -> frozenset[str]:
    """``all`` (the default), ``none``, or names separated by commas; ``-NAME`` takes one out
    (``all,-restart``)."""
    chosen: set[str] = set()
    for item in (part.strip() for part in text.split(",")):
        name = item.lstrip("-").replace("-", "_")
        if item == "":
            continue
        if item == "all":
            chosen.update(FAULTS)
        elif item == "none":
            chosen.clear()
        elif name not in FAULTS:
            raise FaultsError(f"--faults: unknown fault {item!r}; the faults: "
                              f"{', '.join(FAULTS)} (or all, none, -NAME to leave one out)")
        elif item.startswith("-"):
            chosen.discard(name)
        else:
            chosen.add(name)
    return frozenset(chosen)


@dataclass(frozen=True)
class SessionFaults:
    """What goes wrong in one session: the tool call (its index) in which its client dies,
    the turn during which it dies, whether it ever says `program_end`, the share of its
    events dropped."""

    kill_in_tool: int | None = None
    kill_in_turn: int | None = None
    no_end: bool = False
    drop_share: float = 0.0


@dataclass(frozen=True)
class FaultPlan:
    enabled: frozenset[str] = frozenset(FAULTS)
    seed: int = 0

    def session(self, number: int, turns: int) -> SessionFaults:
        """Session `number`'s faults (a program of `turns` turns); the same for the same
        seed and number."""
        rng = random.Random(self.seed * 1_000_003 + number)
        draws = [rng.random() for _ in range(3)]
        kill_tool = kill_turn = None
        if "kill_mid_tool" in self.enabled and turns > 1 and draws[0] < KILL_TOOL_SHARE:
            kill_tool = rng.randrange(turns - 1)
        elif "kill_mid_turn" in self.enabled and draws[1] < KILL_TURN_SHARE:
            kill_turn = rng.randrange(turns)
        return SessionFaults(
            kill_in_tool=kill_tool, kill_in_turn=kill_turn,
            no_end="no_program_end" in self.enabled and draws[2] < NO_END_SHARE,
            drop_share=DROP_SHARE if "drop_events" in self.enabled else 0.0)

    @property
    def restarts(self) -> bool:
        return "restart" in self.enabled

    @property
    def kills_replica(self) -> bool:
        return "kill_replica" in self.enabled

    @property
    def bursts(self) -> bool:
        return "unknown_events" in self.enabled


class ClientKilled(HttpReplayError):
    """The fault plan killed this session's client (not an error of the server)."""


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions an exception group holds, its nested groups opened; [exc] otherwise."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def describe(exc: BaseException) -> str:
    """``Type: message``; a group says what it holds (``ExceptionGroup: ConnectError: ...``),
    since its own message (``unhandled errors in a TaskGroup``) names nothing that happened."""
    if isinstance(exc, BaseExceptionGroup):
        return f"{type(exc).__name__}: " + "; ".join(describe(leaf) for leaf in leaves(exc))
    return f"{type(exc).__name__}: {exc}"


@dataclass
class Tally:
    """What happened to the requests and events, summed over the run (the record keeps it).

    Every request sent is counted once in exactly one of: ``answered``, ``refused`` (an error
    from the server, or the connection cut, as the ``restart`` fault cuts the turns in
    flight), ``hangs``, ``killed_turns`` (the fault plan's), ``left_at_end`` (in flight when the
    clients left at the end of the run: its task was cancelled) and ``client_errors`` (an
    exception in our own client code, not the server's answer). The judge checks the sum."""

    timeout_s: float = 0.0
    sent: int = 0
    answered: int = 0
    refused: int = 0
    hangs: int = 0
    killed_turns: int = 0
    left_at_end: int = 0
    client_errors: int = 0
    killed_tools: int = 0
    no_end_sessions: int = 0
    events_dropped: int = 0
    unknown_events: int = 0
    sessions_done: int = 0
    sessions_restarted: int = 0
    restarts: int = 0
    replicas_killed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: requests sent and without a first token yet: key -> monotonic time sent (not recorded)
    waiting: dict[str, float] = field(default_factory=dict, repr=False)
    #: the unexpected exceptions whose traceback was logged, by their leaves' types (not
    #: recorded)
    logged: set[tuple[str, ...]] = field(default_factory=set, repr=False)

    def error(self, what: str | BaseException) -> None:
        """Keep the first errors (a session's failed request is reported again as the
        session's failure: kept once); an exception as `describe` says it."""
        message = (what if isinstance(what, str) else describe(what))[:300]
        if len(self.errors) < 20 and message not in self.errors[-1:]:
            self.errors.append(message)

    def log_once(self, exc: BaseException) -> None:
        """The traceback of an exception the client did not expect, to the soak's log
        (stderr), once per kind (its leaves' types): the record keeps only a line, and the
        next run must say where it came from."""
        kind = tuple(type(leaf).__name__ for leaf in leaves(exc))
        if kind in self.logged:
            return
        self.logged.add(kind)
        print(f"soak: unexpected client error ({describe(exc)[:300]}); its traceback, logged "
              "once per kind:", file=sys.stderr)
        traceback.print_exception(exc, file=sys.stderr)

    def oldest_wait_s(self) -> float:
        return max((time.monotonic() - t for t in self.waiting.values()), default=0.0)

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("waiting", "logged")}


class FaultyDriver(Driver):
    """`Driver` with one session's faults, counting every request's outcome in a `Tally`."""

    def __init__(self, trace: Trace, client: httpx.AsyncClient, base: str, model: str,
                 run_id: str, progress: Callable[[int], None] | None, *,
                 faults: SessionFaults, tally: Tally) -> None:
        super().__init__(trace, client, base, model, run_id, progress)
        self.faults = faults
        self.tally = tally
        self._key = ""
        self.killed = False
        self.tools = 0  # tool calls begun
        self.rng = random.Random(secrets.randbits(32))

    def emit(self, kind: str, program_id: str, **fields: Any) -> None:
        if self.killed or (kind == "program_end" and self.faults.no_end):
            return
        if kind == "tool_start":
            self.tools += 1
        if self.faults.drop_share and self.rng.random() < self.faults.drop_share:
            self.tally.events_dropped += 1
            return
        super().emit(kind, program_id, **fields)

    async def sleep_until(self, t: float) -> None:
        if self.faults.kill_in_tool is not None and self.tools == self.faults.kill_in_tool + 1:
            await super().sleep_until(self.now() + (t - self.now()) / 2)
            self.killed = True
            self.tally.killed_tools += 1
            raise ClientKilled("killed in a tool call by the fault plan")
        await super().sleep_until(t)

    async def complete(self, state: ProgramState, i: int) -> Any:
        key = f"{self.session(state.program.id)}#{i}"
        self.tally.sent += 1
        self.tally.waiting[key] = time.monotonic()
        self._key = key
        try:
            if i == self.faults.kill_in_turn:
                return await self._killed_turn(state, i)
            got = await super().complete(state, i)
        except ClientKilled:
            raise
        except HttpReplayError as exc:
            if "Timeout" in str(exc):
                self.tally.hangs += 1
            else:
                self.tally.refused += 1
            self.tally.error(str(exc))
            raise
        except asyncio.CancelledError:
            # in a soak only the run's end cancels a request (one program per replay: no
            # sibling fails it; a killed turn's own request is cancelled in a task apart)
            self.tally.left_at_end += 1
            raise
        except Exception as exc:  # our client broke: the worker records the line
            self.tally.client_errors += 1
            self.tally.log_once(exc)
            raise
        finally:
            self.tally.waiting.pop(key, None)
        self.tally.answered += 1
        return got

    async def _killed_turn(self, state: ProgramState, i: int) -> Any:
        turn = asyncio.ensure_future(super().complete(state, i))
        done, _ = await asyncio.wait({turn}, timeout=KILL_TURN_AFTER_S)
        if done:  # answered before the kill came: the client dies right after instead
            turn.result()
        else:
            turn.cancel()
            await asyncio.gather(turn, return_exceptions=True)
        self.killed = True
        self.tally.killed_turns += 1
        raise ClientKilled("killed while its turn streamed by the fault plan")

    def read_chunk(self, chunk: dict[str, Any], got: Any, where: str) -> None:
        super().read_chunk(chunk, got, where)
        if got.first_token is not None:
            self.tally.waiting.pop(self._key, None)


def faulty_driver(faults: SessionFaults, tally: Tally) -> DriverFactory:
    """A `RequestOptions.driver` for one session."""
    def make(trace: Trace, client: httpx.AsyncClient, base: str, model: str, run_id: str,
             progress: Callable[[int], None] | None) -> Driver:
        return FaultyDriver(trace, client, base, model, run_id, progress, faults=faults,
                            tally=tally)
    return make


async def event_bursts(base: str, tally: Tally, stop: asyncio.Event,
                       every_s: float = BURST_EVERY_S) -> None:
    """Every `every_s`, `BURST_EVENTS` events for programs no client started (tool calls
    beginning and ending, programs ending), until `stop` is set."""
    async with EventClient(base) as events:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=every_s)
                break
            except TimeoutError:
                pass
            for n in range(BURST_EVENTS):
                program = f"unknown-{secrets.token_hex(4)}"
                kind = ("tool_start", "tool_end", "program_end")[n % 3]
                events.emit(kind, program, tool="bash" if kind == "tool_start" else None)
                tally.unknown_events += 1
            await events.drain(2.0)
