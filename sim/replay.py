"""One engine's replay: a trace's programs through a `VirtualEngine` on its virtual clock, and
each program's isolated JCT (the lower bound of its JCT under any load).

Why these are thin: one engine is a cluster of one replica, so the discrete-event loop is the
cluster's (`sim.loop`); the records are in `sim.records`, the conversation model in
`sim.conversation`, what the client sends in `sim.client`.
"""

from __future__ import annotations

from typing import Any

from common.trace import Trace
from sim.loop import replay_cluster
from sim.records import ReplayResult
from sim.virtual_cluster import VirtualCluster


def replay(trace: Trace, engine: Any, *, progress: Any = None,
           hints: str = "none", concurrency: int | None = None,
           intake_s: float = 0.0, delivery_s: float = 0.0) -> ReplayResult:
    """Run every program of ``trace`` through ``engine`` (a fresh ``VirtualEngine``); the
    engine is left open (the caller closes it). ``progress(n_done)`` is called as programs
    end; ``hints`` is one of ``sim.client.HINT_MODES``; ``intake_s`` / ``delivery_s`` add a
    served path (`sim.loop.replay_cluster`). One engine is a cluster of one replica: the same
    discrete-event loop (`sim.loop`) drives both."""
    return replay_cluster(trace, VirtualCluster.around(engine), progress=progress, hints=hints,
                          concurrency=concurrency, intake_s=intake_s, delivery_s=delivery_s)


def isolated_jcts(trace: Trace, engine: Any, *, progress: Any = None) -> dict[str, float]:
    """Each program alone on ``engine`` (one after another, pins released in between): its
    JCT with no other load, the lower bound of its JCT in any replay. The shared prefix stays
    in the prefix cache across programs (as it would under load), so this is a true bound."""
    out: dict[str, float] = {}
    for n, program in enumerate(trace.programs):
        alone = Trace(name=f"{trace.name}:{program.id}",
                      programs=[program.model_copy(update={"arrival_s": 0.0})])
        result = replay(alone, engine)
        out[program.id] = result.programs[program.id].jct
        engine.scheduler.release_all_pins("reset")
        if progress is not None:
            progress(n + 1)
    return out
