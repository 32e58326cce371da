"""The disk KV tier behind the CPU tier, on the emulated GPU: vLLM's tiering layer, with its
file-system tier's reads and writes timed and no byte moved.

Why: with a disk tier (`server.kv_connectors.DiskTier`) the offloading connector runs vLLM's
`TieringOffloadingSpec`. Its scheduler side keeps the CPU tier as the primary tier, cascades
every block stored there to the file-system tier (`vllm.v1.kv_offload.tiering.fs`: a thread
pool that writes one file per block and reads it back with readv), and when a request's block
is only on disk, promotes it into the CPU tier (the request waits meanwhile) and then loads it
to the GPU as any host hit. All of that is vLLM's code, and runs unchanged here, except the
two parts that move bytes, which the emulated GPU has none of:

* the primary tier's host buffer (`SharedOffloadRegion`: a file in /dev/shm the scheduler
  process populates at start, as much real memory as the CPU tier's size):
  `EmulatedTieringSpec` gives the primary tier the buffer's shape only (`_ShapeOnly`);
* the fs tier and its I/O threads: `EmulatedDiskTier` takes its place. It knows which blocks
  are on disk; a job of n blocks ends `server.perf.copy_model.disk_seconds` after it may start
  on the engine's clock (virtual or real), jobs of one direction one after another on the
  drive (`EmulatedDisk`), as vLLM's pool does a job's blocks one after another on one thread.

The emulated executor selects both (`emulate_disk_tier`, through vLLM's own out-of-tree spec
option, ``spec_name`` + ``spec_module_path``) and owns the drive, so that a step that computes
nothing lasts until the next disk job ends (`EmulatedDisk.idle_seconds`). The GPU <-> CPU copies
stay with the offloading connector's emulated worker (`server.emulated.offload`).

Differences from vLLM's fs tier, on purpose: a lookup answers at once (vLLM's checks the files
on a thread and answers RETRY for one step first: microseconds of work, which the emulation
does not charge); the tier holds `disk_bytes_to_use` (`server.kv_connectors.DISK_BYTES_KEY`)
and drops its least recently used blocks past it, where vLLM 0.32 never removes a file.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.kv_offload.tiering.manager import (
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from server.clock import clock
from server.emulated.offload import TierTraffic
from server.kv_connectors import DISK_BYTES_KEY, FS_TIER, MULTI, OFFLOADING, TIERING_SPEC
from server.perf.copy_model import disk_seconds
from server.perf.hardware import DEFAULT_STORAGE, Storage

#: the spec the emulated GPU runs in place of vLLM's `TieringOffloadingSpec`
EMULATED_SPEC = "EmulatedTieringSpec"


class EmulatedDisk:
    """The drive under the emulated disk tier: reads and writes each in submission order,
    priced from `storage` (`server.perf.hardware.Storage`)."""

    def __init__(self, storage: Storage = DEFAULT_STORAGE) -> None:
        self.storage = storage
        self._free_at = {True: float("-inf"), False: float("-inf")}  # read -> when free
        self._pending: list[float] = []  # when submitted jobs end
        self.traffic = TierTraffic(dropped_blocks=0)

    def submit(self, blocks: int, block_bytes: int, *, read: bool) -> tuple[float, float]:
        """A job of `blocks` blocks submitted now: (when it ends, its own seconds)."""
        now = clock().now()
        seconds = disk_seconds(blocks, block_bytes, self.storage, read=read)
        done_at = max(now, self._free_at[read]) + seconds
        self._free_at[read] = done_at
        self._pending.append(done_at)
        return done_at, seconds

    def record(self, blocks: int, block_bytes: int, *, read: bool, dropped: int = 0) -> None:
        """Count a finished job (and the blocks dropped for it) in `traffic`."""
        self.traffic = self.traffic.plus(blocks, blocks * block_bytes, load=read,
                                         dropped=dropped)

    def idle_seconds(self) -> float:
        """Until the next job ends (0 with none in flight): how long a step that computes
        nothing may last for the disk's sake."""
        now = clock().now()
        self._pending = [t for t in self._pending if t > now]
        return min(self._pending) - now if self._pending else 0.0


