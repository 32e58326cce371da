"""`POST /v1/agent/events` on the vLLM API server's own port (a vLLM endpoint plugin).

Registered under the `vllm.endpoint_plugins` entry point and allow-listed by `harness serve`
through `VLLM_PLUGINS`. Validates each event (a 400 names the bad field), then pushes it to the
scheduler over the side channel of `server.events`. Unknown programs are accepted: the policy
ignores what it cannot place. The wire schema is documented in docs/events.md.

What the scheduler did with them comes back through its status file (`server.events`): `GET
/v1/agent/events` shows it under `scheduler`, and `/metrics` carries it as
`harness:agent_events_total`, `harness:pins_total`, `harness:pins_released_total{reason}` and
`harness:pinned_programs`, beside vLLM's own gauges, so a replica's pins are in its metrics.
"""

from __future__ import annotations

import os
from argparse import Namespace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from server.events import ENV_EVENTS_IPC, EventError, EventSender, parse_events, read_status

ROUTE = "/v1/agent/events"


class AgentEventsPlugin:
    name = "harness_agent_events"
    required_tasks = None

    def __init__(self) -> None:
        self._sender: EventSender | None = None
        self.received = 0
        self.dropped = 0

    def attach_router(self, app: FastAPI) -> None:
        @app.post(ROUTE)
        async def agent_events(request: Request) -> JSONResponse:
            try:
                events = parse_events(await request.body())
            except EventError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            sender = self._get_sender()
            payload = [e.model_dump(exclude_none=True) for e in events]
            sent = sender.send(payload) if sender is not None else 0
            self.received += len(events)
            self.dropped += len(events) - sent
            return JSONResponse({"accepted": len(events), "forwarded": sent})

        @app.get(ROUTE)
        async def agent_events_stats() -> JSONResponse:
            return JSONResponse({"received": self.received, "dropped": self.dropped,
                                 "channel": self._address(),
                                 "scheduler": read_status(self._address())})

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        self._get_sender()
        if self._address():
            # vllm: this plugin runs inside vLLM's API server, where it is always installed
            from vllm.v1.metrics.prometheus import get_prometheus_registry

            # once: vLLM builds one app per API server process, and `describe` names nothing,
            # so the registry could not refuse a second copy
            get_prometheus_registry().register(SchedulerCollector(self._address()))

    @staticmethod
    def _address() -> str | None:
        return os.environ.get(ENV_EVENTS_IPC) or None

    def _get_sender(self) -> EventSender | None:
        if self._sender is None and self._address():
            self._sender = EventSender(self._address())  # type: ignore[arg-type]
        return self._sender


class SchedulerCollector:
    """The scheduler's status file as Prometheus metrics, read at each scrape (a
    `prometheus_client` custom collector: `collect` yields metric families)."""

    def __init__(self, address: str | None) -> None:
        self.address = address

    def describe(self) -> list[Any]:
        return []  # unknown until the first scrape: no name clash check at registration

    def collect(self) -> Any:
        # prometheus_client: vLLM's dependency, imported where the collector runs
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
