"""What one engine is, in one value: `EngineSpec`.

Why one value: an engine's settings (its profile or model, device, seed, KV cache, KV tiers,
batch budget, context, prefix caching, KV-transfer connector, the deployment's TTFT SLO) were
restated by every layer that handed them on (the bench's settings, the engine factory, the
virtual engine, the `vllm serve` command builders, the cluster launcher), unpacked into loose
arguments and packed again. Built once, by the command line, a cluster file
(`cluster.config.ClusterConfig.engine_spec`) or the bench, it is taken whole by the virtual
engine (`server.engine.VirtualEngine`), the engine factory (`sim.engines.make_engine`) and the
`vllm serve` command builders (`server.launch`).

A field left None means "the default of the kind of engine it builds", and the kinds differ
on purpose where they say so: `max_model_len` (`server.max_model_len`: a served replica's
32,768 tokens, a virtual engine's the model's context), `profile` (a real model's engine uses
it only as the policies' cost model). No vLLM import here.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.kv_connectors import DiskTier
from server.perf.copy_model import DEFAULT_OFFLOAD_COPY_MODEL
from server.perf.registry import load_profile
from server.policies.ampd import TTFT_SLO_S
from server.policies.spec import PolicySpec
from server.programs.state import STALE_AFTER_S
from server.settings import (
    DEFAULT_OFFLOAD_GIB,
    DEFAULT_PROFILE,
    ServeOptionsError,
    ServeSettings,
)


@dataclass(frozen=True)
class EngineSpec:
    """One engine's settings, whatever its policy (`PolicySpec`, given beside it)."""

    #: the emulated GPU and model (a profile name or a measured table); None: `DEFAULT_PROFILE`
    #: (`profile_name`), and for a real model's engine only the policies' cost model
    profile: str | None = None
    #: a real model (a folder, a hub id, ...: `server.models.store`) instead of the emulated GPU
    model: str | None = None
    #: `server.launch.DEVICES`: where a served engine runs (``auto``: the emulated GPU without
    #: a model, a CUDA GPU with one)
    device: str = "auto"
    seed: int = 0
    #: KV cache size in 16-token blocks (vLLM's `num_gpu_blocks_override`); None: the profile's
    num_gpu_blocks: int | None = None
    #: host memory (GiB) for vLLM's CPU KV offloading; None: only for the policies that need it
    #: or are named ``NAME+offload`` (`offload_tier`)
    offload_gib: float | None = None
    #: disk (GiB) behind the CPU tier for vLLM's file-system KV tier (`server.kv_connectors`
    #: `DiskTier`); None: no disk tier. Only an engine with a CPU tier gets one (`disk_tier`)
    disk_gib: float | None = None
    #: the folder of the disk tier's block files; None: `default_disk_path()` (a folder of this
    #: process under $TMPDIR). The emulated GPU writes nothing there
    disk_path: str | None = None
    #: how the offloading connector's copies are priced (`server.perf.copy_model`
    #: OFFLOAD_COPY_MODELS): by the emulated worker and by the policies' cost model
    offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL
    #: tokens one step may compute (vLLM's chunked-prefill budget); None: vLLM's default on
    #: the device (on the emulated GPU, the GPU's: `emulated_batch_limits`)
    max_num_batched_tokens: int | None = None
    #: requests one step may run (vLLM's max_num_seqs); None: as `max_num_batched_tokens`. 1
    #: on a prefill replica runs its prefills one at a time, as AMPD's Eq. 3 assumes
    max_num_seqs: int | None = None
    #: vLLM's long-prefill cap (`long_prefill_token_threshold`: while two or more requests
    #: are scheduled, no prompt computes more than this many tokens of a step); None: vLLM's
    #: default, no cap. A policy that shares prefill steps itself (`Policy.prefill_share`,
    #: `lookahead`) sets it at every step instead
    long_prefill_token_threshold: int | None = None
    #: the longest conversation (prompt + output); None: the kind of engine's default
    #: (`server.max_model_len`)
    max_model_len: int | None = None
    #: vLLM's automatic prefix caching (on, as `vllm serve` has it); off: every prompt is
    #: computed from scratch (the `dynamo` baseline's prefill replicas)
    enable_prefix_caching: bool = True
    #: the deployment's TTFT SLO (s), for policies that take it (`ServeSettings.ttft_slo_s`)
    ttft_slo_s: float = TTFT_SLO_S
    #: how long a program scheduler keeps a silent program (`ServeSettings.stale_after_s`)
    stale_after_s: float = STALE_AFTER_S
    #: vLLM's KV-transfer connector config of a replica that moves KV (`cluster.pd`
    #: `kv_transfer_config`): a P/D replica, or one whose router carries programs' KV
    kv_transfer: Mapping[str, Any] | None = field(default=None, hash=False)

    @property
    def profile_name(self) -> str:
        """The profile given, else `DEFAULT_PROFILE`: what the emulated GPU runs, and the
        policies' cost model on a real device."""
        return self.profile or DEFAULT_PROFILE

    def emulated_batch_limits(self) -> tuple[int, int]:
        """(tokens one step may compute, requests one step may run) of an engine on the
        emulated GPU: those given, else the profile's, which are what `vllm serve` takes on that
        GPU (`server.perf.hardware.VLLM_SERVE_DEFAULTS`: 8,192 and 1,024 on an H100 or H200).
        Left to vLLM, an emulated engine on this host would take its CPU platform's 2,048 and
        128: every prefill chunked four times finer and a quarter of the batch, the host's
        limits and not the GPU's. (Figures measured before this rule ran with those; give
        `--max-num-batched-tokens 2048 --max-num-seqs 128` to reproduce them.)"""
        profile = load_profile(self.profile_name, offload_copy_model=self.offload_copy_model)
        tokens = self.max_num_batched_tokens or profile.max_num_batched_tokens
        # vLLM refuses more requests a step than tokens: a small budget given lowers the default
        return tokens, self.max_num_seqs or min(profile.max_num_seqs, tokens)

    def offload_tier(self, policy: PolicySpec) -> float | None:
        """GiB of host memory for vLLM's KV offloading under `policy`, or None to leave it off:
        `offload_gib` where given (any policy may run on top of vLLM's offloading), else
        `DEFAULT_OFFLOAD_GIB` for a policy that needs it or is named ``NAME+offload``."""
        if self.offload_gib is not None:
            if not self.offload_gib > 0:
                raise ServeOptionsError(f"--offload-gib {self.offload_gib}: give a positive "
                                        "size in GiB")
            return float(self.offload_gib)
        return DEFAULT_OFFLOAD_GIB if policy.offload or policy.cls.needs_offload else None

    def disk_tier(self, policy: PolicySpec) -> DiskTier | None:
        """The disk tier behind the CPU tier under `policy`, or None: none without `disk_gib`,
        and none where `policy` runs without a CPU tier (`offload_tier`), since vLLM's tiers
        reach the GPU only through it."""
        if self.disk_gib is None:
            return None
        if not self.disk_gib > 0:
            raise ServeOptionsError(f"--disk-gib {self.disk_gib}: give a positive size in GiB")
        if self.offload_tier(policy) is None:
            return None
        return DiskTier(float(self.disk_gib), self.disk_path or default_disk_path())

    def serve_settings(self, policy: PolicySpec, *, events: bool = True) -> ServeSettings:
        """What reaches the engine core through vLLM's config (`server.settings`) to run
        `policy` here; `events` False: an in-process engine's events come in by method."""
        return ServeSettings(policy=policy.engine_name, profile=self.profile_name,
                             seed=self.seed, offload_copy_model=self.offload_copy_model,
                             ttft_slo_s=self.ttft_slo_s, stale_after_s=self.stale_after_s,
                             events=events)


def default_disk_path() -> str:
    """Where a disk tier keeps its block files when no folder is given: a folder of this
    process under the temporary directory ($TMPDIR, else /tmp), which vLLM's file-system tier
    creates on first use."""
    return str(Path(tempfile.gettempdir()) / f"harness-kv-disk-{os.getpid()}")
