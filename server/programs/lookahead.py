"""`lookahead`: our program scheduler — which programs hold memory, who gives way and what a
tool call keeps, decided at events from the engine's own count of memory, the tool-duration
predictions and the expected remaining work.

Why: on a burst of long programs, admitting everyone thrashes memory (vLLM recomputes most of
what it prefills), so the scheduler admits only what fits. What fits depends on the contexts,
which only the engine counts exactly; what a program will do next (its tool's predicted
return) only the harness's events tell. docs/results-programs.md has the measurements behind
each rule.
The rules:

* **How many at once.** Every live program whose turn fits in memory: no rule of batch size
  holds a program back while memory is free (fewer programs at once do not make the prefill
  of a tool's output or of a recompute cheaper).
* **Memory.** What the active programs hold stays within what they may hold, by one of two
  accounts (`server.programs.memory`): the engine's count once it has been heard and an
  output seen (the blocks that cannot be evicted plus what the turns have still to allocate,
  against the capacity less the output the running turns have still to write), else an
  estimate from the contexts (against the capacity less a turn's growth per reasoning
  program). A program is admitted only if what it adds fits; a paused one only with
  `RESUME_BAND` of the capacity to spare (each pause-resume cycle costs a whole-context
  recompute, so a resume the next turns' growth would undo is not made); while no admitted
  program reasons, a ready turn is let in anyway (the acting programs' pins make room)
  rather than leave the GPU idle.
* **Who.** Of the programs waiting for memory, least expected remaining work first
  (`server.programs.estimates`: E[N - k | N > k] over ended programs, priced by the cost
  model), then arrival (program-level FCFS; the order until `MIN_ENDED` programs ended); an
  admitted program is not displaced by a better-ranked one (a pause costs a reload).
* **Who gives way.** When memory runs short, the acting program whose next turn is furthest
  away, weighted by its size ((predicted return - now) x context), is paused at once; its KV
  goes to the host tier when there is one, else it is dropped. A reasoning program is never
  paused mid-turn. Under an allocation failure the same score picks which pin to give up
  (Belady's rule with the predicted return standing in for the future). When program lengths
  are told (`lookahead-oracle`), a ready turn that does not fit also takes the place of acting
  programs with more than `PREEMPT_MARGIN` times its expected remaining work (most work
  first): program-level shortest-remaining-work with preemption. Learnt lengths are too
  spread for it (on `swe-long` the estimate's spread is half its mean), so it is off there.
* **Idle memory is not a queue slot.** A ready turn that does not fit takes the place of
  acting programs that are *far* from their next turn (`far`: the client's gap quantiles say
  the program is more likely than not still away after the keep horizon, `KEEP_RELOADS` times
  what its return costs if released, or its point prediction says so; with a host tier the
  cost is a reload only as likely as the tier still holds the context then, `TierChurn`, and
  a recompute otherwise), least costly first by the give-way score; with a host tier, a
  program that has run before takes the place of programs gone `CHEAP_IDLE_S` whose context
  the tier still holds (`cheap_to_release`: their return costs a reload); told nothing,
  a turn that has waited `AGING_S` takes the place of programs idle `IDLE_FAR_S` or more
  (`displace_idle`). The bound: no ready turn waits more than `AGING_S` for memory that
  programs idle `IDLE_FAR_S` hold (real sessions hand the turn to a person for minutes; their
  pins, kept by the rule below, would otherwise hold newcomers back until memory ran short).
* **What a tool call keeps.** An active program's finished turn is pinned through its tool
  call; with a host tier, a call the client predicts to be far (as above) is released to the
  tier and prefetched at the predicted return minus the transfer time (`keep_worth_it`; told
  nothing, the KV is kept). With the gap's quantiles, the give-way score's time until the next
  turn is the expected wait given how long the program has been gone (heavy tails: the longer
  gone, the later expected), Belady's rule with the distribution.
* **When.** At every event (a turn arrives, is admitted, finishes; a tool starts or ends; a
  program ends), never on a tick.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from server.costs import CostModel
from server.programs.base import ProgramScheduler
from server.programs.estimates import MIN_ENDED, ProgramEstimates
from server.programs.memory import Account, ContextAccount, EngineCount, resident
from server.programs.state import Kv, Phase, ProgramState
from server.programs.tier_churn import TierChurn

#: A program paused before resumes only with this share of the capacity to spare beyond itself
#: (hysteresis against pause-resume cycles).
RESUME_BAND = 0.1
#: With told lengths, an acting program gives way to a ready turn that does not fit when its
#: expected remaining work is more than this many times the turn's program's (a pause costs a
#: reload or a recompute, so a near tie is not worth one).
PREEMPT_MARGIN = 2.0
#: With a host tier, a tool call is worth keeping the KV through when it is expected back
#: within this many reloads of the context.
KEEP_RELOADS = 10
#: Tool duration assumed when no prediction came (s): Continuum's Exp(1) prior mean.
DEFAULT_TOOL_S = 1.0
#: A program is far from its next turn when its chance of being back within the keep horizon
#: (`KEEP_RELOADS` reloads of its context) is below this (the gap's quantiles told).
KEEP_P = 0.5
#: Told nothing of a program's return: a ready turn that has waited this long (s) for memory
#: takes the place of programs idle `IDLE_FAR_S` or more (the starvation bound).
AGING_S = 60.0
#: Told nothing, a program in its tool call this long (s) is taken to be far: above every tool
#: call of the generated traces (120 s at most), below a person's median answer in Claude Code
#: sessions (132 s from the tool's start is the p50 of `person` gaps; minutes more is common).
IDLE_FAR_S = 300.0
#: With a host tier, a program in its tool call this long (s) gives way to a ready turn at once
#: while the tier still holds its context (`cheap_to_release`): the median gap after a tool
#: call in Claude Code sessions is 9 s.
CHEAP_IDLE_S = 10.0


class Lookahead(ProgramScheduler):
    name = "lookahead"
    tick_s = None
    prefetches = True

    def __init__(self, capacity_tokens: int = 0, cost_model: CostModel | None = None,
                 host_tier: bool = False) -> None:
        super().__init__(capacity_tokens, cost_model, host_tier)
        self.estimates = ProgramEstimates(cost_model)
        self.contexts = ContextAccount(self.estimates.growth)
        self.engine = EngineCount(self.estimates.output)
        self.tier = TierChurn()

    # -- facts -------------------------------------------------------------------------------
    def tell_lengths(self, turns: Mapping[str, int]) -> None:
        """Each program's turn count (`lookahead-oracle`: what the same rules reach when
        program lengths are known)."""
        self.estimates.tell_lengths(turns)

    def turn_arrived(self, program_id: str, prompt_tokens: int, now: float,
                     turn: int | None = None) -> None:
        self.estimates.turn_arrived(program_id, prompt_tokens)
        super().turn_arrived(program_id, prompt_tokens, now, turn)

    def observe_engine(self, in_use_tokens: int,
                       ahead: Callable[[], Mapping[str, int]]) -> None:
        self.engine.observe(in_use_tokens, ahead)

    def turn_finished(self, program_id: str, context_tokens: int, now: float,
                      tool: str | None = None, predicted_s: float | None = None) -> Kv:
        self.estimates.turn_finished(program_id, context_tokens)
        st = self.table.get(program_id)
        if st is not None:
            self.tier.turn_finished(st.finished_context, context_tokens, now)
            st.finished_context = context_tokens
        return super().turn_finished(program_id, context_tokens, now, tool, predicted_s)

    def program_ended(self, program_id: str, now: float) -> None:
        self.estimates.program_ended(program_id, self.table.get(program_id))
        super().program_ended(program_id, now)

    def program_left(self, program_id: str, now: float) -> None:
        self.estimates.program_left(program_id)
        super().program_left(program_id, now)

    def new_prompt_tokens(self, program_id: str | None, prompt_tokens: int) -> int:
        """What of a turn's prompt is new: past the context its program's previous turn left
        (a prompt shorter than that context was rewritten, a compaction: all of it). Whether
        that context is still cached is not known here; the engine finds out at admission."""
        st = self.table.get(program_id)
        held = st.finished_context if st is not None else 0
        return prompt_tokens - held if held <= prompt_tokens else prompt_tokens

    # -- who is admitted ---------------------------------------------------------------------
    def account(self) -> Account:
        """The memory account the rules run on: the engine's count once it can be used."""
        return self.engine if self.engine.ready() else self.contexts

    def rank(self, st: ProgramState) -> tuple[float, ...]:
        """Which waiting program is admitted first, smaller first: expected remaining work,
        then arrival, then the programs that made the most progress (a paused program returns
        before a new one, as in ThunderAgent and MORI: its turns done are work a later start
        would still owe). Admitted programs are not ranked against them: a pause costs a
        reload, so a better-ranked arrival waits for memory rather than displace one (except
        with told lengths, `make_way`)."""
        work = self.estimates.expected_work(st) if self.estimates.lengths_known() else 0.0
        return (work, st.arrival, -st.turns)

    def rebalance(self, now: float) -> None:
        active = self.table.active()
        account = self.account()
        usage, limit = account.balance(active, self.capacity_tokens)
        # memory short: acting programs give way, cheapest pause first
        if usage > limit:
            acting = sorted((st for st in active if st.phase is Phase.ACTING),
                            key=lambda st: -self.give_way_score(st, now))
            for st in acting:
                if usage <= limit:
                    break
                freed = resident(st)
                if freed > 0:
                    self.pause(st, now)
                    usage -= freed
            return
        # grow: the best-ranked waiting programs that fit; while no admitted program reasons
        # (all in tool calls) a ready turn is let in regardless, its room made by the acting
        # programs' pins (the engine's victim rule), rather than leave the GPU idle
        reasoning = sum(1 for st in active if st.phase is not Phase.ACTING or st.turn_waiting)
        decision = Decision(self, now)
        for st in sorted(self.table.inactive(), key=self.rank):
            need = account.need(st)
            band = RESUME_BAND * self.capacity_tokens if st.pauses else 0.0
            if usage + need > limit - band and (reasoning > 0 or not st.turn_waiting):
                short = usage + need - (limit - band)
                freed = self.make_way(st, short, now)
                if freed is None:
                    freed = self.displace_idle(st, short, decision)
                if freed is None:
                    continue
                usage -= freed
            if st.turn_waiting:
                reasoning += 1
            self.resume(st, now)
            usage += need

    # -- who gives way -----------------------------------------------------------------------
    def give_way_score(self, st: ProgramState, now: float) -> float:
        """How little a pause costs: time until its next turn x the KV it frees. The time is
        the expected wait under the gap's distribution when the client sent one, else the
        predicted return (or the default tool time) less now."""
        gap = st.gap_now(now) if st.phase is Phase.ACTING else None
        if gap is not None:
            return gap.expected_wait_s() * max(1, st.context_tokens)
        back = st.predicted_return if st.predicted_return is not None else (
            (st.tool_started or now) + DEFAULT_TOOL_S)
        return max(0.0, back - now) * max(1, st.context_tokens)

    def far(self, st: ProgramState, now: float) -> bool:
        """Whether the client's prediction says the acting program is away longer than its
        keep horizon (`keep_horizon_s`): with the gap's quantiles, less than `KEEP_P` likely
        back within it given how long it has been gone; with a point prediction, due after
        it. Told nothing: not known to be far."""
        if st.phase is not Phase.ACTING or (st.gap is None and st.predicted_return is None):
            return False
        horizon = self.keep_horizon_s(st, now)
        gap = st.gap_now(now)
        if gap is not None:
            return gap.p_back_within(horizon) < KEEP_P
        return st.predicted_return is not None and st.predicted_return - now > horizon

    def keep_horizon_s(self, st: ProgramState, now: float) -> float:
        """How soon a program must be back for its KV to be worth keeping on the GPU:
        `KEEP_RELOADS` times what its return costs otherwise, and at least `DEFAULT_TOOL_S`.
        Without a host tier that is a recompute. With one it is a reload only if the tier
        still holds the context when the program returns: the tier keeps what was written
        for about its size over the rate the engine writes (`TierChurn.residence_s`, vLLM's
        LRU), so the cost is a reload weighted by the chance of a return within that time
        and a recompute otherwise (a small tier under many long sessions holds little for
        long: releasing to it is then close to dropping)."""
        tokens = st.context_tokens
        recompute = self._recompute_seconds(tokens)
        if not self.host_tier:
            return max(KEEP_RELOADS * recompute, DEFAULT_TOOL_S)
        warm = self.back_within(st, now, self.tier.residence_s(self.host_tier_tokens, now))
        cost = warm * self._reload_seconds(tokens) + (1.0 - warm) * recompute
        return max(KEEP_RELOADS * cost, DEFAULT_TOOL_S)

    def back_within(self, st: ProgramState, now: float, seconds: float) -> float:
        """The chance the acting program is back within `seconds` from now, by what the
        client told: its gap's quantiles, else its point prediction (0 or 1); told nothing, 1
        (the tier taken to hold it, as vLLM's write-through copy does for a short call)."""
        if seconds == math.inf:
            return 1.0
        gap = st.gap_now(now)
        if gap is not None:
            return gap.p_back_within(seconds)
        if st.predicted_return is not None:
            return 1.0 if st.predicted_return - now <= seconds else 0.0
        return 1.0

    def displace_idle(self, st: ProgramState, short: float, decision: Decision
                      ) -> float | None:
        """A ready turn that does not fit takes the place of acting programs far from their
        next turn (`far`), or, once it has waited `AGING_S`, of programs idle `IDLE_FAR_S` or
        more; the cheapest pauses first (`give_way_score`) until `short` tokens are freed.
        What they held, or None (nobody paused) when they cannot free that much."""
        if not st.turn_waiting:
            return None
        now = decision.now
        aged = st.waited_s(now) >= AGING_S
        idle = [a for a in self.table.active()
                if a.phase is Phase.ACTING and not a.turn_waiting and resident(a) > 0
                and (decision.far(a) or (aged and a.idle_s(now) >= IDLE_FAR_S)
                     or (st.turns > 0 and decision.cheap(a)))]
        if sum(resident(a) for a in idle) < short:
            return None
        freed = 0.0
        for a in sorted(idle, key=lambda a: (-decision.score(a), -a.idle_s(now))):
            if freed >= short:
                break
            freed += resident(a)
            self.pause(a, now)
        return freed

    def cheap_to_release(self, st: ProgramState, now: float) -> bool:
        """Whether the acting program gives way for the price of a reload: with a host tier,
        gone `CHEAP_IDLE_S` or more (past the median tool gap of real sessions, so more likely
        than not gone longer than a reload takes) and gone less than the tier keeps what is
        written (`TierChurn.residence_s`), so its context, written when its turn ended, is
        still there. A ready turn of a program that has run before (one paused for memory)
        then does not wait for its memory; a new program's first turn still waits its turn
        (program-level FCFS: on a burst of 46 sessions letting new programs in this way too
        shared the GPU among more of them, and the tier, churning, held fewer contexts:
        recomputed prefill 16.2M -> 17.2M tokens, P95 TTFT 158 -> 204 s)."""
        if not self.host_tier:
            return False
        idle = st.idle_s(now)
        return CHEAP_IDLE_S <= idle < self.tier.residence_s(self.host_tier_tokens, now)

    def make_way(self, st: ProgramState, short: float, now: float) -> float | None:
        """With told lengths: pause acting programs with more than `PREEMPT_MARGIN` times
        `st`'s expected remaining work, most first, until `short` tokens are freed; what they
        held, or None (nobody paused) when they cannot free that much or lengths are
        learnt."""
        if self.estimates.known_turns is None or not st.turn_waiting:
            return None
        expected_work = self.estimates.expected_work
        bar = PREEMPT_MARGIN * expected_work(st)
        worse = sorted(((expected_work(a), a) for a in self.table.active()
                        if a.phase is Phase.ACTING and not a.turn_waiting),
                       key=lambda wa: -wa[0])
        worse = [a for w, a in worse if w > bar]
        if sum(resident(a) for a in worse) < short:
            return None
        freed = 0.0
        for a in worse:
            if freed >= short:
                break
            freed += resident(a)
            self.pause(a, now)
        return freed

    def victim(self, pinned: Sequence[str], now: float) -> str:
        def score(pid: str) -> float:
            st = self.table.get(pid)
            return -1.0 if st is None else self.give_way_score(st, now)
        return max(pinned, key=score)

    # -- what a tool call keeps --------------------------------------------------------------
    def on_turn_end(self, st: ProgramState, now: float) -> Kv:
        return Kv.GPU if self.keep_worth_it(st, now) else (
            Kv.CPU if self.host_tier else Kv.NONE)

    def keep_worth_it(self, st: ProgramState, now: float) -> bool:
        """Without a host tier: keep (an active program's KV is part of its budget already,
        and the next turn saves the recompute). With one: keep unless the client's prediction
        says the call is far (`far`: the point prediction past the keep horizon, or the
        quantiles more likely than not); then the memory goes to the reasoning programs and a
        prefetch, timed by the point prediction, reloads it over PCIe. Told nothing, keep: a
        release no prediction times is reloaded on demand, and agents' tool times are spread
        enough that a guessed long call often comes back at once. Under pressure a kept pin
        still gives way (to the tier: vLLM's write-through copy is there)."""
        return not self.host_tier or not self.far(st, now)

    def prefetch_due(self, now: float) -> list[str]:
        """Offloaded active programs whose tool is due back within the reload time."""
        if not self.host_tier:
            return []
        due = []
        for st in self.table.active():
            if st.phase is not Phase.ACTING or st.kv is not Kv.CPU:
                continue
            if st.predicted_return is None:
                continue
            if now >= st.predicted_return - self._reload_seconds(st.context_tokens):
                st.kv = Kv.GPU  # asked once per interception
                due.append(st.program_id)
        return due

    def _reload_seconds(self, tokens: int) -> float:
        """Bringing a context of `tokens` back from the host tier (0 without a cost model)."""
        if self.cost_model is None:
            return 0.0
        return float(self.cost_model.swap_seconds(tokens))

    def _recompute_seconds(self, tokens: int) -> float:
        """Prefilling a context of `tokens` again (0 without a cost model)."""
        if self.cost_model is None:
            return 0.0
        return float(self.cost_model.prefill_seconds(tokens))


class Decision:
    """What one `rebalance` asks of the acting programs, asked once each: every ready turn
    that does not fit asks whether the same programs are far and what pausing each costs, at
    the same time and with nothing they depend on changed in between (a pause or resume
    changes neither), and both cost a forecast's integral under the gap's distribution."""

    def __init__(self, scheduler: Lookahead, now: float) -> None:
        self.scheduler = scheduler
        self.now = now
        self._far: dict[str, bool] = {}
        self._score: dict[str, float] = {}

    def far(self, st: ProgramState) -> bool:
        if st.program_id not in self._far:
            self._far[st.program_id] = self.scheduler.far(st, self.now)
        return self._far[st.program_id]

    def cheap(self, st: ProgramState) -> bool:
        return self.scheduler.cheap_to_release(st, self.now)

    def score(self, st: ProgramState) -> float:
        if st.program_id not in self._score:
            self._score[st.program_id] = self.scheduler.give_way_score(st, self.now)
        return self._score[st.program_id]


__all__ = ["AGING_S", "IDLE_FAR_S", "MIN_ENDED", "Lookahead"]
