"""The served router's event fan-out: `POST /v1/agent/events` to the replicas that hold a
program.

Events are validated as the replicas validate them (`server.intake.events`), then fanned out by
`cluster.placement`'s rule, the one the virtual-time cluster follows: a program's
`program_start` is kept and delivered to each replica the first time one of the program's
turns is routed there (prefill replicas included), before that turn; `tool_start` and
`tool_end` go to the replica that served the program's latest turn (where its KV cache is);
`program_end` goes to every replica the program touched and ends the router's binding;
`program_moved` goes to the replica a turn's routing moved its program away from, before
the turn (sent by the turn forwarder: `tell_moved`). A
program no turn of which was routed yet (events before its first request) falls back to its
binding (`session`, `pd`: bound now) and, for strategies that do not bind, reaches nobody.
The targets are `ClusterState.event_targets`; this class moves the lines and keeps count.

A body is refused as a replica refuses it (`server.intake.events`: 400 when it is not valid events,
413 over `MAX_BODY_BYTES`), and, where the router has tenants (several API keys,
`cluster.router_auth`), with a 403 when it names a program another tenant's key opened
(`server.intake.ownership`, the class the engines keep too: a completions request or an event opens
a program for its key, `program_end` frees the id). Each refusal is counted
(`events_refused_<reason>` in `GET /v1/cluster`, `refused` in `GET /v1/agent/events`). A
completions request naming another key's program is refused the same way (`claim`: 403,
counted as `requests_refused_not_owner`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import httpx

from cluster.router_state import ClusterState
from cluster.router_wire import GONE, Reply, auth_of, error_reply, program_of
from server.intake.events import REFUSALS, EventError, parse_events
from server.intake.ownership import ProgramOwners, admit_events, events_done

log = logging.getLogger("harness.cluster.router")


class EventFanout:
    """Receives a batch of agent events and sends each to the replicas that must hear it."""

    def __init__(self, state: ClusterState, client: Callable[[], httpx.AsyncClient],
                 owners: ProgramOwners | None = None) -> None:
        self.state = state
        self.client = client  # the router's upstream client, opened when it starts
        self.owners = owners  # who opened each program; None: one tenant, nothing to check
        for reason in REFUSALS:
            state.counters.setdefault(f"events_refused_{reason}", 0)
        state.counters.setdefault("requests_refused_not_owner", 0)

    def claim(self, raw: bytes, headers: Any, credential: str | None) -> Reply | None:
        """A completions request (`raw`, its body) opens its program for `credential` when
        nobody has (with tenants only); a 403 when another key opened it (a turn would move,
        pin or end another tenant's program as an event would), None when the turn goes on."""
        if self.owners is None:
            return None
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            return None  # the turn forwarder answers it with a 400
        program = program_of(body, headers) if isinstance(body, dict) else None
        if program is None or self.owners.claim(program, credential):
            return None
        self.state.counters["requests_refused_not_owner"] += 1
        return error_reply(f"program {program!r} was opened with another API key; only that "
                           "key may send its turns", 403, "permission_error")

    async def receive(self, raw: bytes, headers: Any = None,
                      credential: str | None = None) -> Reply:
        """`POST /v1/agent/events`: one JSON event, a JSON list or NDJSON lines in; per
        replica, how many of its events it forwarded to its scheduler. The client's
        `Authorization` goes on to the replicas (`headers`, its request's); `credential`: the
        fingerprint of its key, where the router has tenants (`cluster.router_auth`)."""
        auth = auth_of(headers)
        state = self.state
        try:
            events = parse_events(raw)
            admit_events(self.owners, events, credential)
        except EventError as exc:
            return self.refuse(exc)
        per_target: dict[str, list[int]] = {}
        kept: set[int] = set()  # program_start events held for the program's first turn
        for index, event in enumerate(events):
            for target in state.event_targets(event.program_id, event.type):
                per_target.setdefault(target, []).append(index)
        lines = [json.dumps(e.model_dump(exclude_none=True)) for e in events]
        for event, line in zip(events, lines, strict=True):
            if event.type == "program_start":
                state.starts[event.program_id] = line
                kept.add(id(event))

        async def send(target: str, indices: list[int]) -> tuple[str, int, str | None]:
            forwarded, problem = await self.send(target, [lines[i] for i in indices], auth)
            return target, forwarded, problem

        results = await asyncio.gather(*(send(t, ix) for t, ix in per_target.items()))
        reached: set[int] = set()
        report: dict[str, Any] = {}
        for target, forwarded, problem in results:
            reached.update(per_target[target][:forwarded])
            report[target] = ({"sent": len(per_target[target]), "forwarded": forwarded}
                              if problem is None else {"sent": len(per_target[target]),
                                                       "forwarded": 0, "error": problem})
        for event in events:
            if event.type == "program_end":
                state.router.program_end(event.program_id)
                state.book.end(event.program_id)
                state.starts.pop(event.program_id, None)
                state.counters["programs_ended"] += 1
        events_done(self.owners, events)
        held = sum(1 for i, e in enumerate(events) if id(e) in kept and i not in reached)
        state.counters["events_received"] += len(events)
        state.counters["events_forwarded"] += len(reached)
        state.counters["events_dropped"] += len(events) - len(reached) - held
        return Reply(payload={"accepted": len(events), "forwarded": len(reached),
                              "held": held, "replicas": report})

    def refuse(self, error: EventError) -> Reply:
        """A body refused (`error.status`: 400, 403 or 413), counted under its reason."""
        self.state.counters[f"events_refused_{error.reason}"] += 1
        return Reply(error.status, payload={"error": str(error)})

    def stats(self) -> dict[str, Any]:
        """`GET /v1/agent/events` on the router: its event counters and who owns how much."""
        counters = self.state.counters
        return {"received": counters["events_received"],
                "forwarded": counters["events_forwarded"],
                "dropped": counters["events_dropped"],
                "refused": {r: counters[f"events_refused_{r}"] for r in REFUSALS},
                "owners": None if self.owners is None else self.owners.stats()}

    async def tell_moved(self, target: str, program_id: str,
                         auth: dict[str, str] | None = None) -> None:
        """The router moved `program_id` away from replica `target`: it hears
        `program_moved` (`cluster.placement`), so it releases what it holds for the program
        now. A replica that cannot be told is left to its own bounds (a pin's expiry, a
        program scheduler's silence rule)."""
        _, problem = await self.send(target, [json.dumps({"type": "program_moved",
                                                          "program_id": program_id})], auth)
        if problem is not None:
            log.warning("could not tell replica %s that program %s moved: %s", target,
                        program_id, problem)

    async def send(self, target: str, lines: list[str],
                   auth: dict[str, str] | None = None) -> tuple[int, str | None]:
        """Send event lines to one replica: (how many it forwarded to its scheduler, the
        problem if none). `auth`: the client's `Authorization` header (`auth_of`)."""
        replica = self.state.replicas[target]
        try:
            answer = await self.client().post(
                replica.url + "/v1/agent/events", content="\n".join(lines).encode(),
                headers={"content-type": "application/x-ndjson", **(auth or {})}, timeout=5.0)
        except GONE as exc:
            replica.mark_dead(replica.not_answering(exc))
            return 0, replica.not_answering(exc)
        except httpx.HTTPError as exc:
            return 0, f"{type(exc).__name__}: {exc}"
        if answer.status_code != 200:
            return 0, f"HTTP {answer.status_code}: {answer.text[:200]}"
        try:
            return int(answer.json().get("forwarded", len(lines))), None
        except (ValueError, AttributeError):
            return 0, "the replica's answer is not JSON"
