"""`thunderagent`: ThunderAgent's program scheduler (arXiv 2602.13692), as its paper and its
released code run it.

What it does (our code):

* Every program is reasoning (a turn queued or in flight) or acting (in a tool call), and active
  or paused. Every `TICK_S` = 5 s it counts the backend's usage: the context tokens of every
  active program, reasoning or acting, plus `PER_PROGRAM_TOKENS` = 100 per program, less the
  *shared tokens*, against the backend's KV capacity. The shared tokens are the released
  code's (`remaining_capacity` subtracts them): the reasoning programs' tokens less the
  engine's KV usage times its capacity, when positive, i.e. the prefix the engine holds once
  and the books count once per program; taken at each decision from the engine's count
  (`observe_engine`), 0 until it is heard. (The released repository defines the update and
  its tick's docstring names it, but its tick never calls it, so there the term stays 0; we
  follow the rule its capacity formulas state.)
* Above capacity (`pause_above` x capacity; 1.0 in the paper, 0.95 in NVIDIA Dynamo's port) it
  pauses acting programs, smallest context first, until usage is down to `pause_to` x capacity
  (1.0; Dynamo 0.80); if pausing every acting program is not enough, it marks reasoning
  programs, smallest first, to pause when their turn ends. Smallest first because the cost of a
  pause is a re-prefill, which grows with the square of the context.
* A paused program's KV is assumed lost (the engine's LRU reclaims it; the next turn
  re-prefills wherever it resumes): ThunderAgent runs in front of unmodified engines and holds
  no pins.
* Below capacity it resumes, up to `resume_to` x capacity (1.0; Dynamo 0.85), in this order:
  paused programs whose next turn is already waiting, then new programs, then paused acting
  programs; smallest context first within each class; each placed on the backend with the most
  free room (`ProgramScheduler.place`).
* A new program is admitted at once when it fits and no program is queued (paused, or new and
  waiting): the released code admits no new program ahead of its queue; otherwise it waits for
  a tick. When the engine has nothing to run, the caller asks at once instead of waiting for
  the tick (`decide(idle=True)`): a tick would only idle it.

The two released-code rules live in the loop MORI shares (`server.programs.capacity`).
"""

from __future__ import annotations

from server.programs.capacity import CapacityScheduler, resume_class
from server.programs.state import ProgramState


class ThunderAgent(CapacityScheduler):
    """The thresholds are the paper's (1.0) unless given (`pause_above`, `pause_to`,
    `resume_to`); the loop is `CapacityScheduler`'s, the order smallest context first, and a
    pause leaves the KV to the engine (`CapacityScheduler.paused_kv`'s default)."""

    name = "thunderagent"

    def pause_order(self, st: ProgramState) -> tuple[float, ...]:
        return (st.context_tokens, st.arrival)

    def resume_order(self, st: ProgramState) -> tuple[float, ...]:
        return (resume_class(st), st.context_tokens, st.arrival)
