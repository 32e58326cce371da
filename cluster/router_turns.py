"""The served router's turn forwarding: `POST /v1/chat/completions` and `POST /v1/completions`.

The program id is the body's `session_id` or the `X-Session-ID` header, the turn
`vllm_xargs.turn` (default 0). The router (`ClusterState.route`, i.e. `cluster.routing` /
`cluster.ampd`) picks the replica; the answer carries `X-Harness-Replica` (and
`X-Harness-Prefill` under P/D). Bodies are passed on unchanged (colocated), so `session_id`,
`vllm_xargs` and every other vLLM extension reach the replica; streamed answers (SSE) are
relayed chunk by chunk as they arrive (`cluster.router_sse`). Under P/D (`Route.prefill` set)
the request first goes to the prefill replica with `kv_transfer_params` of vLLM's pull-mode
NixlConnector and `max_tokens=1`, and the returned `kv_transfer_params` go with the original
request to the decode replica (as vLLM's example proxies do; `cluster.pd`). Cost-model
strategies (`ampd`) also get each turn's `TurnInfo`, the replicas' queued prefill tokens and
windowed TTFT / ITL, kept by `cluster.served_turns` from the relayed traffic.

A replica that stops answering fails the requests in flight to it with a 502 whose message names
it (`replica d1 at 127.0.0.1:8102 is not answering: ...`) and is marked not alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from cluster import pd
from cluster.router_events import EventFanout
from cluster.router_sse import RelayedTurn, relay_sse
from cluster.router_state import ClusterState
from cluster.router_wire import (
    GONE,
    PREFILL_HEADER,
    REPLICA_HEADER,
    Reply,
    auth_of,
    error_reply,
    failed_reply,
    forward_headers,
    gone_reply,
    prefill_body,
    program_of,
    turn_of,
)
from cluster.routing import NoReplicaError, Route, TurnInfo
from cluster.served_turns import completion_tokens_of, prompt_tokens_of

log = logging.getLogger("harness.cluster.router")


class TurnForwarder:
    """Routes one completion request and forwards it: to one replica, or under P/D a prefill
    on one replica and the decode, with the prefill's KV, on another."""

    def __init__(self, state: ClusterState, client: Callable[[], httpx.AsyncClient],
                 events: EventFanout) -> None:
        self.state = state
        self.client = client  # the router's upstream client, opened when it starts
        self.events = events  # delivers a program's kept program_start before its turn

    async def complete(self, path: str, raw: bytes, headers: Any,
                       client_gone: Callable[[], Awaitable[None]] | None = None) -> Reply:
        """One request to `path` (`/v1/chat/completions` or `/v1/completions`): `raw` its
        body, `headers` its headers (a case-insensitive mapping). `client_gone`, when given,
        returns once the client disconnects: the turn is then cancelled (answer 499)."""
        state = self.state
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error_reply(f"the request body is not JSON: {exc}", 400,
                               "invalid_request_error")
        if not isinstance(body, dict):
            return error_reply("the request body must be a JSON object", 400,
                               "invalid_request_error")
        given = program_of(body, headers)
        program = given if given is not None else f"anon-{uuid.uuid4().hex}"
        state.counters["requests"] += 1
        tokens = prompt_tokens_of(body)
        info = state.book.info(program, tokens, time.monotonic())
        if given is not None:
            gone = await self._while_held(program, turn_of(body), info, client_gone)
            if gone is not None:
                return gone
            info = dataclasses.replace(info, now=time.monotonic())
        try:
            route, left = state.route_turn(program, turn_of(body), info)
        except NoReplicaError as exc:
            state.counters["no_replica"] += 1
            down = state.down()
            return error_reply(f"no live replica can take the request ({exc})"
                               + (f"; {down}" if down else "")
                               + "; GET /v1/cluster shows the replicas", 503)
        upstream_headers = forward_headers(headers, given)
        leaving = None  # a moved program's old home that prefills this turn for the new one
        if given is not None:
            if left is not None and left == route.prefill:
                leaving = left  # told once its prefill is answered (`cluster.placement`)
            elif left is not None:
                await self.events.tell_moved(left, program, auth_of(headers))
            for name in state.placed(program, route):
                await self.events.send(name, [state.starts[program]], auth_of(headers))
        turn = RelayedTurn(program, tokens, info.new_tokens)
        if route.prefill is not None:
            work = self._pd_turn(path, body, upstream_headers, route, turn,
                                 leaving=(leaving, auth_of(headers)) if leaving else None)
        else:
            state.book.prefill_queued(route.decode, turn.new_tokens)
            turn.queued_on = route.decode
            work = self._forward(path, raw, upstream_headers, route.decode,
                                 stream=bool(body.get("stream")), turn=turn)
        reply = None
        try:
            reply = await self._unless_gone(work, client_gone)
            return reply
        finally:
            if reply is None or reply.stream is None:  # a stream clears it when it runs
                turn.prefilled(state.book)  # answered or failed: no longer queued
            if given is None:
                state.router.program_end(program)  # an anonymous request binds nothing
                state.book.end(program)

    async def _while_held(self, program: str, turn: int, info: TurnInfo,
                          client_gone: Callable[[], Awaitable[None]] | None) -> Reply | None:
        """Wait while the router holds the turn (a global program queue, `Router.hold`),
        asking again when it says; None once it may go. A client that goes away meanwhile
        gets 499, and its program leaves the router's books (slot and memory account)."""
        state = self.state
        hold = getattr(state.router, "hold", None)
        held = False
        while hold is not None:
            try:
                again = hold(program, turn, state.loads(), info)
            except NoReplicaError:
                return None  # routing answers it, naming the replicas that are down
            if again is None:
                return None
            if not held:
                held = True
                state.counters["held"] += 1
            gone = await self._unless_gone(_pause(again - time.monotonic()), client_gone)
            if gone is not None:
                state.router.program_end(program)
                return gone
            info = dataclasses.replace(info, now=time.monotonic())
        return None

    async def _unless_gone(self, work: Awaitable[Reply | None],
                           client_gone: Callable[[], Awaitable[None]] | None) -> Reply | None:
        """Run `work`; if the client goes away first, cancel it (closing the upstream
        connection, so the replica aborts the request) and answer 499."""
        if client_gone is None:
            return await work
        task = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(client_gone())
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.state.counters["cancelled"] += 1
            return error_reply("the client went away", 499, "cancelled")
        return task.result()

    async def _pd_turn(self, path: str, body: dict[str, Any], headers: dict[str, str],
                       route: Route, turn: RelayedTurn,
                       leaving: tuple[str, dict[str, str]] | None = None) -> Reply:
        """A turn prefilled on `route.prefill` and decoded, with the prefill's KV, on
        `route.decode`. `leaving`: (the program's old home, the client's auth) when the
        prefill replica is the home a move left (`carry_kv`): told `program_moved` once its
        prefill is answered."""
        state = self.state
        prefill = state.replicas[route.prefill]  # type: ignore[index]
        request_id = next((v for k, v in headers.items() if k.lower() == "x-request-id"),
                          None) or f"pd-{uuid.uuid4().hex}"
        headers = forward_headers(headers, None, request_id)
        first = prefill_body(body, pd.prefill_params(), chat=path.endswith("chat/completions"))
        prefill.in_flight += 1
        prefill.prefills += 1
        state.counters["pd_prefills"] += 1
        state.book.prefill_queued(prefill.name, turn.new_tokens)
        turn.queued_on = prefill.name
        sent = time.monotonic()
        try:
            answer = await self.client().post(prefill.url + path, json=first, headers=headers)
        except GONE as exc:
            return gone_reply(prefill, exc, state.counters)
        except httpx.HTTPError as exc:
            return failed_reply(prefill, exc, state.counters)
        finally:
            prefill.in_flight -= 1
            turn.prefilled(state.book)
            if leaving is not None:  # answered or not, the program's turns run elsewhere now
                await self.events.tell_moved(leaving[0], turn.program, leaving[1])
        if answer.status_code == 200:
            state.observe("ttft", prefill.name, time.monotonic() - sent)
        if answer.status_code != 200:
            state.counters["failed"] += 1
            return Reply(answer.status_code, content=answer.content,
                         media_type=answer.headers.get("content-type"),
                         headers={REPLICA_HEADER: route.decode, PREFILL_HEADER: prefill.name})
        try:
            returned = answer.json().get("kv_transfer_params")
            second = dict(body)
            second["kv_transfer_params"] = pd.decode_params(returned)
        except (ValueError, AttributeError) as exc:  # PDError is a ValueError
            state.counters["pd_fallbacks"] += 1
            log.warning("prefill replica %s: %s; prefilling on %s instead", prefill.name, exc,
                        route.decode)
            second = dict(body)
        return await self._forward(path, json.dumps(second).encode(), headers, route.decode,
                                   stream=bool(body.get("stream")),
                                   extra_headers={PREFILL_HEADER: prefill.name}, turn=turn)

    async def _forward(self, path: str, content: bytes, headers: dict[str, str], name: str,
                       stream: bool, extra_headers: dict[str, str] | None = None,
                       turn: RelayedTurn | None = None) -> Reply:
        state = self.state
        replica = state.replicas[name]
        replica.routed += 1
        out_headers = {REPLICA_HEADER: name, **(extra_headers or {})}
        upstream = self.client().build_request("POST", replica.url + path, content=content,
                                               headers={**headers, "content-type":
                                                        "application/json"})
        replica.in_flight += 1
        relaying = False  # once the stream is handed to `relay_sse`, it does the accounting
        sent = time.monotonic()
        try:
            try:
                answer = await self.client().send(upstream, stream=stream)
            except GONE as exc:
                return gone_reply(replica, exc, state.counters)
            except httpx.HTTPError as exc:
                return failed_reply(replica, exc, state.counters)
            if not stream:
                state.counters["completed" if answer.status_code == 200 else "failed"] += 1
                if answer.status_code == 200 and turn is not None:
                    tokens = completion_tokens_of(answer.content)
                    turn.answered(state, name, tokens,
                                  (time.monotonic() - sent) / tokens if tokens else None)
                return Reply(answer.status_code, content=answer.content,
                             media_type=answer.headers.get("content-type"), headers=out_headers)
            if answer.status_code != 200:  # an error before the stream began: pass it on
                try:
                    content = await answer.aread()
                except httpx.HTTPError as exc:
                    return gone_reply(replica, exc, state.counters)
                finally:
                    await answer.aclose()
                state.counters["failed"] += 1
                return Reply(answer.status_code, content=content,
                             media_type=answer.headers.get("content-type"), headers=out_headers)
            relaying = True
        finally:
            if not relaying:
                replica.in_flight -= 1
        return Reply(200, stream=relay_sse(state, replica, answer, turn),
                     media_type=answer.headers.get("content-type", "text/event-stream"),
                     headers=out_headers)


async def _pause(seconds: float) -> None:
    """Sleep (a held turn's wait for the router's next decision)."""
    await asyncio.sleep(max(0.0, seconds))
