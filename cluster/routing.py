"""Routing strategies: which replica serves a program's turn (and, under P/D, which prefills it).

Why small pure-Python classes, like `server/policies`: the placement decision is a research
object (AMPD's adaptive routing builds on this interface), and the same object must decide in
the virtual-time cluster (`sim.virtual_cluster`), behind the served router (`cluster.router_app`)
and in unit tests that work the answer out by hand. A router sees only `ReplicaLoad` views
that the caller fills in from whatever it can observe (in-process engines: the block pool and
queues; served replicas: the router's own in-flight counts and vLLM's KV-usage metric).

Strategies:

* `session`: consistent hash of the program id on a ring of replicas (`hash_points` virtual
  nodes each), so a program's turns land where its KV cache is and adding a replica moves only
  1/N of the programs. A KV-load guard: a program's first turn skips, clockwise, replicas whose
  KV usage is above `kv_guard` (unless all are), so one replica is not drowned. The binding is
  kept for the program's life.
* `round_robin`: every turn to the next replica, whatever program it belongs to (the scatter
  that costs RL users their prefix hits; a baseline).
* `least_loaded`: every turn to the replica with the fewest requests in flight, then the
  lowest KV usage.
* `pd` (Dynamo's 1PnD-like disaggregation): every prefill on a prefill replica (fewest prefills
  in flight, then lowest KV usage), decoding on the program's decode replica, bound at its first
  turn to the decode replica with the lowest KV usage (AMPD section 3, step 1, binds the same
  way).
* `programs` (`cluster.program_router`) places programs by the KV room of each replica, and
  `program-queue` (`cluster.program_queue`) also holds a paused program's turns in the router.
* `ampd` (`cluster.ampd`): `pd`'s binding, with each incremental prefill routed remote or local
  by TTFT/ITL slack and a cost model (AMPD section 4.1).
"""

from __future__ import annotations

import bisect
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class ReplicaLoad:
    """What a router may know about one replica right now."""

    name: str
    role: str  # colocated | prefill | decode
    kv_usage: float = 0.0  # share of the KV cache in use, 0..1
    #: requests sent here and not finished, computed or queued (what the strategies balance):
    #: served, the router's own count (exact, no delay); in virtual time, the engine's queues
    in_flight: int = 0
    #: the engine's own queues: in virtual time from its scheduler, served from its last
    #: metrics poll (a poll interval behind)
    running: int = 0
    waiting: int = 0
    alive: bool = True
    #: prompt tokens queued or part-computed here, not yet prefilled (AMPD's prefill queue)
    queued_prefill_tokens: int = 0
    #: the same queue task by task, as (tokens already cached for it, tokens to compute): a
    #: task's cached history is not priced again (Eq. 1-2 sum T_pre(l_hist_k, l_incr_k));
    #: None where only the total is known (the served router)
    queued_prefills: tuple[tuple[int, int], ...] | None = None
    #: context tokens of the requests decoding here, in all (a decode step's cost)
    decode_tokens: int = 0
    #: the KV cache's size in tokens (0: not reported), for routers that place by room
    kv_capacity_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Route:
    """Where a turn goes: `decode` decodes it; `prefill` (a prefill replica) computes its
    prompt first and hands the KV cache over, or None to prefill on `decode` itself."""

    decode: str
    prefill: str | None = None

    @property
    def remote(self) -> bool:
        return self.prefill is not None


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """What the caller knows about the turn being routed (cost-model strategies use it; the
    others ignore it). `now`: the caller's clock, seconds; `prompt_tokens`: the whole prompt;
    `history_tokens`: the part of it computed in the program's earlier turns, which its
    decode replica holds (0 on a first turn)."""

    now: float
    prompt_tokens: int = 0
    history_tokens: int = 0

    @property
    def new_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.history_tokens)


class NoReplicaError(RuntimeError):
    """No live replica can take the turn."""


class Router(ABC):
    """One routing strategy. `route` is called once per turn, in arrival order."""

    name: str = ""

    @abstractmethod
    def route(self, program_id: str, turn: int, replicas: Sequence[ReplicaLoad],
              info: TurnInfo | None = None) -> Route: ...

    def hold(self, program_id: str, turn: int, replicas: Sequence[ReplicaLoad],
             info: TurnInfo | None = None) -> float | None:
        """Asked before `route`: None sends the turn on now; a time (the caller's clock) keeps
        it waiting in the router (a global program queue, `cluster.program_queue`) until
        then, when the caller asks again (the same program and turn). Default: never held."""
        return None

    def program_end(self, program_id: str) -> None:
        """The program ended: forget its binding."""
        return None

    def bound(self, program_id: str) -> str | None:
        """The replica the program is bound to, if the strategy binds."""
        return None

    def reap(self, now: float) -> list[str]:
        """Forget the programs silent past the strategy's bound (never ended: a client
        killed mid-tool) and name them, so the caller drops what it keeps for them too.
        Default: the strategy keeps no program books over time."""
        return []

    def programs_held(self) -> int | None:
        """How many programs the strategy's books hold (None: it keeps none)."""
        return None


