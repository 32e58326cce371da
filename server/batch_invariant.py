"""`harness serve --batch-invariant`: vLLM's batch-invariant mode where vLLM has it, a clear
refusal elsewhere, and the one question about this machine's GPU that decides it.

Why: a scheduling policy changes which requests share a batch, and on most kernels that alone
changes the numbers a model computes (the order of a reduction follows the batch's shape), so
two policies can make the same agent say different things. With `VLLM_BATCH_INVARIANT=1` vLLM
swaps in kernels whose result does not depend on the batch, and a policy change is then
nothing a model says: only when, not what.

Where vLLM 0.32 has it (docs/features/batch_invariance, `vllm.model_executor.determinism.
batch_invariant.enable_batch_invariant_mode`): NVIDIA GPUs of compute capability 8.0 or higher
(SM8x through Triton matmuls, SM90/SM100 through cuBLAS without split-K), AMD Instinct GPUs
(gfx90a, gfx942, gfx950) and Intel XPUs. `harness serve` runs a real model on a CUDA (or
ROCm) GPU or on the CPU engine (an XPU is no device of ours), so refused are:

* `--device cpu`: vLLM installs no batch-invariant kernel on its CPU platform, and its CPU
  GEMMs and attention are not batch invariant (our CPU agreement figure, 29 of 31 turns under
  memory pressure, is that);
* the emulated GPU: it runs no model (its tokens are random or scripted per request), so there
  is no kernel to make invariant and nothing the flag could change;
* a GPU vLLM does not list (compute capability below 8.0, another AMD architecture).
"""

from __future__ import annotations

from dataclasses import dataclass

from server.settings import ServeOptionsError

ENV = "VLLM_BATCH_INVARIANT"
#: AMD architectures vLLM 0.32 lists for batch invariance (`gcnArchName` starts with one)
ROCM_ARCHS = ("gfx90a", "gfx942", "gfx950")
MIN_CUDA_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class Gpu:
    """The first visible GPU as torch sees it."""

    name: str
    capability: tuple[int, int]  # CUDA compute capability (ROCm reports its own numbers)
    rocm_arch: str | None = None  # e.g. "gfx942:sramecc+:xnack-" on ROCm, None on CUDA


def detect_gpu() -> Gpu | None:
    """This machine's first GPU, or None when torch sees none (the one place that asks)."""
    try:
        import torch  # torch: start-up cost, paid only when a GPU is asked about

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
        arch = getattr(props, "gcnArchName", None) if torch.version.hip else None
        return Gpu(name=props.name, capability=(props.major, props.minor), rocm_arch=arch)
    except Exception:  # noqa: BLE001 - any failure means: no usable GPU
        return None


def batch_invariant_env(target: str, gpu: Gpu | None) -> dict[str, str]:
    """The environment that turns the mode on for a server on `target` ("gpu", "cpu" or
    "emulated") with `gpu` (`detect_gpu()`), or a `ServeOptionsError` saying why it cannot."""
    if target == "cpu":
        raise ServeOptionsError(
            "--batch-invariant: vLLM has no batch-invariant kernels on the CPU (its CPU GEMMs "
            "and attention reduce in an order that follows the batch); it needs a real model "
            "on an NVIDIA GPU of compute capability 8.0 or higher or an AMD Instinct GPU "
            "(gfx90a/942/950)")
    if target == "emulated":
        raise ServeOptionsError(
            "--batch-invariant: the emulated GPU runs no model (its tokens are random or "
            "scripted per request, the same whatever the batch); the mode is for a real model "
            "on a GPU (--model)")
    if gpu is None:
        raise ServeOptionsError("--batch-invariant needs a GPU and none is visible here")
    if gpu.rocm_arch is not None:
        if not gpu.rocm_arch.startswith(ROCM_ARCHS):
            raise ServeOptionsError(
                f"--batch-invariant: vLLM supports it on AMD {', '.join(ROCM_ARCHS)}, not on "
                f"this {gpu.name} ({gpu.rocm_arch.split(':')[0]})")
    elif gpu.capability < MIN_CUDA_CAPABILITY:
        major, minor = gpu.capability
        raise ServeOptionsError(
            f"--batch-invariant: vLLM supports it on NVIDIA GPUs of compute capability 8.0 or "
            f"higher, and this {gpu.name} is {major}.{minor}")
    return {ENV: "1"}
