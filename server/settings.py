"""Start-up settings of one engine that its engine core reads: its policy, GPU/model profile,
seed and policy options (the rest of an engine, `server.engine_spec.EngineSpec`, reaches vLLM
as its own options; `EngineSpec.serve_settings` makes these).

vLLM builds the scheduler and the executor inside its engine-core process from class paths, so
our choices cannot be constructor arguments. They travel inside vLLM's own configuration
instead: `VllmConfig.additional_config` (a dict vLLM carries, with the rest of the config,
into the engine-core process) holds them under the key `harness` (`to_additional_config`;
`harness serve` passes it as `vllm serve --additional-config JSON`, the in-process engines as
`EngineArgs(additional_config=...)`), and the scheduler and the executor read them back from the
config they are built with (`from_vllm_config`). So a served replica and a simulated one build
their policy from the same settings, and no engine writes them into the process environment.

Fallback: a config without them (a `vllm serve --scheduler-cls server.scheduler.PolicyScheduler`
started by hand) takes the `HARNESS_*` environment variables (`from_env`), as before.

The cost: `additional_config` is part of vLLM's config hash, so on a real GPU each setting
(say each policy) gets its own torch.compile cache the first time it runs. No vLLM import here.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from common.errors import UserError
from server.perf.copy_model import DEFAULT_OFFLOAD_COPY_MODEL
from server.perf.model_shapes import MODELS_DIR
from server.perf.registry import load_profile
from server.policies.ampd import TTFT_SLO_S
from server.programs.state import STALE_AFTER_S

ENV_POLICY = "HARNESS_POLICY"
ENV_PROFILE = "HARNESS_PROFILE"
ENV_SEED = "HARNESS_SEED"
#: how the emulated offloading connector's copies are priced (`server.perf.copy_model`
#: OFFLOAD_COPY_MODELS); the emulated worker and the policies' cost model read it alike
ENV_OFFLOAD_COPY_MODEL = "HARNESS_OFFLOAD_COPY_MODEL"
ENV_TTFT_SLO = "HARNESS_TTFT_SLO_S"
ENV_STALE_AFTER = "HARNESS_STALE_AFTER_S"
#: the key of our settings in vLLM's `additional_config`
ADDITIONAL_CONFIG_KEY = "harness"
DEFAULT_POLICY = "continuum"
DEFAULT_PROFILE = "h100-llama-3.1-8b"
#: Host memory (GiB) for vLLM's native KV offloading, used by policies with `needs_offload`
#: (`swap`, `infercept`) and by a replayed ``NAME+offload`` unless `--offload-gib` says
#: otherwise (`server.engine_spec.EngineSpec.offload_tier`). Half the 128 GiB of host RAM of
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


@dataclass(frozen=True)
class ServeSettings:
    policy: str = DEFAULT_POLICY
    profile: str = DEFAULT_PROFILE
    seed: int = 0
    offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL
    #: the deployment's TTFT SLO (s): what a policy that counts turns against one (`ampd`,
    #: Algorithm 2's Eq. 4) aims at; a cluster passes its `router.ttft_slo_s`
    ttft_slo_s: float = TTFT_SLO_S
    #: how long a program scheduler keeps a silent program (`server.programs.state`); shorter
    #: only for a soak that must see the table drain within its run (`harness eval soak`)
    stale_after_s: float = STALE_AFTER_S
    #: the scheduler listens on the events channel `harness serve` names (`HARNESS_EVENTS_IPC`,
    #: shared with the API server's events endpoint); False: an in-process engine, whose
    #: events come in through its `event()` method
    events: bool = True

    def __post_init__(self) -> None:
        if not (self.ttft_slo_s > 0 and math.isfinite(self.ttft_slo_s)):
            raise ValueError(f"the TTFT SLO must be a positive number of seconds, "
                             f"got {self.ttft_slo_s!r}")
        if not (self.stale_after_s > 0 and math.isfinite(self.stale_after_s)):
            raise ValueError(f"the silent-program bound must be a positive number of seconds, "
                             f"got {self.stale_after_s!r}")

    @classmethod
    def from_env(cls) -> ServeSettings:
        return cls(
            policy=os.environ.get(ENV_POLICY, DEFAULT_POLICY),
            profile=os.environ.get(ENV_PROFILE, DEFAULT_PROFILE),
            seed=int(os.environ.get(ENV_SEED, "0")),
            offload_copy_model=os.environ.get(ENV_OFFLOAD_COPY_MODEL,
                                              DEFAULT_OFFLOAD_COPY_MODEL),
            ttft_slo_s=float(os.environ.get(ENV_TTFT_SLO, TTFT_SLO_S)),
            stale_after_s=float(os.environ.get(ENV_STALE_AFTER, STALE_AFTER_S)),
        )

    def to_additional_config(self) -> dict[str, Any]:
        """vLLM's `additional_config` that carries these settings into the engine."""
        return {ADDITIONAL_CONFIG_KEY: asdict(self)}

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> ServeSettings:
        """The settings an engine was built with (`additional_config`), else the environment's
        (`from_env`: a `vllm serve` started by hand)."""
        extra = getattr(vllm_config, "additional_config", None)
        if not isinstance(extra, dict) or ADDITIONAL_CONFIG_KEY not in extra:
            return cls.from_env()
        given = extra[ADDITIONAL_CONFIG_KEY]
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known) if isinstance(given, dict) else None
        if unknown is None or unknown:
            raise ServeOptionsError(f"additional_config[{ADDITIONAL_CONFIG_KEY!r}]: expected "
                                    f"an object of {', '.join(sorted(known))}; got {given!r}")
        return cls(**given)

    def policy_options(self) -> dict[str, float]:
        """Keyword options `server.policies.make_policy` hands to the policies that take them."""
        return {"ttft_slo_s": self.ttft_slo_s}
