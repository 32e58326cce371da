"""The real vLLM engine core in this process, on the emulated GPU and a virtual clock.

Why: comparing policies needs thousands of agent programs replayed exactly and repeatably, in
minutes, on a laptop. Here vLLM's `EngineCore` (scheduler = `PolicyScheduler`, KV-cache
manager, prefix cache, output handling) runs without its API server and without sleeping: each
emulated GPU step advances a `VirtualClock` by its modelled duration. A discrete-event driver
(`advance_to`, `step`) interleaves request arrivals and tool returns with engine steps; the
trace-replay benchmark builds on it. Same scheduler, same policies, same step-time model as the
served engine: only the clock differs.

Prefill/decode disaggregation: an `EngineSpec(kv_transfer=cluster.pd.kv_transfer_config(...,
fabric="inproc:NAME"))` runs vLLM's `NixlConnector`; engines of one namespace find each other
in-process (`server.emulated.nixl_fabric`) and each call into an engine installs its own clock as
the process clock, so several engines can live side by side (see `docs/pd.md`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from server.clock import VirtualClock, use_clock
from server.engine_spec import EngineSpec
from server.kv_connectors import NIXL, has_disk_tier, offload_options, stacked, sub_connector
from server.perf.copy_model import check_offload_copy_model
from server.policies import AgentEvent
from server.policies.oracle import TurnFuture
from server.policies.spec import PolicySpec
from server.settings import emulated_model_dir

_ENV_DEFAULTS = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

_F = TypeVar("_F", bound=Callable[..., Any])


def _on_own_clock(method: _F) -> _F:
    """Run a `VirtualEngine` method with the engine's clock as the process clock
    (`server.clock` is process-global; several engines may share the process)."""

    @functools.wraps(method)
    def wrapper(self: VirtualEngine, *args: Any, **kwargs: Any) -> Any:
        previous = use_clock(self.clock)
        try:
            return method(self, *args, **kwargs)
        finally:
            use_clock(previous)

    return wrapper  # type: ignore[return-value]


class ContextTooLong(ValueError):
    """A request that can never fit the engine's context (vLLM's API server answers 400)."""


class NoProgress(RuntimeError):
    """Work is pending but the engine's steps stopped changing anything: a replay would loop
    forever with the clock standing still (or idling without end)."""


#: consecutive steps that compute no token while requests wait, before `NoProgress`: far more
#: than any legitimate wait (a KV load or a peer's transfer ends within a few idle steps)
NO_PROGRESS_STEPS = 10_000
#: P/D: the longest an idle jump (`wait_for_peers`) moves the clock, so a queued request's
#: heartbeats (every `kv_lease_duration // 6`, 5 s by default) still go out on time
PEER_WAIT_MAX_S = 1.0


@dataclass
class Finished:
    request_id: str
    program_id: str | None
    arrival: float
    first_token: float | None
    finished: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    finish_reason: str
    token_ids: list[int] = field(default_factory=list)  # what the emulated model answered
    external_tokens: int = 0  # of cached_tokens, those loaded from host memory or a peer
    #: P/D: what the connector returned (a prefill replica's blocks for the decode replica, or
    #: with bidirectional transfer a decode replica's export); None without P/D
    kv_transfer_params: dict[str, Any] | None = None
    #: the engine-time gap before each output token after the first: a turn's worst token
    #: gaps (a prefill chunk sharing its step) that its mean inter-token latency averages away
    token_gaps: list[float] = field(default_factory=list)


@dataclass
class Pending:
    """A request in flight: what `Finished` will say about it (both in-process engines,
    the emulated and the CPU one, keep these)."""

    arrival: float
    program_id: str | None
    prompt_tokens: int
    first_token: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    external_tokens: int = 0
    last_token: float | None = None  # when the latest output token came
    token_gaps: list[float] = field(default_factory=list)  # see `Finished.token_gaps`


def collect_finished(outputs: Any, pending: dict[str, Pending], now: float) -> list[Finished]:
    """Fold one `EngineCore.step()`'s outputs into `pending` (first token at `now`, token
    counts and ids, cached tokens) and take out the requests that finished, in order."""
    done: list[Finished] = []
    for client_outputs in outputs.values():
        for out in client_outputs.outputs:
            state = pending.get(out.request_id)
            if state is None:
                continue
            if out.new_token_ids:
                if state.first_token is None:
                    state.first_token = now
                elif state.last_token is not None:
                    state.token_gaps.append(now - state.last_token)
                state.last_token = now
            state.output_tokens += len(out.new_token_ids)
            state.token_ids.extend(out.new_token_ids)
            if out.prefill_stats is not None:
                state.cached_tokens = out.prefill_stats.num_cached_tokens
                state.external_tokens = out.prefill_stats.num_external_cached_tokens
            if out.finish_reason is not None:
                del pending[out.request_id]
                done.append(Finished(out.request_id, state.program_id, state.arrival,
                                     state.first_token, now, state.prompt_tokens,
                                     state.output_tokens, state.cached_tokens,
                                     str(out.finish_reason), state.token_ids,
                                     state.external_tokens,
                                     _copy_config(out.kv_transfer_params),
                                     state.token_gaps))
    return done


def submit(core: Any, pending: dict[str, Pending], request_id: str,
           prompt_token_ids: list[int], params: Any, program_id: str | None, now: float) -> None:
    """Hand a request to `core` (vLLM's `EngineCore`) as its API server would, arriving
    `now`, and start its `Pending` record (both in-process engines)."""
    from vllm.v1.engine import EngineCoreRequest  # vLLM: start-up cost

    request = EngineCoreRequest(
        request_id=request_id, prompt_token_ids=list(prompt_token_ids), mm_features=None,
        sampling_params=params, pooling_params=None, arrival_time=now, lora_request=None,
        cache_salt=None, data_parallel_rank=None, session_id=program_id)
    req, wave = core.preprocess_add_request(request)
    core.add_request(req, wave)
    pending[request_id] = Pending(now, program_id, len(prompt_token_ids))


@dataclass
class VirtualEngine:
    """`EngineCore` + `EmulatedExecutor` + `PolicyScheduler` on a virtual clock: `policy` on
    the engine `spec` says (its `profile` emulated; its `max_model_len` None: the model's
    context, 131,072 for Llama-3.1, as `vllm serve`, which vLLM lowers to what the KV cache
    holds when `num_gpu_blocks` is small).

    KV offloading: host memory for vLLM's native offloading as `EngineSpec.offload_tier` says
    (a policy that needs it, or ``NAME+offload``, gets `server.settings.DEFAULT_OFFLOAD_GIB`
    when `offload_gib` is None, as `harness serve` gives it; other policies run without
    unless it is given); `offload_gib` is what the engine got.

    `spec.kv_transfer`: a P/D replica's KV-transfer config (`cluster.pd.kv_transfer_config`,
    with an `inproc:NAME` fabric): vLLM's `NixlConnector` with its worker side emulated. Give a
    request `kv_transfer_params` (`cluster.pd.prefill_params` / `decode_params`); what the
    connector returns comes back in `Finished.kv_transfer_params`. With a CPU tier too, the
    engine runs both connectors in vLLM's `MultiConnector` (`server.kv_connectors`).

    Every public method runs with the engine's own clock installed as the process clock and
    restores the previous one (the constructor leaves the engine's clock installed, as before,
    until `close`).
    """

    policy: PolicySpec
    spec: EngineSpec = EngineSpec()
    clock: VirtualClock = field(default_factory=VirtualClock)
    #: program id -> its turns' future (`server.policies.oracle.TurnFuture`), for a
    #: clairvoyant policy (`oracle`) only; a policy that is not clairvoyant never sees it
    future: Mapping[str, Sequence[TurnFuture]] | None = None

    def __post_init__(self) -> None:
        spec = self.spec
        check_offload_copy_model(spec.offload_copy_model)
        # vLLM picks its platform and the hub its mode from the environment when imported:
        # defaults only, for a process that has not chosen (no setting of ours goes here)
        for key, value in _ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        # events come in through `event()`
        settings = spec.serve_settings(self.policy, events=False)
        self._previous_clock = use_clock(self.clock)

        # vLLM (and torch, through the emulated executor): start-up cost
        from vllm.config import KVTransferConfig

        # vLLM: start-up cost (~3 s); importing this module must not load it (the planner forks
        # its workers before any engine exists, and `harness --help` never builds one)
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.core import EngineCore

        from server.emulated.executor import EmulatedExecutor

        #: GiB of host memory for vLLM's KV offloading, or None (`EngineSpec.offload_tier`)
        self.offload_gib = spec.offload_tier(self.policy)
        disk = spec.disk_tier(self.policy)  # behind the CPU tier (`EngineSpec.disk_tier`)
        kv_transfer = spec.kv_transfer
        connector = None  # our connector options; vLLM names the connector itself
        tier_gib = self.offload_gib  # vLLM's own option, unless the tier is stacked with NIXL
        if kv_transfer is not None and self.offload_gib is not None:
            # a P/D replica, or one whose router carries moved programs' KV, with a CPU tier:
            # both connectors in vLLM's MultiConnector (`server.kv_connectors`)
            connector = KVTransferConfig(**stacked(_copy_config(dict(kv_transfer)),
                                                   self.offload_gib, disk))
            tier_gib = None
        elif kv_transfer is not None:
            connector = KVTransferConfig(**_copy_config(dict(kv_transfer)))
        elif self.offload_gib is not None:
            connector = KVTransferConfig(kv_connector_extra_config=offload_options(disk))
        batch_tokens, batch_seqs = spec.emulated_batch_limits()
        args = EngineArgs(model=str(emulated_model_dir(spec.profile_name)), seed=spec.seed,
                          max_model_len=spec.max_model_len,
                          enable_prefix_caching=spec.enable_prefix_caching,
                          block_size=16, scheduler_cls="server.scheduler.PolicyScheduler",
                          distributed_executor_backend=EmulatedExecutor,
                          num_gpu_blocks_override=spec.num_gpu_blocks,
                          max_num_batched_tokens=batch_tokens, max_num_seqs=batch_seqs,
                          long_prefill_token_threshold=spec.long_prefill_token_threshold or 0,
                          kv_offloading_size=tier_gib,
                          kv_offloading_backend="native", kv_transfer_config=connector,
                          additional_config=settings.to_additional_config())
        self.vllm_config = args.create_engine_config()
        # no stats loggers here: with log_stats vLLM builds per-step scheduler statistics nobody
        # reads (it decides the same; summary.json and runs/ are identical either way)
        self.core = EngineCore(self.vllm_config, EmulatedExecutor, log_stats=False)
        self.scheduler = self.core.scheduler
        self._pending: dict[str, Pending] = {}
        self._idle_steps = 0  # consecutive steps computing nothing while requests wait
        self._idle_since = 0.0  # the clock when the first of them began
        self._idle_at = 0.0  # the clock at the latest of them
        self._still_steps = 0  # of them, those in a row at which the clock stood still
        self.nixl = getattr(self.core.model_executor, "_nixl", None)  # P/D worker side, or None
        #: a disk tier: a turn may wait seconds for its blocks to be read (`_check_progress`)
        self._disk = has_disk_tier(self.vllm_config.kv_transfer_config)
        #: the NIXL connector's scheduler side (alone or in the stack), found once: `has_work`
        #: reads its queues at every step
        self._nixl_scheduler = getattr(sub_connector(self.scheduler.connector, NIXL),
                                       "connector_scheduler", None)
        policy = self.scheduler.agent_policy
        if policy.clairvoyant:
            if self.future is None:
                raise ValueError(f"policy {self.policy.engine_name!r} schedules with every "
                                 "program's future: build its engine with the trace (`future`)")
            policy.foresee(self.future)
        if self.nixl is not None:
            self.nixl.set_wake(self._wake)
            self._peer_stall_s = self._peer_stall_limit()

    # -- inputs ------------------------------------------------------------------------
    @_on_own_clock
    def add_request(self, request_id: str, prompt_token_ids: list[int], *,
                    program_id: str | None = None, max_tokens: int = 256,
                    output_tokens: int | None = None,
                    kv_transfer_params: dict[str, Any] | None = None, **hints: Any) -> None:
        """Queue a turn now. `output_tokens` makes the emulated model answer exactly that many
        tokens (ending in EOS); hints are the `vllm_xargs` a client would send;
        `kv_transfer_params` go to the P/D connector (copied: the connector edits them)."""
        from vllm.sampling_params import SamplingParams  # vLLM: start-up cost

        extra = {k: v for k, v in hints.items() if v is not None}
        needed = len(prompt_token_ids) + int(output_tokens if output_tokens is not None else 1)
        if needed > self.context_limit:
            raise ContextTooLong(
                f"request {request_id}: {needed:,} tokens ({len(prompt_token_ids):,} prompt + "
                f"{needed - len(prompt_token_ids):,} output) exceed max_model_len "
                f"{self.context_limit:,}")
        if output_tokens is not None:
            extra["emulate_output_tokens"] = int(output_tokens)
            max_tokens = max(max_tokens, int(output_tokens))
        if kv_transfer_params is not None:
            if self.nixl is None:
                raise ValueError(f"request {request_id}: kv_transfer_params need a P/D engine "
                                 "(EngineSpec(kv_transfer=cluster.pd.kv_transfer_config(...)))")
            extra["kv_transfer_params"] = _copy_config(kv_transfer_params)
        params = SamplingParams(max_tokens=max_tokens, extra_args=extra or None)
        params.update_from_generation_config({}, eos_token_id=self._eos())
        submit(self.core, self._pending, request_id, prompt_token_ids, params, program_id,
               self.clock.now())

    @_on_own_clock
    def event(self, kind: str, program_id: str, **fields: Any) -> None:
        """An interception event, delivered as the server's side channel would."""
        event = AgentEvent(kind=kind, program_id=program_id, **fields)  # type: ignore[arg-type]
        self.scheduler.handle_event(event, self.clock.now())

    @property
    def context_limit(self) -> int:
        """The longest conversation (prompt + output) a request may have here."""
        return int(self.vllm_config.model_config.max_model_len)

    # -- time --------------------------------------------------------------------------
    def has_work(self) -> bool:
        """Whether the engine must step. A P/D engine whose only business is blocks held for a
        peer (a lease or an export nobody has read yet) is idle: a peer's notification wakes
        it (`_wake`), and `advance_to` steps it at a lease's end on the way."""
        if self.nixl is None:
            return bool(self.scheduler.has_requests())
        scheduler = self.scheduler
        if scheduler.get_num_unfinished_requests() > 0 or scheduler.finished_req_ids:
            return True
        return self.nixl.busy() or self._connector_bookkeeping()

    def _connector_bookkeeping(self) -> bool:
        """P/D: whether the connector's scheduler side has something for the next step to ship
        to the worker (requests to read, send or account for)."""
        pending = self._nixl_scheduler
        return bool(pending is not None and (
            pending._reqs_need_recv or pending._reqs_need_send or pending._reqs_in_batch
            or pending._reqs_not_processed))

    def next_wakeup(self) -> float | None:
        """P/D: when a held lease or export ends if nobody reads it (None: none held). A loop
        that wants blocks freed on time steps the engine then; `advance_to` does it anyway."""
        return None if self.nixl is None else self.nixl.next_deadline()

    def in_flight(self, request_id: str) -> Pending | None:
        """What the engine has recorded so far of a request not yet finished (its first token,
        its token gaps), or None: a replay feeds a router's latency windows from it as tokens
        come, not when the turn ends."""
        return self._pending.get(request_id)

    def held_blocks(self) -> int:
        """KV blocks in use: allocated to requests, including those held for a peer."""
        pool = self.scheduler.kv_cache_manager.block_pool
        return int(pool.num_gpu_blocks - 1 - pool.get_num_free_blocks())

    def kv_transfer_stats(self) -> tuple[int, float]:
        """P/D: bytes this engine pulled from its peers, and the seconds those reads took."""
        if self.nixl is None:
            return 0, 0.0
        return int(self.nixl.bytes_in), float(self.nixl.seconds_in)

    def tier_traffic(self) -> dict[str, Any]:
        """What moved to and from each KV tier so far (`server.emulated.offload.TierTraffic`):
        ``host`` with a CPU tier, ``disk`` with a disk tier behind it; empty without tiers."""
        return self.core.model_executor.tier_traffic()

    @_on_own_clock
    def release_export(self, params: dict[str, Any] | None) -> None:
        """P/D: nobody will read the blocks this engine returned in `params` (e.g. a program's
        last turn under bidirectional transfer): free them at the next step, not at the
        lease's end. The served equivalent is `cluster.pd.release_export`."""
        if self.nixl is None or not params or params.get("remote_request_id") is None:
            return
        self.nixl.release([str(params["remote_request_id"])])

    def _wake(self, t: float) -> None:
        """A peer's notification is on its way: an idle engine's clock catches up to `t`."""
        if not self.has_work():
            self.clock.advance_to(t)

    @_on_own_clock
    def step(self) -> list[Finished]:
        """One engine step (the clock advances by the modelled step time)."""
        outputs, _ = self.core.step()
        done = collect_finished(outputs, self._pending, self.clock.now())
        self._check_progress(outputs, done)
        return done

    def _check_progress(self, outputs: dict[Any, Any], done: list[Finished]) -> None:
        """Raise `NoProgress` when steps that computed no token and finished nothing while
        requests were unfinished go on: `NO_PROGRESS_STEPS` in a row, or, for a P/D engine
        whose clock moves while it waits, for longer than a peer can hold blocks it needs
        (`_peer_stall_limit`): a P/D engine may wait for minutes for a peer to read what it
        holds, or to work through the prefills that read it, and vLLM would wait with it. An
        engine with a disk tier counts only steps at which its clock stood still: a turn may
        wait seconds (thousands of idle steps) for its blocks to be read from disk."""
        scheduler = self.scheduler
        if scheduler.last_scheduled_tokens or done:  # the usual case, decided cheaply
            self._idle_steps = 0
            return
        computed = any(out.new_token_ids for client in outputs.values()
                       for out in client.outputs)
        if computed or not scheduler.get_num_unfinished_requests():
            self._idle_steps = 0
            return
        now = self.clock.now()
        if self._idle_steps == 0:
            self._idle_since = self._idle_at = now
            self._still_steps = 0
        self._idle_steps += 1
        self._still_steps = self._still_steps + 1 if now <= self._idle_at else 0
        self._idle_at = now
        if self.nixl is None and not self._disk:
            stalled = self._idle_steps >= NO_PROGRESS_STEPS
        elif self.nixl is None:  # a disk read moves the clock: a stall is a clock standing still
            stalled = self._still_steps >= NO_PROGRESS_STEPS
        else:  # waiting for peers is no stall until it outlasts what they may hold
            stalled = (self._still_steps >= NO_PROGRESS_STEPS
                       or now - self._idle_since > self._peer_stall_s)
        if not stalled:
            return
        pool = self.scheduler.kv_cache_manager.block_pool
        def listed(requests: Any) -> str:
            shown = [f"{r.request_id} ({r.num_tokens:,} tokens, {r.num_computed_tokens:,} "
                     f"computed)" for r in list(requests)[:5]]
            return ", ".join(shown) or "none"

        raise NoProgress(
            f"{self._idle_steps:,} engine steps in a row computed nothing (for "
            f"{now - self._idle_since:,.1f} s) at t="
            f"{now:.3f} s with {self.scheduler.get_num_unfinished_requests()} "
            f"request(s) unfinished; waiting: {listed(self.scheduler.waiting)}; running: "
            f"{listed(self.scheduler.running)}; free KV blocks {pool.get_num_free_blocks():,} "
            f"of {pool.num_gpu_blocks - 1:,}; max_model_len "
            f"{self.vllm_config.model_config.max_model_len:,}; pinned "
            f"programs {len(self.scheduler.pins)}")

    def _peer_stall_limit(self) -> float:
        """How long a P/D engine may wait on its peers before its wait is no peer's doing: the
        longest anything is held for a reader (a decode replica's export,
        `decoder_kv_blocks_ttl`, under bidirectional transfer) plus two leases (a prefill's
        blocks held while the decode replica queues it, and the read that follows), as vLLM's
        connector resolved them. Past that every block held for or by this engine's requests
        has been read or released."""
        connector = self._nixl_scheduler
        ttl = (connector.decoder_kv_blocks_ttl
               if connector.is_bidirectional_kv_xfer_enabled else 0)
        return float(ttl + 2 * connector._kv_lease_duration)

    def waits_for_peers(self) -> bool:
        """P/D: the engine has work, yet its latest step computed nothing and it awaits nothing
        of its own (no read in flight, no note to take, no finished read or request for the
        next step to act on, no connector bookkeeping to ship, no pin that could expire): it
        changes only when a peer's note, a new request or one of its own deadlines
        (`next_wakeup`) arrives. (An engine without work is not stepped; an arrival moves its
        clock.)"""
        scheduler = self.scheduler
        return bool(self.nixl is not None and not scheduler.last_scheduled_tokens
                    and self.has_work() and not self.nixl.busy() and not scheduler.pins
                    and not scheduler.finished_recving_kv_req_ids
                    and not scheduler.failed_recving_kv_req_ids
                    and not scheduler.finished_req_ids and not self._connector_bookkeeping())

    def wait_for_peers(self, reaches: Callable[[], float]) -> bool:
        """If `waits_for_peers`, move the clock to `reaches()`, when a loop knows something
        may next reach the engine (at most `PEER_WAIT_MAX_S` on, and not past its next
        deadline) instead of polling every millisecond: the same steps, without thousands of
        empty ones between them. Whether it waited (`reaches` is asked only then)."""
        if not self.waits_for_peers():
            return False
        now = self.clock.now()
        until = min(reaches(), now + PEER_WAIT_MAX_S)
        deadline = self.nixl.next_deadline()
        if deadline is not None:
            until = min(until, deadline)
        if until > now:
            self.clock.advance_to(until)
        return True

    def advance_to(self, t: float) -> None:
        """Idle until `t` (an arrival or a tool return); the engine's pins may expire meanwhile.
        P/D: leases that end on the way are reaped at their deadline (one idle step each)."""
        while not self.has_work():
            deadline = self.next_wakeup()
            if deadline is None or deadline > t:
                break
            self.clock.advance_to(deadline)
            self.step()
        self.clock.advance_to(t)

    def close(self) -> None:
        use_clock(self.clock)
        self.scheduler.release_all_pins("shutdown")
        self.core.shutdown()
        use_clock(self._previous_clock)

    def _eos(self) -> int:
        eos = self.vllm_config.model_config.hf_config.eos_token_id
        return int(eos[0] if isinstance(eos, list) else eos)


def _copy_config(value: Any) -> Any:
    """A deep copy of JSON-like data (dicts, lists, tuples, scalars)."""
    if isinstance(value, dict):
        return {k: _copy_config(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copy_config(v) for v in value)
    return value
