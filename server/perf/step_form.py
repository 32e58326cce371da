"""The step-time form every profile shares, and the batch features it is a function of.

Why one form for both kinds of profile (as in the simulators Vidur and BLIS): the roofline's
coefficients follow from datasheets (`server.perf.roofline`), a measured table's from a fit
(`server.perf.fit`), and either way a step costs the same few features of its batch::

    t = c0 + c1 * max(T, T_knee) + c2 * A + c3 * D + c4 * S

    T = new tokens in the step (sum of prefill chunk lengths + one per decoding sequence)
    A = sum over prefill chunks of chunk * ctx + chunk * (chunk + 1) / 2
        (query-key pairs of causal attention; "chunk x context" with the causal half)
    D = sum of decoding sequences' context lengths (KV tokens each decode attends over,
        the token being decoded included: num_computed_tokens + 1)
    S = number of sequences in the step (prefill chunks + decodes)

``c1 * max(T, T_knee)`` is the roofline of the linear layers: below the knee a step is bound by
reading the weights once, above it by FLOPs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StepFeatures:
    """The regressors of the step-time form (see the module docstring)."""

    new_tokens: int  # T
    attention_pairs: float  # A
    decode_context: int  # D
    seqs: int  # S

    def as_row(self) -> tuple[float, float, float, float]:
        return (
            float(self.new_tokens),
            self.attention_pairs,
            float(self.decode_context),
            float(self.seqs),
        )


def check_batch(prefill: Sequence[Sequence[int]], decode: Sequence[int]) -> None:
    """A ValueError unless `prefill` holds (chunk >= 1, context before >= 0) pairs and every
    decode context counts the token being decoded (>= 1)."""
    for item in prefill:
        if len(item) != 2:
            raise ValueError(f"prefill items are (chunk, context_before) pairs, got {item!r}")
        chunk, ctx = item
        if chunk < 1 or ctx < 0:
            raise ValueError(
                f"prefill chunk must be >= 1 token and its prior context >= 0, got {item!r}"
            )
    if decode and min(decode) < 1:  # one C-level pass: this runs on every emulated step
        ctx = next(c for c in decode if c < 1)
        raise ValueError(
            "decode context lengths count the token being decoded, so must be >= 1, "
            f"got {ctx!r}"
        )


def step_features(prefill: Sequence[Sequence[int]], decode: Sequence[int]) -> StepFeatures:
    check_batch(prefill, decode)
    tokens = 0
    pairs = 0.0
    for chunk, ctx in prefill:
        tokens += chunk
        pairs += chunk * ctx + chunk * (chunk + 1) / 2
    return StepFeatures(
        new_tokens=tokens + len(decode),
        attention_pairs=pairs,
        decode_context=int(sum(decode)),
        seqs=len(prefill) + len(decode),
    )


@dataclass(frozen=True)
class Coefficients:
    """t = c0 + c1 * max(T, knee) + c2 * A + c3 * D + c4 * S [+ c5 * T] (seconds)."""

    c0: float
    c1: float
    knee: float
    c2: float
    c3: float
    c4: float
    c5: float = 0.0  # per new token outside the max (TP all-reduce bytes); 0 in fits

    def evaluate(self, f: StepFeatures) -> float:
        return (
            self.c0
            + self.c1 * max(float(f.new_tokens), self.knee)
            + self.c2 * f.attention_pairs
            + self.c3 * f.decode_context
            + self.c4 * f.seqs
            + self.c5 * f.new_tokens
        )
