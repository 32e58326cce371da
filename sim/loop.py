"""Replay a trace on a cluster of in-process engines on virtual clocks: one discrete-event loop
(`Simulation`, run by `replay_cluster`) for a cluster (`sim.virtual_cluster`) as for one engine
(`sim.replay`, a cluster of one replica).

What the replayed client does: programs arrive at ``arrival_s`` (``program_start`` event, then
turn 0's request). When a turn finishes, the client sends ``tool_start`` (tool name), lets the
tool run for ``tool_seconds`` of virtual time, then sends ``tool_end`` (seconds, return tokens)
and the next turn's request; after the last turn it sends ``program_end``. The events reach the
replicas `cluster.placement` says, as behind the served router (a binding router that moves a
program tells the replica it left ``program_moved``). Requests carry the
hints a client would send (`sim.client`) and prompts of token ids grown turn by turn
(`sim.conversation`); what is measured is recorded as `sim.records` says.

The loop (conservative discrete-event simulation):

* The next thing to happen is either the earliest agenda item (`sim.agenda`: a program arrives
  or a tool returns, a request reaches its engine after the served path's intake, a prefill
  replica hands a finished prefill to its decode replica) or a step of the busy engine whose
  clock is earliest; agenda items at or before that clock go first. Ties between engines go to
  the one listed first in the cluster file. So the same trace, cluster and seed give the same
  numbers.
* An item delivered to an idle engine moves that engine's clock up to the item's time (between
  engine steps the clock jumps to the next arrival or tool return); one delivered to a busy
  engine waits for the step in flight, as a request reaching a busy server does; latencies are
  measured from the item's *intended* time.
* Only one engine runs at a time, so the process-wide clock (`server.clock`) is switched to the
  engine's own before every call into it.

P/D: a remote turn is first sent to its prefill replica with `max_tokens=1` and vLLM's
`kv_transfer_params={"do_remote_decode": True}`; when it finishes there, the decode replica
gets the same prompt with the parameters the prefill replica returned, pulls the blocks its
prefix cache lacks over the link (`server.emulated.nixl`), and decodes. With P/D engines built
`bidirectional` (`cluster.pd`), the decode replica exports each finished turn and the
program's next remote prefill carries that export, so the prefill replica reads the history its
prefix cache lacks from the decode replica instead of recomputing it (AMPD's remote path: a
turn prefilled locally leaves the prefill replica behind).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from cluster.pd import decode_params, prefill_params
from cluster.placement import Placement, moved_from
from cluster.routing import Route, TurnInfo
from common.metrics import percentile
from common.trace import Program, Trace
from server.clock import use_clock
from server.engine import ContextTooLong
from sim.agenda import Agenda, AgendaItem, PrefillHandover, RequestArrives, TurnDue
from sim.client import ClientPredictions, turn_hints
from sim.conversation import ProgramState, too_long_turns
from sim.records import ProgramRecord, ReplayResult, TurnRecord
from sim.virtual_cluster import Replica, VirtualCluster


def pin_counters() -> tuple[str, ...]:
    """What each engine's `PinStats` counts (the loop sums them over the replicas)."""
    # vLLM, which server.scheduler imports: start-up cost, and only once an engine has chosen
    # vLLM's platform (`server.engine`), so not at this module's import
    from server.scheduler import PinStats

    return tuple(f.name for f in fields(PinStats) if not f.name.startswith("_"))

#: Suffix of a remote turn's request id on its prefill replica (the decode replica's has none).
PREFILL_SUFFIX = "@p"


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
    return Simulation(trace, cluster, progress=progress, hints=hints, concurrency=concurrency,
                      intake_s=intake_s, delivery_s=delivery_s).run()


@dataclass
class TurnInFlight:
    """A turn in flight: its record and where it runs."""

    record: TurnRecord
    route: Route
    replica: str  # where its current request runs (the prefill replica, then the decode one)
    gaps_seen: int = 0  # token gaps already told to a latency-aware router
    ttft_seen: bool = False  # its first token already told


