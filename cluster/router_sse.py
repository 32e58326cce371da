"""The served router's SSE relay: a replica's streamed answer passed on chunk by chunk as it
arrives, and the accounting of the turn it answers.

Why apart: a stream outlives the request handler that started it (the web framework iterates
it after the headers went out), so the replica's in-flight count, the turn's prefill queue
entry, its history and the decode replica's ITL are settled here, when the stream ends,
fails (the client gets an SSE error event naming the replica) or is dropped by the client
(closing the upstream answer aborts the request on the replica).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from cluster.router_state import ClusterState, ReplicaState
from cluster.router_wire import GONE, sse_error
from cluster.served_turns import StreamClock, TurnBook, completion_tokens_of


@dataclass
class RelayedTurn:
    """One relayed turn's accounting: its prompt, and where its new tokens wait to be
    prefilled (cleared once, at the first token or the prefill's answer)."""

    program: str
    prompt_tokens: int
    new_tokens: int
    queued_on: str | None = None

    def prefilled(self, book: TurnBook) -> None:
        if self.queued_on is not None:
            book.prefill_done(self.queued_on, self.new_tokens)
            self.queued_on = None

    def answered(self, state: ClusterState, replica: str, completion: int | None,
                 itl: float | None) -> None:
        """The turn's answer is complete (`completion` tokens, from its usage): its history
        for the next turn, the decode replica's ITL, the router's books (`program-queue`)."""
        state.book.turn_done(self.program, self.prompt_tokens, completion)
        state.observe("itl", replica, itl)
        finished = getattr(state.router, "turn_finished", None)
        if finished is not None and completion is not None:  # a router that keeps books
            finished(self.program, self.prompt_tokens + completion, time.monotonic())


async def relay_sse(state: ClusterState, replica: ReplicaState, answer: httpx.Response,
                    turn: RelayedTurn | None) -> AsyncIterator[bytes]:
    """The chunks of `answer` (a streamed 200 from `replica`, one request in flight there),
    then the accounting; a replica gone mid-stream ends it with an SSE error event."""
    name = replica.name
    outcome = "cancelled"  # unless it ends below: the client went away
    clock = StreamClock()
    tail = b""  # the last chunks, where the usage is
    pending = b""  # a line not yet ended: held back, so a replica lost mid-line sends no half
    try:
        async for chunk in answer.aiter_raw():
            clock.chunk(time.monotonic())
            if turn is not None:
                turn.prefilled(state.book)  # the first token is out
                tail = (tail + chunk)[-4096:]
            pending += chunk
            cut = pending.rfind(b"\n") + 1
            if cut:
                yield pending[:cut]
                pending = pending[cut:]
        if pending:
            yield pending
        outcome = "completed"
        if turn is not None:
            turn.answered(state, name, completion_tokens_of(tail), clock.itl())
    except GONE as exc:
        outcome = "failed"
        message = replica.not_answering(exc)
        replica.mark_dead(message)
        replica.errors += 1
        yield sse_error(message, replica.name)
    except httpx.HTTPError as exc:
        outcome = "failed"
        replica.errors += 1
        yield sse_error(f"replica {name} at {replica.address} failed: "
                        f"{str(exc) or type(exc).__name__}", replica.name)
    finally:
        replica.in_flight -= 1
        state.counters[outcome] += 1
        if turn is not None:
            turn.prefilled(state.book)
        await answer.aclose()  # a client gone: closing aborts the request upstream
