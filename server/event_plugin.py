"""`POST /v1/agent/events` on the vLLM API server's own port (a vLLM endpoint plugin).

Registered under the `vllm.endpoint_plugins` entry point and allow-listed by `harness serve`
through `VLLM_PLUGINS`. Validates each event (a 400 names the bad field), then pushes it to the
scheduler over the side channel of `server.events`. Unknown programs are accepted: the policy
ignores what it cannot place. The wire schema is documented in docs/events.md.
"""

from __future__ import annotations

import os
from argparse import Namespace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from server.events import ENV_EVENTS_IPC, EventError, EventSender, parse_events

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
                                 "channel": self._address()})

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        self._get_sender()

    @staticmethod
    def _address() -> str | None:
        return os.environ.get(ENV_EVENTS_IPC) or None

    def _get_sender(self) -> EventSender | None:
        if self._sender is None and self._address():
            self._sender = EventSender(self._address())  # type: ignore[arg-type]
        return self._sender
