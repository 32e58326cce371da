"""A program scheduler (`server.programs`) carried out inside one engine, as a policy.

Why an adapter and not a policy of its own: the decisions (who is active, what a paused
program's KV does) live in `server.programs` so the router can take the same ones across
replicas. Inside one engine they are carried out with the scheduler's mechanisms:

* a paused program's waiting turns are held back even while memory is free (`held_back`, the
  scheduler takes them out of the waiting queue for the step);
* an active program's finished turn is pinned when the program scheduler keeps its KV on the
  GPU (`on_finish`); a pin whose program was paused, or told to release, expires at the next
  step (`pin_expired`): with the host tier its KV stays there (vLLM's write-through copy), so
  its next turn reloads it; without, the prefix cache keeps it until evicted;
* the waiting turns of active programs are ordered by the program scheduler (`queue_key`);
* prefetch of an offloaded context ahead of the predicted return (`prefetch_due`);
* a context the program scheduler dropped is recomputed rather than reloaded from the host
  tier (`reload_from_cpu`).

The engine's capacity in tokens is its KV blocks times the block size, and its host tier's the
tier's bytes over a token's (`configure`); its count of what it holds reaches the program
scheduler at every step that decides (`observe_kv`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from server.costs import CostModel
from server.policies.base import AgentEvent, Policy, RequestView
from server.programs.base import ProgramScheduler
from server.programs.state import Kv

#: How often (clock seconds) the KV held by program state is sampled for the reports.
OCCUPANCY_EVERY_S = 5.0


class ProgramPolicy(Policy):
    """Base of the program-scheduling policies: set `scheduler_cls`."""

    scheduler_cls: type[ProgramScheduler] = ProgramScheduler
    reorders_queue = True
    gates_admission = True

    def __init__(self, cost_model: CostModel | None = None) -> None:
        super().__init__(cost_model)
        self.programs = self.scheduler_cls(0, cost_model, host_tier=False)
        self._now = 0.0  # the latest step's time (`pin_victim` is asked without one)
        #: (time, KV tokens by state: reasoning / acting / paused, active programs, paused,
        #: and what the engine held then: `in_use`, its blocks that cannot be evicted)
        self.occupancy: list[tuple[float, dict[str, int]]] = []
        self._blocks_in_use = 0

    def configure(self, *, max_batch_tokens: int, total_blocks: int, block_size: int,
                  host_tier: bool = False, host_tier_tokens: int | None = None) -> None:
        super().configure(max_batch_tokens=max_batch_tokens, total_blocks=total_blocks,
                          block_size=block_size, host_tier=host_tier,
                          host_tier_tokens=host_tier_tokens)
        self.programs.configure(total_blocks * block_size, host_tier, host_tier_tokens)
        # prefetch brings an offloaded context back: only with a host tier to load from
        self.prefetches = host_tier and self.programs.prefetches

    def forget_silent_after(self, seconds: float) -> None:
        """Forget a program silent this long (`ProgramTable.reap`; the deployment's
        `ServeSettings.stale_after_s`)."""
        self.programs.forget_silent_after(seconds)

    # -- facts ---------------------------------------------------------------------------
    def on_arrival(self, req: RequestView, now: float) -> None:
        if req.program_id is not None:
            self.programs.turn_arrived(req.program_id, req.prompt_tokens, now, req.hints.turn)

    def on_scheduled(self, req: RequestView, now: float) -> None:
        if req.program_id is not None:
            self.programs.turn_admitted(req.program_id, now)

    def on_finish(self, req: RequestView, now: float) -> bool:
        pid = req.program_id
        if pid is None:
            return False
        if req.hints.last:
            self.programs.program_ended(pid, now)
            return False
        kept = self.programs.turn_finished(pid, req.context_tokens, now, req.hints.tool,
                                           req.hints.predicted_s)
        return kept is Kv.GPU

    def on_event(self, event: AgentEvent, now: float) -> None:
        pid = event.program_id
        if event.kind == "tool_start":
            self.programs.tool_started(pid, event.tool, event.predicted_s, now,
                                       event.predicted_q)
        elif event.kind == "tool_end":
            self.programs.tool_ended(pid, now)
        elif event.kind == "program_end":
            self.programs.program_ended(pid, now)
        elif event.kind == "program_moved":
            self.programs.program_left(pid, now)

    def on_aborted(self, req: RequestView, now: float) -> None:
        """Its client went away: the program ends here, slot and memory account with it."""
        if req.program_id is not None:
            self.programs.program_ended(req.program_id, now)

    # -- admission -----------------------------------------------------------------------
    def observe_kv(self, blocks_in_use: int, ahead: Callable[[], Mapping[str, int]]) -> None:
        self._blocks_in_use = blocks_in_use
        self.programs.observe_engine(blocks_in_use * self.block_size, ahead)

    def held_back(self, waiting: list[RequestView], running: int, now: float) -> set[str]:
        """Request ids of waiting turns whose program may not run now."""
        self._now = now
        self.programs.decide(now, idle=running == 0)
        if not self.occupancy or now - self.occupancy[-1][0] >= OCCUPANCY_EVERY_S:
            self._sample(now)
        may_run = self.programs.may_run
        return {r.request_id for r in waiting if not may_run(r.program_id)}

    def _sample(self, now: float) -> None:
        held = self.programs.occupancy()
        held["in_use"] = self._blocks_in_use * self.block_size
        self.occupancy.append((now, held))

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        return (*self.programs.order_key(req.program_id, now), req.arrival_time)

    # -- retention -----------------------------------------------------------------------
    def pin_expired(self, program_id: str, now: float, has_waiting: bool) -> bool:
        return self.programs.kv_of(program_id) is not Kv.GPU

    def pin_victim(self, pinned_program_ids: list[str]) -> str:
        return self.programs.victim(pinned_program_ids, self._now)

    def on_unpin(self, program_id: str, reason: str, now: float) -> None:
        self._now = now
        if reason in ("pressure", "expired"):
            self.programs.kv_released(program_id)

    def prefetch_due(self, now: float) -> list[str]:
        self._now = now
        return self.programs.prefetch_due(now)

    def on_prefetched(self, program_id: str, context_tokens: int, now: float) -> bool:
        return self.programs.may_run(program_id)

    def reload_from_cpu(self, req: RequestView) -> bool:
        """A context the program scheduler dropped is recomputed (MORI's last rung), though
        the tier's own LRU may still hold a copy."""
        return self.programs.reloads(req.program_id)
