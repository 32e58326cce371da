"""The worker side of vLLM's native KV offloading, played by the emulated GPU.

Why: with `--kv-offloading-size GiB --kv-offloading-backend native`, vLLM 0.32 runs the
`OffloadingConnector`. Its scheduler side (which chunks are on the CPU, when a turn may reload
them, which GPU blocks must not be reused before their copy is done) is real vLLM code inside
our scheduler. Its worker side copies blocks over PCIe on the GPU worker; the emulated executor
has no workers, so this module stands in for that side. It reads the connector metadata of
each `SchedulerOutput`, lets each store take `profile.store_seconds(tokens)` and each load
`profile.load_seconds(tokens)` of clock time (the same with the default copy model), and
reports finished copies in `ModelRunnerOutput.kv_connector_output` the way the real worker
(`offloading/worker.py`, `kv_offload/cpu/gpu_worker.py`) does:

* Two links, one per direction (PCIe is full duplex). Each runs its jobs one after another in
  submission order, as the real `SingleDirectionOffloadingHandler` chains each copy's stream
  on the previous one's end event. So stores are bounded by bandwidth, and a load never waits
  for stores.
* Stores (GPU->CPU) of step N's `store_jobs` are submitted at the start of step N+1 (the real
  worker defers them so they start after token sampling); they then overlap that step's
  compute.
* Loads (CPU->GPU) are submitted after the step's forward and wait for it (the real copy
  stream calls `wait_stream` on the compute stream), so a load starts when the step ends. The
  request that waits for it stays out of the batch (vLLM's `WAITING_FOR_REMOTE_KVS`) until a
  step ending after the copy reports it in `finished_recving`.
* `jobs_to_flush` (stores whose source blocks are about to be reused, or of a preempted
  request) are waited for before the step computes: the step starts that much later, as the
  real worker's `handle_preemptions` blocks on them.
* Every finished job, load or store, is reported by id in the worker metadata's
  `completed_jobs` (with its bytes and seconds as transfer statistics); only loads also name
  their request in `finished_recving` (stores never emit `finished_sending` in 0.32).
* A step that computes nothing (everyone waits for a copy) lasts until the next copy finishes,
  but at most `idle_poll_s`, so arrivals during a long copy are not held back by more than one
  idle engine step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
    TransferJob,
)
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.outputs import KVConnectorOutput

from server.clock import clock
from server.kv_connectors import NIXL, OFFLOADING, parts

#: The connector this module emulates the worker side of (`--kv-offloading-backend native`).
NATIVE_CONNECTOR = OFFLOADING


@dataclass(frozen=True, slots=True)
class TierTraffic:
    """What moved into (stored) and out of (loaded) one KV tier, in blocks and bytes, and the
    blocks it dropped to make room: None where the tier does not count them (the CPU tier:
    vLLM evicts there without telling its worker side, which counts here)."""

    stored_blocks: int = 0
    stored_bytes: int = 0
    loaded_blocks: int = 0
    loaded_bytes: int = 0
    dropped_blocks: int | None = None

    def plus(self, blocks: int, nbytes: int, *, load: bool,
             dropped: int | None = None) -> TierTraffic:
        """These figures with one more finished job (a load, else a store) added, and the
        blocks dropped for it (None: not counted)."""
        drops = self.dropped_blocks if dropped is None else (self.dropped_blocks or 0) + dropped
        if load:
            return TierTraffic(self.stored_blocks, self.stored_bytes,
                               self.loaded_blocks + blocks, self.loaded_bytes + nbytes, drops)
        return TierTraffic(self.stored_blocks + blocks, self.stored_bytes + nbytes,
                           self.loaded_blocks, self.loaded_bytes, drops)


@dataclass(slots=True)
class _Copy:
    job_id: int
    req_id: str
    is_load: bool
    tokens: int
    seconds: float
    done_at: float


class _Link:
    """One PCIe direction: copies run back to back in submission order."""

    def __init__(self) -> None:
        self.free_at = float("-inf")

    def schedule(self, now: float, seconds: float) -> float:
        """When a copy submitted at `now` that takes `seconds` finishes."""
        self.free_at = max(now, self.free_at) + seconds
        return self.free_at


class EmulatedOffloadWorker:
    """The `OffloadingConnector` worker side on the emulated GPU (see the module docstring).

    `store_seconds(tokens)` is the time of one GPU->CPU job of that many tokens' KV (the
    performance profile's), `load_seconds` that of a CPU->GPU job (default: `store_seconds`),
    `block_size` the GPU block in tokens, `kv_bytes_per_token` only feeds vLLM's transfer
    statistics.
    """

    def __init__(self, store_seconds: Any, block_size: int, kv_bytes_per_token: int,
                 idle_poll_s: float, load_seconds: Any = None) -> None:
        self._store_seconds = store_seconds
        self._load_seconds = load_seconds if load_seconds is not None else store_seconds
        self._block_size = block_size
        self._kv_bytes_per_token = kv_bytes_per_token
        self.idle_poll_s = idle_poll_s
        self._store_link = _Link()
        self._load_link = _Link()
        self._deferred: list[tuple[int, TransferJob]] = []  # step N's stores, sent at N+1
        self._in_flight: dict[int, _Copy] = {}
        self._flushed: set[int] = set()  # this step's stores already sent by a flush
        #: what the finished copies moved between the GPU and the CPU tier
        self.traffic = TierTraffic()

    # -- the three points of a step where the real worker acts ---------------------------------
    def begin_step(self, metadata: OffloadingConnectorMetadata | None) -> None:
        """Before the forward: send last step's stores, then wait for the flushed ones."""
        now = clock().now()
        for job_id, job in self._deferred:
            self._submit(job_id, job, is_load=False, now=now)
        self._deferred.clear()
        self._flushed = set()
        if metadata is None or not metadata.jobs_to_flush:
            return
        for job_id in metadata.jobs_to_flush:
            job = metadata.store_jobs.get(job_id)
            if job is not None:
                self._submit(job_id, job, is_load=False, now=now)
                self._flushed.add(job_id)
        self._wait_for(metadata.jobs_to_flush)

    def after_forward(self, metadata: OffloadingConnectorMetadata | None) -> None:
        """After the forward: send this step's loads, keep this step's stores for the next."""
        if metadata is None:
            return
        now = clock().now()
        for job_id, job in metadata.load_jobs.items():
            self._submit(job_id, job, is_load=True, now=now)
        self._deferred.extend((job_id, job) for job_id, job in metadata.store_jobs.items()
                              if job_id not in self._flushed)

    def finished(self) -> KVConnectorOutput:
        """What the real worker's `get_finished` + `build_connector_worker_meta` report now."""
        now = clock().now()
        done = sorted((c for c in self._in_flight.values() if c.done_at <= now),
                      key=lambda c: (c.done_at, c.job_id)) if self._in_flight else []
        if not done:  # most steps: nothing to report (and no metadata to build)
            return KVConnectorOutput(finished_sending=set(), finished_recving=set(),
                                     kv_connector_worker_meta=None)
        meta = OffloadingWorkerMetadata()
        recving: set[str] = set()
        for copy in done:
            del self._in_flight[copy.job_id]
            meta.mark_completed(copy.job_id)
            stats = meta.transfer_stats.load if copy.is_load else meta.transfer_stats.store
            stats.record(copy.tokens * self._kv_bytes_per_token, copy.seconds)
            self.traffic = self.traffic.plus(copy.tokens // self._block_size,
                                             copy.tokens * self._kv_bytes_per_token,
                                             load=copy.is_load)
            if copy.is_load:
                recving.add(copy.req_id)
        return KVConnectorOutput(finished_sending=set(), finished_recving=recving,
                                 kv_connector_worker_meta=meta)

    # -- time ----------------------------------------------------------------------------------
    def idle_seconds(self) -> float:
        """How long a step that computes nothing lasts: until the next copy ends, at most
        `idle_poll_s` (0 when nothing is in flight: nothing to wait for)."""
        if not self._in_flight:
            return 0.0
        next_done = min(c.done_at for c in self._in_flight.values())
        return min(max(0.0, next_done - clock().now()), self.idle_poll_s)

    # -- helpers -------------------------------------------------------------------------------
    def _submit(self, job_id: int, job: TransferJob, *, is_load: bool, now: float) -> None:
        gpu_side = job.dst_spec if is_load else job.src_spec
        assert isinstance(gpu_side, GPULoadStoreSpec), "one end of every copy is the GPU"
        tokens = len(gpu_side.block_ids) * self._block_size
        seconds = float((self._load_seconds if is_load else self._store_seconds)(tokens))
        link = self._load_link if is_load else self._store_link
        done_at = link.schedule(now, seconds)
        self._in_flight[job_id] = _Copy(job_id, job.req_id, is_load, tokens, seconds, done_at)

    def _wait_for(self, job_ids: set[int]) -> None:
        """Block (let clock time pass) until these copies are done, as `worker.wait` does."""
        ends = [self._in_flight[j].done_at for j in job_ids if j in self._in_flight]
        if ends:
            the_clock = clock()
            the_clock.sleep(max(ends) - the_clock.now())


def uses_native_offloading(kv_transfer_config: Any) -> bool:
    """Whether the engine runs the native offloading connector, alone or in a `MultiConnector`
    beside NIXL's (`server.kv_connectors`), whose worker sides the emulated GPU plays. Any
    other connector needs real workers."""
    names = [p.kv_connector for p in parts(kv_transfer_config)]
    for name in names:
        if name != NATIVE_CONNECTOR and name not in NIXL:
            raise ValueError(
                f"the emulated GPU plays the worker side of vLLM's {NATIVE_CONNECTOR} and "
                f"NixlConnector only (--kv-offloading-backend native), not {name}; unset "
                "VLLM_USE_SIMPLE_KV_OFFLOAD or drop --kv-transfer-config, or serve on a real GPU")
    return NATIVE_CONNECTOR in names
