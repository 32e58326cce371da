"""Every policy by the name a run gives it, and the class that name stands for.

Why names of modules, not imports: loading one policy never pays for (or breaks on) another.
A name is resolved only through `server.policies.spec.PolicySpec`, which also parses what a
name may carry besides it.
"""

from __future__ import annotations

from importlib import import_module

from server.policies.base import Policy

#: name -> "module:Class"
POLICIES: dict[str, str] = {
    "vllm": "server.policies.vllm:VllmPolicy",
    "continuum": "server.policies.continuum:ContinuumPolicy",
    "continuum-code": "server.policies.continuum_code:ContinuumCodePolicy",
    "continuum-prefetch": "server.policies.continuum_prefetch:ContinuumPrefetchPolicy",
    "discard": "server.policies.discard:DiscardPolicy",
    "swap": "server.policies.swap:SwapPolicy",
    "preserve": "server.policies.preserve:PreservePolicy",
    "autellix": "server.policies.autellix:AutellixPolicy",
    "infercept": "server.policies.infercept:InferCeptPolicy",
    "augserve": "server.policies.augserve:AugServePolicy",
    "ampd": "server.policies.ampd:AMPDPolicy",
    "oracle": "server.policies.oracle:OraclePolicy",
    "remaining-work": "server.policies.remaining_work:RemainingWorkPolicy",
    # program schedulers (`server.programs`): which programs may run at all
    "thunderagent": "server.policies.thunderagent:ThunderAgentPolicy",
    "mori": "server.policies.mori:MoriPolicy",
    "lookahead": "server.policies.lookahead:LookaheadPolicy",
    "lookahead-oracle": "server.policies.lookahead:LookaheadOraclePolicy",
}


def registered(name: str) -> type[Policy]:
    """The class registered as `name` (a bare name: nothing after ``:``, ``+`` or ``@``); a
    ValueError lists the valid names."""
    try:
        target = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; choose one of: {', '.join(sorted(POLICIES))}"
        ) from None
    module, _, cls_name = target.partition(":")
    cls: type[Policy] = getattr(import_module(module), cls_name)
    return cls
