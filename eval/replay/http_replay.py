"""Replay a trace over HTTP against a running `harness serve`, on the wall clock.

Why: `sim.replay` runs the engine in-process on a virtual clock, which is exact but only ever
emulated. To set a real GPU beside the emulation, the same trace must drive a real server the
way agents would, and come out as the same records, so `common.metrics.replay_metrics` (and
`harness bench`) report both alike. This driver does that over the OpenAI completions API.

Program semantics are those of `sim.loop`: a program arrives at ``arrival_s`` (wall seconds
from the start), sends ``program_start`` and turn 0's request; when a turn finishes it sends
``tool_start``, sleeps ``tool_seconds``, sends ``tool_end`` (seconds, return tokens) and the next
turn's request; after the last turn, ``program_end``. Requests carry ``session_id`` (the program
id, made unique per replay: ``ID@RUN``) and the same hints (`sim.client.turn_hints`; with
``RequestOptions(agentic_context=True)`` also as the canonical ``vllm_xargs.agentic_context``).
Events go through the harness's own non-blocking `EventClient`, as an agent's do: they are never
waited for, and if the server lags they are dropped and counted (``events_dropped``).

Prompts are token ids (`prompt` as a list of ints), built by `sim.conversation.ProgramState`: the
previous prompt, the ids the model answered (``return_token_ids``), then seeded stand-in ids.
So a retained KV cache covers the previous prompt and its answer, and prefix caching and pins
behave as in the virtual replay. Each turn asks for exactly the trace's output tokens:
``max_tokens = N`` with ``ignore_eos`` for a real model, ``vllm_xargs.emulate_output_tokens =
N`` for the emulated one (which then ends in EOS at N, as in-process).

A server outlives one replay, and the same trace renders the same ids every time, so each
replay salts the prefix cache with its own ``cache_salt`` (``RUN``): a second replay (another
load, the same trace again) finds nothing the first left, just as a fresh in-process engine
would not; within a replay, programs sharing a system prompt still share its blocks. Pass
``run_id`` to share one salt on purpose (`isolated_jcts_over_http` does, as
`sim.replay.isolated_jcts` keeps the shared prefix cached from program to program).

What is measured, and where it comes from (all times in seconds from the replay's start):

* ``arrival``: when the turn was due (the program's scaled arrival, or the tool's intended
  end), as in `sim.replay`, so client-side timer jitter counts against the server.
* ``first_token``: when the first streamed chunk carrying a token id reached this client.
* ``finished``: when the last chunk (the usage chunk) arrived.
* ``admitted``: only if the server runs with ``--enable-per-request-metrics`` (pass
  ``-- --enable-per-request-metrics`` to `harness serve`): the engine's own scheduled-to-first-
  token interval taken back from the client's first-token time. So queueing includes the HTTP
  path (request in, first token out) besides the engine's wait; TTFT minus queueing is the
  engine's prefill exactly. Without the flag: None, and queueing is NaN in the metrics.
* ``cached_tokens``: ``usage.prompt_tokens_details.cached_tokens`` (the server is started with
  ``--enable-prompt-tokens-details``); ``recomputed_tokens`` follows from it as in-process.
* ``preemptions`` per turn: not exposed over HTTP, left 0. The server-wide count over the replay
  (``vllm:num_preemptions_total`` on ``/metrics``) is in ``HttpReplayResult.server``, and
  `http_replay_metrics` reports it as ``preemptions``.
* Pin statistics and scheduler CPU time live inside the engine process and have no endpoint:
  ``pin_stats`` holds only ``block_seconds = NaN`` (so ``pin_memory_share`` is NaN, ``pins``
  empty) and ``sched_seconds`` is NaN. ``engine_steps`` / ``sched_steps`` are the engine
  iterations counted on ``/metrics`` (``vllm:iteration_tokens_total_count``); ``total_blocks``
  is ``num_gpu_blocks`` from ``vllm:cache_config_info``.

``/metrics`` counters are server-wide: run one replay at a time against a server nobody else
uses, or they include others' traffic.

``time_scale`` multiplies arrival times and tool durations (0.1: ten times shorter tool calls
and arrival gaps) but not GPU work. It is a different, denser workload, not a faster run of the
same one: use it for smoke tests and to compare policies on equal terms, not to predict the
unscaled trace's JCTs. Its in-process counterpart is `sim.replay.replay` of
``scale_trace(trace, time_scale)``. ``tool_end`` reports the scaled seconds (what was actually
slept), which is what the server's duration predictor then learns.

From the command line, through the benchmark (same outputs as a virtual-time sweep)::

    harness bench --url http://127.0.0.1:8000 --policies continuum --trace swe --programs 20 \\
        --jps 1 --time-scale 0.1
"""

