"""Start-up settings shared by the processes of one `harness serve` (read from the environment).

vLLM builds the scheduler and the executor inside its engine-core process from class paths, so
our choices (policy, GPU/model profile, event socket, the policy's options) reach them as
environment variables that `harness serve` sets before vLLM starts. The virtual-time engine
(`server.engine.VirtualEngine`) sets the same variables, so a served replica and a simulated one
build their policy from the same settings. No vLLM import here.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from common.errors import UserError
from server.perf.copy_model import DEFAULT_OFFLOAD_COPY_MODEL
from server.perf.model_shapes import MODELS_DIR
from server.perf.registry import load_profile
from server.policies import policy_class
from server.policies.ampd import TTFT_SLO_S

ENV_POLICY = "HARNESS_POLICY"
ENV_PROFILE = "HARNESS_PROFILE"
ENV_SEED = "HARNESS_SEED"
#: how the emulated offloading connector's copies are priced (`server.perf.copy_model`
#: OFFLOAD_COPY_MODELS); the emulated worker and the policies' cost model read it alike
ENV_OFFLOAD_COPY_MODEL = "HARNESS_OFFLOAD_COPY_MODEL"
ENV_TTFT_SLO = "HARNESS_TTFT_SLO_S"
DEFAULT_POLICY = "continuum"
DEFAULT_PROFILE = "h100-llama-3.1-8b"
#: Host memory (GiB) for vLLM's native KV offloading, used by policies with `needs_offload`
#: (`swap`, `infercept`) unless `--offload-gib` says otherwise. Half the 128 GiB of host RAM of
#: the lent H100/H200 machines, so a real-GPU run can pin it; for Llama-3.1-8B that is 524k
#: tokens of KV, more than an H100's 448k-token GPU cache, so host copies are rarely evicted.
DEFAULT_OFFLOAD_GIB = 64.0
#: Options of the offloading connector: store the blocks of generated tokens too. vLLM 0.32
#: offloads prompt blocks only by default (meant for chats that drop earlier answers), but an
#: agent's next turn appends its answer verbatim, so the answer's KV is part of what a swap keeps.
OFFLOAD_CONNECTOR_OPTIONS: dict[str, object] = {"offload_prompt_only": False}


class ServeOptionsError(UserError):
    """A user mistake in the options of a served or in-process engine (`harness serve`
    prints it without a traceback, as `ServeError`)."""


def emulated_model_dir(profile: str) -> Path:
    """The config.json folder of the model a profile name (or table) stands for."""
    model = load_profile(profile).model.name
    folder = MODELS_DIR / model
    if not (folder / "config.json").is_file():
        known = ", ".join(sorted(p.name for p in MODELS_DIR.iterdir() if p.is_dir()))
        raise ServeOptionsError(f"no model config for {model!r} in {MODELS_DIR}; known: {known}")
    return folder


def offload_gib(policy: str, requested: float | None = None) -> float | None:
    """GiB of host memory for KV offloading, or None to leave it off: on when asked for
    (any policy may run on top of vLLM's offloading) or when the policy needs it."""
    if requested is not None:
        if not requested > 0:
            raise ServeOptionsError(f"--offload-gib {requested}: give a positive size in GiB")
        return float(requested)
    return DEFAULT_OFFLOAD_GIB if policy_class(policy).needs_offload else None


@dataclass(frozen=True)
class ServeSettings:
    policy: str = DEFAULT_POLICY
    profile: str = DEFAULT_PROFILE
    seed: int = 0
    offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL
    #: the deployment's TTFT SLO (s): what a policy that counts turns against one (`ampd`,
    #: Algorithm 2's Eq. 4) aims at; a cluster passes its `router.ttft_slo_s`
    ttft_slo_s: float = TTFT_SLO_S

    def __post_init__(self) -> None:
        if not (self.ttft_slo_s > 0 and math.isfinite(self.ttft_slo_s)):
            raise ValueError(f"the TTFT SLO must be a positive number of seconds, "
                             f"got {self.ttft_slo_s!r}")

    @classmethod
    def from_env(cls) -> ServeSettings:
        return cls(
            policy=os.environ.get(ENV_POLICY, DEFAULT_POLICY),
            profile=os.environ.get(ENV_PROFILE, DEFAULT_PROFILE),
            seed=int(os.environ.get(ENV_SEED, "0")),
            offload_copy_model=os.environ.get(ENV_OFFLOAD_COPY_MODEL,
                                              DEFAULT_OFFLOAD_COPY_MODEL),
            ttft_slo_s=float(os.environ.get(ENV_TTFT_SLO, TTFT_SLO_S)),
        )

    def to_env(self) -> dict[str, str]:
        return {ENV_POLICY: self.policy, ENV_PROFILE: self.profile, ENV_SEED: str(self.seed),
                ENV_OFFLOAD_COPY_MODEL: self.offload_copy_model,
                ENV_TTFT_SLO: repr(self.ttft_slo_s)}

    def policy_options(self) -> dict[str, float]:
        """Keyword options `server.policies.make_policy` hands to the policies that take them."""
        return {"ttft_slo_s": self.ttft_slo_s}
