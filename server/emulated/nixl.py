"""The worker side of vLLM's `NixlConnector` (P/D disaggregation, pull mode) on the emulated GPU.

Why: prefill/decode disaggregation in vLLM 0.32 is the `NixlConnector`. Its scheduler side
(which requests pull KV and how many tokens, `WAITING_FOR_REMOTE_KVS`, the prefill replica's
delayed free and lease, heartbeats, `bidirectional_kv_xfer` exports) is real vLLM code inside
our scheduler. Its worker side moves blocks with NIXL RDMA reads on the GPU workers; the
emulated executor has no workers and no NIXL, so this module stands in for that side, as
`server.emulated.offload` does for the offloading connector. It reads the connector metadata of
each `SchedulerOutput` (`NixlConnectorMetadata`) and reports `finished_recving` /
`finished_sending` in `ModelRunnerOutput.kv_connector_output` the way the real worker
(`nixl/pull_worker.py`, `nixl/base_worker.py`) does:

* `start_load_kv`: every `reqs_to_recv` entry is a READ of the remote blocks matching this
  engine's freshly allocated ones. As in `_apply_prefix_caching`, the remote list is trimmed to
  the local one from the end, so only blocks the local prefix cache lacks travel. The read takes
  `Link.seconds(blocks * block_size * kv_bytes_per_token)` on the link from the remote engine to
  this one (`harness_links` in the connector's extra config; reads from one peer queue on its
  link), starting when the step starts (async loads are posted beside the forward). No local
  blocks (a full local prefix hit, or an aborted request's cleanup): no read, only the
  notification, as in `_read_blocks`.
* `reqs_in_batch`, `reqs_not_processed`, `reqs_to_send`: the producer's bookkeeping, kept as the
  real worker keeps it (`_reqs_to_process`; a lease per finished request, rebased from the
  scheduler's clock reading `scheduler_clock`).
* `get_finished`, at the end of the step: reads whose time is up are reported in
  `finished_recving` and the remote engine is notified ("`req:consumers`" in NIXL; here a
  `Note`); notifications that have arrived end the matching leases (`finished_sending`, the
  scheduler frees the blocks); leases past their deadline are reaped the same way; heartbeats
  ("HB:") extend leases by 2/3 of `kv_lease_duration`.
* `bidirectional_kv_xfer`: a turn-2 read of a decode replica's export is declined when the
  export is within 5 s of its deadline (`_is_turn2_read_expired`); the request is then reported
  in `failed_recving` and recomputes (`kv_load_failure_policy="recompute"`, set by
  `cluster.pd`).

What is not played: the NIXL handshake (agent metadata over the side channel; the executor
answers `get_kv_connector_handshake_metadata` with nothing, so no listener starts, and reads
begin without the one-off handshake round trip), TP/DCP/PP rank mapping, heterogeneous block
sizes, host-buffer staging (the CPU platform disables it), and transfer failures other than an
expired export or an unknown peer. All engines are assumed to serve the same model (the real
handshake refuses a mismatch).

Idle steps: a step that computes nothing lasts until the next read ends, note is due or lease
ends, at most the profile's per-step CPU cost (an idle engine loop polls). It polls while
leases are held too: a replica whose waiting request is blocked by its own held blocks must let
time pass, or in a virtual-time loop its peer would never get the turn in which it reads them.

The notes between engines and how they travel are `server.emulated.nixl_fabric`'s; what is
changed in vLLM's scheduler side (its clock, one bug) is `server.emulated.nixl_patches`'s.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm import envs
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
from vllm.v1.outputs import KVConnectorOutput

from server.clock import clock
from server.emulated.nixl_fabric import (
    FABRIC_KEY,
    LINKS_KEY,
    Fabric,
    InprocFabric,
    Note,
    make_fabric,
)
from server.emulated.nixl_patches import fix_readback_retry, follow_process_clock
from server.kv_connectors import NIXL, part
from server.perf.hardware import INFINIBAND, Link

logger = logging.getLogger("harness.emulated_nixl")

#: The connector names this module plays the worker side of (pull mode).
NIXL_CONNECTORS = NIXL
#: `nixl/pull_worker.py` `_KV_BLOCKS_EXPIRY_SAFETY_MARGIN`.
EXPIRY_SAFETY_MARGIN_S = 5.0


def uses_nixl(kv_transfer_config: Any) -> bool:
    """Whether the engine runs vLLM's NIXL connector in pull mode (played here), alone or in a
    `MultiConnector` (`server.kv_connectors`)."""
    config = part(kv_transfer_config, (*NIXL_CONNECTORS, "NixlPushConnector"))
    if config is None:
        return False
    if config.kv_connector == "NixlPushConnector":
        raise ValueError("the emulated GPU plays the NIXL connector in pull mode only "
                         "(kv_connector NixlConnector); push mode needs real workers")
    return True


# -- the worker --------------------------------------------------------------------------------
@dataclass(slots=True)
class Transfer:
    """One read (kept for reports and tests)."""

    req_id: str  # the local request the blocks are for
    src: str  # engine read from
    dst: str  # this engine
    blocks: int
    nbytes: int
    seconds: float
    start: float
    done: float


@dataclass(slots=True)
class _Read:
    transfer: Transfer
    remote_req: str
    host: str | None
    port: int | None
    report: bool  # the scheduler waits for it in finished_recving


class EmulatedNixlWorker:
    """`NixlPullConnectorWorker` on the emulated GPU (see the module docstring).

    `links[peer]`: the link KV takes from `peer` to this engine (`"*"`: any other peer;
    without either, InfiniBand). `lease_extension_s`: what a heartbeat adds (vLLM: 2/3 of
    `kv_lease_duration`). `idle_poll_s`: the longest step that computes nothing lasts while
    something is awaited, as an idle engine loop polls.
    """

    def __init__(self, engine_id: str, *, block_size: int, kv_bytes_per_token: int,
                 links: Mapping[str, Link], fabric: Fabric, lease_extension_s: float,
                 bidirectional: bool, idle_poll_s: float) -> None:
        self.engine_id = engine_id
        self.block_size = block_size
        self.kv_bytes_per_token = kv_bytes_per_token
        self.links = dict(links)
        self.fabric = fabric
        self.lease_extension_s = lease_extension_s
        self.bidirectional = bidirectional
        self.idle_poll_s = idle_poll_s
        # producer side (nixl base_worker names)
        self._reqs_to_process: set[str] = set()
        self._reqs_to_send: dict[str, float] = {}  # req -> lease deadline (clock time)
        self._consumer_counts: dict[str, int] = {}
        self._inbox: list[tuple[float, int, Note]] = []  # notes not yet due
        self._seq = 0
        # consumer side
        self._reads: dict[str, _Read] = {}
        self._link_free_at: dict[str, float] = {}
        self._done_now: set[str] = set()  # notify-only receipts reported at this step's end
        self._failed: set[str] = set()
        self._invalid_blocks: set[int] = set()
        self._step_start = 0.0
        # what happened (cumulative)
        self.bytes_in = 0
        self.seconds_in = 0.0
        self.reads = 0
        self.expired_leases = 0
        self.declined_reads = 0
        self.transfers: deque[Transfer] = deque(maxlen=10_000)

    @classmethod
    def from_config(cls, vllm_config: Any, block_size: int, kv_bytes_per_token: int,
                    idle_poll_s: float) -> EmulatedNixlWorker:
        follow_process_clock()
        fix_readback_retry()
        kv = part(vllm_config.kv_transfer_config, NIXL_CONNECTORS)
        extra = kv.kv_connector_extra_config or {}
        links: dict[str, Link] = {}
        for peer, spec in (extra.get(LINKS_KEY) or {}).items():
            try:
                links[str(peer)] = Link(float(spec["latency_s"]), float(spec["bandwidth"]))
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{LINKS_KEY}[{peer!r}] must be {{'latency_s': seconds, "
                                 f"'bandwidth': bytes/s}}, got {spec!r}") from None
        lease = float(extra.get("kv_lease_duration", 30))
        host = envs.VLLM_NIXL_SIDE_CHANNEL_HOST
        port = envs.VLLM_NIXL_SIDE_CHANNEL_PORT + vllm_config.parallel_config.data_parallel_index
        fabric = make_fabric(str(extra.get(FABRIC_KEY, "zmq")), str(kv.engine_id), host, port)
        return cls(str(kv.engine_id), block_size=block_size,
                   kv_bytes_per_token=kv_bytes_per_token, links=links, fabric=fabric,
                   lease_extension_s=float(int(lease) * 2 // 3),
                   bidirectional=bool(extra.get("bidirectional_kv_xfer", False)),
                   idle_poll_s=idle_poll_s)

    # -- the two points of a step where the real worker acts -----------------------------------
    def begin_step(self, metadata: Any) -> None:
        """`start_load_kv`: post this step's reads and take the producer bookkeeping."""
        now = clock().now()
        self._step_start = now
        if metadata is None:
            return
        for req_id, meta in metadata.reqs_to_recv.items():
            self._start_read(req_id, meta, now)
        self._reqs_to_process.update(metadata.reqs_in_batch)
        for req_id in metadata.reqs_not_processed:
            self._reqs_to_process.discard(req_id)
        for req_id, deadline in metadata.reqs_to_send.items():
            if req_id in self._reqs_to_process:
                if metadata.scheduler_clock:
                    deadline = now + (deadline - metadata.scheduler_clock)
                self._reqs_to_send[req_id] = deadline
        for engine_id, info in (metadata.heartbeat_by_engine or {}).items():
            note = Note("hb", tuple(sorted(info.req_ids)), self.engine_id, now)
            self.fabric.send(engine_id, info.host, info.port, note, now)

    def finish_step(self) -> KVConnectorOutput:
        """`get_finished` / `get_transfer_results` at the end of the step."""
        now = clock().now()
        done_sending = self._take_notes(now)
        done_recving = set(self._done_now)
        self._done_now.clear()
        stats = NixlKVConnectorStats()  # what the real worker reports: vLLM's nixl metrics
        for req_id, read in sorted(self._reads.items(), key=lambda kv: kv[1].transfer.done):
            t = read.transfer
            if t.done > now:
                continue
            del self._reads[req_id]
            self.reads += 1
            self.bytes_in += t.nbytes
            self.seconds_in += t.seconds
            self.transfers.append(t)
            stats.data["transfer_duration"].append(t.seconds)
            stats.data["post_duration"].append(0.0)
            stats.data["bytes_transferred"].append(t.nbytes)
            stats.data["num_descriptors"].append(t.blocks)
            if read.report:
                done_recving.add(req_id)
            note = Note("read", (read.remote_req,), self.engine_id, t.done)
            if not self.fabric.send(t.src, read.host, read.port, note, self._step_start):
                logger.warning("could not notify %s that %s was read; its blocks are freed when "
                               "the lease ends", t.src, read.remote_req)
        failed = self._failed
        self._failed = set()
        done_recving |= failed
        for req_id, deadline in list(self._reqs_to_send.items()):
            if now >= deadline:
                logger.warning("releasing expired KV blocks for request %s (read by %d "
                               "consumers before the lease ended)", req_id,
                               self._consumer_counts.pop(req_id, 0))
                del self._reqs_to_send[req_id]
                self._reqs_to_process.discard(req_id)
                self.expired_leases += 1
                done_sending.add(req_id)
        invalid, self._invalid_blocks = self._invalid_blocks, set()
        return KVConnectorOutput(finished_sending=done_sending, finished_recving=done_recving,
                                 failed_recving=failed, invalid_block_ids=invalid,
                                 kv_connector_stats=None if stats.is_empty() else stats)

    # -- time ----------------------------------------------------------------------------------
    def idle_seconds(self) -> float:
        """How long a step that computes nothing lasts: until the next read ends, note is due or
        lease ends, at most `idle_poll_s` (an idle engine loop polls); 0 when nothing at all is
        awaited. With leases only, such a step happens when the engine has a request it cannot
        admit (the held blocks are in the way) or bookkeeping to ship: time must pass, or the
        peer that would free the blocks never gets its turn in a virtual-time loop. (A
        `VirtualEngine` that only holds leases does not step at all: `has_work` is False.)"""
        now = clock().now()
        self._receive()
        times = [r.transfer.done for r in self._reads.values()]
        if self._inbox:
            times.append(self._inbox[0][0])
        times.extend(self._reqs_to_send.values())
        if not times:
            return 0.0
        return min(max(0.0, min(times) - now), self.idle_poll_s)

    def busy(self) -> bool:
        """Whether the engine must keep stepping for this side (a read in flight, a receipt or a
        failure to report, a notification waiting); held leases alone do not count."""
        return bool(self._reads or self._done_now or self._failed or self._inbox
                    or self.fabric.pending())

    def next_deadline(self) -> float | None:
        """The earliest lease deadline (blocks freed then if nobody reads them), if any."""
        return min(self._reqs_to_send.values(), default=None)

    def holding(self) -> set[str]:
        """Requests whose blocks this engine holds for a reader (lease registered)."""
        return set(self._reqs_to_send)

    def set_wake(self, wake: Callable[[float], None]) -> None:
        """In-process: `wake(t)` is called before a note is delivered to this engine."""
        if isinstance(self.fabric, InprocFabric):
            self.fabric.mailbox.wake = wake

    def release(self, req_ids: Iterable[str]) -> None:
        """A router says nobody will read these exports: end their leases at the next step."""
        now = clock().now()
        self._push_note(Note("release", tuple(req_ids), "router", now))

    def close(self) -> None:
        self.fabric.close()

    # -- helpers -------------------------------------------------------------------------------
    def link_from(self, peer: str) -> Link:
        link = self.links.get(peer) or self.links.get("*")
        if link is None:
            logger.warning("no link from %s to %s in %s; using InfiniBand", peer,
                           self.engine_id, LINKS_KEY)
            link = self.links.setdefault(peer, INFINIBAND)
        return link

    def _start_read(self, req_id: str, meta: Any, now: float) -> None:
        remote = meta.remote
        local = [list(g) for g in meta.local_block_ids]
        has_local = any(local)
        report = bool(meta.awaiting_kvs or has_local)
        if (self.bidirectional and has_local and remote.blocks_expiry_time is not None
                and now + EXPIRY_SAFETY_MARGIN_S >= float(remote.blocks_expiry_time)):
            logger.warning("declining expired remote read for %s from engine %s", req_id,
                           remote.engine_id)
            self.declined_reads += 1
            self._fail(req_id, local, report)
            return
        if isinstance(self.fabric, InprocFabric) and not self.fabric.knows(remote.engine_id):
            logger.warning("remote engine %s is unknown; %s recomputes", remote.engine_id,
                           req_id)
            self._fail(req_id, local, report)
            return
        if not has_local:
            note = Note("read", (remote.request_id,), self.engine_id, now)
            self.fabric.send(remote.engine_id, remote.host, remote.port, note, now)
            if meta.awaiting_kvs:
                self._done_now.add(req_id)
            return
        remote_groups = list(remote.block_ids)
        blocks = 0
        for g, group in enumerate(local):
            have = len(remote_groups[g]) if g < len(remote_groups) else 0
            if len(group) > have:
                logger.warning("%s: %d local blocks but the remote offers %d", req_id,
                               len(group), have)
            blocks += min(len(group), have)  # `_apply_prefix_caching`: the remote tail
        nbytes = blocks * self.block_size * self.kv_bytes_per_token
        seconds = self.link_from(remote.engine_id).seconds(nbytes)
        start = max(now, self._link_free_at.get(remote.engine_id, now))
        done = start + seconds
        self._link_free_at[remote.engine_id] = done
        transfer = Transfer(req_id, remote.engine_id, self.engine_id, blocks, nbytes, seconds,
                            start, done)
        self._reads[req_id] = _Read(transfer, remote.request_id, remote.host, remote.port,
                                    report)

    def _fail(self, req_id: str, local: list[list[int]], report: bool) -> None:
        if report:
            self._failed.add(req_id)
            if len(local) == 1:
                self._invalid_blocks.update(local[0])

    def _push_note(self, note: Note) -> None:
        self._seq += 1
        heapq.heappush(self._inbox, (note.at, self._seq, note))

    def _receive(self) -> None:
        for note in self.fabric.receive():
            self._push_note(note)

    def _take_notes(self, now: float) -> set[str]:
        """Notifications due by `now` (all received ones on a real clock): `_get_new_notifs`."""
        self._receive()
        virtual = clock().virtual
        done: set[str] = set()
        while self._inbox and (not virtual or self._inbox[0][0] <= now):
            _, _, note = heapq.heappop(self._inbox)
            if note.kind == "hb":
                extended = now + self.lease_extension_s
                for req_id in note.req_ids:
                    if req_id in self._reqs_to_send:
                        self._reqs_to_send[req_id] = max(self._reqs_to_send[req_id], extended)
                continue
            for req_id in note.req_ids:
                if req_id not in self._reqs_to_send and req_id not in self._reqs_to_process:
                    logger.error("KV blocks of unknown request %s were read by %s; they may "
                                 "have expired", req_id, note.sender)
                    continue
                count = self._consumer_counts.get(req_id, 0) + 1
                if count < note.consumers:
                    self._consumer_counts[req_id] = count
                    continue
                self._consumer_counts.pop(req_id, None)
                self._reqs_to_process.discard(req_id)
                self._reqs_to_send.pop(req_id, None)
                done.add(req_id)
        return done