from __future__ import annotations

import asyncio
import math
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from common.metrics import replay_metrics
from common.trace import Trace
from harness.events_client import EventClient
from harness.model_client import (
    aiter_sse,
    api_root,
    session_headers,
    usage_counts,
    with_agentic_context,
)
from sim.client import turn_hints
from sim.conversation import ProgramState
from sim.records import ProgramRecord, ReplayResult, TurnRecord

#: Counters read from the server's Prometheus ``/metrics`` before and after a replay (summed
#: over label sets, e.g. engines); the result holds their differences under these names.
SERVER_COUNTERS = {
    "preemptions": "vllm:num_preemptions_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "engine_steps": "vllm:iteration_tokens_total_count",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
}


class HttpReplayError(RuntimeError):
    """The server is unreachable, is not an OpenAI server, or refused a request; the message
    says which and where."""


@dataclass
class HttpReplayResult(ReplayResult):
    """A `ReplayResult` (so `replay_metrics` takes it) plus what only a served replay has."""

    url: str = ""
    model: str = ""
    time_scale: float = 1.0
    run_id: str = ""
    wall_s: float = 0.0
    events_sent: int = 0
    events_dropped: int = 0
    #: differences of `SERVER_COUNTERS` over the replay; empty if /metrics did not answer
    server: dict[str, float] = field(default_factory=dict)
    #: whether every request answered with the engine's per-request timing (admission times)
    per_request_metrics: bool = False


@dataclass(frozen=True)
class RequestOptions:
    """How a replay's requests are sent, beside what the trace says they ask: how long one
    may take (``timeout_s``); whether each also carries its hints as the canonical
    ``vllm_xargs.agentic_context`` (what vllm-router's program scheduling reads); and what
    makes the replay's `Driver` (``driver``; default: `Driver` itself), for a caller that must
    see or change each request (`eval.replay.routers` tags them)."""

    timeout_s: float = 600.0
    agentic_context: bool = False
    driver: DriverFactory | None = None


def replay_over_http(trace: Trace, url: str, *, model: str | None = None,
                     time_scale: float = 1.0, progress: Callable[[int], None] | None = None,
                     run_id: str | None = None,
                     requests: RequestOptions = RequestOptions()) -> HttpReplayResult:
    """Replay ``trace`` against the OpenAI server at ``url`` (``http://host:port``, with or
    without ``/v1``) in wall-clock time and return its records. ``model``: the served model
    name (default: the server's first). ``progress(n_done)`` is called as programs end.
    ``run_id`` (default: random) salts the prefix cache and suffixes the session ids.
    ``requests``: how each request is sent (`RequestOptions`). Raises `HttpReplayError` at
    once if nothing usable answers at ``url``."""
    return asyncio.run(areplay_over_http(trace, url, model=model, time_scale=time_scale,
                                         progress=progress, run_id=run_id, requests=requests))


def scale_trace(trace: Trace, time_scale: float) -> Trace:
    """``trace`` with arrival times and tool durations multiplied by ``time_scale``: the
    workload a ``time_scale`` replay runs, so that an in-process `sim.replay.replay` of it is
    the like-for-like emulated counterpart."""
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise ValueError(f"time_scale must be a positive number, not {time_scale!r}")
    if time_scale == 1.0:
        return trace
    programs = [p.model_copy(update={
        "arrival_s": p.arrival_s * time_scale,
        "turns": [t.model_copy(update={"tool_seconds": t.tool_seconds * time_scale})
                  for t in p.turns]}) for p in trace.programs]
    return trace.model_copy(update={
        "programs": programs, "params": {**trace.params, "time_scale": time_scale}})


