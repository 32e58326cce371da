"""`continuum-prefetch`: Continuum, plus bringing an evicted context back before the tool returns.

Beyond the papers (issue 15). Continuum pins a turn's KV cache only while the pin pays for
itself (`continuum`'s TTL); a long tool call gets no pin, or a pin that expires, and its
context may then be evicted from GPU memory while the tool runs. With a host tier (vLLM's
native offloading) the next turn reloads it over PCIe on arrival, and waits for that load.
This policy starts the reload earlier, so the load overlaps the tool call:

* Predicted return: the interception's start (the turn's finish) plus the predicted duration:
  the client's prediction (`predicted_s`, a hint or a `tool_start`), else the median of the
  tool's own duration distribution once the cold-start chain has one; under the Exp prior
  (nothing learnt yet) there is no prediction and no prefetch.
* Start: at the predicted return minus the lead, lead = T_wait (the measured mean queueing
  wait of turns that arrived without a pin: a prefetch queues like them) plus the reload time
  of the context (`reload_seconds`: the PCIe load with a host tier, a re-prefill without) plus
  `MARGIN_S`.
* Only when needed: a program still pinned when its prefetch is due, or whose turn already
  arrived, is skipped (the scheduler also skips pinned ones).
* After the load the context is pinned (`on_prefetched`) until the predicted return plus the
  hint slack (`HINT_SLACK` of the prediction, as a hinted TTL), then the usual rules: hand-off
  to the next turn, expiry (held while the turn waits), release under pressure.

Everything else is `continuum`'s, inherited unchanged, so a difference between the two is the
prefetch's alone. The mechanism (a one-token request over the known context, kept behind every
turn in the queue and never taking a pin under pressure) is the scheduler's:
`server.prefetch`. Constants: `MARGIN_S = 0.1` s, the engine steps a prefetch needs besides
its load (the step on which it is due, its admission, the step that reports the load done: a
few tens of ms each under load on the profiles we emulate); `HINT_SLACK` is continuum's.

Per-event cost: O(log n) per planned prefetch (a heap), O(1) per due one.
"""

from __future__ import annotations

import heapq
import math

from server.policies.base import AgentEvent, RequestView
from server.policies.continuum import UNKNOWN_TOOL, ContinuumPolicy, _Pin

MARGIN_S = 0.1


class ContinuumPrefetchPolicy(ContinuumPolicy):
    name = "continuum-prefetch"
    prefetches = True
    needs_offload = True  # the reload it moves earlier is a PCIe load from the host tier

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._plans: dict[str, tuple[float, int]] = {}  # pid -> (start, context tokens)
        self._due: list[tuple[float, int, str]] = []  # (start, seq, pid), lazily invalidated
        self._seq = 0
        self.prefetches_planned = 0

    # -- the plan ------------------------------------------------------------------------
    def predicted_duration(self, program_id: str) -> float | None:
        """The current interception's predicted duration (None: no prediction)."""
        st = self._programs.get(program_id)
        if st is None:
            return None
        if st.predicted_s is not None and math.isfinite(st.predicted_s) and st.predicted_s >= 0:
            return float(st.predicted_s)
        _, dist = self.durations.resolve(st.tool or UNKNOWN_TOOL)
        return None if dist is None else float(dist.quantile(0.5))

    def _plan(self, program_id: str, context_tokens: int) -> None:
        st = self._programs.get(program_id)
        predicted = self.predicted_duration(program_id)
        if st is None or st.finish_time is None or predicted is None:
            self._plans.pop(program_id, None)
            return
        returns = st.finish_time + predicted
        start = returns - self.t_wait() - self.reload_seconds(context_tokens) - MARGIN_S
        self._plans[program_id] = (start, context_tokens)
        self._seq += 1
        heapq.heappush(self._due, (start, self._seq, program_id))
        self.prefetches_planned += 1

    def on_finish(self, req: RequestView, now: float) -> bool:
        pinned = super().on_finish(req, now)
        pid = req.program_id
        if pid is not None and pid not in self._ended and not req.hints.last:
            self._plan(pid, req.context_tokens)
        return pinned

    def on_event(self, event: AgentEvent, now: float) -> None:
        super().on_event(event, now)
        pid = event.program_id
        if event.kind == "tool_start" and pid in self._plans:
            self._plan(pid, self._plans[pid][1])  # a new prediction moves the plan
        elif event.kind == "program_end":
            self._plans.pop(pid, None)

    def on_arrival(self, req: RequestView, now: float) -> None:
        super().on_arrival(req, now)
        if req.program_id is not None:
            self._plans.pop(req.program_id, None)  # the turn is here: nothing to prefetch

    # -- the scheduler's questions -------------------------------------------------------
    def prefetch_due(self, now: float) -> list[str]:
        due: list[str] = []
        while self._due and self._due[0][0] <= now:
            start, _, pid = heapq.heappop(self._due)
            plan = self._plans.get(pid)
            if plan is None or plan[0] != start:
                continue  # replanned or cancelled since
            del self._plans[pid]
            st = self._programs.get(pid)
            if st is None or st.ended or st.finish_time is None or st.pin is not None:
                continue
            due.append(pid)
        return due

    def on_prefetched(self, program_id: str, context_tokens: int, now: float) -> bool:
        st = self._programs.get(program_id)
        if st is None or st.ended or st.finish_time is None:
            return False  # the turn came (or the program ended) while it loaded
        predicted = self.predicted_duration(program_id)
        if predicted is None:
            return False
        deadline = max(now, st.finish_time + predicted) + self.hint_slack * predicted
        st.pin = _Pin(now, deadline - now, deadline, context_tokens, "hint")
        self.pins_made += 1
        return True

    def stats(self) -> dict:  # type: ignore[type-arg]
        out = super().stats()
        out["prefetches_planned"] = self.prefetches_planned
        return out
