"""InferCept's min-waste choice among Preserve, Discard and Swap (Abhyankar et al., ICML 2024,
section 4.2, equations 1-3), shared by `infercept` and `augserve` (AugServe's stage I uses the
same equations, section 3.2 of arXiv:2512.04013).

While a program is intercepted (its tool runs), its KV cache of C tokens can be

* preserved: it holds C tokens of GPU memory for the whole interception,
  ``Waste_preserve = T_int * C``;
* discarded and recomputed on return: recomputing takes ``T_fwd(C)``, during which its own C
  tokens and the other running requests' ``C_other`` tokens are tied up,
  ``Waste_discard = T_fwd(C) * C + T_fwd(C) * C_other``;
* swapped out to host memory and back: two PCIe transfers during which a full forward batch
  (``N_fwd_max`` tokens) waits, ``Waste_swap = 2 * T_swap(C) * N_fwd_max``.

The memory unit M of the paper multiplies every term and cancels, so wastes here are in
token-seconds. Swap is only a candidate while the step's swap budget (the tokens PCIe can move
while one forward step runs, so transfers overlap with compute) has room for C tokens.
"""

from __future__ import annotations

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
    swap: float | None  # None: not a candidate (no budget or no swap path)

    def least_value(self) -> float:
        return min(x for x in (self.preserve, self.discard, self.swap) if x is not None)

    def least(self) -> Strategy:
        """The strategy with the least waste; ties go to the cheaper mechanism (preserve, then
        swap, then discard), since a tie means the extra work buys nothing."""
        best: Strategy = "preserve"
        value = self.preserve
        if self.swap is not None and self.swap < value:
            best, value = "swap", self.swap
        if self.discard < value:
            best = "discard"
        return best


def wastes(cost: CostModel, context_tokens: int, interception_s: float, other_tokens: int,
           max_batch_tokens: int, swap_allowed: bool) -> Wastes:
    """The three wastes of one interception (token-seconds)."""
    c = context_tokens
    t_fwd = cost.prefill_seconds(c)
    swap = 2.0 * cost.swap_seconds(c) * max_batch_tokens if swap_allowed else None
    return Wastes(preserve=interception_s * c, discard=t_fwd * c + t_fwd * other_tokens,
                  swap=swap)


class SwapBudget:
    """Tokens that may still be swapped in the current scheduler step.

    A step is recognised by its clock reading (the scheduler calls policies with one `now` per
    step). The budget is what PCIe moves in the last step interval, clamped to
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

    def fits(self, tokens: int, now: float) -> bool:
        self._refresh(now)
        return tokens <= self.left

    def take(self, tokens: int, now: float) -> None:
        self._refresh(now)
        self.left -= tokens
