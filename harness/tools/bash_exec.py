"""Reading one command's output off its ``docker exec`` stream, in a thread of its own.

The stream is Docker's multiplexed format (frames of an 8-byte header and data); the
docker SDK's ``docker.utils.socket.frames_iter`` parses it.  The rest of the SDK's reading
path does not give what the bash tool guarantees, so three parts stay ours:

* ``consume_socket_output`` (and ``exec_start(stream=True)``) keep the whole output in
  memory; a command may write gigabytes, so the frames go into a bounded
  ``HeadTailCapture`` as they arrive.  ``demux_adaptor`` is not needed: the runner script
  merges stderr into stdout, so that the agent sees both in the order they were written.
* The SDK hands out the raw socket beneath the reader that parsed the HTTP response, so
  output that arrived together with the headers would be lost (docker/docker-py#3332,
  #425): ``_drain_buffered`` takes it out of that reader first, and ``_Socket`` serves it
  before the socket's own bytes.
* The SDK's ``read`` waits on the socket with no timeout and raises on a broken
  connection.  The tool must be able to give up on a stream that never ends (the host-side
  deadline, a cancelled program): ``shutdown`` shuts the socket down, which wakes that
  wait, and ``_Socket`` then reads the end of the stream.  A connection that breaks (the
  engine died) also reads as the end of the stream; what happened is then found by the
  next call to the engine, which raises the tool's ``SandboxError``.

The reader runs in its own daemon thread rather than asyncio's default thread pool, so
that many programs running long commands at once do not exhaust that pool.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from harness.tools.bash_output import HeadTailCapture


class _Socket:
    """The exec's socket as ``frames_iter`` reads it: first the bytes that were read along
    with the HTTP headers, then the socket's; the end of the stream once aborted or broken.

    The SDK waits for the socket to be readable before each read, also while bytes are
    pending here: those then come with the socket's next bytes or the end of the stream.
    Nothing is lost or reordered, and the capture is only read once the stream has ended.
    """

    def __init__(self, sock: Any, pending: bytes, abort: threading.Event) -> None:
        self._sock = sock
        self._pending = pending
        self._abort = abort

    def fileno(self) -> int:
        return self._sock.fileno()

    def recv(self, n: int) -> bytes:
        """Up to n bytes; b'' at the end of the stream, when aborted or when it broke."""
        if self._pending:
            data, self._pending = self._pending[:n], self._pending[n:]
            return data
        if self._abort.is_set():
            return b""
        try:
            return self._sock.recv(n)
        except OSError:
            return b""


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

    def start(self) -> None:
        name = f"bash-exec-{self.exec_id[:12]}"
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            # docker SDK: start-up cost (imported here, once the first command runs)
            from docker.utils.socket import frames_iter  # type: ignore[import-untyped]

            raw = self.api.exec_start(self.exec_id, socket=True)
            sock = getattr(raw, "_sock", raw)  # SocketIO on a unix socket: its socket
            self._sock = sock  # set before abort is checked: see shutdown
            try:
                if self.abort.is_set():  # shutdown() came before the socket: its part now
                    _shut(sock)
                pending = self._drain_buffered(raw, sock)
                sock.settimeout(None)
                for _stream, data in frames_iter(_Socket(sock, pending, self.abort), tty=False):
                    self.capture.add(data)
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

    def shutdown(self) -> None:
        """Give up on the stream: make the reader return now.

        The reader sets its socket before it checks ``abort``, and this sets ``abort``
        before it looks for the socket: one of the two shuts the socket down, which wakes
        a reader waiting on it.  Output already read with the headers is still kept.
        """
        self.abort.set()
        sock = self._sock
        if sock is not None:
            _shut(sock)


def _shut(sock: Any) -> None:
    """Shut the socket down, which wakes a reader waiting on it (the stream then ends)."""
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
