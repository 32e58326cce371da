"""The bash tool's reader of a command's output stream, without Docker: Docker's multiplexed
frames over a socket pair, output that came with the HTTP headers (docker-py#3332), a stream
cut short, and giving up on a stream that never ends."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from types import SimpleNamespace
from typing import Any

from harness.tools.bash_exec import ExecReader, _Socket, wait_done
from harness.tools.bash_output import HeadTailCapture


def frame(data: bytes, stream: int = 1) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


class FakeAPI:
    """``exec_start(socket=True)`` as the SDK gives it on a unix socket: the SocketIO under
    the buffered reader that parsed the response (kept as ``_response``)."""

    def __init__(self, sock: socket.socket, buffered: bool = False) -> None:
        self.fp = sock.makefile("rb")
        if buffered:
            self.fp.peek(1)  # what is on the socket now goes into the reader's buffer
        self.raw = self.fp.raw
        self.raw._response = SimpleNamespace(raw=SimpleNamespace(_fp=SimpleNamespace(fp=self.fp)))

    def exec_start(self, exec_id: str, socket: bool) -> Any:
        assert socket
        return self.raw


def read(api: FakeAPI, then: Any = None, limit: float = 5.0) -> tuple[ExecReader, bool]:
    async def go() -> tuple[ExecReader, bool]:
        reader = ExecReader(api, "e" * 64, HeadTailCapture(1000, 1000))
        reader.start()
        if then is not None:
            await asyncio.to_thread(then, reader)
        return reader, await wait_done(reader.done, limit)

    return asyncio.run(go())


def test_frames_of_both_streams_in_order() -> None:
    ours, engine = socket.socketpair()
    engine.sendall(frame(b"hello ") + frame(b"", 1) + frame(b"oops ", 2) + frame(b"world\n"))
    engine.close()
    reader, done = read(FakeAPI(ours))
    assert done and reader.error is None
    assert reader.capture.text() == ("hello oops world\n", 0)


def test_frames_split_across_writes() -> None:
    ours, engine = socket.socketpair()
    data = frame(b"a" * 5000) + frame(b"b" * 3)

    def write() -> None:
        for i in range(0, len(data), 7):  # headers and data cut anywhere
            engine.sendall(data[i:i + 7])
            if i % 700 == 0:
                time.sleep(0.001)
        engine.close()

    threading.Thread(target=write).start()
    reader, done = read(FakeAPI(ours))
    assert done and reader.error is None
    assert reader.capture.total_bytes == 5003 and reader.capture.tail.endswith(b"abbb")


def test_output_read_with_the_headers_is_kept() -> None:
    ours, engine = socket.socketpair()
    engine.sendall(frame(b"early "))
    api = FakeAPI(ours, buffered=True)  # "early" is in the reader's buffer, not the socket
    engine.sendall(frame(b"late\n"))
    engine.close()
    reader, done = read(api)
    assert done and reader.capture.text() == ("early late\n", 0)


def test_a_stream_cut_short_keeps_what_came() -> None:
    ours, engine = socket.socketpair()
    engine.sendall(frame(b"whole ") + frame(b"partial and more")[:15])
    engine.close()
    reader, done = read(FakeAPI(ours))
    assert done and reader.error is None and reader.capture.text() == ("whole partial", 0)


def test_shutdown_gives_up_on_an_open_stream() -> None:
    ours, engine = socket.socketpair()
    engine.sendall(frame(b"started\n"))  # ... and the engine never closes the stream

    def give_up(reader: ExecReader) -> None:
        time.sleep(0.3)
        reader.shutdown()

    t0 = time.monotonic()
    reader, done = read(FakeAPI(ours), then=give_up, limit=2.0)
    assert done and time.monotonic() - t0 < 1.5
    assert reader.error is None and reader.capture.text() == ("started\n", 0)
    engine.close()


def test_shutdown_before_the_stream_opens() -> None:
    ours, engine = socket.socketpair()
    engine.sendall(frame(b"kept\n"))
    api = FakeAPI(ours, buffered=True)
    start = api.exec_start

    def slow_start(exec_id: str, socket: bool) -> Any:
        time.sleep(0.3)  # shutdown() comes while the exec is being started
        return start(exec_id, socket)

    api.exec_start = slow_start  # type: ignore[method-assign]

    def give_up(reader: ExecReader) -> None:
        time.sleep(0.05)
        reader.shutdown()

    reader, done = read(api, then=give_up, limit=2.0)
    assert done and reader.error is None
    assert reader.capture.text() == ("kept\n", 0)  # what came with the headers is kept
    engine.close()


def test_a_broken_connection_reads_as_the_end() -> None:
    class Broken:
        def recv(self, n: int) -> bytes:
            raise ConnectionResetError(104, "Connection reset by peer")

    sock = _Socket(Broken(), b"ab", threading.Event())
    assert sock.recv(1) == b"a" and sock.recv(5) == b"b" and sock.recv(5) == b""


def test_an_engine_error_is_reported() -> None:
    class Failing:
        def exec_start(self, exec_id: str, socket: bool) -> Any:
            raise RuntimeError("no such exec")

    reader, done = read(Failing())  # type: ignore[arg-type]
    assert done and isinstance(reader.error, RuntimeError)
