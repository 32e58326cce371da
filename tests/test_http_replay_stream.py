"""A stream the server breaks is the server's error, said as one: the replay raises
`HttpReplayError` naming the turn (a soak counts it as refused), never a bare ValueError from
the JSON parser or httpx's StreamError, which escaped every count before."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from common.trace import Program, Trace, Turn
from eval.replay.http_replay import HttpReplayError, replay_over_http


class _Broken(BaseHTTPRequestHandler):
    """An OpenAI-shaped server whose completions stream sends a line that is not JSON."""

    def log_message(self, *args):  # quiet
        pass

    def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": "m", "max_model_len": 4096}]}).encode())
        else:
            self._send(404, b"{}")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/completions":
            self._send(200, b'data: {"choices": [{"token_ids": [1, 2\n\n', "text/event-stream")
        else:
            self._send(200, b"{}")


@pytest.fixture
def broken_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Broken)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_malformed_stream_line_is_the_servers_error_named_by_turn(broken_server):
    trace = Trace(name="t", programs=[Program(id="p", arrival_s=0.0, turns=[
        Turn(input_tokens=50, output_tokens=4)])])
    with pytest.raises(HttpReplayError, match="program 'p' turn 0.*malformed stream line"):
        replay_over_http(trace, broken_server)
