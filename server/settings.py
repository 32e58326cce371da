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

from server.perf_model import DEFAULT_OFFLOAD_COPY_MODEL
from server.policies.ampd import TTFT_SLO_S

ENV_POLICY = "HARNESS_POLICY"
ENV_PROFILE = "HARNESS_PROFILE"
ENV_SEED = "HARNESS_SEED"
#: how the emulated offloading connector's copies are priced (`server.perf_model`
#: OFFLOAD_COPY_MODELS); the emulated worker and the policies' cost model read it alike
ENV_OFFLOAD_COPY_MODEL = "HARNESS_OFFLOAD_COPY_MODEL"
ENV_TTFT_SLO = "HARNESS_TTFT_SLO_S"
DEFAULT_POLICY = "continuum"
DEFAULT_PROFILE = "h100-llama-3.1-8b"


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
