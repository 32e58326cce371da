"""`continuum`: KV-cache time-to-live pinning with program-level FCFS (Continuum).

Paper: H. Li, Q. Mang, R. He, et al., "Continuum: Efficient and Robust Multi-Turn LLM Agent
Scheduling with KV Cache Time-to-Live", arXiv:2511.02230. Section names below are the paper's
(its numbering changed between arXiv versions, so we cite by title):

* TTL as a utility maximisation (design, "time-to-live"): when a turn ends in a tool call, pin
  its KV cache for

      tau* = argmax_{tau in {0} ∪ observed durations}  P(d <= tau | tool) * B - tau,
      B    = T_wait * eta + PrefillReload(ctx)

  Pinning for tau costs tau seconds of held memory; with probability P(d <= tau) the tool
  returns in time and the next turn saves the reload of its context plus the queueing wait an
  evicted program would pay, weighted by eta. The reload is what an evicted context costs to
  bring back: a re-prefill, or, when the engine keeps a host-memory copy of the KV cache (vLLM's
  native offloading; the paper's evaluation gives every system such a CPU tier, LMCache), a
  PCIe load of the context, which the engine takes whenever it finds the copy. The utility is
  piecewise linear between observed durations with upward jumps only at them, so the maximum
  is at 0 or at an observed duration: that is why the candidates are exactly those.
* Tool-duration modelling and cold start: P comes from an empirical CDF per tool; with fewer
  than `min_samples` (K = 100, the paper's) samples of the tool, from all tools' CDF; with fewer
  than K samples in all, from a prior d ~ Exp(mean m = 1 s). Under that prior
  U(tau) = B (1 - e^(-tau/m)) - tau is concave with U'(tau) = (B/m) e^(-tau/m) - 1, so the
  maximiser is the closed form tau* = max(0, m ln(B/m)), i.e. max(0, ln B) for m = 1 s (no pin
  unless B > 1 s).
  We put one level in front of the tool (issue #7): a tool name of the form `tool:class`
  (`bash:pytest`, what the harness's SWE-bench agent sends) is first looked up as that command
  class, then as the tool `bash`; a plain name takes the paper's chain unchanged. Durations are
  learnt under the name the events carry (`predictor.durations` holds the key format and the
  chain), so one `bash:pytest` call counts for `bash:pytest`, for `bash` and for all tools.
* eta, "memoryfulness": -corr(k, N-k) over the (turn index, remaining turns) pairs of finished
  programs, clipped to [0, 1]. It scales how much of an evicted turn's queueing wait a pin
  saves: when a program's length is unknown from its progress (all programs equally long gives
  corr = -1, eta = 1) every saved wait counts fully.
* Scheduling: the waiting queue is ordered preempted > pinned within TTL > program arrival
  (program-level FCFS) > request arrival. A pin never expires while the program's next turn
  waits in the queue, and under memory pressure the latest-arrived program's pin goes first.

Constants (module level, stated once here):

* `T_WAIT_WINDOW = 64` turns: T_wait is the sliding mean of the queueing wait (admission time
  minus arrival) of turns that arrived without a pin of their program (evicted or never pinned;
  a program's first turn and requests without a program are not counted).
* `T_WAIT_DEFAULT_S = 0.0`: T_wait before any sample (then only the reload cost argues for a
  pin, the conservative choice).
* `ETA_DEFAULT = 1.0`: eta until at least two finished programs differ in turn count (with
  equal N the correlation is exactly -1, so 1 is also the limit value), and whenever the
  correlation is undefined.
* `FALLBACK_PREFILL_S_PER_TOKEN = 1e-4` (0.1 ms per token): the reload cost when no cost model
  was given (the order of a 7-8B model's prefill on one datacentre GPU).
* `FALLBACK_LOAD_S_PER_TOKEN = 4e-6` (4 us per token): the same for a load from host memory
  (128 KiB of KV per token of an 8B model over ~32 GB/s of PCIe).
* `PRIOR_MEAN_S = 1.0`: the mean of the Exp prior (see above).
* `HINT_SLACK = 0.2`: when the client predicted the tool's duration p (hint `predicted_s` or a
  `tool_start` event's `predicted_s`), the prediction replaces the CDF: tau = p (1 + 0.2) if
  B > tau (the pin pays for itself if the prediction holds), else no pin. A harness extension,
  not in the paper; issue #7 refines it. A hint made for a tool holds until a `tool_start`
  names another call (a hint for `bash` survives `bash:pytest`, one for `bash:ls` does not).
* `MIN_SAMPLES = 100`: K, the samples a level of the cold-start chain needs (the paper's K; the
  client-side predictor keeps its own, smaller default). `DURATION_WINDOW = 1000`: see
  `predictor.durations`.
* `UNKNOWN_TOOL = "unknown"`: the tool name used when no hint or event named it.
* A finish without a tool hint uses the program's previous interception's tool as its guess
  (agents often repeat a tool) until a `tool_start` names the real one and the pin's deadline
  is recomputed as pinned_at + the new tau*.
* `ENDED_MEMORY = 65536` (`server.policies.memory`, shared by the policies that remember):
  how many ended program ids are remembered, so that a late finish of an ended program is not
  pinned.

Per-event cost: `queue_key`, `pin_expired` and `pin_victim` (per pin) are O(1) dictionary
look-ups; a TTL is computed once per finish and per `tool_start` (O(samples), <= 1000).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from common.tool_keys import split_key
from predictor.durations import DEFAULT_WINDOW, ToolDurationModel
from predictor.means import SlidingMean
from server.policies.base import AgentEvent, CostModel, Policy, RequestView, UnpinReason
from server.policies.memory import RecentIds

T_WAIT_WINDOW = 64
T_WAIT_DEFAULT_S = 0.0
ETA_DEFAULT = 1.0
FALLBACK_PREFILL_S_PER_TOKEN = 1e-4
FALLBACK_LOAD_S_PER_TOKEN = 4e-6
PRIOR_MEAN_S = 1.0
HINT_SLACK = 0.2
MIN_SAMPLES = 100
DURATION_WINDOW = DEFAULT_WINDOW
UNKNOWN_TOOL = "unknown"

#: Where a TTL came from: the client's prediction, or a level of the cold-start chain.
TTLSource = Literal["hint", "command", "tool", "global", "prior"]

# queue classes, smallest first
_PREEMPTED, _PINNED, _OTHER = 0.0, 1.0, 2.0

# how a waiting turn arrived (per request, until it is admitted)
_FIRST, _PINNED_ARRIVAL, _EVICTED, _LOST = "first", "pinned", "evicted", "lost"


@dataclass(frozen=True, slots=True)
class TTLDecision:
    """One TTL decision, for tests and reports."""

    ttl: float
    source: TTLSource
    benefit: float  # B = T_wait * eta + reload, seconds
    reload: float  # PrefillReload(ctx): re-prefill, or PCIe load with a host tier, seconds
    tool: str


@dataclass(slots=True)
class _Pin:
    pinned_at: float
    ttl: float
    deadline: float
    context_tokens: int
    source: TTLSource


@dataclass(slots=True)
class _Program:
    arrival: float
    turns: int = 0  # turns seen (arrivals, or the highest hinted turn index + 1)
    tool: str | None = None  # the current (or last) interception's tool
    tool_from_event: bool = False  # named by a tool_start of the current interception
    predicted_s: float | None = None  # the current interception's predicted duration
    predicted_tool: str | None = None  # the tool that prediction was made for (None: any)
    finish_time: float | None = None  # when the turn before the current interception ended
    duration_reported: bool = False  # a tool_end gave the current interception's seconds
    pin: _Pin | None = None
    handoff: bool = False  # the pin was handed to the next turn (set by on_unpin)
    ended: bool = False
    n_recorded: bool = False  # N already fed to eta
    pending: dict[str, str] = field(default_factory=dict)  # waiting request id -> how arrived


def _same_call(hinted: str, named: str) -> bool:
    """Whether a prediction hinted for the tool key `hinted` still holds for a call that a
    `tool_start` names `named`: the same key, or one refines the other (`bash` and
    `bash:pytest`); `bash:ls` against `bash:pytest` is another call. For plain tool names this
    is plain equality."""
    return hinted == named or hinted == split_key(named)[0] or split_key(hinted)[0] == named


class _Memoryfulness:
    """eta = -corr(k, N-k) over all (k, N-k), k = 0..N-1, of finished programs, kept as exact
    integer sums so each finished program costs O(1)."""

    __slots__ = ("n", "sk", "skk", "sr", "srr", "skr", "programs", "lengths", "_eta")

    def __init__(self) -> None:
        self.n = self.sk = self.skk = self.sr = self.srr = self.skr = 0
        self.programs = 0
        self.lengths: set[int] = set()
        self._eta: float | None = ETA_DEFAULT

    def add(self, big_n: int) -> None:
        if big_n < 1:
            return
        m = big_n
        sk = m * (m - 1) // 2  # sum k, k = 0..N-1
        skk = (m - 1) * m * (2 * m - 1) // 6  # sum k^2
        sr = m * (m + 1) // 2  # sum r, r = N-k = 1..N
        srr = m * (m + 1) * (2 * m + 1) // 6  # sum r^2
        self.n += m
        self.sk += sk
        self.skk += skk
        self.sr += sr
        self.srr += srr
        self.skr += m * sk - skk  # sum k (N - k)
        self.programs += 1
        if len(self.lengths) < 2:
            self.lengths.add(m)
        self._eta = None

    def eta(self) -> float:
        if self._eta is None:
            self._eta = self._compute()
        return self._eta

    def _compute(self) -> float:
        if len(self.lengths) < 2:
            return ETA_DEFAULT
        n = self.n
        cov = n * self.skr - self.sk * self.sr
        var_k = n * self.skk - self.sk * self.sk
        var_r = n * self.srr - self.sr * self.sr
        if var_k <= 0 or var_r <= 0:
            return ETA_DEFAULT
        corr = cov / math.sqrt(var_k * var_r)
        return min(1.0, max(0.0, -corr))


class _ConstantReload:
    """The documented fallback cost model (FALLBACK_PREFILL_S_PER_TOKEN per context token)."""

    def prefill_seconds(self, context_tokens: int) -> float:
        return FALLBACK_PREFILL_S_PER_TOKEN * max(0, context_tokens)

    def swap_seconds(self, tokens: int) -> float:
        return FALLBACK_LOAD_S_PER_TOKEN * max(0, tokens)


class ContinuumPolicy(Policy):
    name = "continuum"
    reorders_queue = True

    def __init__(
        self,
        cost_model: CostModel | None = None,
        *,
        durations: ToolDurationModel | None = None,
        min_samples: int = MIN_SAMPLES,
        t_wait_default_s: float = T_WAIT_DEFAULT_S,
        hint_slack: float = HINT_SLACK,
    ) -> None:
        super().__init__(cost_model)
        self.durations = durations or ToolDurationModel(
            min_samples=min_samples, window=DURATION_WINDOW, prior_mean_s=PRIOR_MEAN_S
        )
        self.t_wait_default_s = t_wait_default_s
        self.hint_slack = hint_slack
        self._reload_model: Any = cost_model if cost_model is not None else _ConstantReload()
        self._programs: dict[str, _Program] = {}
        self._ended = RecentIds()
        self._t_wait = SlidingMean(T_WAIT_WINDOW)
        self._eta = _Memoryfulness()
        self.pins_made = 0
        self.decisions: dict[str, int] = dict.fromkeys(get_args(TTLSource), 0)

    # -- estimates ---------------------------------------------------------------------
    def t_wait(self) -> float:
        """Mean queueing wait of recently admitted turns that arrived without a pin."""
        return self._t_wait.mean(self.t_wait_default_s)

    def eta(self) -> float:
        return self._eta.eta()

    def reload_seconds(self, context_tokens: int) -> float:
        """What bringing an evicted context back costs: a PCIe load from the host tier when the
        engine keeps one, else a re-prefill."""
        if self.host_tier:
            return float(self._reload_model.swap_seconds(context_tokens))
        return float(self._reload_model.prefill_seconds(context_tokens))

    def ttl_for(
        self, tool: str | None, context_tokens: int, predicted_s: float | None = None
    ) -> TTLDecision:
        """The TTL Continuum gives a turn whose tool is `tool` (None: unknown) with a context of
        `context_tokens`, now: the same computation `on_finish` and `tool_start` use."""
        tool = tool or UNKNOWN_TOOL
        reload = self.reload_seconds(context_tokens)
        benefit = self.t_wait() * self.eta() + reload
        if predicted_s is not None and math.isfinite(predicted_s) and predicted_s >= 0:
            tau = predicted_s * (1.0 + self.hint_slack)
            return TTLDecision(tau if benefit > tau else 0.0, "hint", benefit, reload, tool)
        source, dist = self.durations.resolve(tool)
        if dist is None:
            m = self.durations.prior_mean_s
            tau = m * math.log(benefit / m) if benefit > m else 0.0
            return TTLDecision(tau, "prior", benefit, reload, tool)
        best_tau, best_u = 0.0, 0.0  # tau = 0: no pin, utility 0
        for value, p in dist.steps():
            u = p * benefit - value
            if u > best_u:  # strict: ties keep the shorter TTL
                best_tau, best_u = value, u
        return TTLDecision(best_tau, source, benefit, reload, tool)

    def deadline(self, program_id: str) -> float | None:
        """The live pin's expiry time for `program_id` (None: not pinned)."""
        st = self._programs.get(program_id)
        return st.pin.deadline if st is not None and st.pin is not None else None

    def stats(self) -> dict[str, Any]:
        """Figures for the benchmark report."""
        return {
            "eta": self.eta(),
            "eta_programs": self._eta.programs,
            "t_wait_s": self.t_wait(),
            "t_wait_samples": len(self._t_wait),
            "duration_samples": self.durations.counts(),
            "pins_made": self.pins_made,
            "pins_live": sum(1 for st in self._programs.values() if st.pin is not None),
            "ttl_sources": dict(self.decisions),
        }

    # -- program bookkeeping -----------------------------------------------------------
    def _program(self, program_id: str, seen_at: float) -> _Program:
        st = self._programs.get(program_id)
        if st is None:
            st = self._programs[program_id] = _Program(arrival=seen_at)
        return st

    def _record_length(self, st: _Program) -> None:
        if not st.n_recorded and st.turns > 0:
            st.n_recorded = True
            self._eta.add(st.turns)

    def _end(self, program_id: str, st: _Program) -> None:
        self._record_length(st)
        st.ended = True
        self._ended.add(program_id)
        if st.pin is None:
            del self._programs[program_id]  # nothing left to decide about it

    # -- lifecycle ---------------------------------------------------------------------
    def on_arrival(self, req: RequestView, now: float) -> None:
        pid = req.program_id
        if pid is None:
            return
        self._ended.discard(pid)  # a reused id is a new program
        st = self._program(pid, min(now, req.arrival_time))
        st.turns = max(st.turns + 1, (req.hints.turn or 0) + 1)
        if st.finish_time is not None:
            if not st.duration_reported:  # server-side fallback: interception length
                self.durations.observe(st.tool or UNKNOWN_TOOL, max(0.0, now - st.finish_time))
            st.finish_time = None
        if st.turns <= 1 and not st.pending:
            how = _FIRST
        elif st.pin is not None or st.handoff:
            how = _PINNED_ARRIVAL
        else:
            how = _EVICTED
        st.pending[req.request_id] = how
        st.handoff = False
        st.predicted_s = st.predicted_tool = None  # the interception is over
        st.tool_from_event = False

    def on_scheduled(self, req: RequestView, now: float) -> None:
        pid = req.program_id
        st = self._programs.get(pid) if pid is not None else None
        if st is None:
            return
        if st.pending.pop(req.request_id, None) == _EVICTED:
            self._t_wait.add(max(0.0, now - req.arrival_time))

    def on_event(self, event: AgentEvent, now: float) -> None:
        pid = event.program_id
        if event.kind == "program_start":
            self._ended.discard(pid)
            st = self._program(pid, now)
            st.arrival = min(st.arrival, now)
        elif event.kind == "tool_start":
            if pid in self._ended:
                return
            st = self._program(pid, now)
            if (
                event.predicted_s is None
                and event.tool
                and st.predicted_tool is not None
                and not _same_call(st.predicted_tool, event.tool)
            ):
                st.predicted_s = None  # the hinted prediction was for another tool
            if event.tool:
                st.tool = event.tool
                st.tool_from_event = True
            if event.predicted_s is not None:
                st.predicted_s, st.predicted_tool = event.predicted_s, event.tool
            if st.pin is not None:
                decision = self._decide(st.tool, st.pin.context_tokens, st.predicted_s)
                st.pin.ttl = decision.ttl
                st.pin.deadline = st.pin.pinned_at + decision.ttl
                st.pin.source = decision.source
        elif event.kind == "tool_end":
            st = self._programs.get(pid)
            tool = event.tool or (st.tool if st is not None else None) or UNKNOWN_TOOL
            if event.seconds is not None and math.isfinite(event.seconds) and event.seconds >= 0:
                self.durations.observe(tool, event.seconds)
                if st is not None:
                    st.duration_reported = True
        elif event.kind == "program_end":
            st = self._programs.get(pid)
            if st is not None:
                self._end(pid, st)
            else:
                self._ended.add(pid)

    # -- retention ---------------------------------------------------------------------
    def on_finish(self, req: RequestView, now: float) -> bool:
        pid = req.program_id
        if pid is None:
            return False
        if req.hints.last:  # the program's last LLM call: it has ended for us
            st = self._programs.get(pid)
            if st is not None:
                st.turns = max(st.turns, (req.hints.turn or 0) + 1)
                self._end(pid, st)
            return False
        if pid in self._ended:
            return False
        st = self._program(pid, req.arrival_time)
        st.turns = max(st.turns, (req.hints.turn or 0) + 1)
        st.finish_time = now
        st.duration_reported = False
        st.handoff = False
        if req.hints.tool and not st.tool_from_event:
            st.tool = req.hints.tool
        if req.hints.predicted_s is not None and st.predicted_s is None:
            st.predicted_s, st.predicted_tool = req.hints.predicted_s, req.hints.tool
        ctx = req.context_tokens
        decision = self._decide(st.tool, ctx, st.predicted_s)
        if decision.ttl <= 0:
            st.pin = None
            return False
        st.pin = _Pin(now, decision.ttl, now + decision.ttl, ctx, decision.source)
        self.pins_made += 1
        return True

    def _decide(self, tool: str | None, ctx: int, predicted_s: float | None) -> TTLDecision:
        decision = self.ttl_for(tool, ctx, predicted_s)
        self.decisions[decision.source] += 1
        return decision

    def pin_expired(self, program_id: str, now: float, has_waiting: bool) -> bool:
        st = self._programs.get(program_id)
        if st is None or st.ended:
            return True
        if has_waiting:
            return False
        return st.pin is None or now >= st.pin.deadline

    def pin_victim(self, pinned_program_ids: list[str]) -> str:
        """The latest-arrived program (ties: the later in the list); a program this policy no
        longer tracks (ended) goes first."""
        best, best_key = pinned_program_ids[-1], (-math.inf, -1)
        for i, pid in enumerate(pinned_program_ids):
            st = self._programs.get(pid)
            key = (math.inf if st is None else st.arrival, i)
            if key > best_key:
                best, best_key = pid, key
        return best

    def on_unpin(self, program_id: str, reason: UnpinReason, now: float) -> None:
        if reason == "replaced":
            return  # the scheduler releases the old pin after on_finish set the new one
        st = self._programs.get(program_id)
        if st is None:
            return
        st.pin = None
        if reason == "handoff":
            # Normally the next turn was admitted (after on_arrival). A scheduler that hands
            # off before reporting the arrival leaves finish_time set: remember the pin.
            st.handoff = st.finish_time is not None
        else:  # the KV is gone: a waiting turn no longer has a pin to reuse
            for rid, how in st.pending.items():
                if how == _PINNED_ARRIVAL:
                    st.pending[rid] = _LOST
        if st.ended:
            del self._programs[program_id]

    # -- ordering ----------------------------------------------------------------------
    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        """(class, program arrival, request arrival): preempted first, then turns of programs
        that hold their pin (arrived within the TTL, or pinned and still within it), then
        program-level FCFS."""
        pid = req.program_id
        st = self._programs.get(pid) if pid is not None else None
        if st is None:
            cls = _PREEMPTED if req.num_preemptions > 0 else _OTHER
            return (cls, req.arrival_time, req.arrival_time)
        if req.num_preemptions > 0:
            cls = _PREEMPTED
        elif st.pending.get(req.request_id) == _PINNED_ARRIVAL or (
            st.pin is not None and now < st.pin.deadline
        ):
            cls = _PINNED
        else:
            cls = _OTHER
        return (cls, st.arrival, req.arrival_time)
