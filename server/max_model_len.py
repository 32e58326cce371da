"""The longest conversation an engine takes (vLLM's `max_model_len`), one rule per kind of
engine, both here so that neither is written twice.

The two kinds differ in their default on purpose:

* a served replica (`harness serve`, each replica of `harness cluster serve`, the router
  baseline's replicas) starts with `SERVED_MAX_MODEL_LEN`, 32,768 tokens, `harness serve`'s
  documented `--max-model-len` default: `vllm serve` refuses to start when its KV cache cannot
  hold one request of that length, and a real GPU (`--model`) may hold far less than the
  model's whole context;
* a virtual-time engine (`harness bench`, the virtual cluster, the planner's simulations) takes
  the model's own context (`max_position_embeddings`, 131,072 for Llama-3.1), as a plain
  `vllm serve` without the option does: a replay checks every turn of a trace against it
  before anything runs, and the README and the benchmark figures say and use that default.

A comparison of the two that must agree on it (`eval.experiments.fidelity`) passes the same explicit
limit to both. Both rules cap the default by what a small `num_gpu_blocks` holds
(`kv_cache_limit`), as vLLM requires.
"""

from __future__ import annotations

import json

from server.settings import emulated_model_dir

#: `harness serve`'s default `--max-model-len` (see the module docstring).
SERVED_MAX_MODEL_LEN = 32768
#: Tokens per KV block on the emulated GPU (`harness serve` passes `--block-size 16`) and
#: vLLM's default on a CUDA GPU.
BLOCK_SIZE = 16
#: What a model config without `max_position_embeddings` is taken to hold.
FALLBACK_MODEL_CONTEXT = 32768


def kv_cache_limit(num_gpu_blocks: int, block_size: int = BLOCK_SIZE) -> int:
    """The longest request a KV cache of `num_gpu_blocks` blocks holds: vLLM refuses a
    max_model_len the cache cannot hold, and one block of the pool is its null block, so it
    counts one block fewer than `--num-gpu-blocks-override`."""
    return (num_gpu_blocks - 1) * block_size


def served_max_model_len(num_gpu_blocks: int | None) -> int:
    """`--max-model-len` of a served replica: `SERVED_MAX_MODEL_LEN`, or what a replica with a
    small `num_gpu_blocks` can hold."""
    if num_gpu_blocks is None:
        return SERVED_MAX_MODEL_LEN
    return min(SERVED_MAX_MODEL_LEN, kv_cache_limit(num_gpu_blocks))


def context_limit(profile: str, num_gpu_blocks: int | None,
                  max_model_len: int | None = None) -> int:
    """The longest conversation a replayed engine takes: ``max_model_len`` (default: the
    model's context, 131,072 for Llama-3.1, as `vllm serve`), capped by what a small
    ``num_gpu_blocks`` holds (vLLM refuses a max_model_len that the KV cache cannot hold)."""
    config = json.loads((emulated_model_dir(profile) / "config.json").read_text())
    model = int(config.get("max_position_embeddings", FALLBACK_MODEL_CONTEXT))
    limit = model if max_model_len is None else max_model_len
    if limit < 1:
        raise ValueError(f"--max-model-len must be at least 1 token, got {limit}")
    if max_model_len is not None and max_model_len > model:
        raise ValueError(f"--max-model-len {max_model_len:,} is longer than the model's "
                         f"context ({model:,} tokens)")
    if num_gpu_blocks is not None:
        limit = min(limit, kv_cache_limit(num_gpu_blocks))
    return limit
