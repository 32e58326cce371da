"""Virtual-time engines, built in one place for every replay (a bench run, a cluster replica,
the planner's simulations, the isolated bound).

Why one factory: a comparison is only fair when every engine of it is built the same way, and
the rules for that (the longest conversation an engine takes, a P/D replica's KV-transfer
connector, a clairvoyant policy's futures) were written in several places before and had begun
to disagree. An engine is a policy (`server.policies.spec.PolicySpec`) on an engine
(`server.engine_spec.EngineSpec`, whose `offload_tier` turns a policy's `+offload` into a CPU
tier; a cluster replica's, the cluster's TTFT SLO among them, comes from the cluster file,
`cluster.config.ClusterConfig.engine_spec`). The longest conversation is
`server.max_model_len`'s rule, beside the served replicas' own. A clairvoyant policy (`oracle`)
also gets every program's future from the trace here (`futures`), and only it: the others are
built without.
"""

from __future__ import annotations

from dataclasses import replace

from cluster.config import ClusterConfig, ReplicaSpec
from cluster.pd import virtual_engine_options
from common.trace import Trace
from server.engine import VirtualEngine
from server.engine_spec import EngineSpec
from server.max_model_len import BLOCK_SIZE, context_limit
from server.perf.registry import load_profile
from server.policies.oracle import TurnFuture
from server.policies.spec import PolicySpec


def make_engine(policy: PolicySpec, spec: EngineSpec, *, trace: Trace | None = None,
                replica: ReplicaSpec | None = None, cluster: ClusterConfig | None = None,
                bidirectional: bool = False) -> VirtualEngine:
    """A fresh virtual-time engine running `policy` on `spec`, its context as
    `server.max_model_len.context_limit` says. `replica` and `cluster` (a cluster file's
    replica and the file, whose `engine_spec` made `spec`): a replica that moves KV (a prefill
    or decode replica, or one of a router that carries KV) also gets its KV-transfer connector
    (`bidirectional`: a prefill replica may read a program's history from its decode replica,
    `cluster.pd`). `trace`: what a clairvoyant policy (`oracle`) is told of the future
    (`futures`); other policies never get it."""
    spec = replace(spec, max_model_len=context_limit(spec.profile_name, spec.num_gpu_blocks,
                                                     spec.max_model_len))
    if replica is not None and cluster is not None and cluster.carries_kv(replica):
        spec = replace(spec, **virtual_engine_options(replica, cluster,
                                                      bidirectional=bidirectional))
    future = None
    if policy.cls.clairvoyant:
        if trace is None:
            raise ValueError(f"policy {policy.engine_name!r} knows every program's future: "
                             "give the trace")
        future = futures(trace)
    return VirtualEngine(policy, spec, future=future)


def pd_spec(replica: ReplicaSpec, cluster: ClusterConfig, seed: int,
            prefill_cache: bool = True) -> EngineSpec:
    """The engine of a P/D replay's replica, one rule for the bench (`eval.ampd.bench`) and the
    planner's simulations (`sim.planning`), so a plan is predicted on the engines it is
    replayed on: the cluster file's replica (`ClusterConfig.engine_spec`) started with
    `fitting_context`; a prefill replica running the ``ampd`` policy runs one prefill at a time
    (`max_num_seqs` 1: AMPD's Eq. 3 assumes so); ``prefill_cache`` off turns a prefill
    replica's prefix cache off (every prefill from scratch, the paper's Dynamo)."""
    prefill = replica.role == "prefill"
    return cluster.engine_spec(replica, EngineSpec(
        seed=seed, max_model_len=fitting_context(replica.profile, replica.num_gpu_blocks),
        max_num_seqs=1 if prefill and replica.policy.name == "ampd" else None,
        enable_prefix_caching=prefill_cache or not prefill))


def pd_replica(replica: ReplicaSpec, cluster: ClusterConfig, seed: int, *,
               history: str = "pull", prefill_cache: bool = True) -> VirtualEngine:
    """A P/D replay's replica on its `pd_spec` engine; `history` ``pull`` makes P/D replicas
    `bidirectional` (a prefill replica reads a program's history from its decode replica)."""
    return make_engine(replica.policy, pd_spec(replica, cluster, seed, prefill_cache),
                       replica=replica, cluster=cluster, bidirectional=history == "pull")


def fitting_context(profile: str, num_gpu_blocks: int | None) -> int | None:
    """The `max_model_len` a P/D replica of `profile` is started with by the AMPD bench and
    the planner alike: None (the model's own context) when its KV cache holds it, else what
    the cache holds, as an operator of a small TP group sets `--max-model-len` (vLLM refuses
    to start otherwise: Llama-3.1-70B at TP2 on H20 holds about 80k of its 131k tokens). A
    conversation longer than that is refused as `ContextTooLong`. One rule for both because
    vLLM sizes its default prefill chunk from it (a 4k `max_model_len` gives 2,048-token
    chunks, the model's context 8,192), so a plan predicted on other lengths is predicted on
    other steps."""
    if num_gpu_blocks is not None:
        return None  # `context_limit` already caps it by the blocks
    capacity = load_profile(profile).kv_capacity_tokens(0.9)
    limit = context_limit(profile, None)
    return None if capacity >= limit else capacity // BLOCK_SIZE * BLOCK_SIZE


def futures(trace: Trace) -> dict[str, tuple[TurnFuture, ...]]:
    """Each program's turns as the trace says they will be: prompt, what a kept previous turn
    leaves to compute, output, and the tool time after it."""
    return {p.id: tuple(TurnFuture(prompt_tokens=p.prompt_tokens(i), new_tokens=p.new_tokens(i),
                                   output_tokens=t.output_tokens, tool_seconds=t.tool_seconds)
                        for i, t in enumerate(p.turns))
            for p in trace.programs}