class Simulation:
    """One replay of a trace on a virtual cluster (see the module docstring and
    `replay_cluster`, which builds and runs it)."""

    def __init__(self, trace: Trace, cluster: VirtualCluster, *, progress: Any = None,
                 hints: str = "none", concurrency: int | None = None,
                 intake_s: float = 0.0, delivery_s: float = 0.0) -> None:
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if not (intake_s >= 0 and delivery_s >= 0):
            raise ValueError(
                f"served-path latencies must be >= 0 s, got {intake_s}, {delivery_s}")
        self.client = ClientPredictions(hints)
        refuse_too_long_turns(trace, cluster)
        self.cluster = cluster
        self.router = cluster.router
        self.progress = progress
        self.intake_s = intake_s
        self.delivery_s = delivery_s
        start = max(r.now() for r in cluster.replicas)
        self.states = {p.id: ProgramState(p) for p in trace.programs}
        self.records = {p.id: ProgramRecord(p.id, start + p.arrival_s) for p in trace.programs}
        # closed loop: a program is released to the system at the loop's start (a burst), so
        # its completion time counts the wait for a worker; its JCT counts from its start
        self.released = start if concurrency else None
        # closed loop: the programs not yet started, popped from the end, in trace order
        self.not_started: list[Program] = list(trace.programs[concurrency:]) if concurrency else []
        self.not_started.reverse()
        if concurrency:
            for p in trace.programs:
                self.records[p.id].arrival = start
            first = [(start, TurnDue(p.id, 0)) for p in trace.programs[:concurrency]]
        else:
            first = [(start + p.arrival_s, TurnDue(p.id, 0)) for p in trace.programs]
        self.agenda = Agenda(first)
        # request id -> turn, until its last request finishes
        self.in_flight: dict[str, TurnInFlight] = {}
        self.exports: dict[str, dict[str, Any]] = {}  # program -> its decode replica's last export
        #: program -> the old home prefilling its moved turn, told `program_moved` at hand-over
        self.leaving: dict[str, str] = {}
        self.placement = Placement()  # who hears which event (`cluster.placement`)
        #: program -> when its turn was sent, while the router holds it (`Router.hold`)
        self.held: dict[str, float] = {}
        #: what a router that keeps program books is asked and told (`cluster.program_queue`)
        self.router_hold = getattr(self.router, "hold", None)
        self.router_turn_finished = getattr(self.router, "turn_finished", None)
        # what a latency-aware router (AMPD) is told, as it happens: each turn's TTFT at its
        # first token (under the replica that prefilled it), each token gap under its decode
        # replica
        self.observe_ttft = getattr(self.router, "observe_ttft", None)
        self.observe_itl = getattr(self.router, "observe_itl", None)
        self.programs_done = 0
        self.engine_steps = 0
        #: P/D engines whose latest step found nothing to do but wait for a peer (`step`)
        self.waiting_for_peers: set[Replica] = set()
        self.start = start
        # one engine's fast path: no list of busy engines to build before every step
        self.only = cluster.replicas[0] if len(cluster.replicas) == 1 else None

    # the loop

    def run(self) -> ReplayResult:
        """Agenda items at or before the earliest busy engine's clock, else a step of that
        engine, until neither is left."""
        agenda = self.agenda
        while True:
            replica = self.next_busy()
            if agenda and (replica is None or agenda.next_time() <= replica.now()):
                self.handle(*agenda.pop())
                continue
            if replica is None:
                break
            self.step(replica)
        return self.result()

    def next_busy(self) -> Replica | None:
        """The busy engine whose clock is earliest (ties: the one listed first), or None."""
        if self.only is not None:
            return self.only if self.only.has_work() else None
        busy = [r for r in self.cluster.replicas if r.has_work()]
        return min(busy, key=lambda r: r.now()) if busy else None

    def handle(self, t: float, item: AgendaItem) -> None:
        match item:
            case TurnDue():
                self.start_turn(t, item)
            case RequestArrives():
                self.request_arrives(t, item)
            case PrefillHandover():
                self.hand_over(t, item)

    # agenda items

    def start_turn(self, t: float, due: TurnDue) -> None:
        """The client sends a turn's request: to its decode replica, or first to a prefill
        replica, as the router says; before it, the last tool call's end (from turn 1 on)."""
        pid, i = due.program_id, due.turn
        state = self.states[pid]
        program = state.program
        history = min(state.computed, len(state.tokens)) if i > 0 else 0
        bound = self.router.bound(pid)
        loads = self.cluster.loads()
        info = TurnInfo(now=t, prompt_tokens=len(state.tokens), history_tokens=history)
        again = None if self.router_hold is None else self.router_hold(pid, i, loads, info)
        sent = self.held.get(pid)  # when the client sent it, if the router held it
        if sent is None and i > 0:  # the tool call's end, told once, as the client does
            prev = program.turns[i - 1]
            self.client.observe(program, i - 1)
            self.tell(self.placement.current(pid), "tool_end", pid, tool=prev.tool,
                      seconds=prev.tool_seconds, return_tokens=prev.tool_return_tokens)
        if again is not None:  # waits in the router's queue: asked again then
            self.held.setdefault(pid, t)
            self.agenda.push(max(again, t), TurnDue(pid, i))
            return
        self.held.pop(pid, None)
        route = self.router.route(pid, i, loads, info)
        decoder = self.cluster.by_name[route.decode]
        left = moved_from(bound, self.router.bound(pid), route)
        if left is not None and route.prefill == left:
            self.leaving[pid] = left  # it prefills this turn first: told at the hand-over
        elif left is not None:
            self.tell(left, "program_moved", pid)
        for name in self.placement.route(pid, route):
            self.tell(name, "program_start", pid)
        record = TurnRecord(pid, i, t if sent is None else sent, prompt_tokens=len(state.tokens))
        record.replica = route.decode
        record.prefill_replica = route.prefill
        self.records[pid].turns.append(record)
        rid = f"{pid}#{i}"
        if route.prefill is None:
            # prefilled where the history is: the decode replica's export will not be read
            self.release(route.decode, self.exports.pop(pid, None))
            self.in_flight[rid] = TurnInFlight(record, route, route.decode)
            self.send(t, RequestArrives(decoder, rid, pid, i, max_one=False, params=None))
            return
        prefiller = self.cluster.by_name[route.prefill]
        self.in_flight[rid + PREFILL_SUFFIX] = TurnInFlight(record, route, route.prefill)
        self.send(t, RequestArrives(prefiller, rid + PREFILL_SUFFIX, pid, i, max_one=True,
                                    params=prefill_params(exported=self.exports.pop(pid, None))))

    def send(self, t: float, request: RequestArrives) -> None:
        """The client's request reaches the engine now, or `intake_s` later."""
        if self.intake_s:
            self.agenda.push(t + self.intake_s, request)
            return
        self.request_arrives(t, request)

    def request_arrives(self, t: float, request: RequestArrives) -> None:
        """A request reaches its engine: an idle engine's clock moves up to `t` first."""
        replica = request.replica
        if not replica.has_work():
            with replica.active() as engine:
                engine.advance_to(t)
        self.waiting_for_peers.discard(replica)  # it has something new to try
        state = self.states[request.program_id]
        program = state.program
        options: dict[str, Any] = dict(turn_hints(program, request.turn))
        if request.params is not None:
            options["kv_transfer_params"] = request.params
        output_tokens = 1 if request.max_one else program.turns[request.turn].output_tokens
        with replica.active() as engine:
            engine.add_request(request.request_id, state.tokens, program_id=request.program_id,
                               output_tokens=output_tokens, **options)

    def hand_over(self, t: float, handover: PrefillHandover) -> None:
        """A remote prefill is done: the decode replica gets the turn's request (at once: the
        hand-over is between engines, not through the served path)."""
        pid, i = handover.program_id, handover.turn
        rid = f"{pid}#{i}"
        turn = self.in_flight.pop(rid + PREFILL_SUFFIX)
        turn.replica = turn.route.decode
        self.in_flight[rid] = turn
        decoder = self.cluster.by_name[turn.route.decode]
        left = self.leaving.pop(pid, None)
        if left is not None:  # a moved program's old home sent its KV: it is let go now
            self.tell(left, "program_moved", pid)
        self.request_arrives(t, RequestArrives(decoder, rid, pid, i, max_one=False,
                                               params=handover.params))

    def release(self, name: str, exported: dict[str, Any] | None) -> None:
        """Free an export of replica `name` that no prefill will read (the program's last
        turn, or a next turn prefilled locally) now, not at the end of its TTL (vLLM's
        `decoder_kv_blocks_ttl`, 480 s), which would hold its blocks for nothing."""
        if exported:
            with self.cluster.by_name[name].active() as engine:
                engine.release_export(exported)

    def tell(self, name: str | None, kind: str, pid: str, **fields: Any) -> None:
        """Send a program event (`tool_start`, ...) to replica `name`."""
        assert name is not None, f"an event for {pid}, which has no replica"
        with self.cluster.by_name[name].active() as engine:
            engine.event(kind, pid, **fields)

    # engine steps

    def step(self, replica: Replica) -> None:
        """One step of `replica`'s engine; then what it admitted, preempted and finished."""
        # as `replica.active()`, without a generator's cost: this runs on every engine step
        engine = replica.engine
        previous = use_clock(engine.clock)
        try:
            step_start = engine.clock.now()
            finished = engine.step()
            if engine.nixl is not None:  # P/D only: a co-located replay's steps pay nothing
                if not finished and engine.wait_for_peers(
                        lambda: self.nothing_reaches(replica)):
                    self.waiting_for_peers.add(replica)
                else:
                    self.waiting_for_peers.discard(replica)
            now = engine.clock.now()
            requests = engine.scheduler.requests
        finally:
            use_clock(previous)
        self.engine_steps += 1
        stats = replica.stats
        stats.engine_steps += 1
        stats.busy_s += now - step_start
        name = replica.name
        watch = self.observe_itl is not None
        for rid, turn in self.in_flight.items():
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
            if watch and not rid.endswith(PREFILL_SUFFIX):
                pending = engine.in_flight(rid)
                if pending is not None:
                    self.observe_tokens(turn, pending.first_token, pending.token_gaps, now)
        for fin in finished:
            turn = self.in_flight.get(fin.request_id)
            if turn is not None and turn.record.admitted is None:
                turn.record.admitted = step_start
            self.request_finished(replica, fin)

    def nothing_reaches(self, replica: Replica) -> float:
        """Until when nothing can reach `replica`: the next agenda item, a step of another busy
        engine (its notes and hand-overs are stamped at or after its clock) or, for one that
        is itself waiting for its peers, its next deadline (which may free what it waits for)."""
        times = []
        for other in self.cluster.replicas:
            if other is replica or not other.has_work():
                continue
            if other in self.waiting_for_peers and other.engine.waits_for_peers():
                deadline = other.engine.next_wakeup()
                if deadline is not None:
                    times.append(deadline)
            else:
                times.append(other.now())
        if self.agenda:
            times.append(self.agenda.next_time())
        return min(times, default=float("inf"))

    def request_finished(self, replica: Replica, fin: Any) -> None:
        """A request finished on `replica`: a remote prefill (handed over to the decode
        replica) or a turn (the client has its tokens `delivery_s` later)."""
        turn = self.in_flight[fin.request_id]
        record = turn.record
        stats = replica.stats
        stats.prompt_tokens += fin.prompt_tokens
        stats.cached_tokens += fin.cached_tokens
        state = self.states[record.program_id]
        local = turn.route.prefill is None
        prefilled_here = fin.request_id.endswith(PREFILL_SUFFIX)
        if local or prefilled_here:  # where the prompt was computed
            stats.prefills += 1
            record.cached_tokens = fin.cached_tokens
            record.reloaded_tokens = fin.external_tokens
            if record.turn > 0:
                record.recomputed_tokens = state.recomputed(record.prompt_tokens,
                                                            record.cached_tokens)
        if not local and prefilled_here:
            self.prefill_finished(replica, record, fin)
            return
        self.turn_finished(replica, record, state, fin)

    def observe_tokens(self, turn: TurnInFlight, first_token: float | None,
                       gaps: list[float], now: float) -> None:
        """Tell the router what a decoding turn's tokens showed since last asked: its TTFT
        once (the window of the replica that prefilled it: the prefill replica, or the decode
        replica for a local prefill) and each new token gap (its decode replica's window)."""
        if first_token is not None and not turn.ttft_seen and self.observe_ttft is not None:
            turn.ttft_seen = True
            where = turn.route.prefill or turn.route.decode
            self.observe_ttft(where, first_token - turn.record.arrival, first_token)
        if self.observe_itl is not None and len(gaps) > turn.gaps_seen:
            for gap in gaps[turn.gaps_seen:]:
                self.observe_itl(turn.route.decode, gap, now)
            turn.gaps_seen = len(gaps)

    def prefill_finished(self, replica: Replica, record: TurnRecord, fin: Any) -> None:
        self.agenda.push(fin.finished, PrefillHandover(record.program_id, record.turn,
                                                       decode_params(fin.kv_transfer_params)))

    def turn_finished(self, replica: Replica, record: TurnRecord, state: ProgramState,
                      fin: Any) -> None:
        turn = self.in_flight.pop(fin.request_id)
        if self.observe_itl is not None:  # what its last step showed
            self.observe_tokens(turn, fin.first_token, getattr(fin, "token_gaps", []),
                                fin.finished)
        if fin.kv_transfer_params:  # a bidirectional decode replica exported this turn
            if record.turn == state.program.n_turns - 1:
                self.release(replica.name, fin.kv_transfer_params)  # no turn will read it
            else:
                self.exports[record.program_id] = fin.kv_transfer_params
        replica.stats.turns_decoded += 1
        seen = fin.finished + self.delivery_s  # when the client has the last token
        record.first_token = None if fin.first_token is None else fin.first_token + self.delivery_s
        record.finished = seen
        record.output_tokens = fin.output_tokens
        gaps = getattr(fin, "token_gaps", None)
        if gaps:
            record.itl_p90 = percentile(gaps, 90)
            record.itl_max = max(gaps)
        if record.admitted is None:  # engine times: the served path does not delay them
            record.admitted = fin.first_token if fin.first_token is not None else fin.finished
        if self.router_turn_finished is not None:  # the answer passed through the router
            self.router_turn_finished(record.program_id, record.prompt_tokens + fin.output_tokens,
                                      seen)
        if record.turn == state.program.n_turns - 1:
            self.program_finished(state.program, seen)
        else:
            self.tool_call(state, record.turn, fin.token_ids, seen)

    def program_finished(self, program: Program, seen: float) -> None:
        for name in self.placement.end(program.id):
            self.tell(name, "program_end", program.id)
        self.router.program_end(program.id)
        self.records[program.id].finished = seen
        if self.not_started:  # closed loop: the freed worker starts the next program now
            following = self.not_started.pop()
            self.records[following.id].arrival = seen
            self.agenda.push(seen, TurnDue(following.id, 0))
        self.programs_done += 1
        if self.progress is not None:
            self.progress(self.programs_done)

    def tool_call(self, state: ProgramState, i: int, answered: list[int], seen: float) -> None:
        """After turn `i`: its tool runs from when the client had the answer; the next turn
        is due when it returns."""
        program = state.program
        call = program.turns[i]
        state.extend(i, answered)
        self.tell(self.placement.current(program.id), "tool_start", program.id, tool=call.tool,
                  **self.client.tool_start(program, i))
        self.agenda.push(seen + call.tool_seconds, TurnDue(program.id, i + 1))

    # the result

    def result(self) -> ReplayResult:
        """The records, and what every engine counted, once the loop has ended."""
        cluster = self.cluster
        end = max(r.now() for r in cluster.replicas)
        counters = pin_counters()
        pin_stats = dict.fromkeys(counters, 0.0)
        sched_s = 0.0
        sched_steps = 0
        total_blocks = 0
        program_stats: dict[str, float] = {}
        occupancy: list[Any] = []
        tier_traffic: dict[str, dict[str, int]] = {}
        for replica in cluster.replicas:
            scheduler = replica.engine.scheduler
            programs = scheduler.agent_policy.programs
            if programs is not None:  # a program scheduler: time per state, pauses, resumes
                for key, value in programs.stats().items():
                    program_stats[key] = program_stats.get(key, 0.0) + value
                if not occupancy:
                    occupancy = [(t - self.start, held) for t, held in
                                 scheduler.agent_policy.occupancy]
            scheduler.account_pins(end)
            for key in counters:
                pin_stats[key] += getattr(scheduler.pin_stats, key)
            sched_s += float(scheduler.sched_seconds)
            sched_steps += int(scheduler.sched_steps)
            total_blocks += int(scheduler.kv_cache_manager.block_pool.num_gpu_blocks)
            moved = getattr(replica.engine, "kv_transfer_stats", None)
            if moved is not None:
                replica.stats.kv_bytes_in, replica.stats.kv_seconds_in = moved()
            add_tier_traffic(tier_traffic, replica.engine)
        router_books = getattr(self.router, "program_stats", None)
        if router_books is not None:  # the router's program scheduler (`program-queue`)
            for key, value in router_books().items():
                program_stats[key] = program_stats.get(key, 0.0) + value
            if not occupancy:
                occupancy = [(t - self.start, held) for t, held in
                             getattr(self.router, "occupancy", [])]
        records = self.records
        finishes = [r.finished for r in records.values() if r.finished is not None]
        first_arrival = min((r.arrival for r in records.values()), default=self.start)
        return ReplayResult(
            programs=records,
            makespan=(max(finishes) - first_arrival) if finishes else 0.0,
            total_blocks=total_blocks,
            pin_stats=pin_stats,
            sched_seconds=sched_s,
            sched_steps=sched_steps,
            engine_steps=self.engine_steps,
            replicas=[r.stats for r in cluster.replicas],
            router=self.router.name,
            released=self.released,
            program_stats=program_stats,
            program_occupancy=occupancy,
            migrations=int(getattr(self.router, "moves", 0)),
            tier_traffic=tier_traffic if "disk" in tier_traffic else {},
        )


def add_tier_traffic(totals: dict[str, dict[str, int]], engine: Any) -> None:
    """Add what moved to and from each of `engine`'s KV tiers (`VirtualEngine.tier_traffic`)
    to `totals` (tier -> figure -> sum over the engines)."""
    traffic = getattr(engine, "tier_traffic", None)
    for tier, moved in (traffic() if traffic is not None else {}).items():
        sums = totals.setdefault(tier, {})
        for name, value in asdict(moved).items():
            if value is not None:  # None: a figure the tier does not count
                sums[name] = sums.get(name, 0) + int(value)


def refuse_too_long_turns(trace: Trace, cluster: VirtualCluster) -> None:
    """Stop before replaying if a turn is longer than every engine takes: it could never run."""
    limit = min(r.engine.context_limit for r in cluster.replicas)
    long = too_long_turns(trace, limit)
    if long:
        pid, turn, tokens = long[0]
        raise ContextTooLong(
            f"{len(long)} program(s) have a turn longer than the engines' max_model_len "
            f"{limit:,}, first {pid} turn {turn} ({tokens:,} tokens): such a turn can never "
            "run; raise max_model_len or leave those programs out "
            "(`sim.conversation.too_long_turns`)")
