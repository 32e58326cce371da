"""API keys: `harness run --server URL --api-key KEY` (or $HARNESS_API_KEY, else
$OPENAI_API_KEY) sends `Authorization: Bearer KEY` with model calls and events; `harness
serve --api-key` and `harness cluster serve --api-key` require it; the router passes a
client's key on to its replicas. Clients are checked against a real local HTTP server that
does what vLLM's `--api-key` check does; the end-to-end test (server-marked) runs
`harness serve --api-key` itself."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from cli.main import main
from cluster.config import RouterSpec
from cluster.router_app import create_app
from cluster.router_state import ReplicaEndpoint
from harness.events_client import EventClient
from harness.model_client import ChatClient, ModelError, Retries, api_key_of
from harness.run import RunError, check_reachable, server_events_received

KEY = "sk-test-123"


class _KeyedServer(BaseHTTPRequestHandler):
    """A vLLM-like server started with `--api-key KEY`: /v1 needs the key, /health does not;
    it records the Authorization header of each request."""

    seen: list[tuple[str, str | None]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        auth = self.headers.get("authorization")
        self.seen.append((self.path, auth))
        if self.path.startswith("/v1") and auth != f"Bearer {KEY}":
            return self._answer(401, {"error": "Unauthorized"})
        if self.path == "/v1/chat/completions":
            return self._answer(200, {"choices": [{"message": {"content": "ok"},
                                                   "finish_reason": "stop"}],
                                      "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
        if self.path == "/v1/agent/events":
            if self.command == "GET":
                return self._answer(200, {"received": 7})
            return self._answer(200, {"forwarded": len(body.splitlines())})
        return self._answer(200, {"data": [{"id": "m"}]})

    do_GET = do_POST = _handle


@pytest.fixture
def keyed_server() -> Iterator[str]:
    _KeyedServer.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeyedServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_model_calls_and_events_carry_the_key(keyed_server):
    async def scenario() -> int:
        client = ChatClient(keyed_server, "m", api_key=KEY, stream=False, retries=Retries(0))
        reply = await client.complete([{"role": "user", "content": "hi"}], program_id="p1")
        await client.aclose()
        async with EventClient(keyed_server, api_key=KEY) as events:
            events.emit("tool_start", "p1", tool="bash")
            await events.drain()
            sent = events.sent
        assert reply.text == "ok"
        return sent

    assert asyncio.run(scenario()) == 1
    assert ("/v1/chat/completions", f"Bearer {KEY}") in _KeyedServer.seen
    assert ("/v1/agent/events", f"Bearer {KEY}") in _KeyedServer.seen
    assert server_events_received(keyed_server, KEY) == 7
    assert server_events_received(keyed_server) is None  # refused without the key


def test_without_the_key_the_server_refuses_and_run_says_so(keyed_server):
    async def call() -> None:
        client = ChatClient(keyed_server, "m", stream=False, retries=Retries(0))
        try:
            await client.complete([{"role": "user", "content": "hi"}])
        finally:
            await client.aclose()

    with pytest.raises(ModelError, match="401"):
        asyncio.run(call())
    assert _KeyedServer.seen[-1] == ("/v1/chat/completions", None)  # no header at all
    with pytest.raises(RunError, match="answered 401 Unauthorized: it wants an API key"):
        check_reachable(keyed_server)
    with pytest.raises(RunError, match="does not take this API key"):
        check_reachable(keyed_server, "wrong")
    check_reachable(keyed_server, KEY)


def test_the_key_comes_from_the_option_then_ours_then_openais(monkeypatch):
    monkeypatch.delenv("HARNESS_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert api_key_of(None) is None
    monkeypatch.setenv("OPENAI_API_KEY", "openai")
    assert api_key_of(None) == "openai"
    monkeypatch.setenv("HARNESS_API_KEY", "ours")
    assert api_key_of(None) == "ours"
    assert api_key_of("given") == "given"


def test_run_takes_a_key_only_for_a_running_server(capsys):
    assert main(["run", "gsm8k", "--api-key", KEY, "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harness: error: --api-key is the key of a running server")


def test_serve_passes_its_key_in_the_environment_not_the_command_line(monkeypatch):
    started: dict[str, Any] = {}

    def execvpe(file: str, argv: list[str], env: dict[str, str]) -> None:
        started.update(argv=argv, env=env)

    monkeypatch.setattr("cli.serve.os.execvpe", execvpe)  # what would become `vllm serve`
    main(["serve", "--api-key", KEY])
    assert started["env"]["VLLM_API_KEY"] == KEY and KEY not in started["argv"]


# -- the cluster router --------------------------------------------------------------------
class _Replicas:
    """Replicas behind an httpx mock transport that record each request's Authorization."""

    def __init__(self) -> None:
        self.auth: list[tuple[str, str | None]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.auth.append((request.url.path, request.headers.get("authorization")))
        if request.url.path == "/v1/agent/events":
            return httpx.Response(200, json={"forwarded": 1})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return httpx.Response(200, json={"usage": {"prompt_tokens": 1}})


def _router(api_key: str | None) -> tuple[Any, _Replicas]:
    replicas = _Replicas()
    app = create_app([ReplicaEndpoint("a", "colocated", "http://127.0.0.1:9301")],
                     RouterSpec(strategy="session"), name="keyed", poll_interval_s=None,
                     transport=httpx.MockTransport(replicas), api_key=api_key)
    return app, replicas


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "session_id": "p"}
EVENT = {"type": "tool_start", "program_id": "p", "tool": "bash"}


