"""Agent events: the wire schema and the side channel from the API server to the scheduler.

The harness POSTs events (`program_start`, `tool_start`, `tool_end`, `program_end`; a cluster
router also `program_moved`) to `/v1/agent/events` on the API server; the scheduler lives in
vLLM's engine-core process. An in-band path does not exist in vLLM for scheduler-bound control
messages (`collective_rpc` reaches the workers, not the scheduler), so the API server pushes
validated events over a ZeroMQ PUSH/PULL pair on an IPC socket, and the scheduler drains it
without blocking at the top of every `schedule()`: an event takes effect within one scheduling
step.

The socket path travels in `HARNESS_EVENTS_IPC`, set by `harness serve` before vLLM starts so
both processes inherit it.

What the endpoint refuses, and with which status, is decided here once for the engine's
endpoint and the router's: a body over `MAX_BODY_BYTES` (`EventsTooLarge`, 413; `read_body`
stops reading at the limit), and anything that is not valid events (`EventError`, 400: not
JSON, nested deeper than JSON parsing allows, not an object, an unknown `type`, a missing,
ill-typed, negative or non-finite field, an unknown field).

The way back (scheduler -> API server) is a status file beside the socket (`StatusFile`): the
scheduler rewrites it whenever its event or pin counters change, and the API server reads it
when asked (`GET /v1/agent/events`, `/metrics`), so the pins a policy makes are visible on the
replica's own port without a request reaching the engine core. No vLLM import here.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import AsyncIterable
from pathlib import Path
from typing import Annotated, Any, Literal

import zmq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from common.trace import GapKind
from server.policies.base import AgentEvent, EventKind

ENV_EVENTS_IPC = "HARNESS_EVENTS_IPC"
#: vLLM reads it as `--api-key` (`vllm.envs`): how a server gets its key without the key in
#: the process list (`harness serve --api-key`, a cluster's replicas); `--api-key` takes
#: precedence and takes several
ENV_API_KEY = "VLLM_API_KEY"
#: Why `POST /v1/agent/events` refused a body (the endpoints count each: `EventError.reason`).
REFUSALS = ("invalid", "too_large", "not_owner")
#: The largest body `POST /v1/agent/events` takes (1 MiB: some 10,000 events; the harness
#: sends at most 512 a batch, `harness.events_client`). A larger one is refused with a 413.
MAX_BODY_BYTES = 1 << 20
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
#: The quantile levels `tool_start`'s `predicted_q` may name (``p50``: the median gap, s).
QuantileLevel = Literal["p10", "p25", "p50", "p75", "p90", "p95", "p99"]


class EventIn(BaseModel):
    """One event as sent by a client. Unknown fields are rejected so typos surface as 400s.

    On `tool_start`, besides the point estimate `predicted_s`, a client may say what the gap
    is (`gap_kind`: a tool call, a person's answer, sub-agents; `common.trace`) and how long
    it expects it in quantiles (`predicted_q`, seconds from the gap's start, non-decreasing
    in the level: `predictor.gaps.GapForecast.hint`)."""

    model_config = ConfigDict(extra="forbid")

    type: EventKind
    program_id: Annotated[str, Field(min_length=1, max_length=256)]
    tool: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    predicted_s: NonNegative | None = None
    gap_kind: GapKind | None = None
    predicted_q: dict[QuantileLevel, NonNegative] | None = None
    seconds: NonNegative | None = None
    return_tokens: Annotated[int, Field(ge=0)] | None = None
    summary: Annotated[str, Field(max_length=512)] | None = None
    ts: Annotated[float, Field(allow_inf_nan=False)] | None = None  # client's, informational

    @field_validator("predicted_q")
    @classmethod
    def _ordered(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        ordered = sorted(value.items(), key=lambda item: int(item[0][1:]))
        if any(a[1] > b[1] for a, b in zip(ordered, ordered[1:], strict=False)):
            raise ValueError("quantiles must not decrease with their level")
        return dict(ordered)

    def to_event(self) -> AgentEvent:
        return AgentEvent(kind=self.type, program_id=self.program_id, tool=self.tool,
                          predicted_s=self.predicted_s, seconds=self.seconds,
                          return_tokens=self.return_tokens, summary=self.summary,
                          gap_kind=self.gap_kind, predicted_q=self.predicted_q)


class EventError(ValueError):
    """A malformed event; the message says which line and what was wrong (HTTP 400).
    `reason`: the refusal's name in the endpoint's counters."""

    status = 400
    reason = "invalid"


class EventsTooLarge(EventError):
    """A body over `MAX_BODY_BYTES` (HTTP 413)."""

    status = 413
    reason = "too_large"

    def __init__(self, limit: int = MAX_BODY_BYTES) -> None:
        super().__init__(f"the body is over {limit:,} bytes: send fewer events per request")


async def read_body(chunks: AsyncIterable[bytes], declared: str | None = None,
                    limit: int = MAX_BODY_BYTES) -> bytes:
    """A request body read up to `limit` bytes: raises `EventsTooLarge` as soon as its
    `Content-Length` (`declared`) or what has arrived says it is larger, without reading on."""
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise EventsTooLarge(limit)
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            raise EventsTooLarge(limit)
    return bytes(body)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise EventError("the JSON is nested too deeply") from None


def parse_events(body: bytes, limit: int = MAX_BODY_BYTES) -> list[EventIn]:
    """Parse one JSON event (possibly pretty-printed), a JSON list, or NDJSON lines."""
    if len(body) > limit:
        raise EventsTooLarge(limit)
    text = body.decode("utf-8", errors="replace").strip()
    if not text:
        raise EventError("empty body: send one JSON event or NDJSON lines")
    try:
        whole = _json(text)
        items = whole if isinstance(whole, list) else [whole]
    except json.JSONDecodeError:
        items = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    items.append(_json(line))
                except json.JSONDecodeError as exc:
                    raise EventError(f"line {number} is not JSON: {exc.msg}") from None
    events = []
    for number, item in enumerate(items, start=1):
        try:
            events.append(EventIn.model_validate(item))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'event'}: {err['msg']}"
                for err in exc.errors()
            )
            raise EventError(f"event {number}: {problems}") from None
    return events


def default_ipc_path() -> str:
    return f"ipc://{tempfile.gettempdir()}/harness-events-{uuid.uuid4().hex[:12]}.sock"


class EventSender:
    """API-server side: push validated events; never blocks a request handler."""

    def __init__(self, address: str) -> None:
        self._socket = zmq.Context.instance().socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, 100_000)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(address)

    def send(self, events: list[dict[str, Any]]) -> int:
        """Send; returns how many were queued (the rest are dropped when the engine lags)."""
        sent = 0
        for event in events:
            try:
                self._socket.send(json.dumps(event).encode(), flags=zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                break
        return sent

    def close(self) -> None:
        self._socket.close()


class EventReceiver:
    """Scheduler side: bind the PULL socket and drain whatever has arrived."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._socket = zmq.Context.instance().socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(address)

    def drain(self, limit: int = 10_000) -> list[AgentEvent]:
        events: list[AgentEvent] = []
        for _ in range(limit):
            try:
                raw = self._socket.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                events.append(EventIn.model_validate_json(raw).to_event())
            except ValidationError:
                continue  # validated by the sender already; never let one event stop the engine
        return events

    def close(self) -> None:
        self._socket.close()
        if self.address.startswith("ipc://"):
            try:
                os.unlink(self.address[len("ipc://"):])
            except OSError:
                pass


class StatusFile:
    """The scheduler's counters (events received, pins made and released, programs pinned
    now) for the API server: a JSON file beside the events socket, replaced atomically, and
    only when a counter changed (a scheduling step without events or pins writes nothing)."""

    def __init__(self, address: str) -> None:
        self.path = status_path(address)
        self._last: dict[str, Any] | None = None

    def write(self, status: dict[str, Any]) -> None:
        if self.path is None or status == self._last:
            return
        partial = self.path.with_name(self.path.name + ".partial")
        try:
            partial.write_text(json.dumps(status))
            os.replace(partial, self.path)
        except OSError:
            return  # the temporary directory went away: the counters are informational
        self._last = status

    def remove(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def status_path(address: str) -> Path | None:
    """Where the scheduler of the events socket `address` leaves its counters (IPC only)."""
    if not address.startswith("ipc://"):
        return None
    return Path(address[len("ipc://"):] + ".status.json")


def read_status(address: str | None) -> dict[str, Any] | None:
    """The scheduler's latest counters, or None before its first write (or without events)."""
    path = status_path(address) if address else None
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
