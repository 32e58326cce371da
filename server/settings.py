"""Start-up settings shared by the processes of one `harness serve` (read from the environment).

vLLM builds the scheduler and the executor inside its engine-core process from class paths, so
our choices (policy, GPU/model profile, event socket) reach them as environment variables that
`harness serve` sets before vLLM starts. No vLLM import here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from server.perf_model import DEFAULT_OFFLOAD_COPY_MODEL

ENV_POLICY = "HARNESS_POLICY"
ENV_PROFILE = "HARNESS_PROFILE"
ENV_SEED = "HARNESS_SEED"
#: how the emulated offloading connector's copies are priced (`server.perf_model`
#: OFFLOAD_COPY_MODELS); the emulated worker and the policies' cost model read it alike
ENV_OFFLOAD_COPY_MODEL = "HARNESS_OFFLOAD_COPY_MODEL"
DEFAULT_POLICY = "continuum"
DEFAULT_PROFILE = "h100-llama-3.1-8b"


@dataclass(frozen=True)
class ServeSettings:
    policy: str = DEFAULT_POLICY
    profile: str = DEFAULT_PROFILE
    seed: int = 0
    offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL

    @classmethod
    def from_env(cls) -> ServeSettings:
        return cls(
            policy=os.environ.get(ENV_POLICY, DEFAULT_POLICY),
            profile=os.environ.get(ENV_PROFILE, DEFAULT_PROFILE),
            seed=int(os.environ.get(ENV_SEED, "0")),
            offload_copy_model=os.environ.get(ENV_OFFLOAD_COPY_MODEL,
                                              DEFAULT_OFFLOAD_COPY_MODEL),
        )

    def to_env(self) -> dict[str, str]:
        return {ENV_POLICY: self.policy, ENV_PROFILE: self.profile, ENV_SEED: str(self.seed),
                ENV_OFFLOAD_COPY_MODEL: self.offload_copy_model}
