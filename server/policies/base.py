"""The one policy interface every retention/ordering policy implements.

Why a separate, vLLM-free layer: the decisions (pin or free a finished turn's KV cache, for how
long, who goes first in the queue, whose pin to give up under memory pressure) are the research
object. Keeping them in small pure-Python classes lets the same code run inside vLLM's scheduler
(`server.scheduler.PolicyScheduler`), in the virtual-time benchmark and in unit tests that state
the right answer by hand.

The scheduler owns the mechanism (holding block references, reordering its queue, releasing
blocks); a policy only answers questions about views of requests and programs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from server.costs import CostModel
from server.programs import ProgramScheduler

#: what an agent tells the server (`server.intake.events` accepts exactly these); `program_moved` is
#: a cluster router's, to the replica a program it moved left (`cluster.placement`)
EventKind = Literal["program_start", "tool_start", "tool_end", "program_end", "program_moved"]
EVENT_KINDS: tuple[str, ...] = get_args(EventKind)

#: why a pin was given up; each is a counter of `server.scheduler.PinStats`
UnpinReason = Literal["handoff", "expired", "program_end", "pressure", "reset", "shutdown",
                      "replaced", "moved"]
UNPIN_REASONS: tuple[str, ...] = get_args(UnpinReason)


@dataclass(frozen=True, slots=True)
class Hints:
    """Per-request hints a client sends in `vllm_xargs` (all optional).

    turn: index of this LLM call within its program (0-based).
    tool: the tool the client expects this turn to call (known to replayers and to agents with
        a single tool); the authoritative name arrives later in a `tool_start` event.
    predicted_s: the client's prediction of that tool call's duration in seconds.
    last: this is the program's last LLM call, so nothing is worth keeping afterwards.
    predicted_output_tokens: the client's prediction of this turn's output length in tokens
        (AugServe's stage-I input; `predictor.lengths` makes it from the request text).
    """

    turn: int | None = None
    tool: str | None = None
    predicted_s: float | None = None
    last: bool = False
    predicted_output_tokens: int | None = None


@dataclass(slots=True)
class RequestView:
    """What a policy may know about one LLM request (one turn of a program)."""

    request_id: str
    program_id: str | None
    arrival_time: float
    prompt_tokens: int
    output_tokens: int = 0
    num_preemptions: int = 0
    hints: Hints = field(default_factory=Hints)

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """An interception event from the harness (see docs/events.md for the wire schema)."""

    kind: EventKind
    program_id: str
    tool: str | None = None
    predicted_s: float | None = None
    seconds: float | None = None
    return_tokens: int | None = None
    summary: str | None = None
    #: on `tool_start`, optional: what the gap is (tool, person, subagent) and its predicted
    #: quantiles in seconds ({"p50": .., "p90": ..}), docs/events.md
    gap_kind: str | None = None
    predicted_q: dict[str, float] | None = None


class Policy:
    """Base policy: vLLM's stock behaviour. Subclasses override only what they decide.

    Times are seconds on the scheduler's clock (`server.clock`), never wall time read directly,
    so virtual-time replays and real serving take the same decisions.
    """

    name = "vllm"
    #: When False the scheduler leaves vLLM's own queue order untouched (and pays nothing).
    reorders_queue = False

    #: When True the scheduler asks `token_budget` for each step's batch token limit.
    adapts_token_budget = False

    #: When True the scheduler asks `prefill_share` for each step in which a turn waits to
    #: start while another is still in its prefill: vLLM's long-prefill cap for that step.
    shares_prefill_steps = False

    #: When True the engine turns on vLLM's native KV offloading (a write-through host-memory
    #: copy of computed blocks), so a turn can reload its context over PCIe (`reload_from_cpu`).
    needs_offload = False

    #: When True the scheduler asks `prefetch_due` every step and brings the named programs'
    #: contexts back into GPU memory ahead of their next turn (`server.scheduler`'s prefetch).
    prefetches = False

    #: When True the scheduler asks `held_back` every step and keeps the named waiting turns
    #: out of that step's admission even while memory is free (a program scheduler's paused
    #: programs, `server.policies.programs`).
    gates_admission = False

    #: When True the scheduler sorts its running batch by `running_key` every step: vLLM
    #: gives token budget to running requests in that order and, when memory runs out,
    #: preempts from its end (FCFS scheduling; under `--scheduling-policy priority` vLLM's own
    #: priority order picks the victim).
    orders_running = False

    #: Keyword options of the constructor that the deployment sets (`server.settings`
    #: `ServeSettings.policy_options`, e.g. ``ttft_slo_s``); `make_policy` passes a policy only
    #: those it names here, so one cluster-wide setting can reach every replica's policy.
    options: ClassVar[tuple[str, ...]] = ()

    #: The constructor keyword that a policy name of the form ``NAME:VALUE`` sets
    #: (`server.policies.spec.PolicySpec`), or None when the policy takes none: a parameter an
    #: experiment sweeps, not a deployment's setting (the error of `lookahead-oracle`'s told
    #: lengths).
    argument: ClassVar[str | None] = None

    #: When True the policy schedules with every program's future, which only a replayed
    #: trace knows: the virtual-time engine tells it (`foresee`, given the trace's futures by
    #: `sim.engines.make_engine`) and `harness serve` refuses it.
    clairvoyant: ClassVar[bool] = False

    #: The program scheduler a policy carries out in the engine (`server.policies.programs`),
    #: whose time per state, pauses and resumes a replay reports; None for a policy that
    #: schedules requests only.
    programs: ProgramScheduler | None = None
    #: What the programs held, by state, over time (sampled by a program policy for the bench's
    #: occupancy plot); empty for the others.
    occupancy: Sequence[tuple[float, dict[str, int]]] = ()

    @classmethod
    def parse_argument(cls, text: str) -> Any:
        """The `argument`'s value from the text after ``:``; a ValueError says what a policy
        that takes one expects."""
        raise ValueError(f"policy {cls.name!r} takes no argument after ':' (got {text!r})")

    def __init__(self, cost_model: CostModel | None = None) -> None:
        self.cost_model = cost_model
        #: The engine's limits, set by the scheduler through `configure` (defaults: vLLM's).
        self.max_batch_tokens = 8192
        self.total_blocks = 0
        self.block_size = 16
        #: Whether the engine keeps a host-memory copy of computed KV (vLLM's native offloading)
        self.host_tier = False
        #: What that tier holds, in tokens (None: no tier, or its size not told)
        self.host_tier_tokens: int | None = None

    def configure(self, *, max_batch_tokens: int, total_blocks: int, block_size: int,
                  host_tier: bool = False, host_tier_tokens: int | None = None) -> None:
        """The engine's shape, known only once vLLM has sized its KV cache."""
        self.max_batch_tokens = max_batch_tokens
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.host_tier = host_tier
        self.host_tier_tokens = host_tier_tokens

    # -- lifecycle notifications -------------------------------------------------------
    def on_arrival(self, req: RequestView, now: float) -> None:
        """A new turn entered the waiting queue."""

    def on_scheduled(self, req: RequestView, now: float) -> None:
        """A waiting turn was admitted to the running batch for the first time."""

    def on_event(self, event: AgentEvent, now: float) -> None:
        """An interception event from the harness."""

    def on_aborted(self, req: RequestView, now: float) -> None:
        """A turn was aborted before it finished (its client went away)."""

    # -- retention ---------------------------------------------------------------------
    def on_finish(self, req: RequestView, now: float) -> bool:
        """A turn finished: return True to pin its KV cache (the scheduler then asks
        `pin_expired` every step), False to free it as vLLM does."""
        return False

    def pin_expired(self, program_id: str, now: float, has_waiting: bool) -> bool:
        """Whether the pin held for `program_id` should be released now."""
        return True

    def pin_victim(self, pinned_program_ids: list[str]) -> str:
        """Which pin to give up when an allocation would otherwise fail.

        Default: the program that arrived last (Continuum's rule), in the order the
        scheduler lists them (program arrival order)."""
        return pinned_program_ids[-1]

    def on_unpin(self, program_id: str, reason: UnpinReason, now: float) -> None:
        """The scheduler released a pin (for bookkeeping)."""

    def unpin_under_pressure(self, others_running: bool) -> bool:
        """An allocation failed while pins are held: True gives up a pin (`pin_victim`) and
        retries; False lets the allocation fail, so vLLM preempts a running request or leaves
        a waiting one waiting. Never False when `others_running` is False, or a pin could
        block the engine for good."""
        return True

    # -- offloading --------------------------------------------------------------------
    def reload_from_cpu(self, req: RequestView) -> bool:
        """Asked when the engine offloads and a waiting turn's context (past what the GPU
        prefix cache holds) is in host memory: True loads it over PCIe, False recomputes it."""
        return True

    # -- prefetch ----------------------------------------------------------------------
    def prefetch_due(self, now: float) -> list[str]:
        """Programs (in a tool call, not pinned) whose context should start coming back into
        GPU memory now, so their next turn finds it resident (used when `prefetches`). Each
        program is named once per interception."""
        return []

    def on_prefetched(self, program_id: str, context_tokens: int, now: float) -> bool:
        """A prefetch of `program_id`'s context finished: True pins it (then `pin_expired`
        decides as for any pin, and the program's next turn takes it over), False leaves it
        as ordinary prefix cache."""
        return False

    # -- batching ----------------------------------------------------------------------
    def token_budget(self, free_blocks: int, paused_blocks: int) -> int:
        """This step's limit on scheduled tokens (used when adapts_token_budget); never above
        `max_batch_tokens`, which sizes the model runner's buffers."""
        return self.max_batch_tokens

    def prefill_share(self, budget: int, computing: list[int], waiting: list[RequestView]
                      ) -> int:
        """The most tokens one prompt may compute of this step of `budget` tokens (used when
        shares_prefill_steps; 0: no cap, vLLM's default, under which the turn first in line
        takes what the budget has left). `computing`: the prompt tokens the running turns still
        in their prefill have left; `waiting`: the turns admitted to this step's queue, in its
        order."""
        return 0

    # -- admission ---------------------------------------------------------------------
    def observe_kv(self, blocks_in_use: int, ahead: Callable[[], Mapping[str, int]]) -> None:
        """The engine's KV blocks in use now, told before `held_back` (when
        `gates_admission`): running turns', pins', exports' — what the prefix cache cannot
        evict; and `ahead()`, per program, the tokens its running and waiting turns have
        still to take blocks for (a walk over the queues: call it only when deciding, and
        only within this step). A gate's own account of memory from contexts is an estimate
        of these (one that counts a prefix programs share once per program)."""

    def held_back(self, waiting: list[RequestView], running: int, now: float) -> set[str]:
        """Request ids of waiting turns to keep out of this step's admission (used when
        `gates_admission`). `running`: turns in the running batch. When nothing runs the
        scheduler admits the first waiting turn regardless, so a gate can never stall the
        engine."""
        return set()

    # -- ordering ----------------------------------------------------------------------
    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        """Sort key for the waiting queue, smallest first (used when reorders_queue)."""
        return (req.arrival_time,)

    def order_waiting(self, waiting: list[RequestView], now: float) -> list[RequestView]:
        """The waiting queue's new order, the same views rearranged (used when
        reorders_queue). Default: sorted by `queue_key`; a policy whose order is not a sort
        by a per-request key (AMPD compares orderings of a window) overrides this."""
        return sorted(waiting, key=lambda req: self.queue_key(req, now))

    def running_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        """Sort key for the running batch, smallest first; the largest is preempted first
        (used when orders_running)."""
        return (req.arrival_time,)
