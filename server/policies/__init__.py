"""Retention and ordering policies, chosen by name at server start-up.

No module in this package imports vLLM (see `base.py` for why). The registry
(`registry.py`) names modules rather than importing them, so loading one policy never pays
for (or breaks on) another; a name is parsed once, into a `PolicySpec` (`spec.py`).
"""

from __future__ import annotations

from server.policies.base import AgentEvent, CostModel, Hints, Policy, RequestView
from server.policies.registry import POLICIES
from server.policies.spec import PolicySpec


def make_policy(policy: PolicySpec | str, cost_model: CostModel | None = None,
                **options: object) -> Policy:
    """The policy `policy` (a `PolicySpec`, or a name as an engine is told it,
    ``NAME[:ARGUMENT]``), given those of `options` its class declares (`Policy.options`) and
    the argument its name carries after ``:``; the rest are dropped, since deployment-wide
    settings reach policies that have no use for them."""
    spec = policy if isinstance(policy, PolicySpec) else PolicySpec.named(policy)
    given = {k: v for k, v in options.items() if k in spec.cls.options}
    return spec.cls(cost_model=cost_model, **given, **spec.arguments())


__all__ = ["AgentEvent", "CostModel", "Hints", "Policy", "PolicySpec", "RequestView",
           "POLICIES", "make_policy"]
