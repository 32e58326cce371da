"""What interception events cost an agent per tool call.

Prints (1) the time `EventClient.emit` takes on the agent's path (it only queues), and (2) the
end-to-end time for a tool call's two events (tool_start + tool_end) to be accepted by a real
`harness serve` (the background sender's cost, off the agent's path).

    harness eval event-overhead [--server URL] [--calls 2000]
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import httpx

from eval import ExperimentError
from harness.events_client import EventClient
from harness.server_process import ServerProcess


async def measure(base_url: str, calls: int) -> None:
    async with EventClient(base_url) as events:
        started = time.perf_counter()
        for i in range(calls):
            events.emit("tool_start", f"overhead-{i % 16}", tool="bash", predicted_s=1.0)
            events.emit("tool_end", f"overhead-{i % 16}", tool="bash", seconds=1.0,
                        return_tokens=100)
        emit_us = (time.perf_counter() - started) / calls * 1e6
    async with httpx.AsyncClient() as client:
        body = (b'{"type":"tool_start","program_id":"overhead","tool":"bash"}\n'
                b'{"type":"tool_end","program_id":"overhead","tool":"bash","seconds":1.0}')
        samples = []
        for _ in range(200):
            t = time.perf_counter()
            response = await client.post(base_url + "/v1/agent/events", content=body)
            samples.append((time.perf_counter() - t) * 1e3)
            assert response.status_code == 200
    print(f"emit() on the agent's path: {emit_us:.1f} us per tool call (2 events), "
          f"sent {events.sent}, dropped {events.dropped}")
    print(f"POST of one tool call's 2 events to the server: median "
          f"{statistics.median(samples):.2f} ms, p95 {sorted(samples)[189]:.2f} ms")


class EventOverheadError(ExperimentError):
    """A measurement that cannot be made as asked (printed without a traceback)."""


@dataclass(frozen=True)
class EventOverheadOptions:
    """One measurement (each field is an option of `harness eval event-overhead`)."""

    server: str | None = field(default=None, metadata={
        "help": "a running harness serve (default: start one with --policy continuum)"})
    calls: int = field(default=2000, metadata={"help": "tool calls to time"})

    def __post_init__(self) -> None:
        if self.calls < 1:
            raise EventOverheadError(f"--calls {self.calls}: give at least 1")


def run_event_overhead(options: EventOverheadOptions) -> None:
    """Measure against `server` (a base URL), or a `harness serve --policy continuum` started
    for it when None."""
    server, calls = options.server, options.calls
    if server:
        asyncio.run(measure(server.rstrip("/"), calls))
    else:
        with ServerProcess(policy="continuum") as process:
            asyncio.run(measure(process.base_url, calls))
