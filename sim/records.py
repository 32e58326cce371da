"""Replay a trace through the in-process engine on a virtual clock (a discrete-event driver).

Programs arrive at ``arrival_s`` (``program_start`` event, then turn 0's request). When a turn
finishes, the driver sends ``tool_start`` (tool name), lets the tool run for ``tool_seconds`` of
virtual time, then sends ``tool_end`` (seconds, return tokens) and the next turn's request; after
the last turn it sends ``program_end``. Requests carry the hints a client would send
(``turn``, ``tool``, ``last``). Between engine steps the clock jumps to the next arrival or tool
return when the engine is idle; while it is busy, arrivals and tool returns that fall inside a
step are delivered at the end of that step (as a request reaching a busy server waits for the
step in flight) and their *intended* time is what latencies are measured from.

Token ids. Every prompt is rendered deterministically so that the prefix cache and pins work as
with a real agent: turn ``i+1``'s prompt is turn ``i``'s prompt, then the tokens the model
actually answered in turn ``i`` (the engine returns them; the emulated model's ids are random
but seeded), then stand-in ids for the tool return and the new input. So a kept (pinned or still
cached) KV cache covers the previous prompt *and* its output, as in an agent that appends the
assistant message verbatim. Stand-in ids come from a generator seeded by the program id (and the
shared-prefix id for the first ``shared_prefix_tokens``, so programs sharing a system prompt hit
each other's cache). Same trace, policy, profile and seed: identical results.

Recorded per turn: when it was due, admitted (the start of the engine step that first scheduled
it), its first token and finish, prompt / output / cached tokens, preemptions, and recomputed
tokens: the part of the previous turn's conversation (prompt + output, minus the last sampled
token, whose KV is never computed) that the cache did not supply. Even with everything kept,
this includes the partial last block (under 16 tokens), since the prefix cache hits whole
blocks only. ``tool_start`` carries a ``predicted_s`` only if asked (``hints``, see
``HINT_MODES``); otherwise policies that need one learn durations from ``tool_end``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.trace import Program, Trace
from predictor.durations import ToolDurationModel

#: Stand-in ids are drawn from [FIRST_ID, LAST_ID): ordinary tokens of every emulated model.
FIRST_ID = 8
LAST_ID = 1000


@dataclass
class TurnRecord:
    program_id: str
    turn: int
    arrival: float  # when the request was due (program arrival, or tool return)
    admitted: float | None = None  # start of the step that first scheduled it
    first_token: float | None = None
    finished: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    recomputed_tokens: int = 0  # computed for an earlier turn, not found in the cache now
    preemptions: int = 0
    replica: str | None = None  # in a cluster: the replica that decoded it
    prefill_replica: str | None = None  # in a cluster: where its prompt was computed, if remote


@dataclass
class ProgramRecord:
    program_id: str
    arrival: float
    finished: float | None = None
    turns: list[TurnRecord] = field(default_factory=list)

    @property
    def jct(self) -> float:
        assert self.finished is not None
        return self.finished - self.arrival


@dataclass
class ReplayResult:
    programs: dict[str, ProgramRecord]
    makespan: float  # last finish minus first arrival
    total_blocks: int
    pin_stats: dict[str, float]
    sched_cpu_seconds: float
    sched_steps: int
    engine_steps: int
    replicas: list[Any] = field(default_factory=list)  # per replica (`cluster_replay`)
    router: str = ""
    #: programs the metrics count (None: all); `steady_programs` leaves warm-up and cool-down out
    measured: set[str] | None = None


def steady_programs(result: ReplayResult, trim: float) -> set[str] | None:
    """The programs of a steady-state measurement: all but the first and the last ``trim``
    share by start time (warm-up: the system fills; cool-down: it drains and the last
    programs run with less competition). None when ``trim`` is 0 (count everything)."""
    if trim <= 0:
        return None
    ordered = sorted(result.programs.values(), key=lambda p: (p.arrival, p.program_id))
    cut = int(len(ordered) * trim)
    kept = ordered[cut:len(ordered) - cut]
    if not kept:
        raise ValueError(f"steady-state trim {trim:g} leaves none of {len(ordered)} programs")
    return {p.program_id for p in kept}


def _rng(*keys: str) -> np.random.Generator:
    return np.random.default_rng([zlib.crc32(k.encode()) for k in keys])


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return [int(x) for x in rng.integers(FIRST_ID, LAST_ID, size=n)] if n > 0 else []


class ProgramState:
    """A program's conversation as token ids, grown turn by turn.

    Public because every replayer must build prompts the same way (this virtual-time driver and
    ``eval.http_replay``'s wall-clock one): the same ids give the same prefix-cache and pin
    behaviour, so their results can be set side by side.
    """

    def __init__(self, program: Program) -> None:
        self.program = program
        self.rng = _rng("program", program.id)
        first = program.turns[0].input_tokens
        shared = program.shared_prefix_tokens if program.shared_prefix_id else 0
        prefix = _ids(_rng("shared", program.shared_prefix_id or ""), shared)
        self.tokens: list[int] = prefix + _ids(self.rng, first - shared)
        self.computed = 0  # tokens of the conversation the engine computed in the last turn

    def extend(self, i: int, answered: list[int]) -> None:
        """After turn ``i``: append its answer (padded/cut to the trace's count), the tool
        return and turn ``i+1``'s input."""
        want = self.program.turns[i].output_tokens
        answer = list(answered[:want]) + _ids(self.rng, want - len(answered))
        # the last sampled token is never fed back, so its KV was never computed
        self.computed = len(self.tokens) + want - 1
        self.tokens += answer
        self.tokens += _ids(self.rng, self.program.new_tokens(i + 1))

    def recomputed(self, prompt_tokens: int, cached_tokens: int) -> int:
        """Tokens of the previous turn's conversation that a later turn's request (with this
        prompt length and prefix-cache hit) had to compute again."""
        return max(0, min(self.computed, prompt_tokens) - cached_tokens)


def too_long_turns(trace: Trace, limit: int) -> list[tuple[str, int, int]]:
    """(program, first turn, its prompt + output tokens) for each program with a turn longer
    than ``limit``: such a turn can never run (vLLM refuses it), so a replay must not start it."""
    out = []
    for program in trace.programs:
        for i, (_, after) in enumerate(program.contexts()):
            if after > limit:
                out.append((program.id, i, after))
                break
    return out


def turn_hints(program: Program, i: int) -> dict[str, Any]:
    """The ``vllm_xargs`` hints a client sends with turn ``i``'s request (None: left out)."""
    return {"turn": i, "tool": program.turns[i].tool,
            "last": 1 if i == program.n_turns - 1 else None}


#: What the replayed client tells the server about a tool call before it runs (``tool_start``'s
#: ``predicted_s``): ``none``, as a trace has no predictor; ``online``, the harness's own rule
#: (the mean of the tool's durations seen so far by this client, once it has enough of them:
#: ``ToolDurationModel.client_prediction``); ``oracle``, the call's true duration, the bound
#: on what any predictor can give.
HINT_MODES = ("none", "online", "oracle")


class ClientPredictions:
    """The replayed client's tool-duration predictions (see ``HINT_MODES``)."""

    def __init__(self, mode: str = "none") -> None:
        if mode not in HINT_MODES:
            raise ValueError(f"hints {mode!r}: choose one of {', '.join(HINT_MODES)}")
        self.mode = mode
        self.durations = ToolDurationModel()

    def predict(self, tool: str, seconds: float) -> float | None:
        """`predicted_s` for a call of `tool` that will take `seconds`."""
        if self.mode == "none":
            return None
        return seconds if self.mode == "oracle" else self.durations.client_prediction(tool)[1]

    def observe(self, tool: str, seconds: float) -> None:
        if self.mode == "online":
            self.durations.observe(tool, seconds)
