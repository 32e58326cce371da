"""`lookahead`: our program scheduler — which programs hold memory, who gives way and what a
tool call keeps, decided at events from the engine's own count of memory, the tool-duration
predictions and the expected remaining work.

Why (docs/programs.md has the measurements): on a burst of long programs a plain cap of 32
programs at a time beats every per-request order, because admitting everyone thrashes memory
(vLLM recomputes most of what it prefills). What fits depends on the contexts, which only the
engine counts exactly; what a program will do next (its tool's predicted return) only the
harness's events tell. The rules:

* **How many at once.** Every live program whose turn fits in memory (below): no rule of batch
  size holds a program back while memory is free. Until 2026-11-28 a square-root rule did
  while a backlog drained (serving N programs in batches of B with a decode step of a + b B
  gives a mean completion time least at B* = sqrt(a N / b)); measured against memory alone
  on every setting, it lost more than it gained, with program lengths known too (the burst:
  `lookahead-oracle` 424.0 s with it, 400.8 s without; docs/programs.md, "What the versions
  taught"): its model prices only the decode step, not the prefill a turn's tool output and
  a recompute add per token, which fewer programs at once do not make cheaper.
* **Memory.** What the active programs hold, counted by the engine (`observe_engine`: the
  blocks that cannot be evicted, running turns' and pins', plus what their turns have still
  to take blocks for), stays within the KV capacity less the decode output the running turns
  have still to write (a turn's mean output each); a program is admitted only if the tokens
  its turn has to allocate fit (a paused one with `RESUME_BAND` of the capacity to spare:
  hysteresis against pause-resume cycles, each a whole-context recompute), except that while
  no admitted program reasons a ready turn is let in anyway (the acting programs' pins make
  room) rather than leave the GPU idle. Until the engine has been heard and an output seen,
  the account is from contexts: an active program's context (an acting one's unless its KV
  was released to the host tier), against the capacity less a turn's mean growth per
  reasoning program (`MEMORY_SHARE` of it until a growth is seen). The engine's count is
  exact where the contexts were not: a prefix programs share is held once, not once per
  program (on short programs the estimate left a quarter of the cache unused, and
  ThunderAgent was 12% ahead).
* **Who.** Of the programs waiting for memory, least expected remaining work first
  (`RemainingTurns`: E[N - k | N > k] over ended programs, priced by the cost model), then
  arrival (program-level FCFS; this is the order until `MIN_ENDED` programs ended); an
  admitted program is not displaced by a better-ranked one (a pause costs a reload).
* **Who gives way.** When memory runs short, the acting program whose
  next turn is furthest away, weighted by its size ((predicted return - now) x context), is
  paused at once; its KV goes to the host tier when there is one, else it is dropped. A
  reasoning program is never paused mid-turn. Under an allocation failure the same score picks
  which pin to give up (Belady's rule with the predicted return standing in for the future).
  When program lengths are known (`lookahead-oracle`), a ready turn that does not fit also
  takes the place of acting programs with more than `PREEMPT_MARGIN` times its expected
  remaining work (most work first): program-level shortest-remaining-work with preemption.
  With lengths learned from ended programs (the age-based estimate, whose spread on
  `swe-long` is half its mean) the same rule measured worse, so it is off there.
* **What a tool call keeps.** An active program's finished turn is pinned through its tool
  call; with a host tier, a call the client predicts to outlast its reload many times over is
  released to the tier and prefetched at the predicted return minus the transfer time
  (`keep_worth_it`; told nothing, the KV is kept).
* **When.** At every event (a turn arrives, is admitted, finishes; a tool starts or ends; a
  program ends), never on a tick.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from predictor.programs import LENGTH_WINDOW, RemainingTurns
from server.costs import WorkModel
from server.programs.base import PER_PROGRAM_TOKENS, ProgramScheduler
from server.programs.state import Kv, Phase, ProgramState

#: Active programs' KV stays within this share of the capacity until a turn's growth is known.
MEMORY_SHARE = 0.9
#: A program paused before resumes only with this share of the capacity to spare beyond
#: itself (hysteresis): a resume that the next turns' growth undoes costs a whole-context
#: recompute per cycle. Without it a closed loop of 64 long programs paused 736 times (0.73 of
#: its prefill recomputed), with it 105 (0.33); ThunderAgent's Dynamo port keeps the same
#: band (pause above 0.95 of capacity, resume up to 0.85).
RESUME_BAND = 0.1
#: With known lengths, an acting program gives way to a ready turn that does not fit when its
#: expected remaining work is more than this many times the turn's program's (a pause costs
#: a reload or a recompute, so a near tie is not worth one). Open loop, swe-long 0.2 jobs/s
#: with the 64 GiB tier: `lookahead-oracle` 318.3 s without it, 292.5 s with it; the learned
#: estimate at 2x 338.7 s (331.8 s without), at 3x 315.4 s but a closed loop of 64 without a
#: tier thrashed (681.0 s against 558.7 s), at 4x it never fires: known lengths only.
PREEMPT_MARGIN = 2.0
#: Programs ended before remaining-work ordering replaces arrival order.
MIN_ENDED = 10
#: With a host tier, a tool call is worth keeping the KV through when it is expected back
#: within this many reloads of the context.
KEEP_RELOADS = 10
#: Tool duration assumed when no prediction came (s): Continuum's Exp(1) prior mean.
DEFAULT_TOOL_S = 1.0


class Lookahead(ProgramScheduler):
    name = "lookahead"
    tick_s = None
    prefetches = True

    def __init__(self, capacity_tokens: int = 0, cost_model: object | None = None,
                 host_tier: bool = False) -> None:
        super().__init__(capacity_tokens, cost_model, host_tier)
        #: what a decoded token costs at a context (the remaining-work policies' yardstick, at
        #: exact contexts: rounded to 256 tokens the burst's order, and its figures, moved)
        self._work = WorkModel(cost_model, bucket=1)
        #: E[N - k | N > k] over the last ended programs' turn counts (remaining-work's table)
        self._lengths = RemainingTurns(window=LENGTH_WINDOW, min_programs=MIN_ENDED)
        self._growth_sum = 0.0
        self._growth_n = 0
        self._last_ctx: dict[str, int] = {}
        #: program -> its turn count, when told (`lookahead-oracle`, a clairvoyant reference:
        #: what the same rules reach when program lengths are known)
        self.known_turns: dict[str, int] | None = None
        #: the engine's count (`observe_engine`): non-evictable tokens (None until the engine
        #: is heard), and per program the tokens its turns have still to allocate (asked of
        #: the engine at each decision, `rebalance`: a walk over its queues)
        self._in_use: int | None = None
        self._ahead_of: Callable[[], Mapping[str, int]] = dict
        self._ahead: Mapping[str, int] = {}
        self._output_sum = 0.0
        self._output_n = 0

    # -- learning ------------------------------------------------------------------------
    def turn_arrived(self, program_id: str, prompt_tokens: int, now: float,
                     turn: int | None = None) -> None:
        prev = self._last_ctx.get(program_id)
        if prev is not None and prompt_tokens > prev:
            self._growth_sum += prompt_tokens - prev
            self._growth_n += 1
        self._last_ctx[program_id] = prompt_tokens
        super().turn_arrived(program_id, prompt_tokens, now, turn)

    def observe_engine(self, in_use_tokens: int,
                       ahead: Callable[[], Mapping[str, int]]) -> None:
        self._in_use = in_use_tokens
        self._ahead_of = ahead

    def turn_finished(self, program_id: str, context_tokens: int, now: float,
                      tool: str | None = None, predicted_s: float | None = None) -> Kv:
        prompt = self._last_ctx.get(program_id)
        if prompt is not None and context_tokens > prompt:  # the turn's output
            self._output_sum += context_tokens - prompt
            self._output_n += 1
        return super().turn_finished(program_id, context_tokens, now, tool, predicted_s)

    def program_ended(self, program_id: str, now: float) -> None:
        st = self.table.get(program_id)
        if st is not None and st.turns > 0:
            self._lengths.add(st.turns)
        self._last_ctx.pop(program_id, None)
        super().program_ended(program_id, now)

    def program_left(self, program_id: str, now: float) -> None:
        self._last_ctx.pop(program_id, None)  # a return here is not one turn's growth
        super().program_left(program_id, now)

    def turns_left(self, st: ProgramState) -> float:
        """E[N - k | N > k] over ended programs (this turn included); before `MIN_ENDED`
        ended, as many again as it has done (a program seen at age k is as likely to be in
        its first half as its second)."""
        k = st.turns
        if self.known_turns is not None and st.program_id in self.known_turns:
            return float(max(1, self.known_turns[st.program_id] - k))
        left = self._lengths.expected(k)
        if left is None or (left == 1.0 and k >= max(self._lengths.lengths)):
            return float(max(1, k))  # too few ended, or older than every ended program
        return left

    def growth(self) -> float:
        return self._growth_sum / self._growth_n if self._growth_n else 0.0

    # -- costs -----------------------------------------------------------------------------
    def expected_work(self, st: ProgramState) -> float:
        left = self.turns_left(st)
        ctx = st.context_tokens + left / 2 * self.growth()
        return left * self._work.decode_seconds_per_token(int(ctx))

    # -- decisions -------------------------------------------------------------------------
    def rank(self, st: ProgramState) -> tuple[float, ...]:
        """Which waiting program is admitted first, smaller first: expected remaining work,
        then arrival, then the programs that made the most progress (a paused program returns
        before a new one, as in ThunderAgent and MORI: its turns done are work a later start
        would still owe). Admitted programs are not ranked against them: a pause costs a
        reload, so a better-ranked arrival waits for memory rather than displace one (except
        with known lengths, `make_way`)."""
        known = self.known_turns is not None or self._lengths.known()
        work = self.expected_work(st) if known else 0.0
        return (work, st.arrival, -st.turns)

    def give_way_score(self, st: ProgramState, now: float) -> float:
        """How little a pause costs: time until its next turn x the KV it frees."""
        back = st.predicted_return if st.predicted_return is not None else (
            (st.tool_started or now) + DEFAULT_TOOL_S)
        return max(0.0, back - now) * max(1, st.context_tokens)

    def resident(self, st: ProgramState) -> int:
        """What a program holds in GPU memory for the memory rule. An acting program whose KV
        was released to the host tier (a long tool call; until its prefetch) is not counted.
        One whose KV stays on the GPU is, with a host tier or without: not counting acting
        programs let a closed loop admit past their pins and thrash (1,179 s mean JCT without
        a tier, and 923 s when counted only while the measured use was at the limit, which
        oscillated; with a tier, 128 programs in flight recomputed 96% of their prefill, as
        nothing that held memory could be paused)."""
        if st.phase is Phase.ACTING and not st.turn_waiting and st.kv is Kv.CPU:
            return 0
        return self.held_tokens(st)

    def memory_limit(self) -> float:
        """What active programs may hold: the capacity less the tokens the reasoning ones add
        before the next decisions (one turn's growth each: its output and the tool's return,
        the mean seen); `MEMORY_SHARE` of the capacity until a growth has been seen."""
        if not self._growth_n:
            return MEMORY_SHARE * self.capacity_tokens
        reasoning = sum(1 for st in self.table.active() if st.phase is not Phase.ACTING)
        return max(0.0, self.capacity_tokens - reasoning * self.growth())

    def counted(self) -> bool:
        """Whether the memory rule runs on the engine's count (heard, and an output seen)."""
        return self._in_use is not None and self._output_n > 0

    def engine_usage(self, active: Sequence[ProgramState]) -> float:
        """What the active programs hold by the engine's count, and what their turns have
        still to allocate."""
        assert self._in_use is not None
        return self._in_use + sum(self._ahead.get(st.program_id, 0) for st in active)

    def engine_limit(self) -> float:
        """The capacity less the output the running turns have still to write (a turn's
        mean output each)."""
        running = sum(1 for st in self.table.active()
                      if st.phase is not Phase.ACTING and not st.turn_waiting)
        return self.capacity_tokens - running * self._output_sum / self._output_n

    def need(self, st: ProgramState) -> float:
        """What admitting `st` adds: by the engine's count, the tokens its waiting turn has to
        allocate (its context when no turn waits); else its context."""
        if self.counted() and st.program_id in self._ahead:
            return self._ahead[st.program_id]
        return self.resident(st)

    def rebalance(self, now: float) -> None:
        active = self.table.active()
        if self.counted():
            self._ahead = self._ahead_of()
            usage, limit = self.engine_usage(active), self.engine_limit()
        else:
            usage = sum(self.resident(st) for st in active)
            limit = self.memory_limit()
        # memory short: acting programs give way, cheapest pause first
        if usage > limit:
            acting = sorted((st for st in active if st.phase is Phase.ACTING),
                            key=lambda st: -self.give_way_score(st, now))
            for st in acting:
                if usage <= limit:
                    break
                freed = self.resident(st)
                if freed > 0:
                    self.pause(st, now)
                    usage -= freed
            return
        # grow: the best-ranked waiting programs that fit; while no admitted program reasons
        # (all in tool calls) a ready turn is let in regardless, its room made by the acting
        # programs' pins (the engine's victim rule), rather than leave the GPU idle
        reasoning = sum(1 for st in active if st.phase is not Phase.ACTING or st.turn_waiting)
        for st in sorted(self.table.inactive(), key=self.rank):
            need = self.need(st)
            band = RESUME_BAND * self.capacity_tokens if st.pauses else 0.0
            if usage + need > limit - band and (reasoning > 0 or not st.turn_waiting):
                freed = self.make_way(st, usage + need - (limit - band), now)
                if freed is None:
                    continue
                usage -= freed
            if st.turn_waiting:
                reasoning += 1
            self.resume(st, now)
            usage += need

    def make_way(self, st: ProgramState, short: float, now: float) -> float | None:
        """With known lengths: pause acting programs with more than `PREEMPT_MARGIN` times
        `st`'s expected remaining work, most first, until `short` tokens are freed; what they
        held, or None (nobody paused) when they cannot free that much or lengths are
        learned."""
        if self.known_turns is None or not st.turn_waiting:
            return None
        bar = PREEMPT_MARGIN * self.expected_work(st)
        worse = sorted(((self.expected_work(a), a) for a in self.table.active()
                        if a.phase is Phase.ACTING and not a.turn_waiting),
                       key=lambda wa: -wa[0])
        worse = [a for w, a in worse if w > bar]
        if sum(self.resident(a) for a in worse) < short:
            return None
        freed = 0.0
        for a in worse:
            if freed >= short:
                break
            freed += self.resident(a)
            self.pause(a, now)
        return freed

    def on_turn_end(self, st: ProgramState, now: float) -> Kv:
        return Kv.GPU if self.keep_worth_it(st, now) else (
            Kv.CPU if self.host_tier else Kv.NONE)

    def keep_worth_it(self, st: ProgramState, now: float) -> bool:
        """Without a host tier: keep (an active program's KV is part of its budget already,
        and the next turn saves the recompute). With one: keep unless the client predicted
        the call (`predicted_s`) to outlast the reload many times over (`KEEP_RELOADS`, and
        at least `DEFAULT_TOOL_S`); then the memory goes to the reasoning programs and a
        prefetch, timed by that prediction, reloads it over PCIe. Told nothing, keep: the
        program's own mean tool time released KV that no prefetch could time (the turn then
        reloaded on demand) and, on tool times as spread as SWE agents', released it for
        calls that came back at once (`swe` at 192 in flight with a 64 GiB tier: 553.6
        turns/min against 599.9 when kept). Under pressure a kept pin still gives way (to
        the tier: vLLM's write-through copy is there)."""
        if not self.host_tier or st.predicted_return is None:
            return True
        reload = getattr(self.cost_model, "swap_seconds", None)
        cost = float(reload(st.context_tokens)) if reload is not None else 0.0
        return st.predicted_return - now <= max(KEEP_RELOADS * cost, DEFAULT_TOOL_S)

    def victim(self, pinned: Sequence[str], now: float) -> str:
        def score(pid: str) -> float:
            st = self.table.get(pid)
            return -1.0 if st is None else self.give_way_score(st, now)
        return max(pinned, key=score)

    def prefetch_due(self, now: float) -> list[str]:
        """Offloaded active programs whose tool is due back within the reload time."""
        if not self.host_tier:
            return []
        reload = getattr(self.cost_model, "swap_seconds", None)
        due = []
        for st in self.table.active():
            if st.phase is not Phase.ACTING or st.kv is not Kv.CPU:
                continue
            if st.predicted_return is None:
                continue
            lead = float(reload(st.context_tokens)) if reload is not None else 0.0
            if now >= st.predicted_return - lead:
                st.kv = Kv.GPU  # asked once per interception
                due.append(st.program_id)
        return due


__all__ = ["Lookahead", "PER_PROGRAM_TOKENS"]
