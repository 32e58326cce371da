"""Reading one command's output off its ``docker exec`` stream, in a thread of its own.

The reader runs in its own daemon thread rather than asyncio's default thread pool, so
that many programs running long commands at once do not exhaust that pool.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import threading
from typing import Any

from harness.tools.bash_output import HeadTailCapture


class ExecReader:
    """The output reader of one command, running in its own daemon thread."""

    def __init__(self, api: Any, exec_id: str, capture: HeadTailCapture) -> None:
        self.api = api
        self.exec_id = exec_id
        self.capture = capture
        self.abort = threading.Event()
        loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self.error: BaseException | None = None
        self._sock: Any = None
        self._pending = b""

    def start(self) -> None:
        name = f"bash-exec-{self.exec_id[:12]}"
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            raw = self.api.exec_start(self.exec_id, socket=True)
            sock = getattr(raw, "_sock", raw)  # SocketIO on a unix socket: its socket
            self._sock = sock
            try:
                self._pending = self._drain_buffered(raw, sock)
                sock.settimeout(None)
                self._read_frames()
            finally:
                raw.close()
                sock.close()
        except BaseException as exc:  # noqa: BLE001 - reported to the awaiting coroutine
            self.error = exc
        finally:
            try:
                self._loop.call_soon_threadsafe(self._finish)
            except RuntimeError:  # the loop is closed: no one is waiting any more
                pass

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    @staticmethod
    def _drain_buffered(raw: Any, sock: Any) -> bytes:
        """Stream bytes that http.client's buffered reader took along with the headers.

        The SDK hands out the raw socket beneath the reader that parsed the HTTP
        response, so output that arrived together with the headers would be lost
        (docker/docker-py#3332).  With the socket non-blocking, read1 returns what is
        buffered (and what is ready on the socket) without waiting.
        """
        try:
            reader = raw._response.raw._fp.fp
        except AttributeError:
            return b""
        out = bytearray()
        sock.settimeout(0)
        try:
            while chunk := reader.read1(65536):
                out += chunk
        except OSError:  # BlockingIOError: nothing more is ready
            pass
        return bytes(out)

    def _recv(self, n: int) -> bytes:
        """Up to n bytes; b'' at the end of the stream or when aborted."""
        if self._pending:
            data, self._pending = self._pending[:n], self._pending[n:]
            return data
        while not self.abort.is_set():
            ready, _, _ = select.select([self._sock], [], [], 0.2)
            if ready:
                try:
                    return self._sock.recv(n)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    return b""
        return b""

    def _read_exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._recv(n - len(buf))
            if not chunk:
                break
            buf += chunk
        return bytes(buf)

    def _read_frames(self) -> None:
        """Docker's multiplexed stream: 8-byte header (stream, 3 zero bytes, size), then data."""
        while True:
            header = self._read_exactly(8)
            if len(header) < 8:
                return
            _stream, size = struct.unpack(">BxxxL", header)
            while size > 0:
                chunk = self._recv(min(size, 65536))
                if not chunk:
                    return
                self.capture.add(chunk)
                size -= len(chunk)

    def shutdown(self) -> None:
        """Give up on the stream: make the reader return now."""
        self.abort.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


async def wait_done(done: asyncio.Future[None], timeout: float) -> bool:
    """Wait up to ``timeout`` s for the reader to finish; True when it has."""
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout)
    except TimeoutError:
        return False
    return True
