"""`eval.experiments.router_baseline` (on `eval.replay.routers`): `vllm-router` in front of two
emulated replicas.

The pure parts (request tagging, log parsing, the router command) are checked on their own; the
`server` test starts two small emulated replicas and replays a tiny trace through vllm-router
in consistent-hash mode (with the X-Session-ID header every program must stay on one replica)
and round robin (turns spread over both), with every turn found in some replica's log.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from common.trace import Program, Trace, Turn
from eval.experiments.router_baseline import MODES, run_mode
from eval.replay.http_replay import Driver
from eval.replay.routers import (
    _TaggingClient,
    router_argv,
    served_turns,
    start_replicas,
    tagging_driver,
)
from harness.model_client import session_headers


def test_tagging_client_adds_request_id_and_can_strip_the_session_header() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text="data: [DONE]\n\n")

    async def go(session_header: bool) -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            tagged = _TaggingClient(client, session_header)
            body = {"prompt": [1, 2], "session_id": "p-1@run", "vllm_xargs": {"turn": 3}}
            headers = session_headers(body)  # what http_replay sends
            async with tagged.stream("POST", "http://x/v1/completions", json=body,
                                     headers=headers) as r:
                await r.aread()
            assert body == {"prompt": [1, 2], "session_id": "p-1@run",
                            "vllm_xargs": {"turn": 3}}  # the caller's body is left alone

    asyncio.run(go(True))
    asyncio.run(go(False))
    with_header, without = seen
    assert with_header.headers["x-session-id"] == "p-1@run"
    assert "x-session-id" not in without.headers
    for request in seen:
        assert b'"request_id":"rb.p-1@run.3"' in request.content.replace(b" ", b"")


def test_tagging_driver_gives_the_replay_a_tagging_client() -> None:
    """The replay's driver comes from the factory `run_front` passes: no patching of
    `http_replay`."""
    async def go() -> Driver:
        async with httpx.AsyncClient() as client:
            make = tagging_driver(session_header=False)
            return make(tiny_trace(), client, "http://x", "m", "run", None)

    driver = asyncio.run(go())
    assert isinstance(driver, Driver)
    assert isinstance(driver.client, _TaggingClient)
    assert driver.client._session_header is False


def test_served_turns_reads_vllm_request_log(tmp_path: Path) -> None:
    log = tmp_path / "replica.log"
    log.write_text(
        "(APIServer pid=1) INFO [request_logger.py:65] Received request "
        "cmpl-rb.swe-00001@ab12.0-0: params: SamplingParams(n=1)\n"
        "(APIServer pid=1) INFO [request_logger.py:65] Received request cmpl-0f3a-0: params\n"
        "(APIServer pid=1) INFO [request_logger.py:65] Received request "
        "cmpl-rb.a.b-c@ab12.12-0: params: SamplingParams(n=1)\n")
    assert served_turns(log, 0) == [("swe-00001@ab12", 0), ("a.b-c@ab12", 12)]
    first_line = len(log.read_text().splitlines(keepends=True)[0])
    assert served_turns(log, first_line) == [("a.b-c@ab12", 12)]


def test_router_argv_names_policy_and_workers() -> None:
    argv = router_argv("round_robin", ["http://a:1", "http://b:2"], 9000, 9001)
    assert argv[1:3] == ["-m", "vllm_router.launch_router"]
    assert argv[argv.index("--policy") + 1] == "round_robin"
    i = argv.index("--worker-urls")
    assert argv[i + 1:i + 3] == ["http://a:1", "http://b:2"]
    assert argv[argv.index("--port") + 1] == "9000"
    assert argv[argv.index("--prometheus-port") + 1] == "9001"


def tiny_trace() -> Trace:
    programs = [
        Program(id=f"rb-{n}", arrival_s=0.1 * n, shared_prefix_tokens=128,
                shared_prefix_id="sys",
                turns=[Turn(input_tokens=300 + 30 * n, output_tokens=8, tool="bash",
                            tool_seconds=0.1, tool_return_tokens=40),
                       Turn(input_tokens=10, output_tokens=8, tool="bash", tool_seconds=0.1,
                            tool_return_tokens=40),
                       Turn(input_tokens=0, output_tokens=8)])
        for n in range(4)]
    return Trace(name="rb-tiny", programs=programs)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("vllm_router")
    out = tmp_path_factory.mktemp("router-baseline")
    started = start_replicas(2, "vllm", "h100-llama-3.1-8b", 256, out)
    try:
        yield started, out
    finally:
        for replica in started:
            replica.stop()


@pytest.mark.server
@pytest.mark.slow
def test_vllm_router_hash_keeps_programs_and_round_robin_spreads(replicas) -> None:
    servers, out = replicas
    trace = tiny_trace()

    hashed = run_mode(MODES["vr-hash"], trace, servers, out, 1.0)
    assert hashed.programs == 4 and hashed.metrics["programs"] == 4
    assert hashed.untracked_turns == 0 and sum(hashed.turns_per_replica) == 12
    assert hashed.split_programs == 0  # X-Session-ID: one replica per program
    assert hashed.metrics["prefix_hit_rate"] > 0.3  # later turns find the earlier ones
    assert hashed.cache_reset

    spread = run_mode(MODES["vr-rr"], trace, servers, out, 1.0)
    assert spread.untracked_turns == 0 and sum(spread.turns_per_replica) == 12
    assert min(spread.turns_per_replica) > 0
    assert spread.split_programs >= 1
