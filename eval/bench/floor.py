"""The analytical floor under every policy's mean JCT, and each policy's share of the gap.

Why two bounds: a program cannot finish faster than alone on the engine (the isolated JCT,
`eval.bench.isolated`), and the programs together cannot finish faster than the engine can do
their work (the throughput bound). Under light load the first binds, under overload the second;
the floor is the larger of the two means.

The throughput bound. Each program's work is priced in engine seconds at the most efficient
batching the engine's step form allows: what one more sequence adds to a step of a large batch
(`BASE_SEQS` one-token decodes, past the point where reading the weights stops being the
bound), for each decoded token at its context and for each turn's prefill of what a kept
previous turn leaves to compute. A step of the profiles' form (a fixed part, plus parts per
token and per sequence, `server.perf.step_form`) is never shorter than the sum of these over
its batch, so however a schedule batches, the engine completes at most one second of such work
per second. Each program's work is released at its arrival; shortest remaining processing time
on one preemptive machine of speed 1 gives the least sum of completion times any schedule of
those works can reach (single-machine scheduling, 1|r_j, pmtn|sum C_j), so its mean JCT bounds
every policy's from below, as the last completion bounds the makespan. The bound ignores tool
calls and the order of turns within a program, which only make it looser. Prices are taken at
the context rounded down to `CONTEXT_BUCKET` tokens (the step time grows with context, so this
keeps them lower bounds).

A second price, the memory's. The price above charges a decoded token only what one more
sequence adds to a batch of 512, as if 512 sequences always fitted; programs of 20-75k tokens
do not (a 461k-token cache holds a handful), and a batch that small pays for reading the
weights. So each sequence is also charged a share of the step's fixed part (``c0 + c1 *
knee`` of the step form) in proportion to the KV it holds beyond the program's shared prefix,
over the cache's capacity ``M``; the sequences of one step hold at most ``M`` between them,
so their shares sum to at most the fixed part. Since ``max(T, knee) >= theta * T + (1 - theta)
* knee`` for any ``theta`` in [0, 1], a sequence's price is ``theta * c1`` per new token plus
``(1 - theta)`` of that memory share plus its attention, context and per-sequence terms, and
the sum over a feasible step is at most the form's value, itself at most the step's time (the
roofline's attention takes a maximum of these terms; a measured table is the form). Each
``theta`` gives a bound (`MEMORY_THETAS`); the floor is the largest of them and of the first.

The gap column: a policy's share of the gap from `vllm` to `oracle` at the same load,
(vllm - policy) / (vllm - oracle) of mean JCT: 1 = as good as the clairvoyant schedule, 0 = no
better than vLLM, negative = worse (NaN when either row is missing or they tie).
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from common.trace import Trace
from server.perf.registry import load_profile

BASE_SEQS = 512
CONTEXT_BUCKET = 256
#: the weights of the linear layers' roofline split between per-token and memory-share prices
MEMORY_THETAS = (0.0, 0.5)


class WorkPrices:
    """Engine seconds of one decoded token, and of a prefill, in the most efficient batch."""

    def __init__(self, profile: Any, chunk: int) -> None:
        self.profile = profile
        self.chunk = chunk  # the engine's per-step token budget: a prefill's largest chunk
        self.base = [1] * BASE_SEQS
        self.base_s = profile.step_seconds([], self.base)
        self._decode: dict[int, float] = {}

    def decode(self, context_tokens: int) -> float:
        bucket = max(1, context_tokens // CONTEXT_BUCKET * CONTEXT_BUCKET)
        price = self._decode.get(bucket)
        if price is None:
            price = max(0.0, self.profile.step_seconds([], [*self.base, bucket]) - self.base_s)
            self._decode[bucket] = price
        return price

    def prefill(self, new_tokens: int, cached_tokens: int) -> float:
        seconds, done = 0.0, cached_tokens
        while new_tokens > 0:
            n = min(new_tokens, self.chunk)
            step = self.profile.step_seconds([(n, done)], self.base)
            seconds += max(0.0, step - self.base_s)
            done += n
            new_tokens -= n
        return seconds

    def program(self, program: Any) -> float:
        """One program's work: every turn's prefill past the kept context and its decode."""
        total = 0.0
        for i, turn in enumerate(program.turns):
            prompt = program.prompt_tokens(i)
            new = program.new_tokens(i)
            if i == 0 and program.shared_prefix_id:
                new -= program.shared_prefix_tokens  # shared by every program: cached
            total += self.prefill(max(0, new), prompt - max(0, new))
            # decode: one token per step at contexts prompt .. prompt + out - 1
            for start in range(0, turn.output_tokens, CONTEXT_BUCKET):
                n = min(CONTEXT_BUCKET, turn.output_tokens - start)
                total += n * self.decode(prompt + start)
        return total


class MemoryPrices(WorkPrices):
    """The memory's price (module docstring): a share of the step's fixed part by the KV a
    sequence holds over the cache's `capacity_tokens`, and `theta` of the per-token linear
    cost, with the step form's attention, context and per-sequence terms."""

    def __init__(self, profile: Any, chunk: int, capacity_tokens: int, theta: float) -> None:
        if capacity_tokens < 1 or not 0.0 <= theta <= 1.0:
            raise ValueError("capacity_tokens must be >= 1 and theta in [0, 1]")
        super().__init__(profile, chunk)
        self.capacity = float(capacity_tokens)
        self.theta = theta
        self.c = profile.coefficients()
        self.fixed = self.c.c0 + self.c.c1 * self.c.knee
        self.shared = 0  # the current program's shared prefix (`program`)

    def _held(self, kv_tokens: int) -> float:
        return (1.0 - self.theta) * self.fixed * max(0, kv_tokens - self.shared) / self.capacity

    def decode(self, context_tokens: int) -> float:
        c = self.c
        return (self.theta * c.c1 + self._held(context_tokens) + c.c3 * context_tokens + c.c4
                + c.c5)

    def prefill(self, new_tokens: int, cached_tokens: int) -> float:
        c = self.c
        seconds, done = 0.0, cached_tokens
        while new_tokens > 0:
            n = min(new_tokens, self.chunk)
            seconds += (self.theta * c.c1 * n + self._held(done + n)
                        + c.c2 * (n * done + n * (n + 1) / 2) + c.c4 + c.c5 * n)
            done += n
            new_tokens -= n
        return seconds

    def program(self, program: Any) -> float:
        self.shared = program.shared_prefix_tokens if program.shared_prefix_id else 0
        return super().program(program)


