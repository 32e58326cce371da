"""`POST /v1/agent/events` on the vLLM API server's own port (a vLLM endpoint plugin).

Registered under the `vllm.endpoint_plugins` entry point and allow-listed by `harness serve`
through `VLLM_PLUGINS`. Reads the body up to `server.intake.events.MAX_BODY_BYTES` (413 beyond),
validates each event (a 400 names the bad field), checks that the sender may speak for each
program (403, below), then pushes the events to the scheduler over the side channel of
`server.intake.events`. Events for a program the scheduler never saw are accepted: the scheduler, in
another process, ignores what it cannot place. The wire schema is documented in
docs/events.md.

Whose program: where the server accepts several API keys (`vllm serve --api-key K1 K2 ...`),
a program belongs to the key that first named it, in a chat request's `session_id` or an
event (`server.intake.ownership`); an event about another key's program is refused with a 403.
The requests are seen by `ClaimPrograms`, an ASGI middleware this plugin adds inside vLLM's
key check. With no key or one, nothing is checked (one tenant).

What the scheduler did with the events comes back through its status file
(`server.intake.events`): `GET /v1/agent/events` shows it under `scheduler`, and `/metrics`
carries it as `harness:agent_events_total`, `harness:pins_total`,
`harness:pins_released_total{reason}` and `harness:pinned_programs`, beside vLLM's own gauges,
so a replica's pins are in its metrics; the requests this endpoint refused are
`harness:agent_event_requests_refused_total {reason}` there and `refused` in `GET
/v1/agent/events`.
"""

from __future__ import annotations

import json
import os
from argparse import Namespace
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from server.intake.agentic_context import PATHS as REQUEST_PATHS  # whose session_id opens a program
from server.intake.events import (
    ENV_API_KEY,
    ENV_EVENTS_IPC,
    REFUSALS,
    EventError,
    EventSender,
    parse_events,
    read_body,
    read_status,
)
from server.intake.ownership import (
    ProgramOwners,
    admit_events,
    credential_of,
    events_done,
    several_keys,
)

ROUTE = "/v1/agent/events"


def server_keys(app: FastAPI) -> list[str]:
    """The API keys vLLM's check accepts on `app`, as vLLM reads them: `--api-key` (a list),
    else $VLLM_API_KEY."""
    args = getattr(app.state, "args", None)
    keys = list(getattr(args, "api_key", None) or [])
    return keys or [os.environ.get(ENV_API_KEY, "")]


class AgentEventsPlugin:
    name = "harness_agent_events"
    required_tasks = None

    def __init__(self) -> None:
        self._sender: EventSender | None = None
        self.received = 0
        self.dropped = 0
        self.refused = dict.fromkeys(REFUSALS, 0)
        #: who opened each program; None: one tenant, nothing to check
        self.owners: ProgramOwners | None = None

    def attach_router(self, app: FastAPI) -> None:
        if several_keys(server_keys(app)):
            self.owners = ProgramOwners()
            # added before vLLM adds its key check (`build_app`), so it runs inside it
            app.add_middleware(ClaimPrograms, owners=self.owners)

        @app.post(ROUTE)
        async def agent_events(request: Request) -> JSONResponse:
            credential = credential_of(request.headers.get("authorization"))
            try:
                raw = await read_body(request.stream(), request.headers.get("content-length"))
                events = parse_events(raw)
                admit_events(self.owners, events, credential)
            except EventError as exc:
                self.refused[exc.reason] += 1
                return JSONResponse({"error": str(exc)}, status_code=exc.status)
            sender = self._get_sender()
            payload = [e.model_dump(exclude_none=True) for e in events]
            sent = sender.send(payload) if sender is not None else 0
            events_done(self.owners, events)
            self.received += len(events)
            self.dropped += len(events) - sent
            return JSONResponse({"accepted": len(events), "forwarded": sent})

        @app.get(ROUTE)
        async def agent_events_stats() -> JSONResponse:
            return JSONResponse(self.stats())

    def stats(self) -> dict[str, Any]:
        """`GET /v1/agent/events`: this API server's counters and the scheduler's."""
        return {"received": self.received, "dropped": self.dropped,
                "refused": dict(self.refused),
                "owners": None if self.owners is None else self.owners.stats(),
                "channel": self._address(), "scheduler": read_status(self._address())}

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        self._get_sender()
        # vllm: this plugin runs inside vLLM's API server, where it is always installed
        from vllm.v1.metrics.prometheus import get_prometheus_registry

        # once: vLLM builds one app per API server process, and `describe` names nothing,
        # so the registry could not refuse a second copy
        get_prometheus_registry().register(SchedulerCollector(self._address(), self.refused))

    @staticmethod
    def _address() -> str | None:
        return os.environ.get(ENV_EVENTS_IPC) or None

    def _get_sender(self) -> EventSender | None:
        if self._sender is None and self._address():
            self._sender = EventSender(self._address())  # type: ignore[arg-type]
        return self._sender


