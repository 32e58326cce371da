"""What a `harness bench` run compares (its policies, `PolicySpec`s, or a cluster file's runs),
and the checks of what every engine of it shares (one `server.engine_spec.EngineSpec`).

Why here: a comparison between policies is only fair when every engine of the run gets the same
settings, and a cluster comparison only when every router and policy runs on the same
replicas; checking these once, before any engine starts, turns a user's mistake into one line
naming the flag (`BenchError`) instead of a failure minutes into a sweep.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cluster.config import ClusterConfig, ClusterConfigError, load_cluster, parse_cluster
from eval import ExperimentError
from server.engine_spec import EngineSpec
from server.max_model_len import context_limit
from server.perf.copy_model import DEFAULT_OFFLOAD_COPY_MODEL, check_offload_copy_model
from server.perf.registry import load_profile
from server.policies.spec import HINT_MODES, PolicySpec, UnknownHints


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
            specs = check_policies(policies)
            if any(p.hint_mode != "none" or p.offload for p in specs):
                raise BenchError("--cluster: give plain policy names (set `offload_gib` per "
                                 "replica in the cluster file; client hints are not replayed)")
            wanted = list(specs)
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


def check_engine(engine: EngineSpec, *, cluster: bool = False, http: bool = False) -> None:
    """Refuse settings no engine of the run takes (`engine`: what every engine of it shares,
    whatever its policy: a comparison between policies is only fair when these are equal, and
    the isolated bound uses them too), naming the flag; `cluster`, `http`: the run replays a
    cluster file, or over HTTP."""
    try:
        check_offload_copy_model(engine.offload_copy_model)
    except ValueError as exc:
        raise BenchError(f"--offload-copy-model: {exc}") from None
    if http and engine.offload_copy_model != DEFAULT_OFFLOAD_COPY_MODEL:
        raise BenchError("--url: the running server has its own copy model; start "
                         "`harness serve --offload-copy-model` instead")
    if engine.num_gpu_blocks is not None and engine.num_gpu_blocks < 2:
        raise BenchError(f"--num-gpu-blocks {engine.num_gpu_blocks}: give at least 2")
    if engine.max_num_batched_tokens is not None and engine.max_num_batched_tokens < 16:
        raise BenchError(f"--max-num-batched-tokens {engine.max_num_batched_tokens}: give at "
                         "least 16 tokens (one block)")
    if engine.long_prefill_token_threshold is not None and not (
            0 < engine.long_prefill_token_threshold):
        raise BenchError(f"--long-prefill-token-threshold {engine.long_prefill_token_threshold}"
                         ": give a positive number of tokens")
    if engine.max_num_seqs is not None and engine.max_num_seqs < 1:
        raise BenchError(f"--max-num-seqs {engine.max_num_seqs}: give at least 1")
    if engine.offload_gib is not None and not (engine.offload_gib > 0
                                               and math.isfinite(engine.offload_gib)):
        raise BenchError(f"--offload-gib {engine.offload_gib}: give a positive size in GiB")
    if engine.disk_gib is not None and not (engine.disk_gib > 0
                                            and math.isfinite(engine.disk_gib)):
        raise BenchError(f"--disk-gib {engine.disk_gib}: give a positive size in GiB")
    if http and (engine.max_num_batched_tokens is not None or engine.max_num_seqs is not None
                 or engine.long_prefill_token_threshold is not None
                 or engine.offload_gib is not None or engine.disk_gib is not None):
        raise BenchError("--url: the running server has its own engine settings; start "
                         "`harness serve` with them instead")
    if cluster and engine.offload_gib is not None:
        raise BenchError("--cluster: set `offload_gib` per replica in the cluster file")
    if cluster and engine.disk_gib is not None:
        raise BenchError("--disk-gib: the cluster file's replicas have no disk tier yet; "
                         "replay one engine (without --cluster)")


def check_profile(engine: EngineSpec) -> None:
    """Refuse a profile that does not load (a name or table path), naming the flag."""
    try:
        load_profile(engine.profile_name, offload_copy_model=engine.offload_copy_model)
    except Exception as exc:  # noqa: BLE001 - any failure is a bad profile name here
        raise BenchError(f"--profile {engine.profile_name!r}: {exc}") from None


def engine_context_limit(engine: EngineSpec) -> int:
    """The longest conversation `engine` takes (`server.max_model_len`)."""
    try:
        return context_limit(engine.profile_name, engine.num_gpu_blocks, engine.max_model_len)
    except ValueError as exc:
        raise BenchError(str(exc)) from None


@dataclass(frozen=True)
class HttpTarget:
    """Where a wall-clock replay goes (`eval.replay.http_replay`)."""

    url: str
    model: str | None = None
    isolated_over_http: bool = False
