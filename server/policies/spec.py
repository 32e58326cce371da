"""A policy as a run names it, parsed once: ``NAME[:ARGUMENT][+offload][@HINTS]``.

Why one value: a policy's name crosses the command line, the bench, the simulator, the engine
and the router, and each part of it is some layer's business (``:ARGUMENT`` the policy's class,
``+offload`` the engine's KV tiers, ``@HINTS`` the replayed client). Parsed at the edge (the
command line, a cluster file, `harness bench --policies`) into a `PolicySpec`, it travels whole,
so no layer splits off the part it knows with a grammar of its own. It crosses a process
boundary (vLLM's `additional_config`, `server.settings`) as its `engine_name`, which the
engine core reads back with `PolicySpec.named`.

Two grammars, both here:

* `named`: ``NAME[:ARGUMENT]``, what an engine runs (`harness serve --policy`, a cluster
  file's `policy`, an engine's settings);
* `parse`: that with ``+offload`` (vLLM's CPU KV offloading for a policy that does not need
  it, so it can be compared on the same memory as one that does) and ``@HINTS`` (what the
  replayed client predicts about tool calls, `HINT_MODES`): what a replay compares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from server.policies.base import Policy
from server.policies.registry import registered

#: What the replayed client tells the server about a tool call before it runs (``tool_start``'s
#: ``predicted_s``, `sim.client`): ``none``, as a trace has no predictor; ``online``, the
#: harness's own rule (the mean of the tool's durations seen so far by this client, once it has
#: enough of them: ``ToolDurationModel.client_prediction``); ``oracle``, the call's true
#: duration, the bound on what any predictor can give; ``gaps``, ``online``'s ``predicted_s``
#: plus the gap's kind and its predicted quantiles (``gap_kind``, ``predicted_q``: the gap
#: model's, `predictor.gaps`), so a policy that reads none of them runs as under ``online``.
HINT_MODES = ("none", "online", "oracle", "gaps")
#: the one suffix a replayed policy's name may carry after ``+``
OFFLOAD_SUFFIX = "offload"


class UnknownHints(ValueError):
    """The part after ``@`` is none of `HINT_MODES` (the name before it is valid)."""


@dataclass(frozen=True)
class PolicySpec:
    """One policy of a run, checked when made: a registered `name`, the text of its
    `argument` after ``:`` (None: none given; its class parses it, `Policy.parse_argument`),
    whether `offload` turns vLLM's CPU KV offloading on for it, and the client `hints` as given
    after ``@`` (None: no ``@``; `hint_mode` is what they mean). `str()` gives the text it was
    parsed from, the run's label."""

    name: str
    argument: str | None = None
    offload: bool = False
    hints: str | None = None
    #: the class registered as `name`, resolved once
    cls: type[Policy] = field(init=False, repr=False, compare=False)
    #: the `argument` as its class parsed it (None without one)
    value: Any = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        cls = registered(self.name)  # a ValueError naming the policies
        object.__setattr__(self, "cls", cls)
        if self.argument is not None:  # a ValueError, also where the class takes none
            object.__setattr__(self, "value", cls.parse_argument(self.argument))
        if self.hint_mode not in HINT_MODES:
            raise UnknownHints(f"hints {self.hint_mode!r}: choose one of "
                               f"{', '.join(HINT_MODES)}")

    @classmethod
    def named(cls, text: str) -> PolicySpec:
        """``NAME[:ARGUMENT]``: the policy an engine runs; a ValueError lists the valid names,
        or says what the argument should be."""
        name, colon, argument = text.partition(":")
        return cls(name, argument if colon else None)

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """``NAME[:ARGUMENT][+offload][@HINTS]``: a policy a replay compares
        (``continuum+offload@online``); a ValueError says what is wrong, an `UnknownHints`
        where only the hints are."""
        named, at, hints = text.partition("@")
        base, plus, suffix = named.partition("+")
        if plus and suffix != OFFLOAD_SUFFIX:
            raise ValueError(f"policy {named!r}: the only suffix is +{OFFLOAD_SUFFIX}")
        name, colon, argument = base.partition(":")
        return cls(name, argument if colon else None, offload=bool(plus),
                   hints=hints if at else None)

    @property
    def hint_mode(self) -> str:
        """What the replayed client predicts about tool calls (`HINT_MODES`)."""
        return self.hints or "none"

    @property
    def engine_name(self) -> str:
        """``NAME[:ARGUMENT]``: what an engine is told to run (its KV tiers and the client's
        hints are not the policy's business)."""
        return self.name if self.argument is None else f"{self.name}:{self.argument}"

    def arguments(self) -> dict[str, Any]:
        """The constructor keyword the argument sets (`Policy.argument`), or none."""
        return {} if self.argument is None else {str(self.cls.argument): self.value}

    def __str__(self) -> str:
        return (self.engine_name + (f"+{OFFLOAD_SUFFIX}" if self.offload else "")
                + ("" if self.hints is None else f"@{self.hints}"))
