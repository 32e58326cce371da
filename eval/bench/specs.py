"""What a `harness bench` run compares, and what every engine of it shares.

Why values of their own: a comparison between policies is only fair when every engine of the
run gets the same settings, and a cluster comparison only when every router and policy runs on
the same replicas; checking these once, before any engine starts, turns a user's mistake into
one line naming the flag (`BenchError`) instead of a failure minutes into a sweep.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cluster.config import ClusterConfig, ClusterConfigError, load_cluster, parse_cluster
from common.trace import Trace
from eval import ExperimentError
from server.max_model_len import context_limit
from server.perf.copy_model import DEFAULT_OFFLOAD_COPY_MODEL, check_offload_copy_model
from server.perf.registry import load_profile
from server.policies.spec import HINT_MODES, PolicySpec, UnknownHints
from sim.engines import make_engine


class BenchError(ExperimentError):
    """A user mistake in `harness bench` arguments (printed without a traceback)."""


def check_policies(names: Sequence[str]) -> list[PolicySpec]:
    """`--policies`: each ``NAME[:ARGUMENT][+offload][@HINTS]`` (`PolicySpec.parse`; the
    hints, `HINT_MODES`, say what the replayed client predicts about tool calls), e.g.
    ``continuum,continuum@oracle``; parsed, without repeats, in the order given. Every name is
    checked before any hints."""
    if not names:
        raise BenchError("--policies is empty; give e.g. vllm,continuum")
    specs: list[PolicySpec] = []
    bad: list[str] = []
    for p in names:
        try:  # a suffix other than +offload, an unknown name, a bad argument after ':'
            specs.append(PolicySpec.parse(p))
        except UnknownHints:
            bad.append(p)
        except ValueError as exc:
            raise BenchError(f"--policies {p}: {exc}") from None
    if bad:
        raise BenchError(f"unknown hints in {', '.join(map(repr, bad))}; after @ give one of: "
                         f"{', '.join(HINT_MODES)}")
    return list(dict.fromkeys(specs))


#: The reference runs of every virtual single-engine report: the baseline and the clairvoyant
#: schedule, so each policy's share of the gap between them can be given (`eval.bench.floor`).
REFERENCES = ("vllm", "oracle")


def with_references(policies: Sequence[PolicySpec]) -> list[PolicySpec]:
    """`policies` with `vllm` first and `oracle` last where they are not already named."""
    out = list(policies)
    first, last = (PolicySpec.named(name) for name in REFERENCES)
    if first not in out:
        out.insert(0, first)
    if last not in out:
        out.append(last)
    return out


@dataclass(frozen=True)
class ClusterRuns:
    """What `--cluster FILE --routers A,B --policies P,Q` compares: the file's replicas under
    each router, with every replica running each policy (or its own, if none are given)."""

    config: ClusterConfig
    runs: tuple[tuple[str, str, PolicySpec | None], ...]  # (label, router, policy or None)

    @classmethod
    def load(cls, path: str, routers: Sequence[str] | None = None,
             policies: Sequence[str] | None = None) -> ClusterRuns:
        """The cluster file at `path` under each of `routers` (None: the file's own), with
        every replica running each of `policies` (None: each replica's own policy)."""
        try:
            config = load_cluster(path)
        except ClusterConfigError as exc:
            raise BenchError(str(exc)) from None
        names = list(routers) if routers is not None else [config.router.strategy]
        wanted: list[PolicySpec | None] = [None]
        if policies is not None:
            wanted = list(check_policies(policies))
            if any(p.hint_mode != "none" or p.offload for p in wanted if p is not None):
                raise BenchError("--cluster: give plain policy names (set `offload_gib` per "
                                 "replica in the cluster file; client hints are not replayed)")
        for name in names:  # the file must make sense under every router and policy asked for
            for policy in wanted:
                data = config.model_dump()
                data["router"]["strategy"] = name
                if policy is not None:
                    for replica in data["replicas"]:
                        replica["policy"] = str(policy)
                try:
                    parse_cluster(data, f"{path} with router {name!r}"
                                  + ("" if policy is None else f" and policy {str(policy)!r}"))
                except ClusterConfigError as exc:
                    raise BenchError(str(exc)) from None
        runs = tuple((name if p is None else f"{name}:{p}", name, p)
                     for name in dict.fromkeys(names) for p in wanted)
        return cls(config, runs)

    def labels(self) -> list[str]:
        return [label for label, _, _ in self.runs]

    def config_for(self, label: str) -> ClusterConfig:
        """The cluster file as run under `label` (its router, and the policy if replaced)."""
        _, router, policy = next(r for r in self.runs if r[0] == label)
        config = self.config.model_copy(deep=True)
        config.router.strategy = router
        if policy is not None:
            for replica in config.replicas:
                replica.policy = policy
        return config

    def isolated_profile(self) -> tuple[str, int | None]:
        """Isolated JCTs are measured on the first replica that decodes (a program alone
        there is the bound for any placement on a homogeneous cluster)."""
        spec = next(r for r in self.config.replicas if r.role != "prefill")
        return spec.profile, spec.num_gpu_blocks


@dataclass(frozen=True)
class EngineSettings:
    """What every engine of a run shares, whatever its policy, set in one place: a comparison
    between policies is only fair when these are equal (the isolated bound uses them too)."""

    num_gpu_blocks: int | None = None
    max_model_len: int | None = None
    #: vLLM's per-step token budget (chunked prefill); None: vLLM's default
    max_num_batched_tokens: int | None = None
    #: host memory for vLLM's CPU KV offloading, for every policy; None: only for the
    #: policies that need it or are named NAME+offload
    offload_gib: float | None = None
    #: how the offloading connector's copies are priced (`server.perf.copy_model`
    #: OFFLOAD_COPY_MODELS), by the emulated worker and the policies' cost model
    offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL

    def check(self, *, cluster: bool = False, http: bool = False) -> None:
        """Refuse values no engine takes, naming the flag."""
        try:
            check_offload_copy_model(self.offload_copy_model)
        except ValueError as exc:
            raise BenchError(f"--offload-copy-model: {exc}") from None
        if http and self.offload_copy_model != DEFAULT_OFFLOAD_COPY_MODEL:
            raise BenchError("--url: the running server has its own copy model; start "
                             "`harness serve --offload-copy-model` instead")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 2:
            raise BenchError(f"--num-gpu-blocks {self.num_gpu_blocks}: give at least 2")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 16:
            raise BenchError(f"--max-num-batched-tokens {self.max_num_batched_tokens}: give at "
                             "least 16 tokens (one block)")
        if self.offload_gib is not None and not (self.offload_gib > 0
                                                 and math.isfinite(self.offload_gib)):
            raise BenchError(f"--offload-gib {self.offload_gib}: give a positive size in GiB")
        if http and (self.max_num_batched_tokens is not None or self.offload_gib is not None):
            raise BenchError("--url: the running server has its own engine settings; start "
                             "`harness serve` with them instead")
        if cluster and self.offload_gib is not None:
            raise BenchError("--cluster: set `offload_gib` per replica in the cluster file")


@dataclass(frozen=True)
class Engines:
    """Every single engine of a run: the profile it emulates, its seed and the shared
    `EngineSettings`. One value, so the isolated bound, the replays and the worker processes of
    `--jobs` build their engines from the same three things, and nothing below the sweep reads
    them from anywhere else."""

    profile: str
    seed: int = 0
    settings: EngineSettings = EngineSettings()

    def check(self) -> None:
        """Refuse a profile that does not load (a name or table path), naming the flag."""
        try:
            load_profile(self.profile, offload_copy_model=self.settings.offload_copy_model)
        except Exception as exc:  # noqa: BLE001 - any failure is a bad profile name here
            raise BenchError(f"--profile {self.profile!r}: {exc}") from None

    def make(self, policy: PolicySpec, trace: Trace | None = None) -> Any:
        """`make_engine` for `policy` under the run's settings; `trace`: the programs it will
        replay (only a clairvoyant policy, `oracle`, is told them)."""
        settings = self.settings
        return make_engine(policy, self.profile, self.seed, settings.num_gpu_blocks,
                           settings.offload_gib, max_model_len=settings.max_model_len,
                           max_num_batched_tokens=settings.max_num_batched_tokens,
                           offload_copy_model=settings.offload_copy_model, trace=trace)

    def context_limit(self) -> int:
        """The longest conversation these engines take (`server.max_model_len`)."""
        try:
            return context_limit(self.profile, self.settings.num_gpu_blocks,
                                 self.settings.max_model_len)
        except ValueError as exc:
            raise BenchError(str(exc)) from None


@dataclass(frozen=True)
class HttpTarget:
    """Where a wall-clock replay goes (`eval.replay.http_replay`)."""

    url: str
    model: str | None = None
    isolated_over_http: bool = False
