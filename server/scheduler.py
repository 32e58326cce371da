"""`PolicyScheduler`: vLLM's v1 scheduler with our retention and ordering policies.

Loaded by vLLM with `--scheduler-cls server.scheduler.PolicyScheduler`. This is the only module
that touches vLLM scheduler internals; every decision is delegated to a `server.policies`
object. The mechanisms added here:

* Pinning. When a turn finishes and the policy says so, its KV blocks are taken out of the
  request with `pop_blocks_for_free` instead of being freed: the references keep them
  resident (and findable by the prefix cache), so the program's next turn hits them.
* Release. A pin ends by hand-off (the program's next turn was admitted and now holds its own
  references), expiry (policy TTL; the policy may hold it while the program waits), program
  end, the program's move to another replica (`program_moved`), memory pressure (an
  allocation would fail: the policy's victim is unpinned and the allocation retried, so pins
  can never deadlock the engine), `reset_prefix_cache` and shutdown. Blocks are freed in
  reverse order so tail blocks are evicted first.
* Ordering. For policies that reorder, the FCFS waiting deque is put in the policy's order
  (`order_waiting`: by default sorted by its key) once per step, before vLLM's own admission
  loop runs over it; policies that order the running batch (`orders_running`) sort it too,
  which decides whom vLLM preempts first.
* Events. Agent events drained from the side channel (`server.intake.events`) at the top of
  each step.
* Prefetch. For policies that prefetch, the contexts of programs in a tool call are brought
  back into GPU memory when the policy says (`server.prefetch` has the mechanism and its rules).
* Step records. With a sink (`record_steps`, or `HARNESS_STEP_LOG`) every executed step's
  batch and wall time go to it (`server.step_log`), to check the step-time model.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from server.clock import clock
from server.intake.events import ENV_EVENTS_IPC, EventReceiver, StatusFile
from server.kv_connectors import OFFLOADING, has_host_tier, host_tier_tokens, sub_connector
from server.perf.profile import Profile
from server.perf.registry import load_profile
from server.policies import AgentEvent, Hints, RequestView, make_policy
from server.policies.base import UnpinReason
from server.policies.programs import ProgramPolicy
from server.prefetch import PREFETCH_PREFIX, PrefetchBook
from server.settings import ServeOptionsError, ServeSettings
from server.step_log import StepRecord, StepTimer, sink_from_env

logger = logging.getLogger("harness.scheduler")

_VIEW_ATTR = "_harness_view"
_NORMAL_FINISH = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)


@dataclass
class Pin:
    program_id: str
    request_id: str
    blocks: list[Any]
    tokens: int
    pinned_at: float


@dataclass
class PinStats:
    """Counters the benchmark reads (`PolicyScheduler.pin_stats`)."""

    pinned: int = 0
    handoff: int = 0
    expired: int = 0
    program_end: int = 0
    moved: int = 0  # its program's later turns run on another replica (`program_moved`)
    pressure: int = 0
    reset: int = 0
    replaced: int = 0
    shutdown: int = 0
    prefetched: int = 0  # prefetch requests made
    prefetch_dropped: int = 0  # of those, dropped unrun: the program's turn arrived first
    gate_overridden: int = 0  # steps an idle engine admitted a turn its policy held back
    # integral of pinned blocks over clock time, for the time-weighted share of memory
    block_seconds: float = 0.0
    _last_t: float | None = field(default=None, repr=False)

    def counts(self) -> dict[str, int]:
        """The counters (what the step log records): pins made, and released by reason."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type in (int, "int")}


def hints_from(extra_args: dict[str, Any] | None) -> Hints:
    """Hints from `vllm_xargs`; wrong types are ignored rather than failing the request."""
    if not extra_args:
        return Hints()

    def number(key: str, kind: type) -> Any:
        value = extra_args.get(key)
        try:
            return kind(value) if value is not None else None
        except (TypeError, ValueError):
            return None

    tool = extra_args.get("tool")
    last = extra_args.get("last")
    return Hints(
        turn=number("turn", int),
        tool=str(tool) if tool not in (None, "") else None,
        predicted_s=number("predicted_s", float),
        last=last in (True, 1, "1", "true", "True"),
        predicted_output_tokens=number("predicted_output_tokens", int),
    )


class PolicyScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = ServeSettings.from_vllm_config(self.vllm_config)
        self.agent_policy = make_policy(settings.policy, cost_model=policy_cost_model(settings),
                                        **settings.policy_options())
        if isinstance(self.agent_policy, ProgramPolicy):
            self.agent_policy.forget_silent_after(settings.stale_after_s)
        self.pins: dict[str, Pin] = {}
        self._pinned_blocks = 0  # sum of len(pin.blocks), kept as pins come and go
        self.pin_stats = PinStats()
        self.sched_seconds = 0.0  # wall time inside schedule() (perf_counter), summed
        self.sched_steps = 0
        self.last_scheduled_tokens = 0  # of the latest step (`VirtualEngine` watches progress)
        self.events_received = 0
        self._events: EventReceiver | None = None
        self._status: StatusFile | None = None
        address = (os.environ.get(ENV_EVENTS_IPC) or None) if settings.events else None
        if address:
            self._events = EventReceiver(address)
            self._status = StatusFile(address)
        self._configured_token_budget = self.max_num_scheduled_tokens
        self.agent_policy.configure(
            max_batch_tokens=self.max_num_scheduled_tokens,
            total_blocks=self.kv_cache_manager.block_pool.num_gpu_blocks,
            block_size=self.block_size,
            host_tier=has_host_tier(self.vllm_config.kv_transfer_config),
            host_tier_tokens=host_tier_tokens(self.vllm_config.kv_transfer_config,
                                              self.kv_cache_config))
        self._allocate_slots = self.kv_cache_manager.allocate_slots
        self.kv_cache_manager.allocate_slots = self._allocate_or_unpin  # type: ignore[method-assign]
        self._gate_offload_reloads()
        self._prefetch: PrefetchBook | None = None
        if self.agent_policy.prefetches:
            self._prefetch = PrefetchBook(self.max_model_len)
        self._step_timer: StepTimer | None = None
        if (sink := sink_from_env()) is not None:
            self.record_steps(sink)
        logger.info("harness policy %s (profile %s, events %s)", settings.policy,
                    settings.profile, address or "off")

    # -- views -------------------------------------------------------------------------
    def view(self, request: Request) -> RequestView:
        view: RequestView | None = getattr(request, _VIEW_ATTR, None)
        if view is None:
            params = request.sampling_params
            view = RequestView(
                request_id=request.request_id,
                program_id=request.session_id,
                arrival_time=request.arrival_time,
                prompt_tokens=request.num_prompt_tokens,
                hints=hints_from(params.extra_args if params else None),
            )
            setattr(request, _VIEW_ATTR, view)
        view.num_preemptions = request.num_preemptions
        view.output_tokens = request.num_output_tokens
        return view

    # -- the step ----------------------------------------------------------------------
    def record_steps(self, sink: Callable[[StepRecord], None]) -> None:
        """From now on hand every executed step (batch and wall seconds) to `sink`."""
        self._step_timer = StepTimer(sink)

    def schedule(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        started = time.perf_counter()  # a vDSO read; process_time() is a syscall (6x dearer)
        now = clock().now()
        queued = len(self.waiting)
        self.account_pins(now)
        if self._events is not None:
            for event in self._events.drain():
                self.events_received += 1
                self.handle_event(event, now)
        if self.pins:
            self._expire_pins(now)
        if self._prefetch is not None:
            self._start_prefetches(now)
        if self.agent_policy.reorders_queue and len(self.waiting) > 1:
            self._reorder_waiting(now)
        if self._prefetch is not None and self._prefetch.in_flight and len(self.waiting) > 1:
            self._prefetches_last()
        if self.agent_policy.orders_running and len(self.running) > 1:
            key = self.agent_policy.running_key
            self.running.sort(key=lambda r: key(self.view(r), now))
        if self.agent_policy.adapts_token_budget:
            self._set_token_budget()
        held = self._hold_back(now) if self.agent_policy.gates_admission and self.waiting else []
        if self.agent_policy.shares_prefill_steps:
            self._share_prefill_step()
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            if held:  # back at the head, in their order, for the next step's decision
                self.waiting.prepend_requests(held)
        for new in output.scheduled_new_reqs:
            request = self.requests.get(new.req_id)
            if request is None or (self._prefetch is not None
                                   and self._prefetch.is_prefetch(new.req_id)):
                continue
            view = self.view(request)
            if request.num_preemptions == 0:
                self.agent_policy.on_scheduled(view, now)
            if view.program_id in self.pins:
                self._unpin(view.program_id, "handoff", now)
        self.last_scheduled_tokens = int(output.total_num_scheduled_tokens)
        # an emulated step lasts its modelled time from here, scheduling included
        output.harness_step_started = started
        if self._step_timer is not None:
            self._step_timer.scheduled(started, now, output.num_scheduled_tokens,
                                       self.requests,
                                       (new.req_id for new in output.scheduled_new_reqs),
                                       waiting=queued, pins=self.pin_stats.counts())
        self.sched_seconds += time.perf_counter() - started
        self.sched_steps += 1
        return output

    def status(self) -> dict[str, Any]:
        """The counters the API server shows (`server.intake.events.StatusFile`). What a
        long run watches for leaks is here too: the blocks pins hold, when the oldest pin was
        made (clock seconds, so the file changes only when pins do), and how many programs the
        policy's program table keeps (None for a policy without one)."""
        oldest = next(iter(self.pins.values()), None)  # pins are kept in the order made
        table = (len(self.agent_policy.programs.table)
                 if isinstance(self.agent_policy, ProgramPolicy) else None)
        return {"events_received": self.events_received, "pinned_now": len(self.pins),
                "pinned_programs": list(itertools.islice(self.pins, 32)),  # the oldest pins
                "pinned_blocks": self._pinned_blocks,
                "oldest_pin_at": oldest.pinned_at if oldest is not None else None,
                "programs_tracked": table,
                "pins": self.pin_stats.counts()}

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any
                           ) -> Any:  # type: ignore[override]
        timer = self._step_timer
        started = time.perf_counter() if timer is not None else 0.0
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if timer is not None:
            timer.updated(scheduler_output.total_num_scheduled_tokens, len(self.requests),
                          started)
        if self._status is not None:  # after the step's pins (a finished turn pins here)
            self._status.write(self.status())
        return outputs

    def handle_event(self, event: AgentEvent, now: float) -> None:
        """An agent event, from the side channel or an in-process driver."""
        self.agent_policy.on_event(event, now)
        if event.kind in ("program_end", "program_moved"):
            # moved: a cluster router sent the program's later turns to another replica,
            # which computes its context anew, so a pin here would hold memory for nothing
            if event.program_id in self.pins:
                self._unpin(event.program_id, "program_end" if event.kind == "program_end"
                            else "moved", now)
            if self._prefetch is not None:
                self._prefetch.forget(event.program_id)

    def add_request(self, request: Request) -> None:
        if self._prefetch is not None:
            self._turn_arrived(request.session_id)
        super().add_request(request)
        self.agent_policy.on_arrival(self.view(request), clock().now())

    def _reorder_waiting(self, now: float) -> None:
        if not isinstance(self.waiting, FCFSRequestQueue):
            return  # --scheduling-policy priority: vLLM's heap order stands
        requests = {r.request_id: r for r in self.waiting}
        views = self.agent_policy.order_waiting([self.view(r) for r in self.waiting], now)
        if len(views) != len(requests) or {v.request_id for v in views} != requests.keys():
            # a request left out of the queue would never run: fail loudly instead
            raise RuntimeError(f"policy {self.agent_policy.name!r}: order_waiting must return "
                               "every waiting request once")
        self.waiting.clear()
        self.waiting.extend(requests[v.request_id] for v in views)

    def _hold_back(self, now: float) -> list[Request]:
        """Take the waiting turns the policy holds back out of the queue for this step (the
        program scheduler's paused programs). When nothing runs, the first waiting turn stays
        whatever the policy says: a gate must never leave an idle engine with work."""
        if not isinstance(self.waiting, FCFSRequestQueue):
            return []  # --scheduling-policy priority: not gated
        pool = self.kv_cache_manager.block_pool
        self.agent_policy.observe_kv(pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(),
                                     self._still_to_allocate)
        views = [self.view(r) for r in self.waiting]
        ids = self.agent_policy.held_back(views, len(self.running), now)
        if not ids:
            return []
        # a prefill this replica computes for another (a P/D hand-off, or a moved program's
        # context carried to its new home) is that replica's turn: this one's gate is not asked
        held = [r for r in self.waiting if r.request_id in ids
                and not (r.kv_transfer_params or {}).get("do_remote_decode")]
        if len(held) == len(self.waiting) and not self.running:
            held = held[1:]
            self.pin_stats.gate_overridden += 1
        if held:
            self.waiting.remove_requests(held)
        return held

    def _still_to_allocate(self) -> dict[str, int]:
        """Per program, the tokens its turns have still to take blocks for: a running turn's
        prompt not yet computed (chunked prefill allocates chunk by chunk), a waiting turn's
        prompt beyond what its program's pin (or its own preempted progress) holds."""
        ahead: dict[str, int] = {}
        for r in self.running:
            left = r.num_prompt_tokens - r.num_computed_tokens
            if left > 0 and r.session_id is not None:
                ahead[r.session_id] = ahead.get(r.session_id, 0) + left
        for r in self.waiting:
            if r.session_id is None:
                continue
            pin = self.pins.get(r.session_id)
            held = max(pin.tokens if pin is not None else 0, r.num_computed_tokens)
            ahead[r.session_id] = (ahead.get(r.session_id, 0)
                                   + max(0, r.num_prompt_tokens - held))
        return ahead

    def _set_token_budget(self) -> None:
        """The policy's batch token limit for this step, clamped to what the model runner was
        sized for (vLLM reads `max_num_scheduled_tokens` afresh in every `schedule()`)."""
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        budget = self.agent_policy.token_budget(free, self._pinned_blocks)
        self.max_num_scheduled_tokens = max(1, min(int(budget), self._configured_token_budget))

    def _share_prefill_step(self) -> None:
        """vLLM's long-prefill cap (`long_prefill_token_threshold`, which its `schedule()`
        reads afresh each step) as the policy sets it for this step, asked only while a turn
        is in its prefill and another waits to start (admitted, not held back) or is in its
        prefill too; otherwise no cap."""
        computing = [r.num_prompt_tokens - r.num_computed_tokens for r in self.running
                     if r.num_computed_tokens < r.num_prompt_tokens]
        share = 0
        if computing and (self.waiting or len(computing) > 1):
            share = self.agent_policy.prefill_share(
                self.max_num_scheduled_tokens, computing, [self.view(r) for r in self.waiting])
        self.scheduler_config.long_prefill_token_threshold = share

    def finish_requests(self, request_ids: Any, finished_status: RequestStatus) -> list[Request]:
        """vLLM's finish from outside the scheduler (a client that went away aborts its
        request); the policy hears of each aborted turn (`Policy.on_aborted`), so a program
        scheduler does not keep a slot for a turn that will never run."""
        finished = super().finish_requests(request_ids, finished_status)
        if finished_status == RequestStatus.FINISHED_ABORTED and finished:
            now = clock().now()
            for request in finished:
                if request.session_id is not None and not request.request_id.startswith(
                        PREFETCH_PREFIX):
                    self.agent_policy.on_aborted(self.view(request), now)
        return finished

    # -- retention ---------------------------------------------------------------------
    def _free_request_blocks(self, request: Request) -> None:
        program = request.session_id
        if self._prefetch is not None and self._prefetch_left(request):
            return
        if (
            program is not None
            and request.status in _NORMAL_FINISH
            and self._request_blocks_can_be_freed(request)
            and self.agent_policy.on_finish(self.view(request), now := clock().now())
        ):
            self._pin(request, now)
            return
        super()._free_request_blocks(request)

    def _unpin(self, program_id: str, reason: UnpinReason, now: float) -> None:
        if program_id not in self.pins:
            return
        self.account_pins(now)
        pin = self.pins.pop(program_id)
        self._pinned_blocks -= len(pin.blocks)
        self.kv_cache_manager.block_pool.free_blocks(reversed(pin.blocks))
        # each reason is a counter (`test_policy_scheduler` checks that every one is)
        setattr(self.pin_stats, reason, getattr(self.pin_stats, reason) + 1)
        self.agent_policy.on_unpin(program_id, reason, now)

    def _expire_pins(self, now: float) -> None:
        waiting_programs = {r.session_id for r in self.waiting}
        waiting_programs.update(r.session_id for r in self.kv_holding_waiting)
        for program_id in list(self.pins):
            if self.agent_policy.pin_expired(program_id, now, program_id in waiting_programs):
                self._unpin(program_id, "expired", now)

    def _allocate_or_unpin(self, request: Request, *args: Any, **kwargs: Any):
        """Allocation that gives up pins before it gives up: a pin never blocks admission.
        A prefetch, being speculative, takes only free memory."""
        if self._prefetch is not None and self._prefetch.is_prefetch(request.request_id):
            return self._allocate_slots(request, *args, **kwargs)
        while True:
            blocks = self._allocate_slots(request, *args, **kwargs)
            if blocks is not None or not self.pins:
                return blocks
            others_running = any(r is not request for r in self.running)
            if not self.agent_policy.unpin_under_pressure(others_running):
                return None  # vLLM preempts a running request (`running_key` order) or waits
            own = request.session_id
            others = [p for p in self.pins if p != own]
            victim = self.agent_policy.pin_victim(others) if others else own
            self._unpin(victim, "pressure", clock().now())

    def release_all_pins(self, reason: UnpinReason) -> None:
        now = clock().now()
        for program_id in list(self.pins):
            self._unpin(program_id, reason, now)

    def account_pins(self, now: float) -> None:
        """Bring `pin_stats.block_seconds` (pinned blocks integrated over time) up to `now`."""
        stats = self.pin_stats
        if stats._last_t is not None:
            stats.block_seconds += (now - stats._last_t) * self._pinned_blocks
        stats._last_t = now

    def _pin(self, request: Request, now: float) -> None:
        """Keep `request`'s blocks resident for its program (the pin replaces an older one)."""
        program = request.session_id
        if program in self.pins:
            self._unpin(program, "replaced", now)
        blocks = self.kv_cache_manager.pop_blocks_for_free(request)
        self.account_pins(now)
        self.pins[program] = Pin(program, request.request_id, blocks,
                                 request.num_computed_tokens, now)
        self._pinned_blocks += len(blocks)
        self.pin_stats.pinned += 1

    # -- prefetch (see `server.prefetch`) ------------------------------------------------
    def _start_prefetches(self, now: float) -> None:
        book = self._prefetch
        assert book is not None
        for program in self.agent_policy.prefetch_due(now):
            if program in self.pins:
                continue  # still resident
            request = book.make(program, now)
            if request is not None:
                Scheduler.add_request(self, request)  # not a turn: the policy is not told
                self.pin_stats.prefetched += 1

    def _prefetches_last(self) -> None:
        """Prefetches wait behind every turn, so one that does not fit never holds up a turn
        (vLLM stops admitting at the first waiting request it cannot place)."""
        if not isinstance(self.waiting, FCFSRequestQueue):
            return
        book = self._prefetch
        assert book is not None
        ordered = sorted(self.waiting, key=lambda r: book.is_prefetch(r.request_id))  # stable
        self.waiting.clear()
        self.waiting.extend(ordered)

    def _turn_arrived(self, program: str | None) -> None:
        """A program's turn arrived: its remembered context is stale, and a prefetch that has
        not started yet is dropped (the turn computes the same prefix itself)."""
        book = self._prefetch
        assert book is not None
        book.forget(program)
        request_id = book.request_of(program)
        request = self.requests.get(request_id) if request_id is not None else None
        if request is not None and request.status == RequestStatus.WAITING:
            self.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
            self.pin_stats.prefetch_dropped += 1

    def _prefetch_left(self, request: Request) -> bool:
        """Bookkeeping for a request leaving the engine; True when it was a prefetch whose
        blocks are now dealt with (pinned for its program, or freed)."""
        book = self._prefetch
        assert book is not None
        normal = request.status in _NORMAL_FINISH
        if not book.is_prefetch(request.request_id):
            if normal and request.session_id is not None and not self.view(request).hints.last:
                book.remember(request)
            return False
        if not request.is_finished():  # preempted: back to the queue, blocks freed as usual
            super()._free_request_blocks(request)
            return True
        program = book.finished(request.request_id)
        now = clock().now()
        if (normal and program is not None and self._request_blocks_can_be_freed(request)
                and self.agent_policy.on_prefetched(program, request.num_computed_tokens, now)):
            self._pin(request, now)
            return True
        super()._free_request_blocks(request)
        return True

    # -- KV offloading ------------------------------------------------------------------
    def _gate_offload_reloads(self) -> None:
        """Put the policy's `reload_from_cpu` in front of the KV connector's prefix lookup.

        vLLM asks `connector.get_num_new_matched_tokens` (inline in `schedule()`, no scheduler
        hook) how many tokens past the GPU prefix-cache hit it can load; with native offloading
        that is the host-memory copy. Wrapping the connector's method keeps vLLM's admission
        code untouched, as `_allocate_or_unpin` does for allocation. Only the tier's connector
        is gated: stacked beside NIXL's (`server.kv_connectors`), a read from another replica
        is not a reload the policy weighs."""
        connector = sub_connector(self.connector, OFFLOADING)
        if connector is None:
            return
        self._connector_lookup = connector.get_num_new_matched_tokens
        connector.get_num_new_matched_tokens = self._lookup_offloaded  # type: ignore[method-assign]

    def _lookup_offloaded(self, request: Request,
                          num_computed_tokens: int) -> tuple[int | None, bool]:
        """The connector's answer, unless the policy declines a hit: then 0 tokens and no load,
        so the request recomputes. The connector's own lookup always runs (it keeps per-request
        state for the step), and "not known yet" (None) passes through unchanged."""
        tokens, load_async = self._connector_lookup(request, num_computed_tokens)
        if not tokens or self.agent_policy.reload_from_cpu(self.view(request)):
            return tokens, load_async
        return 0, False

    # -- lifecycle ---------------------------------------------------------------------
    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        self.release_all_pins("reset")
        return super().reset_prefix_cache(*args, **kwargs)

    def shutdown(self) -> None:
        self.release_all_pins("shutdown")
        if self._events is not None:
            self._events.close()
            self._events = None
        if self._status is not None:
            self._status.remove()
            self._status = None
        super().shutdown()


def policy_cost_model(settings: ServeSettings) -> Profile:
    """The emulator's performance model stands in as the cost model (its copy model too, so
    a policy prices a reload as the emulated offload worker times it); a real GPU run with a
    measured table passes that table as the profile.

    A profile that does not load stops the engine at start-up, naming it: every served or
    in-process engine names one (`ServeSettings.profile`, `harness serve`'s default when none
    is given), so a failure here is a mistyped name or a broken table, and going on without
    costs would silently weaken the policies that price swaps, reloads and prefills."""
    try:
        return load_profile(settings.profile, offload_copy_model=settings.offload_copy_model)
    except ValueError as exc:
        raise ServeOptionsError(
            f"profile {settings.profile!r} (the policies' cost model, offload copy model "
            f"{settings.offload_copy_model!r}) cannot be loaded: {exc}") from None
