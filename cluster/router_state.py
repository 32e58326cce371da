"""What the served router knows about its replicas and programs, and how it keeps it fresh.

Why its own module: the router's decisions are `cluster.routing`'s (the same objects the
virtual-time cluster uses); this state only fills in their `ReplicaLoad` views from what a
proxy can see (its own count of requests in flight per replica, vLLM's
`vllm:kv_cache_usage_perc` gauge polled from each replica's Prometheus `/metrics`), holds the
counters behind `GET /v1/cluster`, and decides which replicas hear a program's events
(`cluster.placement`'s rule, see `cluster.router_events`).

A replica that stops answering (connection refused or dropped, or three failed metric polls in
a row) is marked not alive, and new programs, and programs bound to it, go elsewhere. A replica
whose metrics answer again is alive again, unless its launcher reported the process gone.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from cluster.placement import Placement, moved_from
from cluster.routing import NoReplicaError, ReplicaLoad, Route, Router, TurnInfo
from cluster.served_turns import TurnBook

log = logging.getLogger("harness.cluster.router")


class DownReason(enum.Enum):
    """Why a replica takes no request, for code to act on (`ReplicaState.down_reason`); the
    message beside it (`last_error`) is for people and may be reworded freely."""

    NOT_ANSWERING = "not_answering"  # a request or its metric polls failed
    EXITED = "exited"  # its launcher saw its process end
    NOT_STARTED = "not_started"  # on Ray: it has not run yet
    RESTARTING = "restarting"  # on Ray: Serve dropped it, its node is alive; Ray restarts it
    NODE_GONE = "node_gone"  # on Ray: its node is lost or stopped

#: vLLM 0.32's KV-cache usage gauge (0..1), `vllm/v1/metrics/loggers.py`.
KV_USAGE_METRIC = "vllm:kv_cache_usage_perc"
RUNNING_METRIC = "vllm:num_requests_running"
WAITING_METRIC = "vllm:num_requests_waiting"
#: The scheduler's counters as our events plugin exports them
#: (`server.intake.event_plugin`): pins its retention policy made, programs pinned now, agent
#: events it took in.
PINS_METRIC = "harness:pins_total"
PINNED_METRIC = "harness:pinned_programs"
EVENTS_METRIC = "harness:agent_events_total"
#: Failed metric polls in a row (other than a refused connection) that mark a replica dead.
POLL_FAILURES_DEAD = 3


@dataclass(frozen=True)
class ReplicaEndpoint:
    """A served replica as the router knows it."""

    name: str
    role: str  # colocated | prefill | decode
    url: str  # http://host:port
    pid: int | None = None  # its process (group), when a launcher started it


class ReplicaState:
    """What the router knows about one replica now; `load()` is the view routers see."""

    def __init__(self, endpoint: ReplicaEndpoint) -> None:
        self.endpoint = endpoint
        self.name = endpoint.name
        self.role = endpoint.role
        self.url = endpoint.url.rstrip("/")
        self.alive = True
        self.exited: int | None = None  # the process's exit code, once its launcher saw it go
        self.in_flight = 0
        self.routed = 0  # turns whose decode (or whole turn) went here
        self.prefills = 0  # P/D: prefills sent here
        self.errors = 0
        self.kv_usage = 0.0
        self.kv_capacity_tokens = 0  # from vLLM's cache_config_info (0: not read yet)
        self.engine_running = 0
        self.engine_waiting = 0
        self.pins: dict[str, int] = {}  # the scheduler's pin and event counters (`gauges`)
        self.poll_failures = 0
        self.metrics_at: float | None = None
        self.last_error: str | None = None
        self.down_reason: DownReason | None = None  # None while alive (or never down)
        self.pid = endpoint.pid
        #: what its host adds to `GET /v1/cluster` (on Ray: node, engine URL, restarts)
        self.extra: dict[str, Any] = {}

    @property
    def address(self) -> str:
        return self.url.split("://", 1)[-1]

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(name=self.name, role=self.role, kv_usage=self.kv_usage,
                           in_flight=self.in_flight, running=self.engine_running,
                           waiting=self.engine_waiting, alive=self.alive,
                           kv_capacity_tokens=self.kv_capacity_tokens)

    def not_answering(self, exc: BaseException | str) -> str:
        detail = exc if isinstance(exc, str) else (str(exc) or type(exc).__name__)
        return f"replica {self.name} at {self.address} is not answering: {detail.rstrip('.')}"

    def apply_gauges(self, gauges: dict[str, float]) -> None:
        """Take a reading of `engine_gauges` (the KV usage stays as it was when absent)."""
        self.kv_usage = float(gauges.get("kv_usage", self.kv_usage))
        self.kv_capacity_tokens = int(gauges.get("kv_capacity_tokens", self.kv_capacity_tokens))
        self.engine_running = int(gauges.get("running", 0))
        self.engine_waiting = int(gauges.get("waiting", 0))
        self.pins = {k: int(gauges[k]) for k in ("pins", "pinned_now", "events_taken")
                     if k in gauges}
        self.metrics_at = time.monotonic()

    def mark_dead(self, message: str, reason: DownReason = DownReason.NOT_ANSWERING) -> None:
        if self.alive or message != self.last_error:
            log.warning("%s; it takes no new programs", message)
        self.alive = False
        self.last_error = message
        self.down_reason = reason

    def mark_alive(self, forget_error: bool = False) -> None:
        """It answers (runs) again; `forget_error`: its last error no longer applies."""
        self.alive = True
        self.down_reason = None
        if forget_error:
            self.last_error = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "url": self.url,
                "pid": self.pid, "alive": self.alive,
                "exit_code": self.exited,
                "in_flight": self.in_flight, "kv_usage": round(self.kv_usage, 4),
                "engine_running": self.engine_running, "engine_waiting": self.engine_waiting,
                **self.pins,
                "routed": self.routed, "prefills": self.prefills, "errors": self.errors,
                "metrics_age_s": (None if self.metrics_at is None
                                  else round(time.monotonic() - self.metrics_at, 2)),
                "last_error": self.last_error,
                "down_reason": self.down_reason.value if self.down_reason else None,
                **self.extra}


class ClusterState:
    """The replicas, the routing strategy and the counters behind `GET /v1/cluster`."""

    def __init__(self, replicas: Sequence[ReplicaEndpoint], router: Router,
                 name: str = "cluster", strategy: str | None = None) -> None:
        if not replicas:
            raise ValueError("a router needs at least one replica")
        self.name = name
        self.router = router
        self.strategy = strategy or router.name
        self.replicas = {r.name: ReplicaState(r) for r in replicas}
        self.started = time.time()
        self.counters: dict[str, int] = {
            "requests": 0, "completed": 0, "failed": 0, "cancelled": 0, "no_replica": 0,
            "rebinds": 0, "held": 0,
            "pd_prefills": 0, "pd_fallbacks": 0, "events_received": 0, "events_forwarded": 0,
            "events_dropped": 0, "programs_ended": 0, "programs_forgotten": 0}
        self.placement = Placement()  # who has served each program, for the events fan-out
        self.book = TurnBook()  # prompt / history lengths and prefill queues (AMPD's inputs)
        self.starts: dict[str, str] = {}  # program -> its program_start line, until it ends

    @property
    def pd(self) -> bool:
        return any(r.role in ("prefill", "decode") for r in self.replicas.values())

    def loads(self) -> list[ReplicaLoad]:
        loads = [r.load() for r in self.replicas.values()]
        for load in loads:
            load.queued_prefill_tokens = self.book.queued.get(load.name, 0)
        return loads

    def live(self) -> list[ReplicaState]:
        return [r for r in self.replicas.values() if r.alive]

    def route(self, program_id: str, turn: int, info: TurnInfo | None = None) -> Route:
        """The router's decision (raises `NoReplicaError`), counting rebinds."""
        return self.route_turn(program_id, turn, info)[0]

    def route_turn(self, program_id: str, turn: int,
                   info: TurnInfo | None = None) -> tuple[Route, str | None]:
        """`route`, and the live replica the routing moved the program away from (it must
        hear `program_moved`: `cluster.placement`), or None. First the programs the strategy
        forgot after their silence leave this state's books too (`forget_silent`)."""
        self.forget_silent(info.now if info is not None else time.monotonic())
        before = self.router.bound(program_id)
        route = self.router.route(program_id, turn, self.loads(), info)
        after = self.router.bound(program_id)
        if before is not None and before != after:
            self.counters["rebinds"] += 1
        left = moved_from(before, after, route)
        alive = left is not None and left in self.replicas and self.replicas[left].alive
        return route, left if alive else None

    def forget_silent(self, now: float) -> None:
        """The programs the strategy forgets as silent past its bound (`Router.reap`: a
        client killed mid-tool never sends `program_end`) leave the router's other books, the
        events fan-out's, the kept `program_start`s and the turn figures, as an ended one
        does (the replicas forget them by the same bound)."""
        for program_id in self.router.reap(now):
            self.placement.end(program_id)
            self.starts.pop(program_id, None)
            self.book.end(program_id)
            self.counters["programs_forgotten"] += 1

    def down(self) -> str:
        """Why the replicas that take no request are down, for an error that says so."""
        return "; ".join(r.last_error or f"replica {r.name} is down"
                         for r in self.replicas.values() if not r.alive)

    def binds(self) -> bool:
        """Does the strategy keep a program on one replica (so events have one target)?"""
        return type(self.router).bound is not Router.bound

    def event_targets(self, program_id: str, kind: str) -> list[str]:
        """Replicas an event of `program_id` goes to (see `cluster.router_events`)."""
        alive = {r.name for r in self.live()}
        if kind == "program_start":  # kept; `placed` delivers it with the first turn there
            return [n for n in self.placement.touched(program_id) if n in alive]
        if kind == "program_end" and self.placement.touched(program_id):
            return [n for n in self.placement.end(program_id) if n in alive]
        current = self.placement.current(program_id)
        if current is not None:
            return [current] if current in alive else []
        bound = self.router.bound(program_id)
        if bound is not None and bound in self.replicas and self.replicas[bound].alive:
            return [bound]
        if not self.binds():
            return [r.name for r in self.live()]
        if kind == "program_end":
            return []  # never bound, or bound to a replica that is gone: nobody holds it
        try:
            return [self.route(program_id, 0).decode]
        except NoReplicaError:
            return []

    def placed(self, program_id: str, route: Route) -> list[str]:
        """Record a turn's route; the replicas that must hear the program's kept
        `program_start` before the turn reaches them."""
        new = self.placement.route(program_id, route)
        return new if program_id in self.starts else []

    def mark_exited(self, name: str, code: int | None) -> None:
        """The launcher saw the replica's process end (called from its watcher thread)."""
        replica = self.replicas[name]
        replica.exited = code if code is not None else -1
        replica.mark_dead(f"replica {name} at {replica.address} exited with code {code}",
                          DownReason.EXITED)

    def observe(self, kind: str, replica: str, seconds: float | None) -> None:
        """A TTFT (prefill replica) or ITL (decode replica) sample, for strategies that read
        them (`observe_ttft` / `observe_itl`)."""
        hook = getattr(self.router, f"observe_{kind}", None)
        if hook is not None and seconds is not None:
            hook(replica, seconds, time.monotonic())

    def to_json(self) -> dict[str, Any]:
        bound = getattr(getattr(self.router, "_binding", None), "of", None)
        decisions = getattr(self.router, "decisions", None)
        return {"name": self.name, "strategy": self.strategy,
                "uptime_s": round(time.time() - self.started, 1),
                "replicas": [r.to_json() for r in self.replicas.values()],
                "counters": {**self.counters,
                             "programs_bound": len(bound) if bound is not None else None},
                "programs_held": self.router.programs_held(),
                **({"decisions": dict(decisions)} if decisions is not None else {}),
                **self._program_books()}

    def _program_books(self) -> dict[str, Any]:
        """A router that keeps program books (`program-queue`): time per program state,
        pauses and resumes, summed over its replicas, and the programs it moved."""
        stats = getattr(self.router, "program_stats", None)
        if stats is None:
            return {}
        return {"programs": {**{k: round(v, 3) for k, v in stats().items()},
                             "moves": int(getattr(self.router, "moves", 0))}}


