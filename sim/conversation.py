"""A program's conversation as token ids, rendered the same way by every replayer.

Why token ids at all: the prefix cache and pins must work as with a real agent. Every prompt
is rendered deterministically: turn ``i+1``'s prompt is turn ``i``'s prompt, then the tokens the
model actually answered in turn ``i`` (the engine returns them; the emulated model's ids are
random but seeded), then stand-in ids for the tool return and the new input. So a kept (pinned
or still cached) KV cache covers the previous prompt *and* its output, as in an agent that
appends the assistant message verbatim. Stand-in ids come from a generator seeded by the
program id (and the shared-prefix id for the first ``shared_prefix_tokens``, so programs
sharing a system prompt hit each other's cache). A turn that keeps only the first
``kept_tokens`` of the conversation (`common.trace`, version 2: a compaction) cuts it there
before its new tokens, and its first new id differs from the one it replaces, so a prefix cache
matches exactly the kept tokens (rounded down to its block size, as vLLM's hashes of whole
blocks do). Same trace, policy, profile and seed: identical results.
"""

from __future__ import annotations

import zlib

import numpy as np

from common.trace import Program, Trace

#: Stand-in ids are drawn from [FIRST_ID, LAST_ID): ordinary tokens of every emulated model.
FIRST_ID = 8
LAST_ID = 1000


def _rng(*keys: str) -> np.random.Generator:
    return np.random.default_rng([zlib.crc32(k.encode()) for k in keys])


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return [int(x) for x in rng.integers(FIRST_ID, LAST_ID, size=n)] if n > 0 else []


class ProgramState:
    """A program's conversation as token ids, grown turn by turn.

    Public because every replayer must build prompts the same way (the virtual-time loop,
    `sim.loop`, and ``eval.replay.http_replay``'s wall-clock one): the same ids give the same
    prefix-cache and pin behaviour, so their results can be set side by side.
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
        """After turn ``i``: append its answer (padded/cut to the trace's count), keep what
        turn ``i+1`` keeps of it all, then append the tool return and turn ``i+1``'s input."""
        want = self.program.turns[i].output_tokens
        answer = list(answered[:want]) + _ids(self.rng, want - len(answered))
        # the last sampled token is never fed back, so its KV was never computed
        self.computed = len(self.tokens) + want - 1
        self.tokens += answer
        new = _ids(self.rng, self.program.new_tokens(i + 1))
        kept = self.program.turns[i + 1].kept_tokens
        if kept is not None and kept < len(self.tokens):
            if new and new[0] == self.tokens[kept]:  # the prefix ends exactly at `kept`
                new[0] = FIRST_ID + (new[0] - FIRST_ID + 1) % (LAST_ID - FIRST_ID)
            del self.tokens[kept:]
            self.computed = min(self.computed, kept)
        self.tokens += new

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
