"""Replay a trace on a cluster of in-process engines on virtual clocks (one discrete-event loop).

Why: routing and disaggregation policies are compared on thousands of programs, exactly and
repeatably, on a laptop, as single-engine policies are (`sim.replay`). Each replica is a
`server.engine.VirtualEngine` (the real vLLM `EngineCore`, our scheduler, the emulated GPU) with
its own `VirtualClock`; the router is the same `cluster.routing` object the served cluster uses.

The loop (conservative discrete-event simulation):

* The next thing to happen is either the earliest agenda item (a program arrives, a tool
  returns, a prefill replica hands a finished prefill to its decode replica) or a step of the
  busy engine whose clock is earliest; agenda items at or before that clock go first. Ties
  between engines go to the one listed first in the cluster file. So the same trace, cluster
  and seed give the same numbers.
* An item delivered to an idle engine moves that engine's clock up to the item's time; one
  delivered to a busy engine waits for the step in flight, as a request reaching a busy server
  does; latencies are measured from the item's intended time.
* Only one engine runs at a time, so the process-wide clock (`server.clock`) is switched to the
  engine's own before every call into it.

P/D: a remote turn is first sent to its prefill replica with `max_tokens=1` and vLLM's
`kv_transfer_params={"do_remote_decode": True}`; when it finishes there, the decode replica
gets the same prompt with the parameters the prefill replica returned, pulls the blocks its
prefix cache lacks over the link (`server.emulated_nixl`), and decodes. With P/D engines built
`bidirectional` (`cluster.pd`), the decode replica exports each finished turn and the
program's next remote prefill carries that export, so the prefill replica reads the history its
prefix cache lacks from the decode replica instead of recomputing it (AMPD's remote path: a
turn prefilled locally leaves the prefill replica behind).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cluster.config import ClusterConfig, ReplicaSpec, parse_cluster
from cluster.pd import decode_params, prefill_params
from cluster.placement import Placement
from cluster.routers import make_router
from cluster.routing import ReplicaLoad, Route, Router, TurnInfo
from common.trace import Trace
from server.clock import clock, use_clock
from server.engine import ContextTooLong
from sim.client import ClientPredictions, turn_hints
from sim.conversation import ProgramState, too_long_turns
from sim.engines import make_engine as engine_for
from sim.records import ProgramRecord, ReplayResult, TurnRecord

PIN_COUNTERS = ("pinned", "handoff", "expired", "program_end", "pressure", "reset", "replaced",
                "shutdown", "block_seconds", "prefetched", "prefetch_dropped")


@dataclass
class ReplicaStats:
    """What one replica did in a replay (summed over its engine steps)."""

    name: str
    role: str
    engine_steps: int = 0
    busy_s: float = 0.0  # clock time spent in steps that computed something or waited on KV
    turns_decoded: int = 0
    prefills: int = 0  # turns whose prompt this replica computed (local or for a decode replica)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    kv_bytes_in: int = 0  # KV pulled from other replicas
    kv_seconds_in: float = 0.0


class Replica:
    """One engine of the cluster and the router's view of it."""

    def __init__(self, spec: ReplicaSpec, engine: Any) -> None:
        self.spec = spec
        self.name = spec.name
        self.engine = engine
        self.stats = ReplicaStats(spec.name, spec.role)

    @contextmanager
    def active(self):
        """The engine's clock is the process clock while we call into it."""
        previous = use_clock(self.engine.clock)
        try:
            yield self.engine
        finally:
            use_clock(previous)

    def now(self) -> float:
        return self.engine.clock.now()

    def has_work(self) -> bool:
        return self.engine.has_work()

    def load(self) -> ReplicaLoad:
        scheduler = self.engine.scheduler
        pool = scheduler.kv_cache_manager.block_pool
        usage = 1.0 - pool.get_num_free_blocks() / max(1, pool.num_gpu_blocks)
        queued = sum(max(0, r.num_prompt_tokens - r.num_computed_tokens)
                     for queue in (scheduler.waiting, scheduler.running) for r in queue)
        return ReplicaLoad(self.name, self.spec.role, kv_usage=usage,
                           running=len(scheduler.running), waiting=len(scheduler.waiting),
                           queued_prefill_tokens=queued)


