"""AMPD's routing: bind a program to a decode replica, then send each prefill, initial or
incremental, to a prefill replica (remote) or run it on the decode replica itself (local).

Paper: He et al., "Efficient Multi-round LLM Inference over Disaggregated Serving" (AMPD).
Why it pays: a multi-round program's later prefills are small (a tool's output on top of a
long history the decode replica already holds). Sending each to the prefill pool, as plain P/D
does, moves the history over and the new KV back and waits in the prefill queue; running it
locally saves both but stalls the decode batch. AMPD chooses per prefill, from what it sees.

* Binding (section 3, step 1): a program's first turn binds it to the decode replica with the
  lowest KV-cache usage, and all its decoding stays there: `PDRouter.decode_replica`, inherited.
* Adaptive routing (Algorithm 1, section 4.1), for every prefill: the paper routes "either its
  initial prefill or an incremental prefill" (an initial one is a prefill with no history):
  1. visit the live prefill replicas in random order (seeded) and route remote to the first
     whose windowed TTFT is <= ALPHA * TTFT_thres;
  2. else, if the program's decode replica has windowed ITL <= BETA * ITL_thres, prefill
     locally (it has slack to absorb the prefill);
  3. else take the cheapest estimate: Eq. 1 (local) = T_pre(l_hist, l_incr) + the decode
     replica's prefill queue; Eq. 2 (remote, per prefill replica) = its prefill queue +
     T_kv(l_hist, decode -> prefill) + T_pre(l_hist, l_incr) + T_kv(l_incr, prefill -> decode).
     Ties go to local (no transfer), then to replica names.
* The queue term (Eq. 1-2) sums T_pre(l_hist_k, l_incr_k) over the queued tasks, each priced on
  top of what is already cached for it (its prefix-cache hit, or the history it reads from a
  peer), so a task whose KV comes from another replica costs no compute here. Where the caller
  knows only a token total (`ReplicaLoad.queued_prefills` None: the served router's book) that
  total is priced as one prefill from scratch.
* T_kv(l_hist) in Eq. 2 is charged in full by default, as the paper writes it.
  `credit_held_history=True` charges only the history the prefill replica is believed to lack
  (what it prefilled for the program before, tracked here from the routes taken; it cannot see
  evictions): an option, off by default, that favours AMPD.
* The windows (WINDOW_S seconds): a prefill replica's TTFT window holds the TTFT of every
  prefill it ran (initial and incremental), as the client sees it (arrival to first token);
  a decode replica's ITL window holds every token gap as it happens. A local prefill's TTFT
  goes to its decode replica's TTFT window (reported; Algorithm 1 reads the prefill workers').
  An empty window is not slack: it stands for what the cost model predicts a sample would be
  now: for a prefill replica, this task's Eq. 2 estimate there (queue included); for a decode
  replica, one decode step of its current batch (`Costs.decode_s`; unknown without it, which
  counts as no slack).

Constants: ALPHA = 0.9, BETA = 0.85 (the paper's values), WINDOW_S = 10 s.

T_pre, T_kv and the decode step are injected (`Costs`), so tests give exact numbers;
`Costs.from_cluster` builds them from each replica's profile (`server.perf`) and the cluster's
links (`server.perf.hardware.Link`).

What the caller feeds (no wall clock is read here): `observe_ttft(replica, seconds, now)` when a
prefill's first token comes (the prefill replica, or the decode replica for a local one),
`observe_itl(decode_replica, seconds, now)` for each token gap, `ReplicaLoad.queued_prefills`
(or `queued_prefill_tokens`), and a `TurnInfo` (now, prompt and history tokens) with each
`route`. Decisions are counted per kind, an initial prefill's with the prefix ``initial_``.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cluster.routing import PDRouter, ReplicaLoad, Route, TurnInfo, _alive
from server.perf.registry import load_profile

ALPHA = 0.9  # a prefill replica has slack when its windowed TTFT <= ALPHA * TTFT_thres
BETA = 0.85  # a decode replica has slack when its windowed ITL <= BETA * ITL_thres
WINDOW_S = 10.0  # the latency statistics cover the last WINDOW_S seconds

#: (replica, new tokens, tokens already cached there) -> seconds to prefill the new tokens
PrefillSeconds = Callable[[str, int, int], float]
#: (source replica, destination replica, tokens) -> seconds to move their KV cache
TransferSeconds = Callable[[str, str, int], float]
#: (replica, requests decoding, their context tokens in all) -> seconds of one decode step
DecodeSeconds = Callable[[str, int, int], float]


class WindowedMean:
    """Mean of the values observed per key over the last `window_s` seconds of the caller's
    clock. Each key's observations must come in time order (one replica's clock)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: dict[str, deque[tuple[float, float]]] = {}
        self._sums: dict[str, float] = {}

    def observe(self, key: str, value: float, now: float) -> None:
        self._samples.setdefault(key, deque()).append((now, value))
        self._sums[key] = self._sums.get(key, 0.0) + value
        self._trim(key, now)

    def mean(self, key: str, now: float) -> float | None:
        """The windowed mean, or None when nothing was observed in the window."""
        self._trim(key, now)
        samples = self._samples.get(key)
        return self._sums[key] / len(samples) if samples else None

    def _trim(self, key: str, now: float) -> None:
        samples = self._samples.get(key)
        if not samples:
            return
        while samples and samples[0][0] < now - self.window_s:
            self._sums[key] -= samples.popleft()[1]
        if not samples:
            self._sums[key] = 0.0  # no float drift carried into the next window