@dataclass(slots=True)
class _Job:
    keys: list[OffloadKey]
    read: bool
    done_at: float
    seconds: float


class EmulatedDiskTier(SecondaryTierManager):
    """vLLM's file-system tier on the emulated GPU (see the module docstring): which blocks
    are on disk, at most `capacity_blocks` of them (None: no limit), and jobs that end on the
    `disk`'s clock."""

    medium = Medium.STORAGE

    def __init__(self, offloading_spec: Any, primary_kv_view: Any, tier_type: str, *,
                 disk: EmulatedDisk, capacity_blocks: int | None) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        self.disk = disk
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[OffloadKey, None] = OrderedDict()  # on disk, LRU first
        self._jobs: dict[int, _Job] = {}
        self._reading: dict[OffloadKey, int] = {}  # keys of loads in flight: not dropped

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if key in self._blocks else LookupResult.MISS

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def submit_store(self, job_metadata: TransferJob) -> None:
        # vLLM's fs tier skips a block whose file exists, at the cost of one stat
        keys = [k for k in job_metadata.keys if k not in self._blocks]
        self._submit(job_metadata.job_id, keys, read=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        for key in keys:
            self._reading[key] = self._reading.get(key, 0) + 1
        self._submit(job_metadata.job_id, keys, read=True)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        if not self._jobs:
            return []
        now = clock().now()
        done = sorted((job_id for job_id, job in self._jobs.items() if job.done_at <= now),
                      key=lambda j: (self._jobs[j].done_at, j))
        results = []
        for job_id in done:
            job = self._jobs.pop(job_id)
            dropped = self._finish(job)
            self.disk.record(len(job.keys), self.block_size_bytes, read=job.read,
                             dropped=dropped)
            results.append(JobResult(job_id=job_id, success=True, transfer_time=job.seconds,
                                     transfer_bytes=len(job.keys) * self.block_size_bytes))
        return results

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        """Let the clock run to the end of every job in flight (vLLM's waits for its
        threads); their results come with the next `get_finished_jobs`."""
        if self._jobs:
            the_clock = clock()
            the_clock.sleep(max(job.done_at for job in self._jobs.values()) - the_clock.now())

    # -- helpers -------------------------------------------------------------------------------
    def _submit(self, job_id: int, keys: list[OffloadKey], *, read: bool) -> None:
        done_at, seconds = self.disk.submit(len(keys), self.block_size_bytes, read=read)
        self._jobs[job_id] = _Job(keys, read, done_at, seconds)

    def _finish(self, job: _Job) -> int:
        """A job's effect once it ends: a load frees its blocks for dropping, a store puts
        its blocks on disk (most recently used); the blocks dropped to make room."""
        if job.read:
            for key in job.keys:
                left = self._reading.get(key, 0) - 1
                if left > 0:
                    self._reading[key] = left
                else:
                    self._reading.pop(key, None)
            return 0
        for key in job.keys:
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        return self._make_room()

    def _make_room(self) -> int:
        """Drop least recently used blocks (none being read) down to `capacity_blocks`."""
        if self.capacity_blocks is None:
            return 0
        dropped = 0
        excess = len(self._blocks) - self.capacity_blocks
        for key in list(self._blocks):
            if excess - dropped <= 0:
                break
            if key not in self._reading:
                del self._blocks[key]
                dropped += 1
        return dropped


class _ShapeOnly:
    """The primary tier's host buffer without its memory: the shape vLLM's tiering manager
    and its tiers read (chunk count and bytes per chunk), and nothing to map or free."""

    def __init__(self, num_chunks: int, chunk_bytes: int) -> None:
        self.shape = (num_chunks, chunk_bytes)
        self.strides = (chunk_bytes, 1)

    def create_kv_memoryview(self) -> _ShapeOnly:
        return self

    def release(self) -> None:
        return None

    def cleanup(self) -> None:
        return None


#: engine id -> its drive: the executor makes it, the spec's tier takes it (one process)
_DISKS: dict[str, EmulatedDisk] = {}


class EmulatedTieringSpec(TieringOffloadingSpec):
    """vLLM's tiering spec on the emulated GPU: its CPU primary tier and tiering manager as
    vLLM builds them, over `_ShapeOnly`, with `EmulatedDiskTier` for the ``fs`` tier."""

    def get_manager(self) -> Any:
        if self._manager is None:
            primary = CPUPrimaryTierOffloadingManager(
                num_chunks=self.num_chunks,
                mmap_region=_ShapeOnly(self.num_chunks, self.kv_bytes_per_chunk),  # type: ignore[arg-type]
                cache_policy=self.eviction_policy,
                cache_policy_module_path=self.cache_policy_module_path,
                enable_events=self.kv_events_config.enable_kv_cache_events)
            view = primary.get_kv_memoryview()
            tiers = [self._tier(config, view) for config in self.secondary_tier_configs]
            self._manager = TieringOffloadingManager(primary_tier=primary,
                                                     secondary_tiers=tiers)
        return self._manager

    def _tier(self, config: dict[str, Any], view: Any) -> EmulatedDiskTier:
        if config.get("type") != FS_TIER:
            raise ValueError(f"the emulated GPU plays vLLM's {FS_TIER!r} tier only, not "
                             f"{config.get('type')!r}")
        disk = _DISKS.get(self.config.engine_id)
        if disk is None:
            raise RuntimeError("no emulated drive for this engine: the disk tier runs on the "
                               "emulated GPU's executor (server.emulated.executor)")
        size = self.extra_config.get(DISK_BYTES_KEY)
        block_bytes = view.strides[0]
        capacity = int(size) // block_bytes if size and block_bytes else None
        return EmulatedDiskTier(self, view, FS_TIER, disk=disk, capacity_blocks=capacity)

    def get_worker(self, kv_caches: Any) -> Any:
        raise RuntimeError("the emulated GPU plays the CPU tier's worker side itself "
                           "(server.emulated.offload)")


def emulate_disk_tier(kv_transfer_config: Any,
                      storage: Storage = DEFAULT_STORAGE) -> EmulatedDisk | None:
    """If the engine's offloading connector (alone or in a `MultiConnector`) runs vLLM's
    tiering spec with a file-system tier, point it at `EmulatedTieringSpec` (in place: the
    engine core builds its scheduler from this config after the executor) and return the
    drive its tier will use; else None and the config untouched."""
    if kv_transfer_config is None:
        return None
    options = _offloading_options(kv_transfer_config)
    if options is None or options.get("spec_name") != TIERING_SPEC:
        return None
    if not any(t.get("type") == FS_TIER for t in options.get("secondary_tiers") or []):
        return None
    options["spec_name"] = EMULATED_SPEC
    options["spec_module_path"] = __name__
    disk = EmulatedDisk(storage)
    _DISKS[str(kv_transfer_config.engine_id)] = disk
    return disk


def forget_disk(kv_transfer_config: Any) -> None:
    """The engine is shut down: drop its drive from the process's table."""
    if kv_transfer_config is not None:
        _DISKS.pop(str(kv_transfer_config.engine_id), None)


def _offloading_options(kv_transfer_config: Any) -> dict[str, Any] | None:
    """The offloading connector's own options dict in the engine's config (the one vLLM
    will read), or None when it runs no such connector."""
    if kv_transfer_config.kv_connector == OFFLOADING:
        return kv_transfer_config.kv_connector_extra_config
    if kv_transfer_config.kv_connector == MULTI:
        for part in (kv_transfer_config.kv_connector_extra_config or {}).get("connectors") or []:
            if part.get("kv_connector") == OFFLOADING:
                return part.setdefault("kv_connector_extra_config", {})
    return None