# -- the replicas' gauges ----------------------------------------------------------------------

_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str, names: Sequence[str] = (KV_USAGE_METRIC, RUNNING_METRIC,
                                                     WAITING_METRIC)) -> dict[str, float]:
    """Values of `names` in a Prometheus text exposition: the largest over label sets (one
    per engine) for the KV usage, the sum for the request gauges. Absent names are absent."""
    wanted = set(names)
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _METRIC_LINE.match(line)
        if m is None or m.group(1) not in wanted:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        name = m.group(1)
        if name not in out:
            out[name] = value
        elif name == KV_USAGE_METRIC:
            out[name] = max(out[name], value)
        else:
            out[name] += value
    return out


#: `engine_gauges`' names for the metrics it reads
_GAUGES = {KV_USAGE_METRIC: "kv_usage", RUNNING_METRIC: "running", WAITING_METRIC: "waiting",
           PINS_METRIC: "pins", PINNED_METRIC: "pinned_now", EVENTS_METRIC: "events_taken"}


_CACHE_CONFIG = re.compile(r'^vllm:cache_config_info\{([^}]*)\}', re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def engine_gauges(text: str) -> dict[str, float]:
    """What the router reads from a replica's Prometheus `/metrics` (the local poll, and a Ray
    replica's routing stats alike): the metrics of `_GAUGES` that are present, by short name,
    and the KV capacity in tokens (`kv_capacity_tokens`: vLLM's `cache_config_info` labels
    `num_gpu_blocks` x `block_size`), which the `programs` router places by."""
    values = parse_metrics(text, tuple(_GAUGES))
    out = {_GAUGES[name]: value for name, value in values.items()}
    m = _CACHE_CONFIG.search(text)
    if m is not None:
        labels = dict(_LABEL.findall(m.group(1)))
        try:
            out["kv_capacity_tokens"] = float(int(labels["num_gpu_blocks"])
                                              * int(labels["block_size"]))
        except (KeyError, ValueError):
            pass
    return out


async def poll_replica(client: httpx.AsyncClient, replica: ReplicaState,
                       timeout_s: float = 2.0) -> None:
    """Read one replica's gauges; a refused connection or repeated failures mark it dead,
    an answer (from a replica whose process still runs) marks it alive."""
    try:
        answer = await client.get(replica.url + "/metrics", timeout=timeout_s)
        answer.raise_for_status()
    except httpx.ConnectError as exc:
        replica.mark_dead(replica.not_answering(exc))
        return
    except httpx.HTTPError as exc:
        replica.poll_failures += 1
        if replica.poll_failures >= POLL_FAILURES_DEAD:
            replica.mark_dead(replica.not_answering(
                f"{replica.poll_failures} metric polls failed, the last with "
                f"{str(exc) or type(exc).__name__}"))
        return
    replica.apply_gauges(engine_gauges(answer.text))
    replica.poll_failures = 0
    if not replica.alive and replica.exited is None:
        log.warning("replica %s at %s answers again", replica.name, replica.address)
        replica.mark_alive()


async def poll_forever(client: httpx.AsyncClient, state: ClusterState,
                       interval_s: float) -> None:
    """Poll every replica whose process has not exited, every `interval_s`, until cancelled."""
    while True:
        started = time.monotonic()
        await asyncio.gather(*(poll_replica(client, r) for r in state.replicas.values()
                               if r.exited is None), return_exceptions=True)
        await asyncio.sleep(max(0.05, interval_s - (time.monotonic() - started)))