def test_a_router_with_a_key_refuses_clients_without_it():
    app, replicas = _router(KEY)
    with TestClient(app) as client:
        for method, path, body in (("POST", "/v1/chat/completions", CHAT),
                                   ("POST", "/v1/agent/events", EVENT),
                                   ("GET", "/v1/models", None), ("GET", "/v1/cluster", None)):
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                answer = client.request(method, path, json=body, headers=headers)
                assert answer.status_code == 401, path
                assert "Authorization: Bearer KEY" in answer.json()["error"]["message"]
        assert client.get("/health").status_code == 200  # probes stay open
    assert replicas.auth == []  # nothing reached a replica


def test_a_router_passes_the_clients_key_on_to_the_replicas():
    for router_key in (KEY, None):  # its own key, or open in front of keyed replicas
        app, replicas = _router(router_key)
        auth = {"Authorization": f"Bearer {KEY}"}
        with TestClient(app) as client:
            assert client.post("/v1/chat/completions", json=CHAT, headers=auth).status_code == 200
            assert client.post("/v1/agent/events", json=EVENT, headers=auth).status_code == 200
            assert client.get("/v1/models", headers=auth).status_code == 200
        assert replicas.auth == [("/v1/chat/completions", f"Bearer {KEY}"),
                                 ("/v1/agent/events", f"Bearer {KEY}"),
                                 ("/v1/models", f"Bearer {KEY}")]


def test_a_clusters_replicas_want_the_routers_key(tmp_path):
    from cluster.config import ClusterConfig
    from cluster.launcher import replica_command

    config = ClusterConfig.model_validate({"replicas": [{"name": "a"}]})
    argv, env = replica_command(config, config.replicas[0], 9400, api_key=KEY)
    assert env["VLLM_API_KEY"] == KEY and KEY not in argv
    assert "VLLM_API_KEY" not in replica_command(config, config.replicas[0], 9400)[1]


@pytest.mark.server
@pytest.mark.slow
def test_harness_serve_with_a_key_end_to_end():
    """The real `harness serve --api-key` (vLLM's check, our events endpoint behind it)."""
    from harness.server_process import ServerProcess

    with ServerProcess(policy="vllm", serve_args=["--api-key", KEY]) as server:
        url = server.base_url

        async def scenario() -> tuple[str, int]:
            client = ChatClient(url, "llama-3.1-8b", api_key=KEY, retries=Retries(0))
            reply = await client.complete([{"role": "user", "content": "hi"}],
                                          program_id="p1", max_tokens=4)
            await client.aclose()
            async with EventClient(url, api_key=KEY) as events:
                events.emit("tool_start", "p1", tool="bash")
                await events.drain()
                return reply.finish_reason or "", events.sent

        finish, sent = asyncio.run(scenario())
        assert finish in ("stop", "length") and sent == 1
        assert (server_events_received(url, KEY) or 0) >= 1
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.post(url + "/v1/agent/events", json=EVENT).status_code == 401
        check_reachable(url, KEY)
        with pytest.raises(RunError, match="wants an API key"):
            check_reachable(url)


@pytest.mark.server
@pytest.mark.slow
def test_harness_cluster_serve_with_a_key_end_to_end(tmp_path):
    """A real one-replica `harness cluster serve` with its key from HARNESS_CLUSTER_API_KEY:
    the router and the replica both want it, and requests with it go through."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from harness.server_process import free_port

    root = Path(__file__).resolve().parent.parent
    spec = tmp_path / "keyed.yaml"
    spec.write_text(json.dumps({"name": "keyed", "replicas": [
        {"name": "r0", "policy": "vllm", "num_gpu_blocks": 256}]}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "cluster.out"
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "cluster", "serve", str(spec), "--port", str(port),
         "--base-port", str(free_port()), "--log-dir", str(tmp_path / "logs")],
        stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=root, start_new_session=True,
        env={**os.environ, "HARNESS_CLUSTER_API_KEY": KEY})
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        deadline = time.monotonic() + 420
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert httpx.get(url + "/v1/cluster", timeout=5).status_code == 401
        replica = httpx.get(url + "/v1/cluster", headers=auth, timeout=5).json()["replicas"][0]
        assert httpx.get(replica["url"] + "/v1/models", timeout=5).status_code == 401
        answer = httpx.post(url + "/v1/chat/completions", headers=auth, timeout=60, json={
            **CHAT, "model": "llama-3.1-8b", "max_tokens": 4})
        assert answer.status_code == 200, answer.text
        events = httpx.post(url + "/v1/agent/events", headers=auth, json=EVENT, timeout=10)
        assert events.status_code == 200 and events.json()["forwarded"] == 1
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
