"""The simulation's agenda: what is due at a virtual time outside any engine step, and in what
order.

Why named kinds: the loop (`sim.loop`) does one thing per kind, and a reader should see which
without decoding tuples. Three things happen between engine steps:

* `TurnDue`: a program's turn is due, because the program arrives (turn 0) or a tool call
  returns (the turns after it).
* `RequestArrives`: a request the client sent reaches its engine, `intake_s` after it was sent
  (only with a served path; without one a request reaches the engine the moment it is sent).
* `PrefillHandover`: a prefill replica finished a remote turn's prompt; its decode replica now
  gets the request with the KV-transfer parameters the prefill replica returned.

Items are ordered by time, and items due at the same time in the order they were pushed (a
sequence number), so the same trace, cluster and seed give the same numbers.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sim.virtual_cluster import Replica


@dataclass(frozen=True, slots=True)
class TurnDue:
    """Turn `turn` of program `program_id` is due: the client sends its request now."""

    program_id: str
    turn: int


@dataclass(frozen=True, slots=True)
class RequestArrives:
    """Request `request_id` (turn `turn` of `program_id`) reaches `replica`'s engine.
    `max_one`: a remote prefill (one output token); `params`: its `kv_transfer_params`."""

    replica: Replica
    request_id: str
    program_id: str
    turn: int
    max_one: bool
    params: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class PrefillHandover:
    """Turn `turn` of `program_id` was prefilled remotely; its decode replica takes it over
    with `params` (`cluster.pd.decode_params` of what the prefill replica returned)."""

    program_id: str
    turn: int
    params: dict[str, Any]


AgendaItem = TurnDue | RequestArrives | PrefillHandover


class Agenda:
    """Agenda items by virtual time; ties go to the item pushed first."""

    def __init__(self, items: Iterable[tuple[float, AgendaItem]] = ()) -> None:
        self._heap: list[tuple[float, int, AgendaItem]] = [
            (t, n, item) for n, (t, item) in enumerate(items)]
        heapq.heapify(self._heap)
        self._sequence = itertools.count(len(self._heap) + 1)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def next_time(self) -> float:
        """When the earliest item is due (the agenda must not be empty)."""
        return self._heap[0][0]

    def push(self, t: float, item: AgendaItem) -> None:
        heapq.heappush(self._heap, (t, next(self._sequence), item))

    def pop(self) -> tuple[float, AgendaItem]:
        t, _, item = heapq.heappop(self._heap)
        return t, item
