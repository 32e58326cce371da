"""Bounds the planner computes from the perf model alone, so that simulations (seconds each)
are spent only where they can change the answer (``sim.planning``).

* Capacity (``CAPACITY``): the load above which a replica has no steady state, from a lower
  bound on the work a program gives it. A finite simulation above it reports whatever its
  length gives, not a latency, so such candidates are infeasible and never simulated.
* Idle P95 (``idle_p95``): the P95 a trace would show on an idle replica, each turn alone with
  its history cached. Queueing, batching and the KV hand-off only add to a turn's time, so no
  simulation of that trace reports less; ``bound_score`` turns it into the best objective a
  plan holding such a candidate can reach (branch and bound over (role, degree) chains).

Both use only the step-time form (``server.perf.step_form``) and the trace: no vLLM.
"""

from __future__ import annotations

import math
from typing import Any

from cluster.planner import ROLES, Candidate, Objective
from common.metrics import percentile


def _uncached_tokens(program: Any, i: int) -> int:
    """Turn ``i``'s new tokens, less the shared prefix on the first turn (cached too)."""
    return program.new_tokens(i) - (program.shared_prefix_tokens if i == 0 else 0)


def prefill_capacity(programs: Any, profile: Any) -> float:
    """Programs/s above which one prefill replica of ``profile`` has no steady state: the
    inverse of a lower bound on the mean prefill work of a program.

    Why a bound and not a simulation: above its capacity a replica's queue grows without end,
    so a finite simulation's P95 only measures how long the simulation was (at 256 GPUs, TP2
    prefill replicas simulated at 2.8-32 programs/s all came out at 46-63 s, and the flat-floor
    rule then took that plateau as "unloaded"). The bound is the step-time form's terms that
    add up across a batch (``Coefficients``: ``c1 + c5`` per new token, ``c2`` per query-key
    pair, ``c4`` per sequence), without the per-step overhead ``c0`` or the weight-read floor
    that batching shares, for each turn's new tokens only (``Program.new_tokens``: the history
    is taken as cached), so a replica's work is at least this much whatever it batches and
    caches (a shared prefix counts as cached too). Candidates at or above it are infeasible
    (tau = inf) and never simulated."""
    c = profile.coefficients()
    total = 0.0
    for p in programs:
        for i in range(p.n_turns):
            n = _uncached_tokens(p, i)
            history = p.context_before(i) - n
            total += (c.c1 + c.c5) * n + c.c2 * (n * history + n * (n + 1) / 2) + c.c4
    return len(programs) / total if total > 0 else math.inf


def decode_capacity(programs: Any, profile: Any) -> float:
    """Programs/s above which one decode replica of ``profile`` has no steady state: its KV
    cache (``kv_capacity_tokens`` at full memory, more than an engine gets) over a lower bound
    on the KV token-seconds a program holds while it decodes (Little's law: the mean KV in use
    is the arrival rate times that).

    Why: the decode simulations replay at most ``max_programs`` programs, a burst that ends
    before a replica's KV fills, so their inter-token latency stays low at loads the replica
    cannot hold (at 32 programs/s a TP2 decode replica of Llama-3.1-70B measured 31 ms, yet
    its 75k-token cache holds under one DuReader program/s). The bound: each turn holds at
    least its context (less a shared prefix) for at least its decode steps, each no shorter
    than one step at that context alone."""
    held = 0.0
    for p in programs:
        for i, t in enumerate(p.turns):
            ctx = p.context_before(i)
            step = profile.step_seconds([], [ctx + 1])
            held += (ctx - p.shared_prefix_tokens) * (t.output_tokens - 1) * step
    return profile.kv_capacity_tokens(1.0) * len(programs) / held if held > 0 else math.inf


CAPACITY = {"prefill": prefill_capacity, "decode": decode_capacity}


def idle_p95(programs: Any, profile: Any, role: str) -> float:
    """P95 over the turns of ``programs`` on an idle replica of ``profile``: the prefill time
    of each turn's new tokens (history and any shared prefix cached) for ``prefill``; one
    decode step at the turn's context for ``decode`` (turns of two tokens or more, those an
    inter-token latency exists for)."""
    times = []
    for p in programs:
        for i, t in enumerate(p.turns):
            ctx = p.context_before(i)
            if role == "prefill":
                new = _uncached_tokens(p, i)
                times.append(profile.prefill_seconds(ctx, cached=ctx - new))
            elif t.output_tokens >= 2:
                times.append(profile.step_seconds([], [ctx + 1]))
    return percentile(times, 95) if times else math.inf


def bound_score(objective: Objective, role: str, tau: float) -> float:
    """The best score a plan holding a candidate of ``role`` with this tau can have (the other
    role at tau 0)."""
    other = ROLES[1 - ROLES.index(role)]
    c, idle = Candidate(role, 1, 1, tau), Candidate(other, 1, 1, 0.0)
    return objective.score(*((c, idle) if role == "prefill" else (idle, c)))