def isolated_jcts_over_http(trace: Trace, url: str, *, model: str | None = None,
                            time_scale: float = 1.0,
                            progress: Callable[[int], None] | None = None) -> dict[str, float]:
    """Each program alone on the server, one after another: its unloaded JCT there (the
    counterpart of `sim.replay.isolated_jcts`, under whatever policy the server runs). Takes
    the sum of those JCTs in wall time."""
    out: dict[str, float] = {}
    run_id = new_run_id()  # one salt: the shared prefix stays cached from program to program
    for n, program in enumerate(trace.programs):
        alone = Trace(name=f"{trace.name}:{program.id}",
                      programs=[program.model_copy(update={"arrival_s": 0.0})])
        result = replay_over_http(alone, url, model=model, time_scale=time_scale,
                                  run_id=run_id)
        out[program.id] = result.programs[program.id].jct
        if progress is not None:
            progress(n + 1)
    return out


def http_replay_metrics(result: HttpReplayResult, isolated: dict[str, float] | None = None,
                        slo: Any = None) -> dict[str, Any]:
    """`replay_metrics` with what HTTP cannot see made explicit: ``preemptions`` from the
    server's counter (None without /metrics), ``pin_memory_share`` and
    ``sched_cpu_ms_per_step`` NaN, ``pins`` None; plus the server counters, event counts, URL,
    model and time scale."""
    out = replay_metrics(result, isolated, slo)
    server = result.server
    out["preemptions"] = int(server["preemptions"]) if "preemptions" in server else None
    out["pin_memory_share"] = math.nan
    out["pins"] = None
    out["sched_cpu_ms_per_step"] = math.nan
    queries = server.get("prefix_cache_queries")
    out["server_prefix_hit_rate"] = (server["prefix_cache_hits"] / queries
                                     if queries else math.nan)
    out["server"] = dict(server)
    out["events_sent"] = result.events_sent
    out["events_dropped"] = result.events_dropped
    out["url"] = result.url
    out["model"] = result.model
    out["time_scale"] = result.time_scale
    out["wall_s"] = result.wall_s
    return out


