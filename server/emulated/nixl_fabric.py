"""How the emulated P/D workers of different engines reach each other: notes and fabrics.

The real NIXL workers tell each other that a read is done ("`req:consumers`"), keep leases
alive with heartbeats ("HB:") and, from a router, hear that an export will not be read; here
each of those is a `Note`, carried by a fabric. Replicas find each other through a fabric
(`harness_fabric`): `inproc:NAMESPACE` for `VirtualEngine`s in one process (a registry keyed by
engine id; a notification to an idle engine wakes it), `zmq` for one `vllm serve` per replica:
each engine binds a ZMQ PULL socket on the side-channel host and port it advertises as
`remote_host` / `remote_port` (`VLLM_NIXL_SIDE_CHANNEL_HOST` / `_PORT`, where the real
handshake listener would bind) and peers PUSH their notifications there.

Why apart from the worker (`server.emulated.nixl`): the transport knows nothing of steps,
reads or leases, and a router (`cluster.pd.release_export`) sends its notes without a worker;
with no vLLM import at module level, the router side loads it cheaply.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import zmq

from server.clock import clock

#: the P/D worker's logger, as before the transport had a module of its own
logger = logging.getLogger("harness.emulated_nixl")

#: Keys of `kv_connector_extra_config` the emulated worker reads (vLLM ignores them), written by
#: `cluster.pd`: the links to the peers (`{peer: {"latency_s": s, "bandwidth": bytes/s}}`) and
#: the fabric.
LINKS_KEY = "harness_links"
FABRIC_KEY = "harness_fabric"


@dataclass(frozen=True, slots=True)
class Note:
    """A worker-to-worker message: `read` (a reader is done with `req_ids`: NIXL's
    "req:consumers" notification), `hb` (heartbeat: extend those leases) or `release` (a
    router says nobody will read them). `at`: the sender's clock when it takes effect."""

    kind: str
    req_ids: tuple[str, ...]
    sender: str
    at: float
    consumers: int = 1

    def encode(self) -> bytes:
        return json.dumps({"kind": self.kind, "req_ids": list(self.req_ids),
                           "sender": self.sender, "at": self.at,
                           "consumers": self.consumers}).encode()

    @classmethod
    def decode(cls, data: bytes) -> Note:
        raw = json.loads(data)
        return cls(str(raw["kind"]), tuple(str(r) for r in raw["req_ids"]), str(raw["sender"]),
                   float(raw["at"]), int(raw.get("consumers", 1)))


class Fabric:
    """How an engine's worker reaches its peers' workers."""

    def send(self, engine_id: str, host: str | None, port: int | None, note: Note,
             not_before: float) -> bool:
        raise NotImplementedError

    def receive(self) -> list[Note]:
        raise NotImplementedError

    def pending(self) -> bool:
        """Whether notes are waiting to be received (in-process: exact; ZMQ: unknown, False)."""
        return False

    def close(self) -> None:
        return None


class _Mailbox:
    def __init__(self) -> None:
        self.notes: list[Note] = []
        self.wake: Callable[[float], None] | None = None


_INPROC: dict[tuple[str, str], _Mailbox] = {}


class InprocFabric(Fabric):
    """Engines of one process, keyed by (namespace, engine id)."""

    def __init__(self, namespace: str, engine_id: str) -> None:
        key = (namespace, engine_id)
        if key in _INPROC:
            raise ValueError(f"engine id {engine_id!r} is already registered in fabric "
                             f"namespace {namespace!r}; give each replica its own name, or "
                             "close the previous engine first")
        self.namespace = namespace
        self.engine_id = engine_id
        self.mailbox = _Mailbox()
        _INPROC[key] = self.mailbox

    def send(self, engine_id: str, host: str | None, port: int | None, note: Note,
             not_before: float) -> bool:
        box = _INPROC.get((self.namespace, engine_id))
        if box is None:
            return False
        if box.wake is not None:
            # The target may be idle with a stale clock: bring it up to when the sender's step
            # began (every arrival before that has already been delivered to it), no further.
            box.wake(min(not_before, note.at))
        box.notes.append(note)
        return True

    def receive(self) -> list[Note]:
        notes, self.mailbox.notes = self.mailbox.notes, []
        return notes

    def pending(self) -> bool:
        return bool(self.mailbox.notes)

    def knows(self, engine_id: str) -> bool:
        """Whether an engine of that id is registered in this fabric's namespace."""
        return (self.namespace, engine_id) in _INPROC

    def close(self) -> None:
        if _INPROC.get((self.namespace, self.engine_id)) is self.mailbox:
            del _INPROC[(self.namespace, self.engine_id)]


def _zmq_path(host: str, port: int) -> str:
    from vllm.utils.network_utils import make_zmq_path  # vLLM: start-up cost (the router side)

    return make_zmq_path("tcp", host, port)


class ZmqFabric(Fabric):
    """One process per engine: a PULL socket on this engine's side-channel address, PUSH
    sockets to the peers' (`remote_host` / `remote_port` of their `kv_transfer_params`)."""

    def __init__(self, host: str, port: int) -> None:
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        try:
            self._pull.bind(_zmq_path(host, port))
        except zmq.ZMQError as exc:
            self._ctx.destroy(linger=0)
            raise RuntimeError(
                f"cannot listen for P/D notifications on {host}:{port} ({exc}); give each "
                "replica its own VLLM_NIXL_SIDE_CHANNEL_PORT (cluster.pd.side_channel_env)"
            ) from None
        self._push: dict[tuple[str, int], Any] = {}

    def send(self, engine_id: str, host: str | None, port: int | None, note: Note,
             not_before: float) -> bool:
        if host is None or port is None:
            return False
        sock = self._push.get((host, int(port)))
        if sock is None:
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(_zmq_path(host, int(port)))
            self._push[(host, int(port))] = sock
        try:
            sock.send(note.encode(), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            logger.warning("P/D notification to %s (%s:%s) failed: %s", engine_id, host, port,
                           exc)
            return False
        return True

    def receive(self) -> list[Note]:
        notes: list[Note] = []
        while True:
            try:
                data = self._pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                return notes
            try:
                notes.append(Note.decode(data))
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("ignoring a malformed P/D notification: %s", exc)

    def close(self) -> None:
        for sock in self._push.values():
            sock.close()
        self._push.clear()
        self._pull.close()
        self._ctx.term()


def make_fabric(spec: str, engine_id: str, host: str, port: int) -> Fabric:
    kind, _, namespace = spec.partition(":")
    if kind == "inproc":
        return InprocFabric(namespace or "default", engine_id)
    if kind == "zmq":
        return ZmqFabric(host, port)
    raise ValueError(f"unknown {FABRIC_KEY} {spec!r}; use 'zmq' or 'inproc[:NAMESPACE]'")


def send_release(exported: Mapping[str, Any]) -> bool:
    """Served replicas: tell the engine that exported `exported` to free those blocks now
    (see `cluster.pd.release_export`)."""
    req = exported.get("remote_request_id")
    host, port = exported.get("remote_host"), exported.get("remote_port")
    if req is None or host is None or port is None:
        return False
    note = Note("release", (str(req),), "router", clock().now())
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(_zmq_path(str(host), int(port)))
        sock.send(note.encode(), zmq.NOBLOCK)
        sock.close()
        return True
    except zmq.ZMQError as exc:
        logger.warning("release of %s on %s:%s failed: %s", req, host, port, exc)
        return False
    finally:
        ctx.term()
