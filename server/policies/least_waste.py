"""InferCept's GPU-memory waste of Preserve, Discard and Swap (Abhyankar et al., ICML 2024,
section 4, equations 2-5), shared by `infercept` and `augserve` (AugServe's stage I values an
interception with the same equations, section 3.2 of arXiv:2512.04013).

While a program is intercepted (its tool runs), its KV cache of C tokens can be

* preserved: it holds C tokens of GPU memory for the whole interception (Eq. 2),
  ``Waste_preserve = T_int * C``;
* discarded and recomputed on return, in chunks (Eq. 4). Eq. 1 recomputes the whole context in
  one forward that stalls the running batch (``T_fwd(C) * (C + C_other)``). InferCept instead
  splits the recomputation into chunks that ride along with the other requests' decode
  iterations, so the others are not stalled and the only waste is the part of the context
  already recomputed, held while the rest is: with chunks of S tokens, after chunk j
  ``m_j = min(j S, C)`` tokens are resident during that chunk's forward,
  ``Waste_discard = sum_j (T_fwd(m_j) - T_fwd(m_{j-1})) * m_j``
  (about ``T_fwd(C) * C / 2`` for many chunks). The chunk is the engine's per-step token
  budget, since vLLM's chunked prefill is what runs the recomputation;
* swapped out to host memory and back (Eq. 3): two PCIe transfers during which the running
  batch (``C_batch`` tokens of KV) waits, ``Waste_swap = 2 * T_swap(C) * C_batch``.

The memory unit M of the paper multiplies every term and cancels, so wastes here are in
token-seconds.

Swap is not costed against the other two when deciding (Eq. 5, `assign`): swapping that
overlaps with compute is free, and what PCIe moves while one iteration computes is the swap
budget. So each iteration the interceptions are sorted by the waste they would otherwise cause,
``min(Waste_preserve, Waste_discard)``, the most wasteful are swapped while their contexts fit
the budget, and the rest take the smaller of preserve and discard. Eq. 3 remains the cost of a
swap that does not overlap (AugServe's value of a swapped call).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from server.policies.base import CostModel

Strategy = Literal["preserve", "discard", "swap"]

#: The step interval the swap budget is computed from is clamped to this range (seconds): a
#: step is never shorter than a small decode and an idle gap is not a step.
MIN_STEP_S = 0.005
MAX_STEP_S = 0.05


@dataclass(frozen=True, slots=True)
class Wastes:
    preserve: float
    discard: float
    swap: float

    def without_swap(self) -> float:
        """The waste an interception causes unless it is swapped (Eq. 5's sort key)."""
        return min(self.preserve, self.discard)

    def preserve_or_discard(self) -> Strategy:
        """Eq. 5's choice for an interception left out of the swap budget; a tie keeps the
        cache, since recomputing would buy nothing."""
        return "discard" if self.discard < self.preserve else "preserve"


def chunked_recompute_waste(cost: CostModel, context_tokens: int, chunk_tokens: int) -> float:
    """Eq. 4: token-seconds of GPU memory held by a context while it is recomputed in chunks."""
    if context_tokens <= 0:
        return 0.0
    chunk = max(1, chunk_tokens)
    waste, done, t_done = 0.0, 0, 0.0
    while done < context_tokens:
        done = min(context_tokens, done + chunk)
        t = cost.prefill_seconds(done)
        waste += (t - t_done) * done
        t_done = t
    return waste


def wastes(cost: CostModel, context_tokens: int, interception_s: float, batch_tokens: int,
           chunk_tokens: int) -> Wastes:
    """The three wastes (token-seconds) of one interception of `context_tokens`, lasting
    `interception_s`, with `batch_tokens` of KV in the running batch and recomputation chunks
    of `chunk_tokens`."""
    c = context_tokens
    return Wastes(preserve=interception_s * c,
                  discard=chunked_recompute_waste(cost, c, chunk_tokens),
                  swap=2.0 * cost.swap_seconds(c) * max(0, batch_tokens))


def assign(candidates: Iterable[tuple[str, int, Wastes]], budget_tokens: int
           ) -> dict[str, Strategy]:
    """Eq. 5: strategies for one iteration's interceptions, given as (key, context tokens,
    wastes). The most wasteful (by `Wastes.without_swap`) are swapped while their contexts fit
    `budget_tokens`; a context that does not fit leaves the budget to smaller ones after it.
    Ties keep the given order."""
    ranked = sorted(candidates, key=lambda c: -c[2].without_swap())
    left = budget_tokens
    out: dict[str, Strategy] = {}
    for key, tokens, w in ranked:
        if tokens <= left and w.without_swap() > 0:
            out[key] = "swap"
            left -= tokens
        else:
            out[key] = w.preserve_or_discard()
    return out


class SwapBudget:
    """Tokens PCIe may move in the current scheduler step.

    A step is recognised by its clock reading (the scheduler calls policies with one `now` per
    step). The budget is what one PCIe direction moves in the last step interval, clamped to
    [MIN_STEP_S, MAX_STEP_S], so swapping stays hidden behind compute as InferCept's pipelined
    swap requires (section 4.3).
    """

    def __init__(self, cost: CostModel) -> None:
        # the cost model is linear in tokens apart from a fixed latency: probe it at a large size
        probe = 100_000
        self._per_token_s = cost.swap_seconds(probe) / probe
        self._step_at: float | None = None
        self.left = 0

    def _refresh(self, now: float) -> None:
        if now == self._step_at:
            return
        interval = MAX_STEP_S if self._step_at is None else now - self._step_at
        interval = min(MAX_STEP_S, max(MIN_STEP_S, interval))
        self._step_at = now
        self.left = self.tokens_in(interval)

    def tokens_in(self, seconds: float) -> int:
        """Tokens one PCIe direction moves in `seconds`."""
        if self._per_token_s <= 0:
            return 1 << 30
        return int(seconds / self._per_token_s + 1e-6)

    def available(self, now: float) -> int:
        """What is left of this step's budget (a new clock reading starts a new step)."""
        self._refresh(now)
        return self.left

    def take(self, tokens: int, now: float) -> None:
        self._refresh(now)
        self.left -= tokens
