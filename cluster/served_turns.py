"""What a served router learns about turns from the requests and responses it relays.

Why: AMPD's routing (`cluster.ampd`) prices each incremental prefill with the turn's prompt and
history lengths and each replica's prefill queue, and reads windowed TTFT / ITL per replica.
The virtual-time cluster reads those from its engines; behind `harness cluster serve` the
router only sees HTTP, so this book keeps the same figures from what passes through it:

* prompt tokens: exact when the prompt is token ids (what `harness bench --url` sends); for
  text and chat messages, an estimate of 4 characters per token (the router has no tokenizer,
  and a cost estimate needs the size, not the ids);
* history tokens: what the program's earlier turns computed on its decode replica, its last
  prompt plus its last answer (the answer's length from the response's `usage`, when given),
  never more than the new prompt;
* queued prefill tokens per replica: prompt tokens sent there whose first token (or, for a
  remote prefill, whose prefill answer) has not come back yet;
* TTFT per prefill replica: a remote prefill's round trip; ITL per decode replica: the mean gap
  between streamed chunks after the first (a non-streamed answer: its time over its tokens).

The router calls `observe_ttft` / `observe_itl` only when the strategy has them (`ampd`); the
others ignore the book.
"""

from __future__ import annotations

import json
from collections import Counter, OrderedDict
from typing import Any

from cluster.routing import TurnInfo

CHARS_PER_TOKEN = 4  # the estimate for text prompts (English text under Llama-3's tokenizer)
#: programs whose history the book keeps: a client that never sends `program_end` must not grow
#: the router's memory without bound; the least recently served are forgotten first (their next
#: turn is then priced as if nothing were held)
HISTORY_MEMORY = 65_536


def prompt_tokens_of(body: dict[str, Any]) -> int:
    """The request's prompt length in tokens: exact for token ids, else estimated."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        return sum(len(p) for p in prompt)  # a batch of token-id prompts
    text = ""
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list):
        text = "".join(p for p in prompt if isinstance(p, str))
    for message in body.get("messages") or ():
        if isinstance(message, dict):
            content = message.get("content")
            if isinstance(content, str):
                text += content
            elif isinstance(content, list):
                text += "".join(str(part.get("text", "")) for part in content
                                if isinstance(part, dict))
    return max(1, len(text) // CHARS_PER_TOKEN) if text else 0


def completion_tokens_of(payload: bytes) -> int | None:
    """`usage.completion_tokens` from a JSON answer or the last SSE chunk that carries usage."""
    text = payload.decode("utf-8", "replace")
    candidates = [text] if not text.lstrip().startswith("data:") else [
        line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    for item in reversed(candidates):
        if '"usage"' not in item:
            continue
        try:
            usage = json.loads(item).get("usage") or {}
        except (json.JSONDecodeError, AttributeError):
            continue
        tokens = usage.get("completion_tokens")
        if isinstance(tokens, int):
            return tokens
    return None


class TurnBook:
    """Per program and per replica, the figures above."""

    def __init__(self) -> None:
        # program -> tokens its decode replica computed, least recently served first
        self._history: OrderedDict[str, int] = OrderedDict()
        self.queued: Counter[str] = Counter()  # replica -> prompt tokens not yet prefilled

    def info(self, program_id: str, prompt_tokens: int, now: float) -> TurnInfo:
        history = min(self._history.get(program_id, 0), prompt_tokens)
        return TurnInfo(now=now, prompt_tokens=prompt_tokens, history_tokens=history)

    def prefill_queued(self, replica: str, tokens: int) -> None:
        self.queued[replica] += tokens

    def prefill_done(self, replica: str, tokens: int) -> None:
        self.queued[replica] -= tokens
        if self.queued[replica] <= 0:
            del self.queued[replica]

    def turn_done(self, program_id: str, prompt_tokens: int, completion_tokens: int | None) -> None:
        self._history[program_id] = prompt_tokens + (completion_tokens or 0)
        self._history.move_to_end(program_id)
        while len(self._history) > HISTORY_MEMORY:
            self._history.popitem(last=False)

    def end(self, program_id: str) -> None:
        self._history.pop(program_id, None)


class StreamClock:
    """Chunk times of one relayed stream, for its inter-token latency."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.chunks = 0

    def chunk(self, now: float) -> None:
        if self.first is None:
            self.first = now
        self.last = now
        self.chunks += 1

    def itl(self) -> float | None:
        """Mean gap between chunks after the first (None: fewer than two chunks)."""
        if self.first is None or self.last is None or self.chunks < 2:
            return None
        return (self.last - self.first) / (self.chunks - 1)
