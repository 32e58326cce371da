"""Virtual-time engines, built in one place for every replay (a bench run, a cluster replica,
the planner's simulations, the isolated bound).

Why one factory: a comparison is only fair when every engine of it is built the same way, and
the rules for that (a policy's `+offload`, the longest conversation an engine takes, a P/D
replica's KV-transfer connector, the cluster's TTFT SLO) were written in several places before
and had begun to disagree. The longest conversation is `server.max_model_len`'s
rule, beside the served replicas' own. A clairvoyant policy (`oracle`) also gets every
program's future from the trace here (`futures`), and only it: the others are built without.
"""

from __future__ import annotations

from typing import Any

from cluster.pd import virtual_engine_options
from common.trace import Trace
from server.engine import VirtualEngine
from server.max_model_len import BLOCK_SIZE, context_limit
from server.perf.copy_model import DEFAULT_OFFLOAD_COPY_MODEL
from server.perf.registry import load_profile
from server.policies.oracle import TurnFuture
from server.policies.spec import PolicySpec
from server.settings import DEFAULT_OFFLOAD_GIB


def make_engine(policy: PolicySpec, profile: str, seed: int, num_gpu_blocks: int | None,
                offload_gib: float | None = None, replica: Any = None,
                cluster: Any = None, max_model_len: int | None = None,
                max_num_batched_tokens: int | None = None,
                bidirectional: bool = False,
                offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL,
                trace: Trace | None = None, max_num_seqs: int | None = None,
                enable_prefix_caching: bool = True) -> Any:
    """A fresh virtual-time engine for `policy` (its `offload` turns vLLM's CPU KV offloading
    on), its context
    as `server.max_model_len.context_limit` says. `replica` and `cluster` (a cluster file's
    replica and the file): a prefill or decode replica also gets its KV-transfer connector
    (`bidirectional`: a prefill replica may read a program's history from its decode replica,
    `cluster.pd`), and every replica of a cluster the cluster's TTFT SLO (`router.ttft_slo_s`)
    for its policy. `trace`: what a clairvoyant policy (`oracle`) is told of the future
    (`futures`); other policies never get it. `max_num_seqs`, `enable_prefix_caching`: vLLM's,
    as `server.engine.VirtualEngine` takes them."""
    max_len = context_limit(profile, num_gpu_blocks, max_model_len)
    name = policy.engine_name
    if policy.offload and offload_gib is None:
        offload_gib = DEFAULT_OFFLOAD_GIB
    options: dict[str, Any] = {}
    if cluster is not None:  # the cluster's TTFT SLO, as `harness cluster serve` gives it
        options["ttft_slo_s"] = cluster.router.ttft_slo_s
    if replica is not None and cluster is not None and cluster.carries_kv(replica):
        options.update(virtual_engine_options(replica, cluster, bidirectional=bidirectional))
    if policy.cls.clairvoyant:
        if trace is None:
            raise ValueError(f"policy {name!r} knows every program's future: give the trace")
        options["future"] = futures(trace)
    return VirtualEngine(policy=name, profile=profile, seed=seed, max_model_len=max_len,
                         num_gpu_blocks=num_gpu_blocks, offload_gib=offload_gib,
                         max_num_batched_tokens=max_num_batched_tokens,
                         offload_copy_model=offload_copy_model, max_num_seqs=max_num_seqs,
                         enable_prefix_caching=enable_prefix_caching, **options)


def pd_options(role: str, policy: PolicySpec, *, history: str = "pull",
               prefill_cache: bool = True) -> dict[str, Any]:
    """How a P/D replay builds a replica of `role` running `policy` (`make_engine`'s keywords),
    one rule for the bench (`eval.ampd.bench`) and the planner's simulations
    (`sim.planning`), so a plan is predicted on the engines it is replayed on:
    `history` ``pull`` makes P/D replicas `bidirectional` (a prefill replica reads a program's
    history from its decode replica); a prefill replica running the ``ampd`` policy runs one
    prefill at a time (`max_num_seqs` 1: AMPD's Eq. 3 assumes so); ``prefill_cache`` off
    turns a prefill replica's prefix cache off (every prefill from scratch, the paper's
    Dynamo)."""
    prefill = role == "prefill"
    return {"bidirectional": history == "pull",
            "max_num_seqs": 1 if prefill and policy.name == "ampd" else None,
            "enable_prefix_caching": prefill_cache or not prefill}


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