class VirtualCluster:
    """The replicas of a cluster file as in-process engines (see the module docstring).

    `make_engine(spec)` builds one replica's `VirtualEngine`; by default `sim.engines.make_engine`,
    so every engine option stays in one place.
    """

    def __init__(self, config: ClusterConfig, *, seed: int = 0,
                 make_engine: Callable[[ReplicaSpec], Any] | None = None,
                 router: Router | None = None) -> None:
        self.config = config
        self.router = router or make_router(config.router, config)
        self._owns_engines = True
        self._outer_clock = clock()
        if make_engine is None:
            def make_engine(spec: ReplicaSpec) -> Any:
                return engine_for(spec.policy, spec.profile, seed, spec.num_gpu_blocks,
                                    spec.offload_gib, spec, config)
        build = make_engine
        self.replicas: list[Replica] = []
        try:
            for spec in config.replicas:
                self.replicas.append(Replica(spec, build(spec)))
        except BaseException:
            self.close()
            raise
        use_clock(self._outer_clock)
        self.by_name = {r.name: r for r in self.replicas}

    @classmethod
    def around(cls, engine: Any) -> VirtualCluster:
        """One engine as a cluster of one replica (left open by `close`: the caller owns it)."""
        config = parse_cluster({"replicas": [{"name": "engine", "profile": engine.profile,
                                              "policy": engine.policy}]})
        cluster = cls(config, make_engine=lambda spec: engine)
        cluster._owns_engines = False
        return cluster

    def loads(self) -> list[ReplicaLoad]:
        return [r.load() for r in self.replicas]

    def close(self) -> None:
        if not self._owns_engines:
            return
        for replica in self.replicas:
            with replica.active() as engine:
                engine.close()
        use_clock(self._outer_clock)


@dataclass
class _Turn:
    """A turn in flight: its record and where it runs."""

    record: TurnRecord
    route: Route
    replica: str  # where its current request runs (the prefill replica, then the decode one)


