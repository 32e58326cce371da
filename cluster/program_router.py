"""`programs`: a router that places programs, not requests, by the KV room each replica has.

Why: session routing hashes a program to a replica and keeps it there whatever the replica
holds; least-loaded routing moves every turn to the emptiest queue and loses the program's KV
each time. A program scheduler (`server.programs`) knows how much KV each program holds, so the
router can put a program where there is room for it and keep it there while it fits:

* A program's first turn goes to the replica with the most free KV room, counted from the
  contexts of the programs the router has placed there (their latest prompts, plus
  `PER_PROGRAM_TOKENS` each) against the replica's KV capacity (`ReplicaLoad.kv_capacity_tokens`;
  where a replica does not report one, the replica's measured KV usage ranks it instead).
* Later turns follow the program home (its KV is there). A program whose home no longer has
  room for it, while another replica has, is moved there at its next turn — `moves` counts
  them — re-prefilled there, as ThunderAgent and vllm-router resume, or, with `carry_kv`,
  taking its KV along over NIXL: the turn is routed as a P/D turn whose prefill replica is the
  old home (its prefix cache holds the context, so it computes only the turn's new tokens)
  and whose decode replica is the new home, which reads the whole context over the link.
  The old home then forgets the program (`program_moved`, `cluster.placement`).
* Each replica's own program scheduler (its policy, e.g. `lookahead`) decides which of the
  programs placed on it run at once; the router decides where, the engine decides when.

Placement is `ProgramScheduler.place` (the rule the engine-side schedulers share), over a
ledger kept with the scheduler's public methods (`track`, `place`, `held_by_replica`,
`forget`); the ledger forgets a program at its end, and one that never ends after the
cluster's silent-program bound (`router.stale_after_s`, by default `STALE_AFTER_S`, the
replicas' own: `ProgramTable.reap`, the engines' rule), so a client killed mid-tool, or an
event about an id nobody started, holds nothing here for ever; `reap` names the forgotten
programs so the served router drops its own books of them (`ClusterState.route_turn`).
"""

from __future__ import annotations

from collections.abc import Sequence

from cluster.routing import ReplicaLoad, Route, Router, TurnInfo, _alive
from server.programs import ProgramScheduler, Room
from server.programs.state import STALE_AFTER_S

#: A replica is full for placement above this share of its capacity (room for growing turns).
ROOM_SHARE = 0.9


class ProgramRouter(Router):
    name = "programs"

    def __init__(self, carry_kv: bool = False, stale_after_s: float = STALE_AFTER_S) -> None:
        #: the programs placed: each one's context, home and last turn (for forgetting a
        #: program that never ends, after `stale_after_s` of silence) are all it needs
        self.ledger = ProgramScheduler()
        self.ledger.forget_silent_after(stale_after_s)  # as the engines set theirs
        self.moves = 0
        #: a moved program's KV goes along over NIXL (every replica runs the connector)
        self.carry_kv = carry_kv

    def _rooms(self, live: Sequence[ReplicaLoad], program_id: str) -> list[Room]:
        held = self.ledger.held_by_replica(excluding=program_id)
        rooms = []
        for r in live:
            if r.kv_capacity_tokens > 0:
                rooms.append(Room(r.name, int(ROOM_SHARE * r.kv_capacity_tokens),
                                  held.get(r.name, 0)))
            else:  # no capacity reported: rank by measured usage on a 0..1000 scale
                rooms.append(Room(r.name, 1000, int(1000 * r.kv_usage)))
        return rooms

    def route(self, program_id: str, turn: int, replicas: Sequence[ReplicaLoad],
              info: TurnInfo | None = None) -> Route:
        live = _alive(replicas, "colocated")
        now = info.now if info is not None else 0.0
        ledger = self.ledger
        self.reap(now)
        ledger.track(program_id, now, info.prompt_tokens if info is not None else None)
        home = ledger.replica_of(program_id)
        home_lives = home in {r.name for r in live}
        # a home lost with its replica is no room of `live`: the program is placed afresh
        chosen = ledger.place(program_id, self._rooms(live, program_id))  # records it
        if home is None or chosen == home:
            return Route(decode=chosen)
        self.moves += 1
        if self.carry_kv and home_lives:  # the old home holds the context: it sends it
            return Route(decode=chosen, prefill=home)
        return Route(decode=chosen)

    def program_end(self, program_id: str) -> None:
        self.ledger.forget(program_id)

    def bound(self, program_id: str) -> str | None:
        return self.ledger.replica_of(program_id)

    def reap(self, now: float) -> list[str]:
        return self.ledger.reap(now)

    def programs_held(self) -> int:
        return len(self.ledger.table)
