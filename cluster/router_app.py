"""The served router: one OpenAI-compatible endpoint in front of a cluster's `harness serve`
replicas (started by `cluster.launcher`, or any replicas the caller names).

Why a thin FastAPI proxy: the placement decision is `cluster.routing` (the same objects the
virtual-time cluster uses); this module only fills in their `ReplicaLoad` views from what a
proxy can see (its own count of requests in flight per replica, vLLM's
`vllm:kv_cache_usage_perc` gauge polled from each replica's Prometheus `/metrics`) and moves
bytes. Bodies are passed on unchanged (colocated), so `session_id`, `vllm_xargs` and every
other vLLM extension reach the replica; streamed answers (SSE) are relayed chunk by chunk as
they arrive.

Endpoints:

* `POST /v1/chat/completions`, `POST /v1/completions`: the program id is the body's
  `session_id` or the `X-Session-ID` header, the turn `vllm_xargs.turn` (default 0). The router
  picks the replica; the answer carries `X-Harness-Replica` (and `X-Harness-Prefill` under
  P/D). Under P/D (`Route.prefill` set) the request first goes to the prefill replica with
  `kv_transfer_params` of vLLM's pull-mode NixlConnector and `max_tokens=1`, and the returned
  `kv_transfer_params` go with the original request to the decode replica (as vLLM's example
  proxies do; `cluster.pd`, imported only for P/D clusters).
* `POST /v1/agent/events`: validated as the replicas validate (`server.events`), then fanned
  out by `cluster.placement`'s rule, the one the virtual-time cluster follows: a program's
  `program_start` is kept and delivered to each replica the first time one of the program's
  turns is routed there (prefill replicas included), before that turn; `tool_start` and
  `tool_end` go to the replica that served the program's latest turn (where its KV cache is);
  `program_end` goes to every replica the program touched and ends the router's binding. A
  program no turn of which was routed yet (events before its first request) falls back to its
  binding (`session`, `pd`: bound now) and, for strategies that do not bind, reaches nobody.
* Cost-model strategies (`ampd`) also get each turn's `TurnInfo`, the replicas' queued prefill
  tokens and windowed TTFT / ITL, kept by `cluster.served_turns` from the relayed traffic.
* `GET /v1/models` (from the first live replica), `GET /health` (200 while a replica lives),
  `GET /v1/cluster` (per-replica state and the routing counters).

A replica that stops answering (connection refused or dropped, or three failed metric polls in
a row) is marked not alive: requests in flight to it fail with a 502 whose message names it
(`replica d1 at 127.0.0.1:8102 is not answering: ...`), and new programs, and programs bound to
it, go elsewhere. A replica whose metrics answer again is alive again, unless its launcher
reported the process gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from cluster.placement import Placement
from cluster.routers import make_router
from cluster.routing import NoReplicaError, ReplicaLoad, Route, Router, TurnInfo
from cluster.served_turns import StreamClock, TurnBook, completion_tokens_of, prompt_tokens_of

log = logging.getLogger("harness.cluster.router")

SESSION_HEADER = "X-Session-ID"
REPLICA_HEADER = "X-Harness-Replica"
PREFILL_HEADER = "X-Harness-Prefill"
#: vLLM 0.32's KV-cache usage gauge (0..1), `vllm/v1/metrics/loggers.py`.
KV_USAGE_METRIC = "vllm:kv_cache_usage_perc"
RUNNING_METRIC = "vllm:num_requests_running"
WAITING_METRIC = "vllm:num_requests_waiting"
#: Failed metric polls in a row (other than a refused connection) that mark a replica dead.
POLL_FAILURES_DEAD = 3
#: Request headers not passed on to a replica (hop-by-hop, or set by httpx itself).
_DROP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding",
                 "te", "trailer", "upgrade", "proxy-authorization", "proxy-connection",
                 "accept-encoding"}
#: Transport errors that mean the replica is gone (or its process is), not a slow answer.
_GONE = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError,
         httpx.ConnectTimeout, httpx.CloseError)


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
        self.engine_running = 0
        self.engine_waiting = 0
        self.poll_failures = 0
        self.metrics_at: float | None = None
        self.last_error: str | None = None

    @property
    def address(self) -> str:
        return self.url.split("://", 1)[-1]

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(name=self.name, role=self.role, kv_usage=self.kv_usage,
                           running=self.in_flight, waiting=0, alive=self.alive)

    def not_answering(self, exc: BaseException | str) -> str:
        detail = exc if isinstance(exc, str) else (str(exc) or type(exc).__name__)
        return f"replica {self.name} at {self.address} is not answering: {detail.rstrip('.')}"

    def mark_dead(self, reason: str) -> None:
        if self.alive:
            log.warning("%s; it takes no new programs", reason)
        self.alive = False
        self.last_error = reason

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "url": self.url,
                "pid": self.endpoint.pid, "alive": self.alive, "exit_code": self.exited,
                "in_flight": self.in_flight, "kv_usage": round(self.kv_usage, 4),
                "engine_running": self.engine_running, "engine_waiting": self.engine_waiting,
                "routed": self.routed, "prefills": self.prefills, "errors": self.errors,
                "metrics_age_s": (None if self.metrics_at is None
                                  else round(time.monotonic() - self.metrics_at, 2)),
                "last_error": self.last_error}


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
            "rebinds": 0,
            "pd_prefills": 0, "pd_fallbacks": 0, "events_received": 0, "events_forwarded": 0,
            "events_dropped": 0, "programs_ended": 0}
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
        before = self.router.bound(program_id)
        route = self.router.route(program_id, turn, self.loads(), info)
        if before is not None and before != self.router.bound(program_id):
            self.counters["rebinds"] += 1
        return route

    def binds(self) -> bool:
        """Does the strategy keep a program on one replica (so events have one target)?"""
        return type(self.router).bound is not Router.bound

    def event_targets(self, program_id: str, kind: str) -> list[str]:
        """Replicas an event of `program_id` goes to (see the module docstring)."""
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
        replica.mark_dead(f"replica {name} at {replica.address} exited with code {code}")

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
                **({"decisions": dict(decisions)} if decisions is not None else {})}


@dataclass
class _Turn:
    """One relayed turn's accounting: its prompt, and where its new tokens wait to be
    prefilled (cleared once, at the first token or the prefill's answer)."""

    program: str
    prompt_tokens: int
    new_tokens: int
    queued_on: str | None = None

    def prefilled(self, book: TurnBook) -> None:
        if self.queued_on is not None:
            book.prefill_done(self.queued_on, self.new_tokens)
            self.queued_on = None


# -- pure helpers (unit-tested without servers) ----------------------------------------------

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


def program_of(body: dict[str, Any], headers: Any) -> str | None:
    """The program id: the body's `session_id`, else the `X-Session-ID` header."""
    session = body.get("session_id")
    if session is None or session == "":
        session = headers.get(SESSION_HEADER) if headers is not None else None
    return None if session is None or session == "" else str(session)


def turn_of(body: dict[str, Any]) -> int:
    """`vllm_xargs.turn` as an int (0 when absent or not a number)."""
    xargs = body.get("vllm_xargs")
    if not isinstance(xargs, dict):
        return 0
    try:
        return int(xargs.get("turn", 0))
    except (TypeError, ValueError):
        return 0


def prefill_body(body: dict[str, Any], kv_transfer_params: dict[str, Any],
                 chat: bool) -> dict[str, Any]:
    """The request to a prefill replica: the same prompt with `kv_transfer_params`, one output
    token and no streaming (what vLLM's toy P/D proxy sends)."""
    out = dict(body)
    out["kv_transfer_params"] = kv_transfer_params
    out["stream"] = False
    out.pop("stream_options", None)
    out.pop("min_tokens", None)
    out["max_tokens"] = 1
    if chat and "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    return out


def forward_headers(headers: Any, program_id: str | None,
                    request_id: str | None = None) -> dict[str, str]:
    out = {k: v for k, v in headers.items() if k.lower() not in _DROP_HEADERS}
    if program_id is not None and not any(k.lower() == SESSION_HEADER.lower() for k in out):
        out[SESSION_HEADER] = program_id
    if request_id is not None:
        out = {k: v for k, v in out.items() if k.lower() != "x-request-id"}
        out["X-Request-Id"] = request_id
    return out


def error_body(message: str, status: int, kind: str = "replica_unavailable",
               replica: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object (what the `openai` package shows as the message)."""
    error: dict[str, Any] = {"message": message, "type": kind, "code": status}
    if replica is not None:
        error["replica"] = replica
    return {"error": error}


def error_response(message: str, status: int, kind: str = "replica_unavailable",
                   replica: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, kind, replica), status_code=status)


def sse_error(message: str, replica: str | None) -> bytes:
    """An error event for a stream whose replica went away after the answer began (blank lines
    first, to close an event the replica left half-sent)."""
    return b"\n\ndata: " + json.dumps(error_body(message, 502, replica=replica)).encode() + b"\n\n"


# -- the app ---------------------------------------------------------------------------------

def _pd_module() -> Any:
    try:
        from cluster import pd
    except ImportError as exc:  # pragma: no cover - only while cluster/pd.py is missing
        raise RuntimeError(f"this cluster has prefill/decode replicas, but cluster.pd (the "
                           f"P/D request parameters) cannot be imported: {exc}") from None
    return pd


def create_app(replicas: Sequence[ReplicaEndpoint], router: Router | Any, *,
               name: str = "cluster", poll_interval_s: float = 0.5,
               transport: httpx.AsyncBaseTransport | None = None,
               connect_timeout_s: float = 5.0, cluster: Any = None) -> FastAPI:
    """The router app. `router`: a `cluster.routing.Router`, or a `RouterSpec` to build one
    (`ampd` needs `cluster`, the `ClusterConfig`, whose profiles and links price its estimates).
    `transport`: an httpx transport for the upstream client (tests use a mock one)."""
    if not isinstance(router, Router):
        router = make_router(router, cluster)
    state = ClusterState(replicas, router, name=name)
    pd = _pd_module() if state.pd else None
    holder: dict[str, httpx.AsyncClient] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(connect=connect_timeout_s, read=None, write=60.0, pool=None),
            limits=httpx.Limits(max_connections=4096, max_keepalive_connections=256))
        holder["client"] = client
        task = asyncio.create_task(_poll_forever(client, state, poll_interval_s))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.aclose()

    app = FastAPI(title=f"harness cluster router ({name})", lifespan=lifespan)
    app.state.cluster = state

    def client() -> httpx.AsyncClient:
        return holder["client"]

    # -- completions ------------------------------------------------------------------------
    async def completions(request: Request, path: str) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error_response(f"the request body is not JSON: {exc}", 400,
                                  "invalid_request_error")
        if not isinstance(body, dict):
            return error_response("the request body must be a JSON object", 400,
                                  "invalid_request_error")
        given = program_of(body, request.headers)
        program = given if given is not None else f"anon-{uuid.uuid4().hex}"
        state.counters["requests"] += 1
        tokens = prompt_tokens_of(body)
        info = state.book.info(program, tokens, time.monotonic())
        try:
            route = state.route(program, turn_of(body), info)
        except NoReplicaError as exc:
            state.counters["no_replica"] += 1
            return error_response(f"no live replica can take the request ({exc}); "
                                  f"GET /v1/cluster shows the replicas", 503)
        headers = forward_headers(request.headers, given)
        if given is not None:
            for name in state.placed(program, route):
                await _post_events(name, [state.starts[program]])
        turn = _Turn(program, tokens, info.new_tokens)
        if route.prefill is not None:
            assert pd is not None
            work = _pd_turn(path, body, headers, route, pd, turn)
        else:
            state.book.prefill_queued(route.decode, turn.new_tokens)
            turn.queued_on = route.decode
            work = _forward(path, raw, headers, route.decode, stream=bool(body.get("stream")),
                            turn=turn)
        response = None
        try:
            response = await _unless_disconnected(request, work)
            return response
        finally:
            if not isinstance(response, StreamingResponse):  # a stream clears it when it runs
                turn.prefilled(state.book)  # answered or failed: no longer queued
            if given is None:
                state.router.program_end(program)  # an anonymous request binds nothing
                state.book.end(program)

    async def _unless_disconnected(request: Request, work: Any) -> Response:
        """Run `work`; if the client goes away first, cancel it (closing the upstream
        connection, so the replica aborts the request) and answer 499."""
        task = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            state.counters["cancelled"] += 1
            return error_response("the client went away", 499, "cancelled")
        return task.result()

    async def _pd_turn(path: str, body: dict[str, Any], headers: dict[str, str],
                       route: Route, pd: Any, turn: _Turn) -> Response:
        prefill = state.replicas[route.prefill]  # type: ignore[index]
        request_id = next((v for k, v in headers.items() if k.lower() == "x-request-id"),
                          None) or f"pd-{uuid.uuid4().hex}"
        headers = forward_headers(headers, None, request_id)
        first = prefill_body(body, pd.prefill_params(), chat=path.endswith("chat/completions"))
        prefill.in_flight += 1
        prefill.prefills += 1
        state.counters["pd_prefills"] += 1
        state.book.prefill_queued(prefill.name, turn.new_tokens)
        turn.queued_on = prefill.name
        sent = time.monotonic()
        try:
            answer = await client().post(prefill.url + path, json=first, headers=headers)
        except _GONE as exc:
            return _gone(prefill, exc)
        except httpx.HTTPError as exc:
            return _failed(prefill, exc)
        finally:
            prefill.in_flight -= 1
            turn.prefilled(state.book)
        if answer.status_code == 200:
            state.observe("ttft", prefill.name, time.monotonic() - sent)
        if answer.status_code != 200:
            state.counters["failed"] += 1
            return Response(answer.content, status_code=answer.status_code,
                            media_type=answer.headers.get("content-type"),
                            headers={REPLICA_HEADER: route.decode,
                                     PREFILL_HEADER: prefill.name})
        try:
            returned = answer.json().get("kv_transfer_params")
            second = dict(body)
            second["kv_transfer_params"] = pd.decode_params(returned)
        except (ValueError, AttributeError) as exc:  # PDError is a ValueError
            state.counters["pd_fallbacks"] += 1
            log.warning("prefill replica %s: %s; prefilling on %s instead", prefill.name, exc,
                        route.decode)
            second = dict(body)
        return await _forward(path, json.dumps(second).encode(), headers, route.decode,
                              stream=bool(body.get("stream")),
                              extra_headers={PREFILL_HEADER: prefill.name}, turn=turn)

    def _answered(turn: _Turn | None, name: str, completion: int | None,
                  itl: float | None) -> None:
        """A turn's answer is complete (`completion` tokens, from its usage): its history
        for the next turn, the decode replica's ITL."""
        if turn is None:
            return
        state.book.turn_done(turn.program, turn.prompt_tokens, completion)
        state.observe("itl", name, itl)

    async def _forward(path: str, content: bytes, headers: dict[str, str], name: str,
                       stream: bool, extra_headers: dict[str, str] | None = None,
                       turn: _Turn | None = None) -> Response:
        replica = state.replicas[name]
        replica.routed += 1
        out_headers = {REPLICA_HEADER: name, **(extra_headers or {})}
        upstream = client().build_request("POST", replica.url + path, content=content,
                                          headers={**headers, "content-type":
                                                   "application/json"})
        replica.in_flight += 1
        relaying = False  # once the stream is handed to `relay`, it does the accounting
        sent = time.monotonic()
        try:
            try:
                answer = await client().send(upstream, stream=stream)
            except _GONE as exc:
                return _gone(replica, exc)
            except httpx.HTTPError as exc:
                return _failed(replica, exc)
            if not stream:
                state.counters["completed" if answer.status_code == 200 else "failed"] += 1
                if answer.status_code == 200 and turn is not None:
                    tokens = completion_tokens_of(answer.content)
                    _answered(turn, name, tokens,
                              (time.monotonic() - sent) / tokens if tokens else None)
                return Response(answer.content, status_code=answer.status_code,
                                media_type=answer.headers.get("content-type"),
                                headers=out_headers)
            if answer.status_code != 200:  # an error before the stream began: pass it on
                try:
                    content = await answer.aread()
                except httpx.HTTPError as exc:
                    return _gone(replica, exc)
                finally:
                    await answer.aclose()
                state.counters["failed"] += 1
                return Response(content, status_code=answer.status_code,
                                media_type=answer.headers.get("content-type"),
                                headers=out_headers)
            relaying = True
        finally:
            if not relaying:
                replica.in_flight -= 1

        async def relay() -> AsyncIterator[bytes]:
            outcome = "cancelled"  # unless it ends below: the client went away
            clock = StreamClock()
            tail = b""  # the last chunks, where the usage is
            try:
                async for chunk in answer.aiter_raw():
                    clock.chunk(time.monotonic())
                    if turn is not None:
                        turn.prefilled(state.book)  # the first token is out
                        tail = (tail + chunk)[-4096:]
                    yield chunk
                outcome = "completed"
                if turn is not None:
                    _answered(turn, name, completion_tokens_of(tail), clock.itl())
            except _GONE as exc:
                outcome = "failed"
                message = replica.not_answering(exc)
                replica.mark_dead(message)
                replica.errors += 1
                yield sse_error(message, replica.name)
            except httpx.HTTPError as exc:
                outcome = "failed"
                replica.errors += 1
                yield sse_error(f"replica {name} at {replica.address} failed: "
                                f"{str(exc) or type(exc).__name__}", replica.name)
            finally:
                replica.in_flight -= 1
                state.counters[outcome] += 1
                if turn is not None:
                    turn.prefilled(state.book)
                await answer.aclose()  # a client gone: closing aborts the request upstream

        return StreamingResponse(relay(), status_code=200,
                                 media_type=answer.headers.get("content-type",
                                                               "text/event-stream"),
                                 headers=out_headers)

    def _gone(replica: ReplicaState, exc: BaseException) -> JSONResponse:
        message = replica.not_answering(exc)
        replica.mark_dead(message)
        replica.errors += 1
        state.counters["failed"] += 1
        return error_response(message, 502, replica=replica.name)

    def _failed(replica: ReplicaState, exc: BaseException) -> JSONResponse:
        replica.errors += 1
        state.counters["failed"] += 1
        return error_response(f"replica {replica.name} at {replica.address} failed: "
                              f"{str(exc) or type(exc).__name__}", 502, replica=replica.name)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await completions(request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def text_completions(request: Request) -> Response:
        return await completions(request, "/v1/completions")

    # -- events -----------------------------------------------------------------------------
    @app.post("/v1/agent/events")
    async def agent_events(request: Request) -> JSONResponse:
        from server.events import EventError, parse_events

        try:
            events = parse_events(await request.body())
        except EventError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        per_target: dict[str, list[int]] = {}
        kept: set[int] = set()  # program_start events held for the program's first turn
        for index, event in enumerate(events):
            for target in state.event_targets(event.program_id, event.type):
                per_target.setdefault(target, []).append(index)
        lines = [json.dumps(e.model_dump(exclude_none=True)) for e in events]
        for event, line in zip(events, lines, strict=True):
            if event.type == "program_start":
                state.starts[event.program_id] = line
                kept.add(id(event))

        async def send(target: str, indices: list[int]) -> tuple[str, int, str | None]:
            forwarded, problem = await _post_events(target, [lines[i] for i in indices])
            return target, forwarded, problem

        results = await asyncio.gather(*(send(t, ix) for t, ix in per_target.items()))
        reached: set[int] = set()
        report: dict[str, Any] = {}
        for target, forwarded, problem in results:
            reached.update(per_target[target][:forwarded])
            report[target] = ({"sent": len(per_target[target]), "forwarded": forwarded}
                              if problem is None else {"sent": len(per_target[target]),
                                                       "forwarded": 0, "error": problem})
        for event in events:
            if event.type == "program_end":
                state.router.program_end(event.program_id)
                state.book.end(event.program_id)
                state.starts.pop(event.program_id, None)
                state.counters["programs_ended"] += 1
        held = sum(1 for i, e in enumerate(events) if id(e) in kept and i not in reached)
        state.counters["events_received"] += len(events)
        state.counters["events_forwarded"] += len(reached)
        state.counters["events_dropped"] += len(events) - len(reached) - held
        return JSONResponse({"accepted": len(events), "forwarded": len(reached),
                             "held": held, "replicas": report})

    async def _post_events(target: str, lines: list[str]) -> tuple[int, str | None]:
        """Send event lines to one replica: (how many it forwarded to its scheduler, the
        problem if none)."""
        replica = state.replicas[target]
        try:
            answer = await client().post(
                replica.url + "/v1/agent/events", content="\n".join(lines).encode(),
                headers={"content-type": "application/x-ndjson"}, timeout=5.0)
        except _GONE as exc:
            replica.mark_dead(replica.not_answering(exc))
            return 0, replica.not_answering(exc)
        except httpx.HTTPError as exc:
            return 0, f"{type(exc).__name__}: {exc}"
        if answer.status_code != 200:
            return 0, f"HTTP {answer.status_code}: {answer.text[:200]}"
        try:
            return int(answer.json().get("forwarded", len(lines))), None
        except (ValueError, AttributeError):
            return 0, "the replica's answer is not JSON"

    # -- the rest ---------------------------------------------------------------------------
    @app.get("/v1/models")
    async def models() -> Response:
        live = state.live()
        if not live:
            return error_response("no live replica", 503)
        replica = live[0]
        try:
            answer = await client().get(replica.url + "/v1/models", timeout=10.0)
        except _GONE as exc:
            return _gone(replica, exc)
        except httpx.HTTPError as exc:
            return _failed(replica, exc)
        return Response(answer.content, status_code=answer.status_code,
                        media_type=answer.headers.get("content-type"))

    @app.get("/health")
    async def health() -> JSONResponse:
        live = [r.name for r in state.live()]
        return JSONResponse({"status": "ok" if live else "no live replica", "alive": live},
                            status_code=200 if live else 503)

    @app.get("/v1/cluster")
    async def cluster() -> JSONResponse:
        return JSONResponse(state.to_json())

    return app


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


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
    values = parse_metrics(answer.text)
    replica.kv_usage = values.get(KV_USAGE_METRIC, replica.kv_usage)
    replica.engine_running = int(values.get(RUNNING_METRIC, 0))
    replica.engine_waiting = int(values.get(WAITING_METRIC, 0))
    replica.poll_failures = 0
    replica.metrics_at = time.monotonic()
    if not replica.alive and replica.exited is None:
        log.warning("replica %s at %s answers again", replica.name, replica.address)
        replica.alive = True


async def _poll_forever(client: httpx.AsyncClient, state: ClusterState,
                        interval_s: float) -> None:
    while True:
        started = time.monotonic()
        await asyncio.gather(*(poll_replica(client, r) for r in state.replicas.values()
                               if r.exited is None), return_exceptions=True)
        await asyncio.sleep(max(0.05, interval_s - (time.monotonic() - started)))
