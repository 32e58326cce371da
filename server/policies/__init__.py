"""Retention and ordering policies, chosen by name at server start-up.

No module in this package imports vLLM (see `base.py` for why). The registry names modules
rather than importing them, so loading one policy never pays for (or breaks on) another.
"""

from __future__ import annotations

from importlib import import_module

from server.policies.base import AgentEvent, CostModel, Hints, Policy, RequestView

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


def _resolve(name: str) -> tuple[type[Policy], dict[str, object]]:
    """The class registered as `name`'s part before ``:``, and the keyword its argument after
    ``:`` sets (`Policy.argument`), parsed once; a clear ValueError lists the valid names, or
    says what the argument should be."""
    base, colon, text = name.partition(":")
    try:
        target = POLICIES[base]
    except KeyError:
        raise ValueError(
            f"unknown policy {base!r}; choose one of: {', '.join(sorted(POLICIES))}"
        ) from None
    module, _, cls_name = target.partition(":")
    cls: type[Policy] = getattr(import_module(module), cls_name)
    if not colon:
        return cls, {}
    value = cls.parse_argument(text)  # raises ValueError, also where the class takes none
    return cls, {str(cls.argument): value}


def policy_class(name: str) -> type[Policy]:
    """The class registered as `name`, or as its part before ``:`` where the class takes an
    argument there (``lookahead-oracle:0.5``); a ValueError for an unknown name or a bad
    argument."""
    return _resolve(name)[0]


def make_policy(name: str, cost_model: CostModel | None = None, **options: object) -> Policy:
    """The policy `name`, given those of `options` its class declares (`Policy.options`) and
    the argument its name carries after ``:``; the rest are dropped, since deployment-wide
    settings reach policies that have no use for them."""
    cls, argument = _resolve(name)
    given = {k: v for k, v in options.items() if k in cls.options}
    return cls(cost_model=cost_model, **given, **argument)


__all__ = ["AgentEvent", "CostModel", "Hints", "Policy", "RequestView", "POLICIES",
           "make_policy", "policy_class"]
