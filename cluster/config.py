"""A cluster is a file: `cluster.yaml`, validated here.

Why pydantic and one schema: the served cluster (`harness cluster serve`) and the virtual-time
cluster (`harness bench --cluster`) must read the same file the same way, and a user's mistake
must come back as the field that is wrong and what to write instead, never a traceback.

    name: 1p3d
    router: {strategy: pd}
    links:
      intra_node: {latency_us: 5, bandwidth_gbs: 900}     # NVLink (AMPD section 7.1)
      inter_node: {latency_us: 10, bandwidth_gbs: 200}    # InfiniBand (AMPD section 7.1)
    replicas:
      - {name: p, role: prefill, profile: h100-llama-3.1-8b, policy: vllm, node: 0}
      - {name: d, role: decode, count: 3, profile: h100-llama-3.1-8b, policy: vllm, node: 1}

`count: N` expands one entry into N replicas named `d0 .. d{N-1}`. Roles: `colocated` replicas
prefill and decode; `prefill` replicas only prefill and hand the KV cache to a `decode` replica,
which decodes (and, under AMPD, may also prefill locally). A cluster is either all colocated or
has at least one prefill and one decode replica.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    InstanceOf,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from common.errors import UserError
from server.engine_spec import EngineSpec
from server.perf.hardware import INFINIBAND, NVLINK, Link
from server.perf.registry import load_profile
from server.policies.ampd import TTFT_SLO_S
from server.policies.spec import PolicySpec
from server.programs.state import STALE_AFTER_S

Role = Literal["colocated", "prefill", "decode"]


def _policy(value: object) -> PolicySpec:
    """A replica's `policy` as the file writes it (``NAME[:ARGUMENT]``, `PolicySpec.named`:
    a ValueError names the policies), parsed once, when the file is read."""
    if isinstance(value, PolicySpec):
        return value
    if not isinstance(value, str):
        raise ValueError("Input should be a valid string")  # as pydantic says it of a `str`
    return PolicySpec.named(value)


#: A replica's policy: a `PolicySpec` in the config, its text in the file and in a dump.
ReplicaPolicy = Annotated[InstanceOf[PolicySpec], BeforeValidator(_policy),
                          PlainSerializer(str, return_type=str)]

#: Strategies that place a whole turn on one replica (no P/D); `pd` and `ampd` need P/D roles.
COLOCATED_STRATEGIES = ("session", "round_robin", "least_loaded", "programs", "program-queue")
PD_STRATEGIES = ("pd", "ampd")
STRATEGIES = COLOCATED_STRATEGIES + PD_STRATEGIES


class ClusterConfigError(UserError):
    """A mistake in a cluster file: says which field and what to write (no traceback)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LinkSpec(_Strict):
    latency_us: float = Field(gt=0, description="one-way latency per transfer, microseconds")
    bandwidth_gbs: float = Field(gt=0, description="bandwidth in GB/s (1e9 bytes per second)")

    def link(self) -> Link:
        return Link(latency_s=self.latency_us / 1e6, bandwidth=self.bandwidth_gbs * 1e9)


class LinksSpec(_Strict):
    intra_node: LinkSpec = LinkSpec(latency_us=NVLINK.latency_s * 1e6,
                                    bandwidth_gbs=NVLINK.bandwidth / 1e9)
    inter_node: LinkSpec = LinkSpec(latency_us=INFINIBAND.latency_s * 1e6,
                                    bandwidth_gbs=INFINIBAND.bandwidth / 1e9)


