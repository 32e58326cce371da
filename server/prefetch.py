"""Prefetch: bring a program's context back into GPU memory before its tool call returns.

Why a request: vLLM has no call that loads a host-memory copy into GPU blocks on its own; its
KV connector loads only for a request that the prefix lookup finds in host memory. So a
prefetch is a real request over the context the program already has (the token ids of its last
finished turn, prompt and output) with `max_tokens = 1`: admission finds the prefix still in the
GPU cache, the offloading connector loads the rest from host memory (or, without a host tier,
vLLM recomputes it), the engine computes at most one block's tail and one token, and the policy
may pin the result (`Policy.on_prefetched`) so that the program's next turn, whose prompt starts
with exactly those tokens, is admitted onto a resident context. Nobody reads its output: the
emulated and the served engine both drop outputs of request ids no client submitted.

The rules the scheduler keeps (`server.scheduler.PolicyScheduler`):

* A prefetch is speculative, so it never costs a real turn anything it could avoid: it waits at
  the end of the queue, never takes another program's pin under memory pressure, and, if the
  program's turn arrives while the prefetch still waits, it is dropped (the turn does the work).
* The policy says when (`Policy.prefetch_due`); this module only remembers contexts and makes
  the requests. A context is forgotten when the program's next turn arrives, when the program
  ends, and once used; so memory is one token list per program in a tool call.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request

#: Request ids of prefetches start with this (so logs and tests can tell them apart).
PREFETCH_PREFIX = "prefetch-"

#: At most this many contexts are remembered (the least recently finished go first), so a
#: server whose clients never send `program_end` does not grow without bound.
MAX_CONTEXTS = 4096


@dataclass(slots=True)
class _Context:
    token_ids: list[int]  # the finished turn's prompt + output (not copied: never mutated again)
    block_hasher: Any  # the engine's, from the finished request (same prefix-cache hashes)
    cache_salt: str | None
    lora_request: Any


class PrefetchBook:
    """Contexts of programs in a tool call, and the prefetch requests in flight."""

    def __init__(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self._contexts: OrderedDict[str, _Context] = OrderedDict()
        self.in_flight: dict[str, str] = {}  # request id -> program id
        self._by_program: dict[str, str] = {}  # program id -> its prefetch's request id
        self._made = 0

    def remember(self, request: Request) -> None:
        """A turn (not a prefetch: the scheduler tells them apart) of `request.session_id`
        finished normally: its context is what a prefetch would bring back."""
        program = request.session_id
        if program is None:
            return
        self._contexts[program] = _Context(request._all_token_ids, request._block_hasher,
                                           request.cache_salt, request.lora_request)
        self._contexts.move_to_end(program)
        while len(self._contexts) > MAX_CONTEXTS:
            self._contexts.popitem(last=False)

    def forget(self, program_id: str | None) -> None:
        if program_id is not None:
            self._contexts.pop(program_id, None)

    def is_prefetch(self, request_id: str) -> bool:
        return request_id in self.in_flight

    def request_of(self, program_id: str | None) -> str | None:
        """The id of `program_id`'s prefetch in flight (None: none)."""
        return self._by_program.get(program_id) if program_id is not None else None

    def make(self, program_id: str, now: float) -> Request | None:
        """A prefetch request for `program_id`'s remembered context (None: nothing remembered,
        one already in flight, or the context plus one token would not fit the model)."""
        if program_id in self._by_program:
            return None
        context = self._contexts.pop(program_id, None)
        if context is None or len(context.token_ids) + 1 > self.max_model_len:
            return None
        self._made += 1
        request_id = f"{PREFETCH_PREFIX}{program_id}-{self._made}"
        request = Request(request_id, context.token_ids, SamplingParams(max_tokens=1), None,
                          arrival_time=now, block_hasher=context.block_hasher,
                          session_id=program_id, cache_salt=context.cache_salt,
                          lora_request=context.lora_request)
        self.in_flight[request_id] = program_id
        self._by_program[program_id] = request_id
        return request

    def finished(self, request_id: str) -> str | None:
        """A prefetch left the engine (done or dropped): its program id."""
        program = self.in_flight.pop(request_id, None)
        if program is not None and self._by_program.get(program) == request_id:
            del self._by_program[program]
        return program
