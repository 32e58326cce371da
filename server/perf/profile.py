"""A profile: what the emulated executor asks of one GPU (or TP group) serving one model.

The emulated executor asks :meth:`Profile.step_seconds` how long a vLLM step (one forward pass
over a batch of prefill chunks and decoding sequences) would take on a given GPU and model, and
:meth:`Profile.kv_capacity_tokens` how many tokens of KV cache the GPU would hold; the
offloading connector and the policies ask what copies and reloads cost. Why a base class: the
memory, copy and all-reduce arithmetic is the same whether the step time comes from the
datasheet roofline (`server.perf.roofline`) or from a fit to a measured table
(`server.perf.table`); only `step_seconds` differs. Pure Python: no vLLM, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from server.perf.copy_model import (
    DEFAULT_OFFLOAD_COPY_MODEL,
    SOURCED_COPY_GPUS,
    check_offload_copy_model,
    sourced_copy_seconds,
)
from server.perf.hardware import DEFAULT_EFFICIENCY, GPUS, VLLM_SERVE_DEFAULTS, Efficiency, GiB
from server.perf.model_shapes import ModelSpec


class Profile:
    """What the emulated executor asks: step times, KV capacity, swap and reload costs."""

    kind = "base"

    def __init__(
        self,
        name: str,
        gpu_key: str,
        model: ModelSpec,
        efficiency: Efficiency = DEFAULT_EFFICIENCY,
        offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL,
    ) -> None:
        if gpu_key not in GPUS:
            raise ValueError(f"unknown GPU {gpu_key!r}; known: {', '.join(sorted(GPUS))}")
        check_offload_copy_model(offload_copy_model)
        if offload_copy_model == "sourced" and gpu_key not in SOURCED_COPY_GPUS:
            raise ValueError(
                f"offload copy model 'sourced' stands for PCIe Gen5 hosts "
                f"({', '.join(SOURCED_COPY_GPUS)}), not {gpu_key}; use peak80")
        self.offload_copy_model = offload_copy_model
        self.name = name
        self.gpu_key = gpu_key
        self.gpu = GPUS[gpu_key]
        self.model = model
        self.tp = model.tp
        self.eff = efficiency
        self.max_num_batched_tokens, self.max_num_seqs = VLLM_SERVE_DEFAULTS[gpu_key]
        self._check_fits()

    # --- the emulated device (tp GPUs act as one) -------------------------------------------
    @property
    def peak_flops(self) -> float:
        return self.gpu.peak_flops * self.tp

    @property
    def hbm_bandwidth(self) -> float:
        return self.gpu.hbm_bandwidth * self.tp

    @property
    def memory_bytes(self) -> int:
        return self.gpu.memory_bytes * self.tp

    @property
    def pcie_bandwidth(self) -> float:
        return self.gpu.pcie_bandwidth * self.tp  # one link per GPU

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    # --- memory -----------------------------------------------------------------------------
    def activation_reserve_bytes(self) -> int:
        """Memory vLLM's start-up profile run takes from the KV budget, over the group.

        Per GPU: CUDA context and workspaces, TP buffers, plus the larger of the forward
        activations at max_num_batched_tokens (residual, normed input, QKV, gate/up and
        SiLU output, bf16) and the sampler's dummy run over max_num_seqs rows of fp32 logits
        (logits, probabilities, one temporary).
        """
        m = self.model
        tokens, seqs = self.max_num_batched_tokens, self.max_num_seqs
        qkv = (m.heads // m.tp + 2 * m.kv_heads_per_gpu) * m.head_dim
        per_token = (3 * m.hidden + qkv
                     + 3 * m.active_experts * m.intermediate // m.tp) * m.bytes_per_param
        forward = tokens * per_token
        sampler = seqs * m.vocab * 4 * 3
        per_gpu = self.eff.non_torch_bytes + max(forward, sampler)
        if self.tp > 1:
            per_gpu += self.eff.tp_buffer_bytes
        return per_gpu * self.tp

    def kv_capacity_tokens(self, gpu_memory_utilization: float = 0.9) -> int:
        """(memory * util - weights - activation reserve) / kv bytes per token, for the group."""
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        free = (
            self.memory_bytes * gpu_memory_utilization
            - self.model.weight_bytes
            - self.activation_reserve_bytes()
        )
        if free <= 0:
            raise ValueError(
                f"{self.name}: no memory left for KV cache at gpu_memory_utilization="
                f"{gpu_memory_utilization} (weights {self.model.weight_bytes / GiB:.1f} GiB, "
                f"reserve {self.activation_reserve_bytes() / GiB:.1f} GiB, memory "
                f"{self.memory_bytes / GiB:.1f} GiB); raise the utilization or use more GPUs"
            )
        return int(free // self.kv_bytes_per_token)

    def _check_fits(self) -> None:
        util = 0.9
        per_gpu_budget = self.gpu.memory_bytes * util
        per_gpu_need = (self.model.weight_bytes + self.activation_reserve_bytes()) / self.tp
        if per_gpu_need < per_gpu_budget:
            return
        need = self.model.weight_bytes / GiB
        suggestion = ""
        for n in (2, 4, 8, 16):
            if n <= self.tp:
                continue
            try:
                ModelSpec(**{**asdict(self.model), "tp": n}).validate()
            except ValueError:
                continue
            if (self.model.weight_bytes / n) < per_gpu_budget * 0.8:
                suggestion = f"; try {self.gpu_key}x{n}-{self.model.name}"
                break
        raise ValueError(
            f"{self.model.name} does not fit on {self.tp} x {self.gpu_key}: weights "
            f"{need:.1f} GiB (+ {self.activation_reserve_bytes() / GiB:.1f} GiB activations) "
            f"vs {self.tp} x {per_gpu_budget / GiB:.1f} GiB usable at "
            f"gpu_memory_utilization={util}{suggestion}"
        )

    # --- time -------------------------------------------------------------------------------
    def step_seconds(
        self, prefill: Sequence[Sequence[int]], decode: Sequence[int]
    ) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def allreduce_seconds(self, tokens: int) -> float:
        """Two ring all-reduces per layer of tokens x hidden bf16 activations over NVLink."""
        if self.tp <= 1 or tokens <= 0:
            return 0.0
        n = self.tp
        nbytes = tokens * self.model.hidden * self.model.bytes_per_param
        bus = self.gpu.nvlink_bandwidth / 2 * self.eff.nvlink  # one direction
        one = self.eff.allreduce_latency_s + 2 * (n - 1) / n * nbytes / bus
        return 2 * self.model.layers * one

    def cpu_overhead_seconds(self, seqs: int) -> float:
        return self.eff.step_overhead_s + self.eff.per_seq_overhead_s * seqs

    def _copy_seconds(self, tokens: int, *, load: bool) -> float:
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        if self.offload_copy_model == "sourced":
            m = self.model
            return sourced_copy_seconds(tokens, m.layers, m.offload_page_bytes, load=load)
        return tokens * self.kv_bytes_per_token / (self.pcie_bandwidth * self.eff.pcie)

    def load_seconds(self, tokens: int) -> float:
        """One offloading-connector job copying the KV of `tokens` tokens from host memory to
        the GPUs (each GPU its own link), as `offload_copy_model` prices it."""
        return self._copy_seconds(tokens, load=True)

    def store_seconds(self, tokens: int) -> float:
        """One job copying the KV of `tokens` tokens from the GPUs to host memory."""
        return self._copy_seconds(tokens, load=False)

    def swap_seconds(self, tokens: int) -> float:
        """What the policies' cost models call: the time to bring `tokens` tokens of KV back
        from host memory, i.e. a load. With ``peak80`` loads and stores cost the same: the
        KV's bytes over one PCIe direction at `Efficiency.pcie` of the peak."""
        return self.load_seconds(tokens)

    def prefill_seconds(self, context_tokens: int, chunk: int | None = None,
                        cached: int = 0) -> float:
        """A whole prompt prefilled alone (the cost of reloading a dropped KV cache), in
        chunks of `chunk` tokens (default: vLLM's max_num_batched_tokens), one step each.
        With `cached` tokens of it already computed, only the rest is prefilled, attending to
        them (a multi-round turn's incremental prefill)."""
        if context_tokens < 0:
            raise ValueError(f"context_tokens must be >= 0, got {context_tokens}")
        if not 0 <= cached <= context_tokens:
            raise ValueError(f"cached must be in [0, context_tokens={context_tokens}], "
                             f"got {cached}")
        chunk = chunk or self.max_num_batched_tokens
        total, done = 0.0, cached
        while done < context_tokens:
            c = min(chunk, context_tokens - done)
            total += self.step_seconds([(c, done)], [])
            done += c
        return total

    def describe(self) -> dict[str, Any]:
        m = self.model
        return {
            "name": self.name,
            "kind": self.kind,
            "gpu": self.gpu_key,
            "gpu_name": self.gpu.name,
            "tp": self.tp,
            "model": m.name,
            "params": m.params,
            "weight_gib": round(m.weight_bytes / GiB, 2),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_capacity_tokens": self.kv_capacity_tokens(0.9),
            "memory_gib": round(self.memory_bytes / GiB, 2),
            "activation_reserve_gib": round(self.activation_reserve_bytes() / GiB, 2),
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "offload_copy_model": self.offload_copy_model,
            "efficiency": asdict(self.eff),
            "gpu_source": self.gpu.source,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
