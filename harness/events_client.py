"""Non-blocking sender of interception events to `POST /v1/agent/events`.

An agent must never wait on the serving engine's bookkeeping: `emit` only puts the event on a
bounded queue and returns. One background task drains the queue and sends what has gathered as
one NDJSON body. When the server is slow or gone, events are dropped and counted
(`dropped`), and the agents go on.

`emit` may be called from any thread: off the client's event loop it hands the event to that
loop. `BackgroundEventClient` runs an `EventClient` on an event loop of its own (a daemon
thread), for synchronous code such as LangChain callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any, Protocol

import httpx

from harness.model_client import api_root, auth_headers


class EventSink(Protocol):
    """What emits events: `EventClient`, `BackgroundEventClient`."""

    def emit(self, type: str, program_id: str, **fields: Any) -> None: ...


class EventClient:
    def __init__(self, base_url: str, *, max_queue: int = 10_000, timeout_s: float = 2.0,
                 max_batch: int = 512, api_key: str | None = None) -> None:
        """`api_key`: for a server started with `--api-key` (its events endpoint is behind
        the same check as its completions)."""
        self.url = api_root(base_url) + "/v1/agent/events"
        self._headers = {"content-type": "application/x-ndjson", **auth_headers(api_key)}
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=max_queue)
        self._timeout = timeout_s
        self._max_batch = max_batch
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sent = 0
        self.dropped = 0
        self._inflight = 0  # events taken off the queue and not yet accounted for

    async def __aenter__(self) -> EventClient:
        self._client = httpx.AsyncClient(timeout=self._timeout)
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._pump())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def emit(self, type: str, program_id: str, **fields: Any) -> None:
        """Queue one event; never blocks, never raises. Thread-safe."""
        event = {"type": type, "program_id": program_id, "ts": time.time(),
                 **{k: v for k, v in fields.items() if v is not None}}
        loop = self._loop
        if loop is None or _running_loop() is loop:
            self._put(event)
            return
        try:
            loop.call_soon_threadsafe(self._put, event)
        except RuntimeError:  # the loop is closed: the client is gone
            self.dropped += 1

    def _put(self, event: dict[str, Any]) -> None:
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
                    self.url, content=body, headers=self._headers)
                if response.status_code == 200:
                    forwarded = int(response.json().get("forwarded", len(batch)))
                    self.sent += forwarded
                    self.dropped += len(batch) - forwarded
                else:
                    self.dropped += len(batch)
            except (httpx.HTTPError, ValueError):
                self.dropped += len(batch)
            self._inflight = 0

    async def drain(self, timeout_s: float = 2.0) -> bool:
        """Wait until every queued event has been sent or dropped (True), or `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not self._queue.empty() or self._inflight:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def aclose(self, flush_timeout_s: float = 2.0) -> None:
        """Give queued events a moment to go out, then stop; what is left counts as dropped."""
        await self.drain(flush_timeout_s)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.dropped += self._queue.qsize() + self._inflight
        self._inflight = 0
        if self._client is not None:
            await self._client.aclose()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class BackgroundEventClient:
    """An `EventClient` on its own event loop in a daemon thread, for code without one.

    `emit` is the same non-blocking, thread-safe call as `EventClient.emit`; `flush` waits for
    what was emitted so far to be sent; `close` flushes and stops the thread.
    """

    def __init__(self, base_url: str, **options: Any) -> None:
        self.client = EventClient(base_url, **options)
        self.url = self.client.url
        self.closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="harness-events")
        self._thread.start()
        self._call(self.client.__aenter__())

    def _call(self, coro: Any, timeout_s: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def emit(self, type: str, program_id: str, **fields: Any) -> None:
        """Queue one event; never blocks, never raises."""
        if self.closed:
            self.client.dropped += 1
            return
        self.client.emit(type, program_id, **fields)

    @property
    def sent(self) -> int:
        return self.client.sent

    @property
    def dropped(self) -> int:
        return self.client.dropped

    def flush(self, timeout_s: float = 2.0) -> bool:
        """Wait until everything emitted before this call is sent or dropped."""
        if self.closed:
            return True
        return bool(self._call(self.client.drain(timeout_s), timeout_s + 1.0))

    def close(self, flush_timeout_s: float = 2.0) -> None:
        if self.closed:
            return
        self.closed = True
        self._call(self.client.aclose(flush_timeout_s), flush_timeout_s + 5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)
        self._loop.close()

    def __enter__(self) -> BackgroundEventClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