def _alive(replicas: Sequence[ReplicaLoad], *roles: str) -> list[ReplicaLoad]:
    found = [r for r in replicas if r.alive and r.role in roles]
    if not found:
        raise NoReplicaError(f"no live {' or '.join(roles)} replica")
    return found


def _least_kv(replicas: Sequence[ReplicaLoad]) -> ReplicaLoad:
    """Lowest KV usage; ties by fewest in flight, then by name (deterministic)."""
    return min(replicas, key=lambda r: (r.kv_usage, r.in_flight, r.name))


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class _Binding:
    """Program -> replica, for strategies that keep a program on one replica."""

    def __init__(self) -> None:
        self.of: dict[str, str] = {}

    def live(self, program_id: str, replicas: Sequence[ReplicaLoad]) -> str | None:
        name = self.of.get(program_id)
        if name is not None and any(r.name == name and r.alive for r in replicas):
            return name
        return None


class SessionRouter(Router):
    name = "session"

    def __init__(self, kv_guard: float = 0.9, hash_points: int = 64) -> None:
        self.kv_guard = kv_guard
        self.hash_points = hash_points
        self._binding = _Binding()
        self._ring: list[tuple[int, str]] = []
        self._ring_names: tuple[str, ...] = ()

    def _ring_for(self, names: tuple[str, ...]) -> list[tuple[int, str]]:
        if names != self._ring_names:
            self._ring = sorted((_hash(f"{name}#{i}"), name) for name in names
                                for i in range(self.hash_points))
            self._ring_names = names
        return self._ring

    def ring_order(self, program_id: str, names: Sequence[str]) -> list[str]:
        """Replicas clockwise from the program's point on the ring, each once."""
        ring = self._ring_for(tuple(sorted(names)))
        start = bisect.bisect(ring, (_hash(program_id), ""))
        order: list[str] = []
        for k in range(len(ring)):
            name = ring[(start + k) % len(ring)][1]
            if name not in order:
                order.append(name)
                if len(order) == len(names):
                    break
        return order

    def route(self, program_id: str, turn: int, replicas: Sequence[ReplicaLoad],
              info: TurnInfo | None = None) -> Route:
        bound = self._binding.live(program_id, replicas)
        if bound is not None:
            return Route(decode=bound)
        live = _alive(replicas, "colocated")
        by_name = {r.name: r for r in live}
        order = self.ring_order(program_id, list(by_name))
        chosen = next((n for n in order if by_name[n].kv_usage <= self.kv_guard), order[0])
        self._binding.of[program_id] = chosen
        return Route(decode=chosen)

    def program_end(self, program_id: str) -> None:
        self._binding.of.pop(program_id, None)

    def bound(self, program_id: str) -> str | None:
        return self._binding.of.get(program_id)


class RoundRobinRouter(Router):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def route(self, program_id: str, turn: int, replicas: Sequence[ReplicaLoad],
              info: TurnInfo | None = None) -> Route:
        live = sorted(_alive(replicas, "colocated"), key=lambda r: r.name)
        chosen = live[self._next % len(live)]
        self._next += 1
        return Route(decode=chosen.name)


class LeastLoadedRouter(Router):
    name = "least_loaded"

    def route(self, program_id: str, turn: int, replicas: Sequence[ReplicaLoad],
              info: TurnInfo | None = None) -> Route:
        live = _alive(replicas, "colocated")
        chosen = min(live, key=lambda r: (r.in_flight, r.kv_usage, r.name))
        return Route(decode=chosen.name)


class PDRouter(Router):
    """Always remote prefill; decoding stays on the program's decode replica."""

    name = "pd"

    def __init__(self) -> None:
        self._binding = _Binding()

    def decode_replica(self, program_id: str, replicas: Sequence[ReplicaLoad]) -> str:
        """The program's decode replica: bound at its first turn to the lowest KV usage."""
        bound = self._binding.live(program_id, replicas)
        if bound is None:
            bound = _least_kv(_alive(replicas, "decode")).name
            self._binding.of[program_id] = bound
        return bound

    def route(self, program_id: str, turn: int, replicas: Sequence[ReplicaLoad],
              info: TurnInfo | None = None) -> Route:
        decode = self.decode_replica(program_id, replicas)
        prefill = min(_alive(replicas, "prefill"),
                      key=lambda r: (r.in_flight, r.kv_usage, r.name))
        return Route(decode=decode, prefill=prefill.name)

    def program_end(self, program_id: str) -> None:
        self._binding.of.pop(program_id, None)

    def bound(self, program_id: str) -> str | None:
        return self._binding.of.get(program_id)