class RouterSpec(_Strict):
    strategy: str = "session"
    #: `session`: a replica whose KV cache is fuller than this share takes no *new* program
    #: (programs already bound to it stay), unless every replica is that full.
    kv_guard: float = Field(default=0.9, gt=0, le=1)
    #: Virtual nodes per replica on the consistent-hash ring (more: a more even spread).
    hash_points: int = Field(default=64, ge=1, le=4096)
    seed: int = 0
    #: `ampd`: the SLOs its routing keeps slack against (TTFT_thres, ITL_thres, seconds).
    ttft_slo_s: float = Field(default=TTFT_SLO_S, gt=0)
    itl_slo_s: float = Field(default=0.1, gt=0)
    #: `ampd`: charge Eq. 2's T_kv(l_hist) only for the history a prefill replica is believed
    #: to lack (off: the paper's rule, the whole history every time; `cluster.ampd`)
    ampd_credit_held_history: bool = False
    #: How long a program silent without `program_end` is kept (seconds): by every replica's
    #: program scheduler (`EngineSpec.stale_after_s`) and by the router's own program books
    #: (`programs`: `cluster.program_router`), one bound for both so they forget together;
    #: `harness cluster serve --stale-after-s` overrides it (a time-scaled soak)
    stale_after_s: float = Field(default=STALE_AFTER_S, gt=0, allow_inf_nan=False)
    #: `programs`: a program moved to another replica takes its KV cache along over NIXL (its
    #: old home prefills the turn's new tokens, the new home reads the whole context) instead
    #: of recomputing it there; every replica then runs vLLM's NIXL connector (`kv_both`),
    #: stacked with the CPU tier's in vLLM's MultiConnector where a replica keeps one
    #: (`server.kv_connectors`)
    carry_kv: bool = False
    #: The tenants' API keys of a shared cluster (besides `harness cluster serve --api-key`,
    #: the cluster's own): a client sends one, and each program belongs to the key that opened
    #: it (`server.intake.ownership`; another key's events about it get a 403). Only the router sees
    #: them; the replicas get the cluster's key (`cluster.router_auth`). Not shown in a
    #: config's repr, nor dumped when empty.
    api_keys: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, repr=False, exclude_if=lambda keys: not keys)

    @field_validator("strategy")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in STRATEGIES:
            raise ValueError(f"unknown router strategy {value!r}; choose one of "
                             f"{', '.join(STRATEGIES)}")
        return value


class ReplicaSpec(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")
    role: Role = "colocated"
    profile: str = "h100-llama-3.1-8b"
    policy: ReplicaPolicy = PolicySpec.named("vllm")
    node: int = Field(default=0, ge=0, description="server the replica's GPUs sit in")
    count: int = Field(default=1, ge=1, le=256)
    #: vLLM CPU KV offloading for this replica (GiB of host memory); None: the policy decides.
    offload_gib: float | None = Field(default=None, gt=0)
    #: KV cache size override in 16-token blocks (None: the profile's capacity).
    num_gpu_blocks: int | None = Field(default=None, ge=16)
    #: HTTP port when served (None: the launcher assigns base_port + index).
    port: int | None = Field(default=None, ge=1024, le=65535)

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str) -> str:
        load_profile(value)  # raises ValueError naming the valid profiles
        return value


