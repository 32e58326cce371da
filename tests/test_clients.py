"""The agent-side event client never blocks an agent and never loses count."""

from __future__ import annotations

import asyncio
import time

import pytest

from common.processes import free_port
from harness.events_client import EventClient


def test_server_gone_events_are_dropped_and_counted():
    async def scenario() -> tuple[EventClient, float]:
        async with EventClient(f"http://127.0.0.1:{free_port()}", timeout_s=0.5) as events:
            started = time.perf_counter()
            for i in range(50):
                events.emit("tool_start", f"p{i}", tool="bash")
            emit_s = time.perf_counter() - started
            await asyncio.sleep(0.2)
        return events, emit_s

    events, emit_s = asyncio.run(scenario())
    assert emit_s < 0.05  # queued, not sent, on the agent's path
    assert events.sent == 0 and events.dropped == 50


def test_full_queue_drops_instead_of_blocking():
    async def scenario() -> EventClient:
        events = EventClient(f"http://127.0.0.1:{free_port()}", max_queue=5)
        for i in range(8):  # no sender task running: the queue fills
            events.emit("tool_end", "p", seconds=float(i))
        await events.aclose(flush_timeout_s=0)
        return events

    events = asyncio.run(scenario())
    assert events.dropped == 8 and events.sent == 0


def test_model_client_gives_a_clear_error_when_the_server_is_down():
    import pytest

    from harness.model_client import ChatClient, ModelError, Retries

    async def scenario() -> None:
        client = ChatClient(f"http://127.0.0.1:{free_port()}", "m",
                            retries=Retries(max_retries=1, backoff_s=0.01))
        try:
            await client.complete([{"role": "user", "content": "hi"}], program_id="p")
        finally:
            await client.aclose()

    with pytest.raises(ModelError, match="unreachable"):
        asyncio.run(scenario())


@pytest.mark.parametrize("typed", ["127.0.0.1:8000", "http://127.0.0.1:8000/",
                                   "http://127.0.0.1:8000/v1", " http://127.0.0.1:8000/v1/ "])
def test_every_client_reads_a_server_url_the_same_way(typed):
    from harness.model_client import api_root

    assert api_root(typed) == "http://127.0.0.1:8000"
