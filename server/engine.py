"""The real vLLM engine core in this process, on the emulated GPU and a virtual clock.

Why: comparing policies needs thousands of agent programs replayed exactly and repeatably, in
minutes, on a laptop. Here vLLM's `EngineCore` (scheduler = `PolicyScheduler`, KV-cache
manager, prefix cache, output handling) runs without its API server and without sleeping: each
emulated GPU step advances a `VirtualClock` by its modelled duration. A discrete-event driver
(`advance_to`, `step`) interleaves request arrivals and tool returns with engine steps; the
trace-replay benchmark builds on it. Same scheduler, same policies, same step-time model as the
served engine: only the clock differs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from server.clock import VirtualClock, use_clock
from server.settings import ServeSettings

_ENV_DEFAULTS = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass
class Finished:
    request_id: str
    program_id: str | None
    arrival: float
    first_token: float | None
    finished: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    finish_reason: str
    token_ids: list[int] = field(default_factory=list)  # what the emulated model answered
    external_tokens: int = 0  # of cached_tokens, those loaded from host memory (KV offloading)


@dataclass
class _Pending:
    arrival: float
    program_id: str | None
    prompt_tokens: int
    first_token: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    external_tokens: int = 0


@dataclass
class VirtualEngine:
    """`EngineCore` + `EmulatedExecutor` + `PolicyScheduler` on a virtual clock.

    `offload_gib`: host memory for vLLM's native KV offloading. Policies that need it (`swap`)
    get `harness.serve.DEFAULT_OFFLOAD_GIB` when it is None, as `harness serve` gives them;
    other policies run without offloading unless it is given.
    """

    policy: str = "continuum"
    profile: str = "h100-llama-3.1-8b"
    seed: int = 0
    max_model_len: int = 32768
    num_gpu_blocks: int | None = None
    offload_gib: float | None = None
    clock: VirtualClock = field(default_factory=VirtualClock)

    def __post_init__(self) -> None:
        for key, value in _ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        os.environ.update(ServeSettings(self.policy, self.profile, self.seed).to_env())
        os.environ.pop("HARNESS_EVENTS_IPC", None)  # events come in through `event()`
        self._previous_clock = use_clock(self.clock)

        from vllm.config import KVTransferConfig
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.core import EngineCore

        from harness.serve import OFFLOAD_CONNECTOR_OPTIONS, emulated_model_dir, offload_gib
        from server.emulated_executor import EmulatedExecutor

        self.offload_gib = offload_gib(self.policy, self.offload_gib)
        connector = None  # our connector options; vLLM names the connector itself
        if self.offload_gib is not None:
            connector = KVTransferConfig(kv_connector_extra_config=dict(OFFLOAD_CONNECTOR_OPTIONS))
        args = EngineArgs(model=str(emulated_model_dir(self.profile)), seed=self.seed,
                          max_model_len=self.max_model_len, enable_prefix_caching=True,
                          block_size=16, scheduler_cls="server.scheduler.PolicyScheduler",
                          distributed_executor_backend=EmulatedExecutor,
                          num_gpu_blocks_override=self.num_gpu_blocks,
                          kv_offloading_size=self.offload_gib,
                          kv_offloading_backend="native", kv_transfer_config=connector)
        self.vllm_config = args.create_engine_config()
        self.core = EngineCore(self.vllm_config, EmulatedExecutor, log_stats=True)
        self.scheduler = self.core.scheduler
        self._pending: dict[str, _Pending] = {}

    # -- inputs ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], *,
                    program_id: str | None = None, max_tokens: int = 256,
                    output_tokens: int | None = None, **hints: Any) -> None:
        """Queue a turn now. `output_tokens` makes the emulated model answer exactly that many
        tokens (ending in EOS); hints are the `vllm_xargs` a client would send."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.engine import EngineCoreRequest

        extra = {k: v for k, v in hints.items() if v is not None}
        if output_tokens is not None:
            extra["emulate_output_tokens"] = int(output_tokens)
            max_tokens = max(max_tokens, int(output_tokens))
        params = SamplingParams(max_tokens=max_tokens, extra_args=extra or None)
        params.update_from_generation_config({}, eos_token_id=self._eos())
        now = self.clock.now()
        request = EngineCoreRequest(
            request_id=request_id, prompt_token_ids=list(prompt_token_ids), mm_features=None,
            sampling_params=params, pooling_params=None, arrival_time=now, lora_request=None,
            cache_salt=None, data_parallel_rank=None, session_id=program_id)
        req, wave = self.core.preprocess_add_request(request)
        self.core.add_request(req, wave)
        self._pending[request_id] = _Pending(now, program_id, len(prompt_token_ids))

    def event(self, kind: str, program_id: str, **fields: Any) -> None:
        """An interception event, delivered as the server's side channel would."""
        from server.policies import AgentEvent

        event = AgentEvent(kind=kind, program_id=program_id, **fields)  # type: ignore[arg-type]
        self.scheduler.handle_event(event, self.clock.now())

    # -- time --------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.scheduler.has_requests())

    def step(self) -> list[Finished]:
        """One engine step (the clock advances by the modelled step time)."""
        outputs, _ = self.core.step()
        now = self.clock.now()
        done: list[Finished] = []
        for client_outputs in outputs.values():
            for out in client_outputs.outputs:
                pending = self._pending.get(out.request_id)
                if pending is None:
                    continue
                if out.new_token_ids and pending.first_token is None:
                    pending.first_token = now
                pending.output_tokens += len(out.new_token_ids)
                pending.token_ids.extend(out.new_token_ids)
                if out.prefill_stats is not None:
                    pending.cached_tokens = out.prefill_stats.num_cached_tokens
                    pending.external_tokens = out.prefill_stats.num_external_cached_tokens
                if out.finish_reason is not None:
                    del self._pending[out.request_id]
                    done.append(Finished(out.request_id, pending.program_id, pending.arrival,
                                         pending.first_token, now, pending.prompt_tokens,
                                         pending.output_tokens, pending.cached_tokens,
                                         str(out.finish_reason), pending.token_ids,
                                         pending.external_tokens))
        return done

    def advance_to(self, t: float) -> None:
        """Idle until `t` (an arrival or a tool return); the engine's pins may expire meanwhile."""
        self.clock.advance_to(t)

    def close(self) -> None:
        self.scheduler.release_all_pins("shutdown")
        self.core.shutdown()
        use_clock(self._previous_clock)

    def _eos(self) -> int:
        eos = self.vllm_config.model_config.hf_config.eos_token_id
        return int(eos[0] if isinstance(eos, list) else eos)
