"""Which replicas hear about a program: the events fan-out rule of a cluster, in one place.

Why: a retention policy acts on interception events (`server/policies`), and in a cluster the
KV cache a policy would pin sits on the replica that computed the program's last turn, which a
scattering router (round robin, or a P/D split) may not send the next turn to. So both the
served router (`cluster.router_app`) and the virtual-time cluster (`sim.loop`) follow
this rule:

* `program_start` goes to each replica the first time the program is routed to it (so every
  replica's policy sees a whole lifecycle, start to end);
* `tool_start` and `tool_end` go to the replica that served the turn before the tool call
  (where that turn's KV cache is held, pinned or not);
* `program_end` goes to every replica the program touched, so no pin outlives its program;
* `program_moved` goes to the replica a binding router moved a program away from
  (`moved_from`), at the move: its next turns compute their context elsewhere, so what that
  replica holds for the program (a pin, a program scheduler's slot and memory account) is
  released now, not when the program ends; when the move carries the program's KV (the old
  home prefills the turn for the new one, `carry_kv`), once that prefill is handed over.
  Not for a P/D program's old decode replica: it keeps what it exported, which the next
  prefill may still read.
"""

from __future__ import annotations

from cluster.routing import Route


def moved_from(bound_before: str | None, bound_after: str | None, route: Route) -> str | None:
    """The replica a turn's routing moved its program away from (it gets `program_moved`:
    at once, or after its prefill when `route.prefill` is that replica, a move carrying the
    KV), or None: the router's binding before and after routing the turn (`Router.bound`)."""
    if bound_before is None or bound_after == bound_before:
        return None
    if route.prefill is not None and route.prefill != bound_before:
        return None  # a P/D turn: the prefill replica is not the program's home
    return bound_before


class Placement:
    """Per program, the replicas it has been routed to, the latest last."""

    def __init__(self) -> None:
        self._touched: dict[str, list[str]] = {}

    def route(self, program_id: str, route: Route) -> list[str]:
        """Record a turn's route; returns the replicas that must get `program_start` first."""
        used = self._touched.setdefault(program_id, [])
        new: list[str] = []
        for name in (route.prefill, route.decode):
            if name is None:
                continue
            if name in used:
                used.remove(name)
            else:
                new.append(name)
            used.append(name)
        return new

    def current(self, program_id: str) -> str | None:
        """Where tool events go: the replica that served the program's latest turn."""
        used = self._touched.get(program_id)
        return used[-1] if used else None

    def touched(self, program_id: str) -> list[str]:
        """Every replica the program has been routed to so far, the latest last."""
        return list(self._touched.get(program_id, []))

    def end(self, program_id: str) -> list[str]:
        """The program ended: every replica it touched (each gets `program_end`)."""
        return self._touched.pop(program_id, [])

    def forget_replica(self, name: str) -> None:
        """A replica died: no event goes to it any more."""
        for used in self._touched.values():
            if name in used:
                used.remove(name)