@dataclass(frozen=True)
class Costs:
    """T_pre and T_kv of Eq. 1-2, and T_dec (one decode step), which stands in for an empty
    ITL window (None: no prediction, so an empty ITL window shows no slack)."""

    prefill_s: PrefillSeconds
    transfer_s: TransferSeconds
    decode_s: DecodeSeconds | None = None

    @classmethod
    def from_cluster(cls, config: Any) -> Costs:
        """From a `cluster.config.ClusterConfig`: each replica's profile, the links between."""
        by_profile = {name: load_profile(name) for name in {s.profile for s in config.replicas}}
        profiles = {spec.name: by_profile[spec.profile] for spec in config.replicas}

        def prefill_s(replica: str, new: int, cached: int) -> float:
            return profiles[replica].prefill_seconds(cached + new, cached=cached)

        def transfer_s(src: str, dst: str, tokens: int) -> float:
            return config.link(src, dst).seconds(tokens * profiles[src].kv_bytes_per_token)

        def decode_s(replica: str, batch: int, context_tokens: int) -> float:
            batch = max(1, batch)
            return profiles[replica].step_seconds([], [max(1, context_tokens // batch)] * batch)

        return cls(prefill_s, transfer_s, decode_s)


class AMPDRouter(PDRouter):
    """Algorithm 1 on top of `pd`'s binding (see the module docstring)."""

    name = "ampd"

    def __init__(self, costs: Costs, *, ttft_slo_s: float, itl_slo_s: float, seed: int = 0,
                 window_s: float = WINDOW_S, credit_held_history: bool = False) -> None:
        super().__init__()
        self.costs = costs
        self.ttft_slo_s = ttft_slo_s
        self.itl_slo_s = itl_slo_s
        self.credit_held_history = credit_held_history
        self.ttft = WindowedMean(window_s)  # per prefill replica (and decode, local prefills)
        self.itl = WindowedMean(window_s)  # per decode replica
        self._rng = random.Random(seed)
        self._prefilled: dict[str, dict[str, int]] = {}  # program -> prefill replica -> tokens
        self._latest = 0.0  # the latest time the caller told us, for a route without TurnInfo
        #: why each prefill went where it did: remote_slack, local_slack, local_cost,
        #: remote_cost, an initial prefill's prefixed ``initial_`` (the share of local
        #: prefills is a headline metric of the paper)
        self.decisions: Counter[str] = Counter()

    @classmethod
    def from_spec(cls, spec: Any, cluster: Any) -> AMPDRouter:
        """From a `cluster.config.RouterSpec` and the `ClusterConfig` it belongs to."""
        return cls(Costs.from_cluster(cluster), ttft_slo_s=spec.ttft_slo_s,
                   itl_slo_s=spec.itl_slo_s, seed=spec.seed,
                   credit_held_history=spec.ampd_credit_held_history)

    # -- observations ----------------------------------------------------------------------
    def observe_ttft(self, replica: str, seconds: float, now: float) -> None:
        """A prefill that `replica` ran got its first token `seconds` after its arrival."""
        self._latest = max(self._latest, now)
        self.ttft.observe(replica, seconds, now)

    def observe_itl(self, replica: str, seconds: float, now: float) -> None:
        """Decode replica `replica` emitted a token `seconds` after the previous one."""
        self._latest = max(self._latest, now)
        self.itl.observe(replica, seconds, now)

    # -- Eq. 1 and Eq. 2 -------------------------------------------------------------------
    def queue_s(self, replica: ReplicaLoad) -> float:
        """The queue term: sum of T_pre(l_hist_k, l_incr_k) over the queued tasks."""
        if replica.queued_prefills is None:  # only a token total known: one from scratch
            return self.costs.prefill_s(replica.name, replica.queued_prefill_tokens, 0)
        return sum(self.costs.prefill_s(replica.name, new, cached)
                   for cached, new in replica.queued_prefills if new > 0)

    def _kv_s(self, src: str, dst: str, tokens: int) -> float:
        return self.costs.transfer_s(src, dst, tokens) if tokens > 0 else 0.0

    def local_s(self, decode: ReplicaLoad, info: TurnInfo) -> float:
        """Eq. 1: prefill on the decode replica, which holds the history, after its queue."""
        return (self.costs.prefill_s(decode.name, info.new_tokens, info.history_tokens)
                + self.queue_s(decode))

    def remote_s(self, program_id: str, prefill: ReplicaLoad, decode: str,
                 info: TurnInfo) -> float:
        """Eq. 2: the prefill replica's queue, the history moved decode -> prefill (all of it,
        or with `credit_held_history` what it lacks), the prefill, and the new tokens' KV
        moved back prefill -> decode."""
        held = 0
        if self.credit_held_history:
            held = min(info.history_tokens,
                       self._prefilled.get(program_id, {}).get(prefill.name, 0))
        return (self.queue_s(prefill)
                + self._kv_s(decode, prefill.name, info.history_tokens - held)
                + self.costs.prefill_s(prefill.name, info.new_tokens, info.history_tokens)
                + self._kv_s(prefill.name, decode, info.new_tokens))

    # -- the windows, or what stands for an empty one ---------------------------------------
    def windowed_ttft(self, program_id: str, prefill: ReplicaLoad, decode: str,
                      info: TurnInfo) -> float:
        """TTFT-hat of `prefill`: the window's mean, or this task's Eq. 2 estimate there."""
        seen = self.ttft.mean(prefill.name, info.now)
        return seen if seen is not None else self.remote_s(program_id, prefill, decode, info)

    def windowed_itl(self, decode: ReplicaLoad, now: float) -> float:
        """ITL-hat of `decode`: the window's mean, or one decode step of its batch now (with
        this program in it); no decode model: infinity (no slack)."""
        seen = self.itl.mean(decode.name, now)
        if seen is not None:
            return seen
        if self.costs.decode_s is None:
            return float("inf")
        return self.costs.decode_s(decode.name, decode.running + 1, decode.decode_tokens)

    # -- Algorithm 1 -----------------------------------------------------------------------
    def route(self, program_id: str, turn: int, replicas: Sequence[ReplicaLoad],
              info: TurnInfo | None = None) -> Route:
        if info is None:
            info = TurnInfo(now=self._latest)
        self._latest = max(self._latest, info.now)
        prefix = "initial_" if turn == 0 else ""
        decode = self.decode_replica(program_id, replicas)
        load = next(r for r in replicas if r.name == decode)
        prefills = sorted(_alive(replicas, "prefill"), key=lambda r: r.name)
        for p in self._rng.sample(prefills, len(prefills)):
            if self.windowed_ttft(program_id, p, decode, info) <= ALPHA * self.ttft_slo_s:
                self.decisions[prefix + "remote_slack"] += 1
                return self._remote(program_id, Route(decode, p.name), info)
        if self.windowed_itl(load, info.now) <= BETA * self.itl_slo_s:
            self.decisions[prefix + "local_slack"] += 1
            return Route(decode)
        best: tuple[float, str | None] = (self.local_s(load, info), None)
        for p in prefills:
            best = min(best, (self.remote_s(program_id, p, decode, info), p.name),
                       key=lambda c: c[0])
        if best[1] is None:
            self.decisions[prefix + "local_cost"] += 1
            return Route(decode)
        self.decisions[prefix + "remote_cost"] += 1
        return self._remote(program_id, Route(decode, best[1]), info)

    def _remote(self, program_id: str, route: Route, info: TurnInfo) -> Route:
        """Note that the prefill replica now holds the program's prompt."""
        assert route.prefill is not None
        self._prefilled.setdefault(program_id, {})[route.prefill] = info.prompt_tokens
        return route

    def program_end(self, program_id: str) -> None:
        super().program_end(program_id)
        self._prefilled.pop(program_id, None)
