"""`EmulatedExecutor`: a vLLM `Executor` that stands in for the GPU.

Loaded with `--distributed-executor-backend server.emulated.executor.EmulatedExecutor`, it lets
the real engine (API server, engine core, scheduler, KV-cache manager, prefix cache, output
processing) run on a machine without a GPU. For every scheduled batch it

* prices the step with the performance model (`server.perf`): a roofline from published
  GPU figures, or a fit to a table measured on a real GPU;
* lets that time pass on the process clock (`server.clock`): real time sleeps, virtual time
  advances without sleeping;
* returns sampled tokens: random ids, or the tokens of a text given with the request
  (`vllm_xargs={"emulate_text": ...}`, used to replay a recorded agent through the server),
  or random ids ending in EOS after `emulate_output_tokens` tokens (used by trace replay).

The KV cache it reports is the profile's capacity (GPU memory minus weights and a reserve), so
block counts, preemption and prefix caching behave as on the emulated GPU.

With vLLM's native KV offloading on (`--kv-offloading-size`), the copies between GPU and host
memory that real workers would make are played by `server.emulated.offload` (PCIe time from
the profile); the connector's scheduler side stays real vLLM. With vLLM's `NixlConnector`
(prefill/decode disaggregation, pull mode), the reads between replicas are played by
`server.emulated.nixl` (time from the link between the two replicas). With both (a replica
that keeps a CPU tier and carries moved programs' KV: vLLM's `MultiConnector`,
`server.kv_connectors`) each worker gets its connector's share of the metadata and the step's
report joins theirs as the `MultiConnector`'s worker side would. With a disk tier behind the
CPU tier (vLLM's tiering spec, `server.kv_connectors.DiskTier`), the file-system tier's reads
and writes are timed on an emulated drive (`server.emulated.disk`), which this executor owns.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiKVConnectorMetadata,
    MultiKVConnectorStats,
    MultiKVConnectorWorkerMetadata,
)
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

from server.clock import clock
from server.emulated.disk import EmulatedDisk, emulate_disk_tier, forget_disk
from server.emulated.nixl import EmulatedNixlWorker, uses_nixl
from server.emulated.offload import EmulatedOffloadWorker, TierTraffic, uses_native_offloading
from server.kv_connectors import NIXL, OFFLOADING, part, parts
from server.perf.registry import load_profile
from server.settings import ServeSettings

logger = logging.getLogger("harness.emulated_executor")

#: Ids below this are the tokenizer's special tokens (see server/tokenizer/README.md).
FIRST_ORDINARY_TOKEN = 8


class _Sequence:
    """What the emulator tracks per request: how far it has got and what it will say."""

    __slots__ = ("prompt_len", "emitted", "script", "budget")

    def __init__(self, prompt_len: int, script: list[int] | None, budget: int | None) -> None:
        self.prompt_len = prompt_len
        self.emitted = 0
        self.script = script  # exact tokens to emit (ends with EOS), or None for random
        self.budget = budget  # random tokens to emit before EOS, or None for until max_tokens


class _Completed(Future):
    """A future that is done when made: what `execute_model(non_block=True)` returns. The
    engine core asks every step for a future and reads its result at once; a plain `Future`
    builds a lock and a condition for that, a measurable share of an emulated step."""

    def __init__(self, value: Any) -> None:  # no super().__init__: nothing ever waits
        self._value = value

    def result(self, timeout: float | None = None) -> Any:
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return None

    def done(self) -> bool:
        return True

    def running(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def add_done_callback(self, fn: Any) -> None:
        fn(self)


class EmulatedExecutor(Executor):
    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        settings = ServeSettings.from_vllm_config(self.vllm_config)
        self.profile = load_profile(settings.profile,
                                    offload_copy_model=settings.offload_copy_model)
        self._rng = np.random.default_rng(settings.seed)
        hf = self.model_config.hf_config
        self._num_layers = int(hf.num_hidden_layers)
        self._num_kv_heads = int(hf.num_key_value_heads)
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        self._head_dim = int(head_dim)
        eos = hf.eos_token_id
        self._eos = int(eos[0] if isinstance(eos, list) else eos)
        self._tokenizer: Any = None
        self._token_limit: int | None = None  # random ids stay below this (see _next_token)
        self._drawn: list[int] = []  # random ids drawn ahead, next one last (see _random_id)
        self._seqs: dict[str, _Sequence] = {}
        self._nixl = self._nixl_worker()
        self._offload = self._offload_worker()
        #: the drive of a disk tier behind the CPU tier (set before the scheduler is built
        #: from the same config, whose tier then uses it), or None
        self._disk: EmulatedDisk | None = (
            emulate_disk_tier(self.vllm_config.kv_transfer_config)
            if self._offload is not None else None)
        #: with both (vLLM's `MultiConnector`): where each one's metadata sits in the stack,
        #: and NIXL's connector class (the key of its statistics there)
        stack = [p.kv_connector for p in parts(self.vllm_config.kv_transfer_config)]
        self._nixl_at = next((i for i, name in enumerate(stack) if name in NIXL), -1)
        self._offload_at = stack.index(OFFLOADING) if OFFLOADING in stack else -1
        self._stack_size = len(stack)
        self._nixl_class = (KVConnectorFactory.get_connector_class(
            part(self.vllm_config.kv_transfer_config, NIXL)).__name__
            if self._nixl is not None and self._offload is not None else "")

    def _offload_worker(self) -> EmulatedOffloadWorker | None:
        """The offloading connector's worker side, when the engine runs that connector: without
        it nobody would ever finish the connector's copies and its requests would wait forever.
        An idle step polls at the profile's per-step CPU cost, as an idle engine loop would."""
        if not uses_native_offloading(self.vllm_config.kv_transfer_config):
            return None
        return EmulatedOffloadWorker(self.profile.store_seconds, self._block_size(),
                                     self.profile.kv_bytes_per_token,
                                     idle_poll_s=self.profile.cpu_overhead_seconds(0),
                                     load_seconds=self.profile.load_seconds)

    def _nixl_worker(self) -> EmulatedNixlWorker | None:
        """The NIXL connector's worker side (P/D disaggregation), when the engine runs it: the
        reads between replicas and the notifications that free a prefill replica's blocks."""
        if not uses_nixl(self.vllm_config.kv_transfer_config):
            return None
        return EmulatedNixlWorker.from_config(self.vllm_config, self._block_size(),
                                              self.profile.kv_bytes_per_token,
                                              idle_poll_s=self.profile.cpu_overhead_seconds(0))

    # -- engine start-up ---------------------------------------------------------------
    def _block_size(self) -> int:
        return int(self.cache_config.block_size or 16)

    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        spec = FullAttentionSpec(block_size=self._block_size(), num_kv_heads=self._num_kv_heads,
                                 head_size=self._head_dim, dtype=torch.bfloat16)
        return [{f"model.layers.{i}.self_attn.attn": spec for i in range(self._num_layers)}]

    def determine_available_memory(self) -> list[int]:
        util = float(self.cache_config.gpu_memory_utilization or 0.9)
        tokens = self.profile.kv_capacity_tokens(util)
        return [int(tokens * self.profile.kv_bytes_per_token)]

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        blocks = kv_cache_configs[0].num_blocks
        logger.info("emulated %s: %d KV blocks of %d tokens", self.profile.name, blocks,
                    self._block_size())

    def compile_or_warm_up_model(self) -> None:
        return None

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        if self._nixl is not None:
            return [["NHD", "HND"]]  # the NIXL connector prefers HND (LBHNC), as GPUs offer
        return [["NHD"]]

    def set_kv_cache_layout(self, layout_name: str) -> None:
        return None

    def register_failure_callback(self, callback: Any) -> None:
        return None

    def check_health(self) -> None:
        return None

    @property
    def max_concurrent_batches(self) -> int:
        return 1

    def collective_rpc(self, method: Any, timeout: float | None = None, args: tuple = (),
                       kwargs: dict | None = None, non_block: bool = False) -> Any:
        """Answer the few worker RPCs the engine makes; there are no workers."""
        name = method if isinstance(method, str) else getattr(method, "__name__", "callable")
        answers: dict[str, Any] = {
            "get_supported_tasks": ("generate",),
            "supports_draft_weight_updates": False,
            "list_loras": set(),
        }
        result = [answers.get(name)]
        if name == "get_kv_connector_handshake_metadata":
            # nothing truthy: the engine then starts no NIXL side-channel listener (the
            # emulated workers find each other through `server.emulated.nixl_fabric`)
            result = []
        if non_block:
            future: Future = Future()
            future.set_result(result)
            return future
        return result

    def tier_traffic(self) -> dict[str, TierTraffic]:
        """What moved between the GPU and the CPU tier (``host``) and between the CPU tier and
        the disk tier (``disk``, only with one); empty without a CPU tier."""
        traffic = {} if self._offload is None else {"host": self._offload.traffic}
        if self._disk is not None:
            traffic["disk"] = self._disk.traffic
        return traffic

    def shutdown(self) -> None:
        self._seqs.clear()
        if self._disk is not None:
            forget_disk(self.vllm_config.kv_transfer_config)
        if self._nixl is not None:
            self._nixl.close()

    # -- the step ----------------------------------------------------------------------
    def execute_model(self, scheduler_output: Any, non_block: bool = False) -> Any:
        nixl_meta, offload_meta = self._connector_metadata(scheduler_output)
        if self._offload is not None:
            self._offload.begin_step(offload_meta)  # may wait for flushed stores first
        if self._nixl is not None:
            self._nixl.begin_step(nixl_meta)  # reads start beside the forward
        # a modelled step time covers the whole engine step (a measured "step" table, or a
        # GPU forward plus the CPU overheads the profile adds), so on the wall clock the
        # step ends that long after its scheduling began, not after the scheduler's real
        # time plus the modelled time again
        started = getattr(scheduler_output, "harness_step_started", None) or time.perf_counter()
        output, prefill, decode = self._step(scheduler_output)
        idle = scheduler_output.total_num_scheduled_tokens == 0
        if not idle:
            seconds = float(self.profile.step_seconds(prefill, decode))
            the_clock = clock()
            the_clock.sleep(seconds if the_clock.virtual
                            else seconds - (time.perf_counter() - started))
        if self._offload is not None:
            self._offload.after_forward(offload_meta)  # loads start when the forward ends
        if idle and (self._offload is not None or self._nixl is not None):
            # a step that computes nothing lasts until the first copy or read may be done
            waits = [w.idle_seconds() for w in (self._offload, self._nixl) if w is not None]
            if self._disk is not None and self._offload is not None:  # as the tier polls
                waits.append(min(self._disk.idle_seconds(), self._offload.idle_poll_s))
            clock().sleep(min((w for w in waits if w > 0), default=0.0))
        offloaded = self._offload.finished() if self._offload is not None else None
        read = self._nixl.finish_step() if self._nixl is not None else None
        output.kv_connector_output = (self._stacked_output(read, offloaded)
                                      if read is not None and offloaded is not None
                                      else read if read is not None else offloaded)
        if non_block:
            return _Completed(output)
        return output

    def _connector_metadata(self, scheduler_output: Any) -> tuple[Any, Any]:
        """This step's metadata for the NIXL worker and for the offload worker: the one
        connector's, or each one's share of a `MultiConnector`'s."""
        meta = getattr(scheduler_output, "kv_connector_metadata", None)
        if not isinstance(meta, MultiKVConnectorMetadata):
            return meta, meta
        if meta.extra_async_saves:
            # vLLM 0.32's offloading connector never delays a request's frees, so only NIXL
            # sends after a request ends; a second sender would need MultiConnector's count
            raise RuntimeError("two stacked KV connectors both delay a request's frees "
                               f"({sorted(meta.extra_async_saves)}): the emulated workers "
                               "play only NIXL's sends")
        nixl = meta.metadata[self._nixl_at] if self._nixl_at >= 0 else None
        offload = meta.metadata[self._offload_at] if self._offload_at >= 0 else None
        return nixl, offload

    def _stacked_output(self, read: Any, offloaded: Any) -> Any:
        """One step's report of both workers, as vLLM's `MultiConnector` worker side joins
        them: NIXL's sends and failures, both connectors' finished loads, each connector's
        worker metadata in its place in the stack, statistics by connector class."""
        worker_meta = None
        if offloaded.kv_connector_worker_meta is not None:
            worker_meta = MultiKVConnectorWorkerMetadata(metadata=tuple(
                offloaded.kv_connector_worker_meta if i == self._offload_at else None
                for i in range(self._stack_size)))
        stats = None
        if read.kv_connector_stats is not None:
            stats = MultiKVConnectorStats(data={self._nixl_class: read.kv_connector_stats})
        return KVConnectorOutput(
            finished_sending=read.finished_sending,
            finished_recving=(read.finished_recving or set()) | offloaded.finished_recving,
            failed_recving=read.failed_recving, invalid_block_ids=read.invalid_block_ids,
            kv_connector_stats=stats, kv_connector_worker_meta=worker_meta)

    def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> Any:
        raise RuntimeError("EmulatedExecutor returns tokens from execute_model")

    def _step(self, so: Any) -> tuple[ModelRunnerOutput, list[tuple[int, int]], list[int]]:
        """Advance every scheduled sequence; also return the batch shape the step is priced by:
        prefill chunks as (new tokens, tokens computed before) and decodes as context length."""
        seqs = self._seqs  # (locals: this runs on every emulated step)
        for req_id in so.finished_req_ids:
            seqs.pop(req_id, None)
        computed_before: dict[str, int] = {}
        for new in so.scheduled_new_reqs:
            if new.req_id not in seqs:
                seqs[new.req_id] = self._new_sequence(new)
            computed_before[new.req_id] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        computed_before.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))

        scheduled = so.num_scheduled_tokens
        req_ids = list(scheduled)
        sampled: list[list[int]] = []
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        next_token = self._next_token
        for req_id, n in scheduled.items():
            seq = seqs.get(req_id)
            if seq is None:
                sampled.append([])
                continue
            before = computed_before.get(req_id, 0)
            known = seq.prompt_len + seq.emitted
            if n == 1 and seq.emitted > 0 and before + 1 == known:
                decode.append(before + 1)
            else:
                prefill.append((n, before))
            # A token is sampled only when this step reaches the end of what is known.
            sampled.append([next_token(seq)] if before + n >= known else [])
        output = ModelRunnerOutput(req_ids=req_ids,
                                   req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                   sampled_token_ids=sampled)
        return output, prefill, decode

    def _new_sequence(self, new: Any) -> _Sequence:
        extra = (new.sampling_params.extra_args or {}) if new.sampling_params else {}
        prompt_len = len(new.prompt_token_ids or [])
        script = None
        text = extra.get("emulate_text")
        if isinstance(text, str):
            script = self._encode(text) + [self._eos]
        budget = extra.get("emulate_output_tokens")
        try:
            budget = int(budget) if budget is not None else None
        except (TypeError, ValueError):
            budget = None
        return _Sequence(prompt_len, script, budget)

    def _next_token(self, seq: _Sequence) -> int:
        index = seq.emitted
        seq.emitted += 1
        if seq.script is not None:
            return seq.script[index] if index < len(seq.script) else self._eos
        if seq.budget is not None and index >= seq.budget - 1:
            return self._eos
        if self._token_limit is None:
            # the config's vocabulary (128256) is larger than our tokenizer's (32000); ids past
            # the tokenizer would decode to nothing
            vocab = int(self.model_config.hf_config.vocab_size)
            self._token_limit = min(vocab, len(self._get_tokenizer()))
        return self._random_id()

    def _random_id(self) -> int:
        """The next random id, as `int(rng.integers(FIRST_ORDINARY_TOKEN, limit))` would give
        it: numpy draws an array with the same calls, one after another, as it does scalars
        (tests/test_virtual_engine.py checks it), so ids are drawn 4096 at a time instead of
        one numpy call per emulated token."""
        if not self._drawn:
            ids = self._rng.integers(FIRST_ORDINARY_TOKEN, self._token_limit, size=4096)
            self._drawn = ids.tolist()[::-1]
        return self._drawn.pop()

    def _get_tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer  # transformers: start-up cost

            path = self.model_config.tokenizer
            self._tokenizer = AutoTokenizer.from_pretrained(path)
        return self._tokenizer

    def _encode(self, text: str) -> list[int]:
        return list(self._get_tokenizer().encode(text, add_special_tokens=False))
