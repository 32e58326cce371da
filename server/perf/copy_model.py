"""How long one copy of vLLM's offloading connector takes (KV to and from host memory).

Why two models: the emulated offloading connector (`server.emulated.offload`) and the policies'
reload cost both price these copies, and how to price them is itself an assumption worth
comparing. ``peak80`` is the simple one every published table used (bytes over one PCIe
direction at 0.8 of the datasheet peak); ``sourced`` follows what vLLM 0.32's native connector
really issues, priced from public H100 measurements (docs/reload-cost-sources.md). A profile
(`server.perf.profile.Profile`) picks one by name.

The command-line option that picks it is data here (`OFFLOAD_COPY_MODELS`,
`DEFAULT_OFFLOAD_COPY_MODEL`, `OFFLOAD_COPY_MODEL_HELP`); the commands own their parsers.
"""

from __future__ import annotations

from server.perf.hardware import Storage

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

#: The ``--offload-copy-model`` option's help, one text for every command that takes it
#: (`harness serve`, the bench): ``{what}`` names the copies the command times.
OFFLOAD_COPY_MODEL_HELP = ("how the emulated GPU times {what}: peak80 (default: PCIe at 0.8 "
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


def disk_seconds(blocks: int, block_bytes: int, storage: Storage, *, read: bool) -> float:
    """One job of vLLM 0.32's file-system tier (`vllm.v1.kv_offload.tiering.fs`): `blocks`
    blocks of `block_bytes` each read from (`read`) or written to `storage`.

    The tier hands a job's blocks to one thread of its pool as one task, which does them one
    after another, one file per block (write to a temp file and rename; read with readv), so a
    job costs one I/O per block back to back: ``blocks * (latency + block_bytes /
    bandwidth)``. Jobs of the same direction share the drive, one after another
    (`server.emulated.disk`)."""
    if blocks <= 0:
        return 0.0
    if read:
        latency, bandwidth = storage.read_latency_s, storage.read_bandwidth
    else:
        latency, bandwidth = storage.write_latency_s, storage.write_bandwidth
    return blocks * (latency + block_bytes / bandwidth)
