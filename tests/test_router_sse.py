"""The router's relay of a streamed answer: a replica lost mid-line sends the client no half
line, only the error event naming it (a half line followed by the event read as a malformed
JSON line, which the client could only report as the stream's own corruption)."""

from __future__ import annotations

import asyncio
import json

import httpx

from cluster.config import parse_cluster
from cluster.router_sse import relay_sse
from cluster.router_state import ClusterState, ReplicaEndpoint
from cluster.routers import make_router


class _CutMidLine(httpx.AsyncByteStream):
    """One whole event, then half of the next, then the connection drops."""

    async def __aiter__(self):
        yield b'data: {"choices": [{"token_ids": [1]}]}\n\n'
        yield b'data: {"choices": [{"token_ids": [2'
        raise httpx.RemoteProtocolError("peer closed connection")

    async def aclose(self) -> None:
        pass


def _state() -> ClusterState:
    config = parse_cluster({"router": {"strategy": "programs"},
                            "replicas": [{"name": "r", "count": 1}]})
    return ClusterState([ReplicaEndpoint("r0", "colocated", "http://127.0.0.1:9100")],
                        make_router(config.router))


def test_a_replica_lost_mid_line_sends_whole_lines_then_the_error_event():
    state = _state()
    replica = state.replicas["r0"]
    replica.in_flight = 1
    answer = httpx.Response(200, stream=_CutMidLine())

    async def relay() -> bytes:
        return b"".join([chunk async for chunk in relay_sse(state, replica, answer, None)])

    body = asyncio.run(relay()).decode()
    data = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")]
    parsed = [json.loads(d) for d in data]  # every line the client gets is whole JSON
    assert parsed[0]["choices"][0]["token_ids"] == [1]
    assert "error" in parsed[-1] and "r0" in json.dumps(parsed[-1])
    assert len(parsed) == 2 and not replica.alive and replica.in_flight == 0