class ClusterConfig(_Strict):
    name: str = "cluster"
    router: RouterSpec = RouterSpec()
    links: LinksSpec = LinksSpec()
    replicas: list[ReplicaSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _expand_and_check(self) -> ClusterConfig:
        expanded: list[ReplicaSpec] = []
        for spec in self.replicas:
            if spec.count == 1:
                expanded.append(spec)
                continue
            if spec.port is not None:
                raise ValueError(f"replica {spec.name!r}: `port` cannot be combined with "
                                 f"`count: {spec.count}`; drop `port` (the launcher assigns one)")
            for i in range(spec.count):
                expanded.append(spec.model_copy(update={"name": f"{spec.name}{i}", "count": 1}))
        self.replicas = expanded
        names = [r.name for r in expanded]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"replica names must be unique; repeated: {', '.join(dupes)} "
                             "(with `count: N`, names get the suffixes 0..N-1)")
        ports = [r.port for r in expanded if r.port is not None]
        if len(ports) != len(set(ports)):
            raise ValueError("two replicas ask for the same `port`; give each its own")
        roles = {r.role for r in expanded}
        pd = self.router.strategy in PD_STRATEGIES
        if "colocated" in roles and roles != {"colocated"}:
            raise ValueError("mixing `colocated` with `prefill`/`decode` replicas is not "
                             "supported; make every replica colocated, or split them into "
                             "prefill and decode")
        if pd and not {"prefill", "decode"} <= roles:
            raise ValueError(f"router strategy {self.router.strategy!r} needs at least one "
                             "`role: prefill` and one `role: decode` replica")
        if not pd and roles != {"colocated"}:
            raise ValueError(f"router strategy {self.router.strategy!r} places whole turns on "
                             "one replica: give every replica `role: colocated`, or use "
                             f"strategy {PD_STRATEGIES[0]!r} for prefill/decode replicas")
        if self.router.carry_kv and self.router.strategy != "programs":
            raise ValueError(f"`carry_kv` is the `programs` router's (it moves programs with "
                             f"their KV); router strategy {self.router.strategy!r} moves none")
        return self

    # -- queries --------------------------------------------------------------------------------
    def replica(self, name: str) -> ReplicaSpec:
        for spec in self.replicas:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def engine_spec(self, spec: ReplicaSpec, base: EngineSpec) -> EngineSpec:
        """The engine of replica `spec`: what the file says of it (its profile, KV cache and
        CPU tier, and the cluster's TTFT SLO, `router.ttft_slo_s`, for its policy) on `base`
        (the seed and what every engine of a run shares), one rule for the served replicas
        (`cluster.launcher`, locally and on Ray) and the virtual-time ones (`sim.engines`).
        The silent-program bound is the router's too (`router.stale_after_s`)."""
        return replace(base, profile=spec.profile, num_gpu_blocks=spec.num_gpu_blocks,
                       offload_gib=spec.offload_gib, ttft_slo_s=self.router.ttft_slo_s,
                       stale_after_s=self.router.stale_after_s)

    def with_stale_after(self, seconds: float) -> ClusterConfig:
        """This cluster with its silent-program bound set to `seconds` (`harness cluster
        serve --stale-after-s`), validated as the file's `router.stale_after_s` is."""
        try:
            router = RouterSpec.model_validate({**self.router.model_dump(),
                                                "stale_after_s": seconds})
        except ValidationError:
            raise ClusterConfigError(f"--stale-after-s {seconds}: give a positive, finite "
                                     "number of seconds") from None
        return self.model_copy(update={"router": router})

    def carries_kv(self, spec: ReplicaSpec) -> bool:
        """Whether a replica runs vLLM's NIXL connector (`cluster.pd`): a prefill or decode
        replica always, a colocated one when the router moves programs with their KV
        (`carry_kv`)."""
        return spec.role != "colocated" or self.router.carry_kv

    def link(self, src: str, dst: str) -> Link:
        """The link KV takes from replica `src` to replica `dst`."""
        same_node = self.replica(src).node == self.replica(dst).node
        return (self.links.intra_node if same_node else self.links.inter_node).link()

    def gpus(self) -> int:
        return sum(load_profile(r.profile).model.tp for r in self.replicas)


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)


def parse_cluster(data: object, source: str = "cluster") -> ClusterConfig:
    """A `ClusterConfig` from parsed YAML/JSON; `ClusterConfigError` says what to fix."""
    if not isinstance(data, dict):
        raise ClusterConfigError(f"{source}: expected a mapping with `replicas:` (and optionally "
                                 "`name`, `router`, `links`), got "
                                 f"{type(data).__name__}")
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as exc:
        raise ClusterConfigError(f"{source} is not a valid cluster file:\n{_describe(exc)}"
                                 ) from None


def load_cluster(path: str | Path) -> ClusterConfig:
    """Read and validate a cluster file (YAML or JSON)."""
    path = Path(path)
    if not path.is_file():
        shipped = ", ".join(sorted(p.name for p in EXAMPLES_DIR.glob("*.yaml")))
        raise ClusterConfigError(f"no cluster file {path}; examples: {shipped} in {EXAMPLES_DIR}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ClusterConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse_cluster(data, str(path))


EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