# -- the driver --------------------------------------------------------------------------------
async def areplay_over_http(trace: Trace, url: str, *, model: str | None = None,
                            time_scale: float = 1.0,
                            progress: Callable[[int], None] | None = None,
                            run_id: str | None = None,
                            requests: RequestOptions = RequestOptions()) -> HttpReplayResult:
    """`replay_over_http` for a caller that has an event loop."""
    trace = scale_trace(trace, time_scale)
    run_id = run_id or new_run_id()
    if not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"run_id {run_id!r}: use 1-64 letters, digits, '-' or '_'")
    base = api_root(url)
    # no pool limit: a program waiting for a connection would be queueing the server never saw
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(requests.timeout_s, connect=10.0, pool=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        model = await _probe(client, base, model)
        before = await scrape_counters(client, base)
        replay = (requests.driver or Driver)(trace, client, base, model, run_id, progress)
        replay.agentic_context = requests.agentic_context
        async with EventClient(base) as events:
            replay.events = events
            await replay.run()
            await events.drain(5.0)
        await asyncio.sleep(0.2)  # the last step's statistics reach /metrics just after
        after = await scrape_counters(client, base)
    return replay.result(before, after, url=base, time_scale=time_scale, sent=events.sent,
                         dropped=events.dropped)


_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def new_run_id() -> str:
    return secrets.token_hex(6)


async def _probe(client: httpx.AsyncClient, base: str, model: str | None) -> str:
    """Fail fast and clearly if ``base`` is not a running OpenAI server; the model to use."""
    where = f"{base}/v1/models"
    try:
        response = await client.get(where, timeout=5.0)
    except httpx.HTTPError as exc:
        raise HttpReplayError(f"no server answers at {base} ({type(exc).__name__}: {exc}); "
                              "start one with `harness serve --policy continuum` or check the "
                              "URL") from None
    if response.status_code != 200:
        raise HttpReplayError(f"{where} answered {response.status_code}: "
                              f"{response.text[:300]!r}; is this an OpenAI-compatible server?")
    try:
        served = [m["id"] for m in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise HttpReplayError(f"{where} did not list models: {response.text[:300]!r}; is this "
                              "an OpenAI-compatible server?") from None
    if model is None:
        if not served:
            raise HttpReplayError(f"{base} serves no model")
        return str(served[0])
    if model not in served:
        raise HttpReplayError(f"{base} does not serve {model!r}; it serves: "
                              f"{', '.join(served) or 'nothing'}")
    return model


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)")


async def scrape_counters(client: httpx.AsyncClient, base: str) -> dict[str, float]:
    """`SERVER_COUNTERS` and ``num_gpu_blocks`` from Prometheus ``/metrics``; {} if absent."""
    try:
        response = await client.get(f"{base}/metrics", timeout=10.0)
    except httpx.HTTPError:
        return {}
    if response.status_code != 200:
        return {}
    wanted = {metric: name for name, metric in SERVER_COUNTERS.items()}
    out: dict[str, float] = {}
    for line in response.text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        metric, labels, value = match.groups()
        if metric in wanted:
            try:
                out[wanted[metric]] = out.get(wanted[metric], 0.0) + float(value)
            except ValueError:
                continue
        elif metric == "vllm:cache_config_info" and labels:
            blocks = re.search(r'[{,]num_gpu_blocks="(\d+)"', labels)
            if blocks:
                out["num_gpu_blocks"] = out.get("num_gpu_blocks", 0.0) + float(blocks.group(1))
    return out


@dataclass
class _Turn:
    """What one streamed completion told us."""

    first_token: float | None = None
    finished: float = 0.0
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    engine_ttft_s: float | None = None  # scheduled -> first token, from the engine


class Driver:
    """One replay: a coroutine per program, times relative to `start` (monotonic)."""

    def __init__(self, trace: Trace, client: httpx.AsyncClient, base: str, model: str,
                 run_id: str, progress: Callable[[int], None] | None) -> None:
        self.trace = trace
        self.client = client
        self.url = f"{base}/v1/completions"
        self.model = model
        self.run_id = run_id
        self.progress = progress
        self.events: EventClient | None = None
        self.agentic_context = False  # send the canonical vllm_xargs.agentic_context too
        self.records = {p.id: ProgramRecord(p.id, p.arrival_s)
                        for p in trace.programs}
        self.done = 0
        self.timed = 0  # turns that came with the engine's per-request timing
        self.start = 0.0
        self.wall_s = 0.0

    def now(self) -> float:
        return time.monotonic() - self.start

    async def sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)

    def session(self, program_id: str) -> str:
        """The program's id on the server: unique to this replay, so that no policy state
        (attained service, pins, an ended program) carries over from an earlier replay."""
        return f"{program_id}@{self.run_id}"

    def emit(self, kind: str, program_id: str, **fields: Any) -> None:
        assert self.events is not None
        self.events.emit(kind, self.session(program_id), **fields)

    async def run(self) -> None:
        self.start = time.monotonic()
        try:
            async with asyncio.TaskGroup() as group:
                for program_state in (ProgramState(p) for p in self.trace.programs):
                    group.create_task(self.program(program_state))
        except* HttpReplayError as failed:
            raise failed.exceptions[0] from None
        finally:
            self.wall_s = self.now()

    async def program(self, state: ProgramState) -> None:
        program = state.program
        record = self.records[program.id]
        await self.sleep_until(record.arrival)
        due = record.arrival
        self.emit("program_start", program.id)
        ended = False
        try:
            for i, turn in enumerate(program.turns):
                if i > 0:
                    prev = program.turns[i - 1]
                    self.emit("tool_end", program.id, tool=prev.tool,
                              seconds=prev.tool_seconds,
                              return_tokens=prev.tool_return_tokens)
                turn_record = TurnRecord(program.id, i, due, prompt_tokens=len(state.tokens))
                record.turns.append(turn_record)
                got = await self.complete(state, i)
                self.fill(turn_record, got, state)
                if i == program.n_turns - 1:
                    break
                state.extend(i, got.token_ids)
                self.emit("tool_start", program.id, tool=turn.tool)
                due = got.finished + turn.tool_seconds
                await self.sleep_until(due)
            self.emit("program_end", program.id)
            ended = True
            record.finished = record.turns[-1].finished
            self.done += 1
            if self.progress is not None:
                self.progress(self.done)
        finally:
            if not ended:  # cancelled or failed: let the server release what it keeps for us
                self.emit("program_end", program.id)

    def fill(self, record: TurnRecord, got: _Turn, state: ProgramState) -> None:
        record.first_token = got.first_token
        record.finished = got.finished
        record.output_tokens = got.output_tokens
        record.cached_tokens = got.cached_tokens
        if got.engine_ttft_s is not None and got.first_token is not None:
            self.timed += 1
            admitted = got.first_token - got.engine_ttft_s
            record.admitted = min(got.first_token, max(record.arrival, admitted))
        if record.turn > 0:
            record.recomputed_tokens = state.recomputed(record.prompt_tokens, record.cached_tokens)

    async def complete(self, state: ProgramState, i: int) -> _Turn:
        """Turn ``i``'s request, streamed; exactly the trace's output tokens come back."""
        program = state.program
        want = program.turns[i].output_tokens
        hints = {k: v for k, v in turn_hints(program, i).items() if v is not None}
        hints["emulate_output_tokens"] = want
        body = {"model": self.model, "prompt": state.tokens, "max_tokens": want,
                "ignore_eos": True, "return_token_ids": True, "stream": True,
                "stream_options": {"include_usage": True},
                "session_id": self.session(program.id), "cache_salt": self.run_id,
                "vllm_xargs": with_agentic_context(
                    hints, self.session(program.id) if self.agentic_context else None)}
        got = _Turn()
        where = f"program {program.id!r} turn {i} ({len(state.tokens)} prompt tokens)"
        try:
            async with self.client.stream("POST", self.url, json=body,
                                          headers=session_headers(body)) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    raise HttpReplayError(f"{where}: the server answered "
                                          f"{response.status_code}: {text[:500]}")
                async for chunk in aiter_sse(response.aiter_text()):
                    self.read_chunk(chunk, got, where)
        except (httpx.HTTPError, httpx.StreamError) as exc:
            # StreamError (a RuntimeError, not an HTTPError): the stream closed under the read
            raise HttpReplayError(f"{where}: request to {self.url} failed "
                                  f"({type(exc).__name__}: {exc})") from None
        except ValueError as exc:  # a line that is not JSON: a stream cut mid-chunk
            raise HttpReplayError(f"{where}: the server sent a malformed stream line "
                                  f"({type(exc).__name__}: {exc})") from None
        got.finished = self.now()
        if got.first_token is None:
            raise HttpReplayError(f"{where}: the stream ended without a token")
        return got

    def read_chunk(self, chunk: dict[str, Any], got: _Turn, where: str) -> None:
        if "error" in chunk:
            raise HttpReplayError(f"{where}: the server reported {chunk['error']}")
        for choice in chunk.get("choices") or []:
            ids = choice.get("token_ids") or []
            if ids and got.first_token is None:
                got.first_token = self.now()
            got.token_ids.extend(int(x) for x in ids)
        usage = chunk.get("usage")
        if usage:
            got.prompt_tokens, got.output_tokens, got.cached_tokens = usage_counts(usage)
            ttft_ms = (chunk.get("metrics") or {}).get("time_to_first_token_ms")
            if ttft_ms is not None:
                got.engine_ttft_s = float(ttft_ms) / 1000.0

    def result(self, before: dict[str, float], after: dict[str, float], *, url: str,
               time_scale: float, sent: int, dropped: int) -> HttpReplayResult:
        server = {k: after[k] - before[k] for k in SERVER_COUNTERS
                  if k in before and k in after}
        records = self.records
        finishes = [r.finished for r in records.values() if r.finished is not None]
        first_arrival = min((r.arrival for r in records.values()), default=0.0)
        steps = int(server.get("engine_steps", 0))
        turns = sum(len(r.turns) for r in records.values())
        return HttpReplayResult(
            programs=records,
            makespan=(max(finishes) - first_arrival) if finishes else 0.0,
            total_blocks=int(after.get("num_gpu_blocks", 0)),
            pin_stats={"block_seconds": math.nan},  # not exposed by the server
            sched_seconds=math.nan,  # inside the engine process; not exposed
            sched_steps=steps,
            engine_steps=steps,
            url=url, model=self.model, time_scale=time_scale, run_id=self.run_id,
            wall_s=self.wall_s,
            events_sent=sent, events_dropped=dropped, server=server,
            per_request_metrics=turns > 0 and self.timed == turns,
        )


#: what makes the `Driver` of one replay, from (trace, client, base URL, model, run id,
#: progress): `Driver` itself, or a caller's own (a client that tags each request, for one)
DriverFactory = Callable[
    [Trace, httpx.AsyncClient, str, str, str, Callable[[int], None] | None], Driver]
