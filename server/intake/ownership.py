"""Whose program is it: a program id belongs to the credential (API key) that first named it.

Why: an API key (vLLM's `--api-key`, the router's) says who may talk to a server, not whose
program a message is about. Without this, anyone holding a key could end, pause or move
another tenant's programs by naming their ids in `POST /v1/agent/events`. The events endpoint
of an engine (`server.intake.event_plugin`) and of a cluster's router (`cluster.router_events`) each
keep one `ProgramOwners` and refuse (403) an event about a program another credential opened.

A credential is a fingerprint of the request's bearer token (`credential_of`: SHA-256, never
the token itself). The first request or event that names a program opens it for its
credential; later ones from the same credential refresh it. The table is bounded, so ids
nobody uses again cannot grow it without limit:

* each credential keeps at most `PROGRAMS_PER_CREDENTIAL` programs; its least recently named
  goes first, so one tenant's flood of new ids forgets only its own programs;
* a program nobody named for `IDLE_FORGET_S` is forgotten (the program schedulers forget a
  silent program after the same time, `server.programs.state.STALE_AFTER_S`, and a KV pin
  lasts far less), and so is an ended one (`forget`, at its `program_end`);
* credentials are bounded by the keys the server accepts: its key check runs first.

Ownership is checked only where the server accepts several keys (`several_keys`): with none
or one, every client is the same tenant and nothing changes. Pure Python, no vLLM.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from server.intake.events import EventError, EventIn
from server.programs.state import STALE_AFTER_S

#: The most programs one credential owns at once (its least recently named is forgotten).
PROGRAMS_PER_CREDENTIAL = 65_536
#: A program no request or event named for this long is forgotten (seconds).
IDLE_FORGET_S = STALE_AFTER_S


def credential_of(authorization: str | None) -> str | None:
    """The fingerprint of an `Authorization` header's bearer token (None: no header).

    A fingerprint, not the key: the table may be shown or logged without giving a key away."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    secret = token if scheme.lower() == "bearer" else authorization
    return hashlib.sha256(secret.encode()).hexdigest()[:32]


def several_keys(keys: Iterable[str | None]) -> bool:
    """Whether a server that accepts `keys` has tenants to keep apart (two different keys)."""
    return len({key for key in keys if key}) > 1


class ProgramOwners:
    """program id -> the credential that opened it, bounded (see the module docstring).

    `clock`: seconds, monotonic (tests pass their own)."""

    def __init__(self, per_credential: int = PROGRAMS_PER_CREDENTIAL,
                 idle_s: float = IDLE_FORGET_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_credential = per_credential
        self.idle_s = idle_s
        self.clock = clock
        self._owner: dict[str, str | None] = {}
        #: per credential, its programs by when they were last named (oldest first)
        self._named: dict[str | None, OrderedDict[str, float]] = {}
        self.counts = {"opened": 0, "ended": 0, "idle": 0, "evicted": 0}

    def __len__(self) -> int:
        return len(self._owner)

    def owner(self, program_id: str) -> str | None:
        """The credential that opened `program_id` (None: nobody, or no credential)."""
        return self._owner.get(program_id)

    def admit(self, program_ids: Sequence[str], credential: str | None) -> int | None:
        """All or nothing: the index of the first program another credential owns (then
        nothing is recorded), else None once every program is recorded as `credential`'s
        (opened now, or refreshed)."""
        now = self.clock()
        self._forget_idle(now)
        for index, program_id in enumerate(program_ids):
            if program_id in self._owner and self._owner[program_id] != credential:
                return index
        for program_id in program_ids:
            self._name(program_id, credential, now)
        return None

    def claim(self, program_id: str, credential: str | None) -> bool:
        """A request names `program_id`: open it for `credential` if nobody has; whether
        `credential` owns it now. Nothing is refused here (the caller decides)."""
        return self.admit([program_id], credential) is None

    def forget(self, program_id: str) -> None:
        """The program ended: its id is free again."""
        if program_id in self._owner:
            credential = self._owner.pop(program_id)
            self._named[credential].pop(program_id, None)
            self._drop_if_empty(credential)
            self.counts["ended"] += 1

    def stats(self) -> dict[str, Any]:
        return {"programs": len(self._owner), "credentials": len(self._named), **self.counts}

    # -- bounds ------------------------------------------------------------------------------
    def _name(self, program_id: str, credential: str | None, now: float) -> None:
        named = self._named.setdefault(credential, OrderedDict())
        if program_id in named:
            named.move_to_end(program_id)
        else:
            self._owner[program_id] = credential
            self.counts["opened"] += 1
            if len(named) >= self.per_credential:
                oldest, _ = named.popitem(last=False)
                del self._owner[oldest]
                self.counts["evicted"] += 1
        named[program_id] = now

    def _forget_idle(self, now: float) -> None:
        for credential, named in list(self._named.items()):
            while named:
                program_id, seen = next(iter(named.items()))
                if now - seen < self.idle_s:
                    break
                named.popitem(last=False)
                del self._owner[program_id]
                self.counts["idle"] += 1
            self._drop_if_empty(credential)

    def _drop_if_empty(self, credential: str | None) -> None:
        if not self._named.get(credential, True):
            del self._named[credential]


class NotOwner(EventError):
    """An event about a program another credential opened (HTTP 403). The message names the
    program, never its owner."""

    status = 403
    reason = "not_owner"

    def __init__(self, index: int, program_id: str) -> None:
        super().__init__(f"event {index + 1}: program {program_id!r} was opened with another "
                         "API key; only that key may send events about it")


def admit_events(owners: ProgramOwners | None, events: Sequence[EventIn],
                 credential: str | None) -> None:
    """Raise `NotOwner` unless `credential` (`credential_of` the sender's key) may send every
    one of `events` (the programs nobody owned become its own); no-op without `owners` (one
    tenant). The `program_end`s among them free their ids: call `events_done` once they are
    sent."""
    if owners is None:
        return
    refused = owners.admit([e.program_id for e in events], credential)
    if refused is not None:
        raise NotOwner(refused, events[refused].program_id)


def events_done(owners: ProgramOwners | None, events: Sequence[EventIn]) -> None:
    """The ended programs among `events` (sent on) are forgotten."""
    if owners is None:
        return
    for event in events:
        if event.type == "program_end":
            owners.forget(event.program_id)