def srpt_completions(jobs: list[tuple[float, float]]) -> list[float]:
    """Completion times of (release, work) jobs under preemptive SRPT on one machine of
    speed 1, in the jobs' order."""
    order = sorted(range(len(jobs)), key=lambda j: jobs[j][0])
    done = [math.nan] * len(jobs)
    ready: list[tuple[float, int]] = []  # (remaining work, job)
    t, k = 0.0, 0
    while k < len(order) or ready:
        if not ready:
            t = max(t, jobs[order[k]][0])
        while k < len(order) and jobs[order[k]][0] <= t:
            heapq.heappush(ready, (jobs[order[k]][1], order[k]))
            k += 1
        left, j = heapq.heappop(ready)
        next_release = jobs[order[k]][0] if k < len(order) else math.inf
        if t + left <= next_release:
            t += left
            done[j] = t
        else:
            heapq.heappush(ready, (left - (next_release - t), j))
            t = next_release
    return done


def throughput_floor(trace: Trace, profile: str, offload_copy_model: str,
                     max_num_batched_tokens: int | None,
                     capacity_tokens: int | None = None) -> dict[str, float]:
    """The throughput bound of `trace` on `profile`: mean JCT and makespan, and the work, the
    largest of the batch price's and (with the KV cache's `capacity_tokens`; default: what the
    profile's GPUs hold) the memory prices' (`MEMORY_THETAS`); ``memory_bound`` says whether
    a memory price gave the mean."""
    perf = load_profile(profile, offload_copy_model=offload_copy_model)
    chunk = max_num_batched_tokens or perf.max_num_batched_tokens  # the engine's own default
    capacity = capacity_tokens or perf.kv_capacity_tokens(0.9)
    bounds = [_bound(trace, WorkPrices(perf, chunk))]
    bounds += [_bound(trace, MemoryPrices(perf, chunk, capacity, theta))
               for theta in MEMORY_THETAS]
    best = max(bounds, key=lambda b: b["throughput_jct_mean_s"])
    return {**best, "throughput_makespan_s": max(b["throughput_makespan_s"] for b in bounds),
            "memory_bound": float(best is not bounds[0])}


def _bound(trace: Trace, prices: WorkPrices) -> dict[str, float]:
    jobs = [(p.arrival_s, prices.program(p)) for p in trace.programs]
    ends = srpt_completions(jobs)
    first = min(r for r, _ in jobs)
    jcts = [e - r for e, (r, _) in zip(ends, jobs, strict=True)]
    return {"throughput_jct_mean_s": sum(jcts) / len(jcts),
            "throughput_makespan_s": max(ends) - first,
            "work_s": sum(w for _, w in jobs),
            "offered_load": sum(w for _, w in jobs) / max(max(r for r, _ in jobs) - first,
                                                          1e-9)}


def add_bounds(rows: list[dict[str, Any]], floors: dict[Any, dict[str, float]],
               isolated_mean: float) -> None:
    """Put the floor and the share of the vllm -> oracle gap on every row (in place);
    `floors`: the throughput bound per load (`jps`)."""
    by_load: dict[Any, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_load.setdefault((row["jps"], row.get("concurrency")), {})[row["policy"]] = row
    for row in rows:
        floor = floors.get(row["jps"]) if not row.get("concurrency") else None
        through = floor["throughput_jct_mean_s"] if floor else math.nan
        row["throughput_jct_mean_s"] = through
        row["floor_jct_mean_s"] = max(isolated_mean, through) if floor else isolated_mean
        same = by_load[(row["jps"], row.get("concurrency"))]
        row["gap_closed"] = gap_share(same.get("vllm"), same.get("oracle"), row)


#: a vllm-to-oracle gap smaller than this share of vllm's mean JCT counts as a tie
TIE_SHARE = 1e-3


def gap_share(vllm: dict[str, Any] | None, oracle: dict[str, Any] | None,
              row: dict[str, Any]) -> float:
    """(vllm - row) / (vllm - oracle) of mean JCT; NaN without both or when they tie: a gap
    under 0.1% of vllm's JCT (swe-long at 0.1 jobs/s: 0.03 s of 190.4 s) has nothing to
    close, and a share of it would be noise."""
    if vllm is None or oracle is None:
        return math.nan
    gap = vllm["jct_mean_s"] - oracle["jct_mean_s"]
    if not abs(gap) > TIE_SHARE * abs(vllm["jct_mean_s"]):
        return math.nan
    return (vllm["jct_mean_s"] - row["jct_mean_s"]) / gap
