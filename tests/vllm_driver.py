"""Drive the real vLLM v1 scheduler on CPU, as vLLM's own scheduler tests do.

Builds a `PolicyScheduler` over a small KV cache, feeds it `Request`s, and plays the GPU by
answering each `SchedulerOutput` with a hand-made `ModelRunnerOutput`. Every test of retention
behaviour goes through the real block pool, prefix cache and admission code.

vLLM (and torch with it) is imported when a scheduler is built, not when a test module
imports this one: the policy tests beside the scheduler tests, and `pytest -m "not engine"`,
do not pay its seconds of start-up.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vLLM is imported (no GPU here)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

from server.clock import VirtualClock, use_clock  # noqa: E402
from server.settings import ServeSettings  # noqa: E402

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

    from server.scheduler import PolicyScheduler

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "server" / "models" / "llama-3.1-8b"
TOKENIZER_DIR = ROOT / "server" / "tokenizer"
BLOCK = 16
EOS = 4


def make_scheduler(policy: str, num_blocks: int = 64, max_num_seqs: int = 16,
                   max_batched_tokens: int = 512, profile: str = "h100-llama-3.1-8b",
                   additional_config: dict[str, Any] | None = None) -> PolicyScheduler:
    """A `PolicyScheduler` on a small vLLM config; its settings travel in the config, as an
    engine's do (`additional_config`: as given, else policy and profile's)."""
    # vLLM and torch: start-up cost
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from server.scheduler import PolicyScheduler

    model_config = ModelConfig(model=str(MODEL_DIR), tokenizer=str(TOKENIZER_DIR),
                               max_model_len=4096, seed=0, dtype="bfloat16",
                               skip_tokenizer_init=True)
    scheduler_config = SchedulerConfig(max_num_seqs=max_num_seqs,
                                       max_num_batched_tokens=max_batched_tokens,
                                       max_model_len=4096, enable_chunked_prefill=True,
                                       is_encoder_decoder=False)
    cache_config = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9,
                               enable_prefix_caching=True)
    cache_config.num_gpu_blocks = num_blocks
    if additional_config is None:
        additional_config = ServeSettings(policy, profile).to_additional_config()
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                             cache_config=cache_config, additional_config=additional_config)
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=128,
                             dtype=torch.bfloat16)
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)])
    init_none_hash(sha256)
    return PolicyScheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                           structured_output_manager=StructuredOutputManager(vllm_config),
                           block_size=BLOCK, log_stats=False)


@dataclass
class Turn:
    request: Request
    output: list[int]


class Driver:
    """A scheduler plus a virtual clock plus a fake GPU that emits fixed-length answers."""

    def __init__(self, scheduler: PolicyScheduler, step_seconds: float = 0.01) -> None:
        from vllm.utils.hashing import sha256  # vLLM: start-up cost (imported by now anyway)
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher

        self.scheduler = scheduler
        self.clock = VirtualClock(1000.0)
        self._previous_clock = use_clock(self.clock)
        self.step_seconds = step_seconds
        self.hasher = get_request_block_hasher(BLOCK, sha256)
        self.turns: dict[str, Turn] = {}
        self.finished: list[str] = []
        self.last_output: SchedulerOutput | None = None

    def close(self) -> None:
        use_clock(self._previous_clock)

    def submit(self, request_id: str, prompt: list[int], program: str | None,
               max_tokens: int = 4, **hints: Any) -> Request:
        from vllm.sampling_params import SamplingParams  # vLLM: start-up cost
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                extra_args=hints or None)
        request = Request(request_id=request_id, prompt_token_ids=list(prompt),
                          sampling_params=params, pooling_params=None,
                          arrival_time=self.clock.now(), block_hasher=self.hasher,
                          session_id=program)
        self.turns[request_id] = Turn(request, [])
        self.scheduler.add_request(request)
        return request

    def step(self) -> SchedulerOutput:
        from vllm.v1.outputs import ModelRunnerOutput  # vLLM: start-up cost

        out = self.scheduler.schedule()
        self.last_output = out
        req_ids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            request = self.scheduler.requests[rid]
            done = request.num_computed_tokens + out.num_scheduled_tokens[rid]
            if done >= request.num_tokens:
                token = 100 + len(self.turns[rid].output)
                self.turns[rid].output.append(token)
                sampled.append([token])
            else:
                sampled.append([])
        runner = ModelRunnerOutput(req_ids=req_ids,
                                   req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                   sampled_token_ids=sampled)
        self.clock.sleep(self.step_seconds)
        engine_outputs = self.scheduler.update_from_output(out, runner)
        for outputs in engine_outputs.values():
            for o in outputs.outputs:
                if o.finish_reason is not None:
                    self.finished.append(o.request_id)
        return out

    def run_until_finished(self, request_id: str, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            if request_id in self.finished:
                return
            self.step()
        raise AssertionError(f"{request_id} did not finish in {max_steps} steps")

    def advance(self, seconds: float) -> None:
        self.clock.sleep(seconds)

    @property
    def free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    @property
    def total_blocks(self) -> int:
        # one block is the null block vLLM reserves
        return self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1
