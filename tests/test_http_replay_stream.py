"""Streams read as the SSE format cuts them. A token whose text holds a line separator that JSON
leaves unescaped (U+2028, U+0085) is one line, not two halves that do not parse (httpx's
`aiter_lines` split there: the soak counted such turns as malformed streams). A stream the
server really breaks is its error, said as one: the replay raises `HttpReplayError` naming the
turn (a soak counts it as refused), never a bare ValueError or httpx's StreamError, which
escaped every count before."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from common.trace import Program, Trace, Turn
from eval.replay.http_replay import HttpReplayError, replay_over_http


class _Server(BaseHTTPRequestHandler):
    """An OpenAI-shaped server whose completions stream sends `STREAM`."""

    STREAM = b""

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
            self._send(200, self.STREAM, "text/event-stream")
        else:
            self._send(200, b"{}")


def _serving(stream: bytes):
    handler = type("Handler", (_Server,), {"STREAM": stream})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _trace(output_tokens: int) -> Trace:
    return Trace(name="t", programs=[Program(id="p", arrival_s=0.0, turns=[
        Turn(input_tokens=50, output_tokens=output_tokens)])])


def test_a_token_holding_a_line_separator_is_one_line():
    chunk = {"choices": [{"text": "a\u2028b\x85c", "token_ids": [1, 2]}]}
    body = ("data: " + json.dumps(chunk, ensure_ascii=False) + "\r\n\r\n"
            + "data: [DONE]\n\n").encode()
    server, url = _serving(body)
    try:
        result = replay_over_http(_trace(2), url)
    finally:
        server.shutdown()
    record = next(iter(result.programs.values()))
    assert record.turns[0].first_token is not None


def test_a_malformed_stream_line_is_the_servers_error_named_by_turn():
    server, url = _serving(b'data: {"choices": [{"token_ids": [1, 2\n\n')
    try:
        with pytest.raises(HttpReplayError, match="program 'p' turn 0.*malformed stream line"):
            replay_over_http(_trace(4), url)
    finally:
        server.shutdown()