Message = MutableMapping[str, Any]


class ClaimPrograms:
    """ASGI middleware: a completions request opens its program (vLLM's session id: the
    body's `session_id`, else the `X-Session-ID` header, else `vllm_xargs.session_id`) for
    its key, when nobody has. It only watches the body as vLLM reads it (no copy is replayed)
    and never refuses a request."""

    def __init__(self, app: Any, owners: ProgramOwners) -> None:
        self.app = app
        self.owners = owners

    async def __call__(self, scope: Message, receive: Callable[[], Awaitable[Message]],
                       send: Any) -> None:
        if (scope["type"] != "http" or scope.get("method") != "POST"
                or scope.get("path") not in REQUEST_PATHS):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        chunks: list[bytes] = []

        async def watched() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    program = session_of(b"".join(chunks), headers)
                    if program is not None:
                        self.owners.claim(program, credential_of(headers.get("authorization")))
            return message

        await self.app(scope, watched, send)


def session_of(raw: bytes, headers: dict[str, str]) -> str | None:
    """The program a completions request names, in vLLM's order (None: none, or the body is
    not a JSON object: vLLM refuses it anyway)."""
    body: Any = None
    if b"session_id" in raw:
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = None
    if not isinstance(body, dict):
        body = {}
    xargs = body.get("vllm_xargs")
    for value in (body.get("session_id"), headers.get("x-session-id"),
                  xargs.get("session_id") if isinstance(xargs, dict) else None):
        if isinstance(value, str) and value:
            return value
    return None


class SchedulerCollector:
    """The scheduler's status file, and the requests the events endpoint refused, as
    Prometheus metrics, read at each scrape (a `prometheus_client` custom collector: `collect`
    yields metric families)."""

    def __init__(self, address: str | None, refused: dict[str, int] | None = None) -> None:
        self.address = address
        self.refused = refused if refused is not None else {}

    def describe(self) -> list[Any]:
        return []  # unknown until the first scrape: no name clash check at registration

    def collect(self) -> Any:
        # prometheus_client: vLLM's dependency, imported where the collector runs
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        refused = CounterMetricFamily("harness:agent_event_requests_refused",
                                      "POST /v1/agent/events requests refused, by reason",
                                      labels=["reason"])
        for reason, count in sorted(self.refused.items()):
            refused.add_metric([reason], count)
        yield refused
        status = read_status(self.address)
        if status is None:
            return
        pins = dict(status.get("pins") or {})
        yield CounterMetricFamily("harness:agent_events", "Agent events the scheduler took in",
                                  value=status.get("events_received", 0))
        yield CounterMetricFamily("harness:pins", "KV pins the retention policy made",
                                  value=pins.pop("pinned", 0))
        released = CounterMetricFamily("harness:pins_released",
                                       "KV pins released, by reason", labels=["reason"])
        for reason, count in sorted(pins.items()):
            if not reason.startswith("prefetch"):  # prefetches made / dropped: not releases
                released.add_metric([reason], count)
        yield released
        yield GaugeMetricFamily("harness:pinned_programs", "Programs whose KV is pinned now",
                                value=status.get("pinned_now", 0))
