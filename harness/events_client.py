"""Non-blocking sender of interception events to `POST /v1/agent/events`.

An agent must never wait on the serving engine's bookkeeping: `emit` only puts the event on a
bounded queue and returns. One background task drains the queue and sends what has gathered as
one NDJSON body. When the server is slow or gone, events are dropped and counted
(`dropped`), and the agents go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import httpx


class EventClient:
    def __init__(self, base_url: str, *, max_queue: int = 10_000, timeout_s: float = 2.0,
                 max_batch: int = 512) -> None:
        self.url = base_url.rstrip("/") + "/v1/agent/events"
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=max_queue)
        self._timeout = timeout_s
        self._max_batch = max_batch
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.dropped = 0
        self._inflight = 0  # events taken off the queue and not yet accounted for

    async def __aenter__(self) -> EventClient:
        self._client = httpx.AsyncClient(timeout=self._timeout)
        self._task = asyncio.create_task(self._pump())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def emit(self, type: str, program_id: str, **fields: Any) -> None:
        """Queue one event; never blocks, never raises."""
        event = {"type": type, "program_id": program_id, "ts": time.time(),
                 **{k: v for k, v in fields.items() if v is not None}}
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1

    async def _pump(self) -> None:
        assert self._client is not None
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            self._inflight = len(batch)
            body = "\n".join(json.dumps(e) for e in batch).encode()
            try:
                response = await self._client.post(
                    self.url, content=body, headers={"content-type": "application/x-ndjson"})
                if response.status_code == 200:
                    forwarded = int(response.json().get("forwarded", len(batch)))
                    self.sent += forwarded
                    self.dropped += len(batch) - forwarded
                else:
                    self.dropped += len(batch)
            except (httpx.HTTPError, ValueError):
                self.dropped += len(batch)
            self._inflight = 0

    async def aclose(self, flush_timeout_s: float = 2.0) -> None:
        """Give queued events a moment to go out, then stop; what is left counts as dropped."""
        deadline = time.monotonic() + flush_timeout_s
        while (not self._queue.empty() or self._inflight) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.dropped += self._queue.qsize() + self._inflight
        self._inflight = 0
        if self._client is not None:
            await self._client.aclose()
