"""What a replay records: per turn, per program, and for the whole run (`ReplayResult`).

Why one record format: every replayer fills it (the virtual-time loop, `sim.loop`, and the
wall-clock one over HTTP, `eval.replay.http_replay`), and `common.metrics` reads only it, so
results of either can be set side by side.

Recorded per turn: when it was due, admitted (the start of the engine step that first scheduled
it), its first token and finish, prompt / output / cached tokens, preemptions, and recomputed
tokens: the part of the previous turn's conversation (prompt + output, minus the last sampled
token, whose KV is never computed) that the cache did not supply. Even with everything kept,
this includes the partial last block (under 16 tokens), since the prefix cache hits whole
blocks only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TurnRecord:
    program_id: str
    turn: int
    arrival: float  # when the request was due (program arrival, or tool return)
    admitted: float | None = None  # start of the step that first scheduled it
    first_token: float | None = None
    finished: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    recomputed_tokens: int = 0  # computed for an earlier turn, not found in the cache now
    #: of cached_tokens, those loaded rather than found resident: from the host tier (vLLM's
    #: offloading) or, on a P/D decode replica, from a peer
    reloaded_tokens: int = 0
    preemptions: int = 0
    replica: str | None = None  # in a cluster: the replica that decoded it
    prefill_replica: str | None = None  # in a cluster: where its prompt was computed, if remote
    #: P90 and longest gap between its output tokens (engine time), None below two tokens or
    #: where the engine does not report gaps: what a per-token ITL SLO is measured on
    itl_p90: float | None = None
    itl_max: float | None = None


@dataclass
class ProgramRecord:
    program_id: str
    arrival: float
    finished: float | None = None
    turns: list[TurnRecord] = field(default_factory=list)

    @property
    def jct(self) -> float:
        assert self.finished is not None
        return self.finished - self.arrival


@dataclass
class ReplayResult:
    programs: dict[str, ProgramRecord]
    makespan: float  # last finish minus first arrival
    total_blocks: int
    pin_stats: dict[str, float]
    sched_seconds: float
    sched_steps: int
    engine_steps: int
    replicas: list[Any] = field(default_factory=list)  # `sim.virtual_cluster.ReplicaStats` each
    router: str = ""
    #: programs the metrics count (None: all); `steady_programs` leaves warm-up and cool-down out
    measured: set[str] | None = None
    #: closed loop: when every program was released to the system (the burst's start), from
    #: which its completion time counts; None: from its arrival (then completion = JCT)
    released: float | None = None
    #: a program scheduler's totals over its programs (`server.programs`: seconds active /
    #: paused / queued, pauses, resumes); empty for a per-request policy
    program_stats: dict[str, float] = field(default_factory=dict)
    #: a program scheduler's samples of KV held by program state over time (one engine: its
    #: own; a cluster: the first replica's), as (time, {reasoning, acting, paused, ...})
    program_occupancy: list[Any] = field(default_factory=list)
    #: programs a router moved to another replica mid-run (`cluster.program_router` counts
    #: them; 0 for routers that do not move programs)
    migrations: int = 0
    #: what moved to and from each KV tier (``host``, ``disk``: blocks and bytes stored and
    #: loaded, blocks dropped; `server.emulated.offload.TierTraffic`), summed over the engines,
    #: only when one has a disk tier: empty otherwise, so a run without one reports as before
    tier_traffic: dict[str, dict[str, int]] = field(default_factory=dict)


def steady_programs(result: ReplayResult, trim: float) -> set[str] | None:
    """The programs of a steady-state measurement: all but the first and the last ``trim``
    share by start time (warm-up: the system fills; cool-down: it drains and the last
    programs run with less competition). None when ``trim`` is 0 (count everything)."""
    if trim <= 0:
        return None
    ordered = sorted(result.programs.values(), key=lambda p: (p.arrival, p.program_id))
    cut = int(len(ordered) * trim)
    kept = ordered[cut:len(ordered) - cut]
    if not kept:
        raise ValueError(f"steady-state trim {trim:g} leaves none of {len(ordered)} programs")
    return {p.program_id for p in kept}
