"""What work costs the GPU in seconds: the cost model an engine hands its policies and program
schedulers (`CostModel`), and the yardstick the remaining-work rankings measure with
(`WorkModel`).

Why here, beside the policies and the program schedulers rather than in either: both price
reloads, swaps and turns with the same model, and neither may import the other.

Why seconds of GPU and not tokens: a decoded token costs more the longer its context (each
step reads the sequence's whole KV cache), and on the long SWE programs that read is most of a
step, so a program's remaining output tokens alone rank a late, long-context program as cheaper
than it is. The yardstick is the marginal cost of a sequence in a batch: what one more sequence
of that context adds to a decode step, read from the cost model's step time when it has one
(`server.perf` profiles do: ``step_seconds``), else from the documented fallback constants.
`oracle` ranks programs by the exact future of the trace measured with it; `remaining-work` by
its estimate of that future; both only compare these numbers, so their scale does not matter.

Constants (the fallback when the cost model has no step time): `FALLBACK_SEQ_S = 5e-5` s per
sequence per step and `FALLBACK_CONTEXT_S = 5e-8` s per context token per step, the order of an
8B model's decode on one H100 (a 12k-token context adds about 0.65 ms to a step).
`CONTEXT_BUCKET = 256` tokens: contexts are rounded up to it for the per-context cache (a
caller whose order rests on exact contexts, the `lookahead` program scheduler, asks for 1).
"""

from __future__ import annotations

from typing import Any, Protocol

FALLBACK_SEQ_S = 5e-5
FALLBACK_CONTEXT_S = 5e-8
CONTEXT_BUCKET = 256


class CostModel(Protocol):
    """Seconds the GPU needs for the work a retention decision trades against.

    A model may also time a whole engine step, ``step_seconds(prefill, decode)`` (the
    `server.perf` profiles do); `WorkModel` uses it when it is there and its fallback
    constants when it is not."""

    def prefill_seconds(self, context_tokens: int) -> float:
        """Recomputing a whole context of this many tokens from scratch (the reload cost)."""
        ...

    def swap_seconds(self, tokens: int) -> float:
        """Moving this many tokens' KV cache across PCIe, one direction."""
        ...


class WorkModel:
    """GPU seconds of decode and prefill work, from a cost model (None: the fallback)."""

    def __init__(self, cost_model: Any = None, bucket: int = CONTEXT_BUCKET) -> None:
        self.cost_model = cost_model
        self.bucket = bucket
        # optional in a cost model (`CostModel`): without it, the fallback constants
        self._step = getattr(cost_model, "step_seconds", None)
        self._per_token: dict[int, float] = {}

    def decode_seconds_per_token(self, context_tokens: int) -> float:
        """What one decoded token at this context adds to a batched step."""
        bucket = -(-max(1, context_tokens) // self.bucket) * self.bucket
        cached = self._per_token.get(bucket)
        if cached is None:
            if self._step is not None:
                cached = float(self._step([], [bucket, bucket]) - self._step([], [bucket]))
            else:
                cached = FALLBACK_SEQ_S + FALLBACK_CONTEXT_S * bucket
            self._per_token[bucket] = cached = max(cached, 0.0)
        return cached

    def prefill_seconds(self, new_tokens: int, cached_tokens: int) -> float:
        """Computing `new_tokens` on top of `cached_tokens` already in the cache."""
        if new_tokens <= 0:
            return 0.0
        if self.cost_model is None:
            return FALLBACK_CONTEXT_S * 2000 * new_tokens  # ~0.1 ms per token, Continuum's
        whole = self.cost_model.prefill_seconds(cached_tokens + new_tokens)
        return max(0.0, float(whole - self.cost_model.prefill_seconds(cached_tokens)))

    def turn_seconds(self, prompt_tokens: int, new_tokens: int, output_tokens: int) -> float:
        """A turn with this prompt, of which `new_tokens` are not cached, that answers
        `output_tokens` tokens: its prefill plus its decode at the mid-answer context."""
        decode = output_tokens * self.decode_seconds_per_token(prompt_tokens + output_tokens // 2)
        return self.prefill_seconds(new_tokens, prompt_tokens - new_tokens) + decode