def replay_cluster(trace: Trace, cluster: VirtualCluster, *, progress: Any = None,
                   hints: str = "none", concurrency: int | None = None,
                   intake_s: float = 0.0, delivery_s: float = 0.0) -> ReplayResult:
    """Replay every program of `trace` on `cluster` (left open; the caller closes it).
    `progress(n_done)` is called as programs end; `hints` as in `sim.client.HINT_MODES`.
    `concurrency`: closed loop instead of the trace's arrivals: that many programs start at
    once and, in trace order, a new one starts the moment one ends (as an agent fleet with a
    fixed number of workers, or the Continuum runner's concurrent agents).

    `intake_s` and `delivery_s`: the served path, which a virtual-time replay otherwise does
    not have: a turn reaches the engine `intake_s` after the client sends it (HTTP, the API
    server, the engine's input queue), and the client has each token `delivery_s` after the
    engine made it, so its times (first token, finish, the next turn's start) are that much
    later. `harness profile --device cpu --served` measures both on an idle server; 0 (the
    default) replays as before, bit for bit."""
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if not (intake_s >= 0 and delivery_s >= 0):
        raise ValueError(f"served-path latencies must be >= 0 s, got {intake_s}, {delivery_s}")
    client = ClientPredictions(hints)
    limit = min(r.engine.context_limit for r in cluster.replicas)
    long = too_long_turns(trace, limit)
    if long:
        pid, turn, tokens = long[0]
        raise ContextTooLong(
            f"{len(long)} program(s) have a turn longer than the engines' max_model_len "
            f"{limit:,}, first {pid} turn {turn} ({tokens:,} tokens): such a turn can never "
            "run; raise max_model_len or leave those programs out (`sim.replay.too_long_turns`)")
    router = cluster.router
    start = max(r.now() for r in cluster.replicas)
    states = {p.id: ProgramState(p) for p in trace.programs}
    records = {p.id: ProgramRecord(p.id, start + p.arrival_s) for p in trace.programs}
    # (time, sequence, kind, program id, turn, payload); kind "turn": the turn is due (arrival
    # or tool return); kind "decode": its prefill finished remotely, hand it to the decoder
    queued = list(trace.programs[concurrency:]) if concurrency else []
    queued.reverse()  # popped from the end, in trace order
    if concurrency:
        for p in trace.programs:
            records[p.id].arrival = start
    agenda: list[tuple[float, int, str, str, int, Any]] = [
        (start if concurrency else start + p.arrival_s, n, "turn", p.id, 0, None)
        for n, p in enumerate(trace.programs[:concurrency] if concurrency else trace.programs)]
    heapq.heapify(agenda)
    seq = len(agenda)
    live: dict[str, _Turn] = {}  # request id -> turn, until its last request finishes
    exports: dict[str, dict[str, Any]] = {}  # program -> its decode replica's last export
    placement = Placement()  # who hears which event (`cluster.placement`)
    # what a latency-aware router (AMPD) is told: prefill latency per prefill replica, mean
    # token gap per decoded turn
    observe_ttft = getattr(router, "observe_ttft", None)
    observe_itl = getattr(router, "observe_itl", None)
    done = 0
    engine_steps = 0

    def push(t: float, kind: str, pid: str, i: int, payload: Any = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(agenda, (t, seq, kind, pid, i, payload))

    def deliver(replica: Replica, t: float) -> None:
        if not replica.has_work():
            with replica.active() as engine:
                engine.advance_to(t)

    def event(name: str | None, kind: str, pid: str, **fields: Any) -> None:
        assert name is not None, f"an event for {pid}, which has no replica"
        with cluster.by_name[name].active() as engine:
            engine.event(kind, pid, **fields)

    def submit(replica: Replica, rid: str, pid: str, i: int, *, max_one: bool,
               params: dict[str, Any] | None) -> None:
        state = states[pid]
        program = state.program
        options: dict[str, Any] = dict(turn_hints(program, i))
        if params is not None:
            options["kv_transfer_params"] = params
        output_tokens = 1 if max_one else program.turns[i].output_tokens
        with replica.active() as engine:
            engine.add_request(rid, state.tokens, program_id=pid, output_tokens=output_tokens,
                               **options)

    def start_turn(t: float, pid: str, i: int) -> None:
        state = states[pid]
        program = state.program
        history = min(state.computed, len(state.tokens)) if i > 0 else 0
        route = router.route(pid, i, cluster.loads(),
                             TurnInfo(now=t, prompt_tokens=len(state.tokens),
                                      history_tokens=history))
        decoder = cluster.by_name[route.decode]
        if i > 0:
            prev = program.turns[i - 1]
            client.observe(prev.tool, prev.tool_seconds)
            event(placement.current(pid), "tool_end", pid, tool=prev.tool,
                  seconds=prev.tool_seconds, return_tokens=prev.tool_return_tokens)
        for name in placement.route(pid, route):
            event(name, "program_start", pid)
        record = TurnRecord(pid, i, t, prompt_tokens=len(state.tokens))
        record.replica = route.decode
        record.prefill_replica = route.prefill
        records[pid].turns.append(record)
        rid = f"{pid}#{i}"
        if route.prefill is None:
            live[rid] = _Turn(record, route, route.decode)
            send(t, decoder, rid, pid, i, max_one=False, params=None)
            return
        prefiller = cluster.by_name[route.prefill]
        live[rid + "@p"] = _Turn(record, route, route.prefill)
        send(t, prefiller, rid + "@p", pid, i, max_one=True,
             params=prefill_params(exported=exports.pop(pid, None)))

    def send(t: float, replica: Replica, rid: str, pid: str, i: int, *, max_one: bool,
             params: dict[str, Any] | None) -> None:
        """The client's request reaches the engine now, or `intake_s` later."""
        if intake_s:
            push(t + intake_s, "submit", pid, i, (replica, rid, max_one, params))
            return
        deliver(replica, t)
        submit(replica, rid, pid, i, max_one=max_one, params=params)

    def start_decode(t: float, pid: str, i: int, params: dict[str, Any]) -> None:
        rid = f"{pid}#{i}"
        turn = live.pop(rid + "@p")
        turn.replica = turn.route.decode
        live[rid] = turn
        decoder = cluster.by_name[turn.route.decode]
        deliver(decoder, t)
        submit(decoder, rid, pid, i, max_one=False, params=params)

    def finish(replica: Replica, fin: Any) -> None:
        nonlocal done
        turn = live[fin.request_id]
        record = turn.record
        stats = replica.stats
        stats.prompt_tokens += fin.prompt_tokens
        stats.cached_tokens += fin.cached_tokens
        state = states[record.program_id]
        i = record.turn
        local = turn.route.prefill is None
        if local or fin.request_id.endswith("@p"):  # where the prompt was computed
            stats.prefills += 1
            record.cached_tokens = fin.cached_tokens
            if i > 0:
                record.recomputed_tokens = state.recomputed(record.prompt_tokens,
                                                            record.cached_tokens)
        if not local and fin.request_id.endswith("@p"):  # hand over to the decode replica
            if observe_ttft is not None:  # the prefill replica's latency, as AMPD watches it
                observe_ttft(replica.name, fin.finished - record.arrival, fin.finished)

            push(fin.finished, "decode", record.program_id, record.turn,
                 decode_params(fin.kv_transfer_params))
            return
        del live[fin.request_id]
        if fin.kv_transfer_params:  # a bidirectional decode replica exported this turn
            exports[record.program_id] = fin.kv_transfer_params
        stats.turns_decoded += 1
        if observe_itl is not None and fin.first_token is not None and fin.output_tokens > 1:
            observe_itl(replica.name, (fin.finished - fin.first_token) / (fin.output_tokens - 1),
                        fin.finished)
        seen = fin.finished + delivery_s  # when the client has the last token
        record.first_token = None if fin.first_token is None else fin.first_token + delivery_s
        record.finished = seen
        record.output_tokens = fin.output_tokens
        if record.admitted is None:  # engine times: the served path does not delay them
            record.admitted = fin.first_token if fin.first_token is not None else fin.finished
        program = state.program
        if i == program.n_turns - 1:
            for name in placement.end(program.id):
                event(name, "program_end", program.id)
            router.program_end(program.id)
            records[program.id].finished = seen
            if queued:  # closed loop: the freed worker starts the next program now
                following = queued.pop()
                records[following.id].arrival = seen
                push(seen, "turn", following.id, 0)
            done += 1
            if progress is not None:
                progress(done)
            return
        tool_turn = program.turns[i]
        state.extend(i, fin.token_ids)
        event(placement.current(program.id), "tool_start", program.id, tool=tool_turn.tool,
              predicted_s=client.predict(tool_turn.tool, tool_turn.tool_seconds))
        push(seen + tool_turn.tool_seconds, "turn", program.id, i + 1)

    def step(replica: Replica) -> None:
        nonlocal engine_steps
        # as `replica.active()`, without a generator's cost: this runs on every engine step
        engine = replica.engine
        previous = use_clock(engine.clock)
        try:
            step_start = engine.clock.now()
            finished = engine.step()
            now = engine.clock.now()
            requests = engine.scheduler.requests
        finally:
            use_clock(previous)
        engine_steps += 1
        stats = replica.stats
        stats.engine_steps += 1
        stats.busy_s += now - step_start
        name = replica.name
        for rid, turn in live.items():
            if turn.replica != name:
                continue
            request = requests.get(rid)
            if request is None:
                continue
            record = turn.record
            if record.admitted is None and request.num_computed_tokens > 0:
                record.admitted = step_start
            preemptions = request.num_preemptions
            if preemptions > record.preemptions:
                record.preemptions = int(preemptions)
        for fin in finished:
            turn = live.get(fin.request_id)
            if turn is not None and turn.record.admitted is None:
                turn.record.admitted = step_start
            finish(replica, fin)

    only = cluster.replicas[0] if len(cluster.replicas) == 1 else None  # one engine's fast path
    while True:
        if only is not None:
            next_step = only if only.has_work() else None
        else:
            busy = [r for r in cluster.replicas if r.has_work()]
            next_step = min(busy, key=lambda r: r.now()) if busy else None
        if agenda and (next_step is None or agenda[0][0] <= next_step.now()):
            t, _, kind, pid, i, payload = heapq.heappop(agenda)
            if kind == "turn":
                start_turn(t, pid, i)
            elif kind == "submit":
                replica, rid, max_one, params = payload
                deliver(replica, t)
                submit(replica, rid, pid, i, max_one=max_one, params=params)
            else:
                start_decode(t, pid, i, payload)
            continue
        if next_step is None:
            break
        step(next_step)

    end = max(r.now() for r in cluster.replicas)
    pin_stats = dict.fromkeys(PIN_COUNTERS, 0.0)
    sched_cpu = 0.0
    sched_steps = 0
    total_blocks = 0
    for replica in cluster.replicas:
        scheduler = replica.engine.scheduler
        scheduler.account_pins(end)
        for key in PIN_COUNTERS:
            pin_stats[key] += getattr(scheduler.pin_stats, key)
        sched_cpu += float(scheduler.sched_cpu_seconds)
        sched_steps += int(scheduler.sched_steps)
        total_blocks += int(scheduler.kv_cache_manager.block_pool.num_gpu_blocks)
        moved = getattr(replica.engine, "kv_transfer_stats", None)
        if moved is not None:
            replica.stats.kv_bytes_in, replica.stats.kv_seconds_in = moved()
    finishes = [r.finished for r in records.values() if r.finished is not None]
    first_arrival = min((r.arrival for r in records.values()), default=start)
    return ReplayResult(
        programs=records,
        makespan=(max(finishes) - first_arrival) if finishes else 0.0,
        total_blocks=total_blocks,
        pin_stats=pin_stats,
        sched_cpu_seconds=sched_cpu,
        sched_steps=sched_steps,
        engine_steps=engine_steps,
        replicas=[r.stats for r in cluster.replicas],
        router=router.name,
    )
