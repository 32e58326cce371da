"""`vllm-router`'s program scheduling set up for our emulated replicas: its calibration from
our step-time profile, its configuration, and its decisions counted from its own metrics.

Why a module: `eval.experiments.served_comparison` runs `vllm-router
--enable-program-scheduling` as a baseline, and its docs (upstream `docs/program_scheduling.md`)
say to calibrate two cost models per deployment rather than keep the reference coefficients:

* `prefill_cost_model`: a cold prefill of ``x = uncached tokens / 1000`` takes
  ``intercept + linear * x + quadratic * x**2`` seconds; `decode_throughput_alpha` is the share
  of decode throughput kept while a prefill is mixed into the batch;
* `decode_throughput_model`: a decode step of ``B`` requests with ``C`` context tokens in all
  takes ``fixed + per_request * B + per_context_token * C`` seconds.

Upstream measures these on the deployed engine (AgentInfer's calibration tool). Our replicas
run the emulated GPU, whose step time *is* a profile (`server.perf`), so `calibrate` measures
the profile instead: cold prefills of 256 to 32k tokens alone (`Profile.prefill_seconds`,
chunked as vLLM chunks them) and decode batches of 1 to 128 requests at 256 to 16k tokens of
context each (`Profile.step_seconds`), each fitted by non-negative least squares (the
coefficients must be >= 0). Alpha is one step's decode time over that of the same step with a
full prefill chunk mixed in (16 requests at 4k context; the chunk fills vLLM's token budget),
which is how a cold re-prefill meets the decode batch on this engine.

Its metrics (`vllm_router_agent_aware_*` on the router's Prometheus port): `metric_totals`
sums counters and histogram counts/sums by their labels, `decision_counts` reads the committed
transitions (`vllm_router_agent_aware_transitions_total`, by reason) and the RequestPool's
queue waits.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import nnls

from server.perf.profile import Profile

PREFILL_TOKENS = (256, 512, 1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768)
DECODE_BATCH = (1, 2, 4, 8, 16, 32, 64, 128)
DECODE_CONTEXT = (256, 1024, 4096, 8192, 16384)
ALPHA_BATCH, ALPHA_CONTEXT = 16, 4096

METRIC_PREFIX = "vllm_router_agent_aware_"
TRANSITIONS = METRIC_PREFIX + "transitions_total"
QUEUE_WAIT = METRIC_PREFIX + "queue_wait_seconds"
ARMED_TTL = METRIC_PREFIX + "armed_ttl_seconds"


@dataclass(frozen=True)
class Calibration:
    """The seven coefficients vllm-router asks for, and how well they fit the profile."""

    intercept_seconds: float
    linear_seconds_per_1k_tokens: float
    quadratic_seconds_per_1k_tokens_squared: float
    decode_throughput_alpha: float
    fixed_step_seconds: float
    batch_step_seconds_per_request: float
    context_step_seconds_per_token: float
    prefill_max_rel_error: float  # over the measured prefill lengths
    decode_max_rel_error: float  # over the measured decode batches

    def router_models(self) -> dict[str, dict[str, float]]:
        """`prefill_cost_model` and `decode_throughput_model` as the router's JSON takes them."""
        return {
            "prefill_cost_model": {
                "intercept_seconds": self.intercept_seconds,
                "linear_seconds_per_1k_tokens": self.linear_seconds_per_1k_tokens,
                "quadratic_seconds_per_1k_tokens_squared":
                    self.quadratic_seconds_per_1k_tokens_squared,
                "decode_throughput_alpha": self.decode_throughput_alpha},
            "decode_throughput_model": {
                "fixed_step_seconds": self.fixed_step_seconds,
                "batch_step_seconds_per_request": self.batch_step_seconds_per_request,
                "context_step_seconds_per_token": self.context_step_seconds_per_token}}


def calibrate(profile: Profile) -> Calibration:
    """The router's cost models measured on `profile` (see the module docstring)."""
    lengths = np.array(PREFILL_TOKENS, dtype=float)
    prefill = np.array([profile.prefill_seconds(int(n)) for n in lengths])
    x = lengths / 1000.0
    a = np.column_stack([np.ones_like(x), x, x * x])
    (c0, c1, c2), _ = nnls(a, prefill)
    prefill_err = float(np.max(np.abs(a @ [c0, c1, c2] - prefill) / prefill))

    rows, times = [], []
    for batch in DECODE_BATCH:
        for context in DECODE_CONTEXT:
            rows.append((1.0, batch, batch * context))
            times.append(profile.step_seconds([], [context] * batch))
    d = np.array(rows, dtype=float)
    t = np.array(times)
    (f0, f1, f2), _ = nnls(d, t)
    decode_err = float(np.max(np.abs(d @ [f0, f1, f2] - t) / t))

    decodes = [ALPHA_CONTEXT] * ALPHA_BATCH
    chunk = max(1, profile.max_num_batched_tokens - ALPHA_BATCH)
    alone = profile.step_seconds([], decodes)
    mixed = profile.step_seconds([(chunk, 0)], decodes)
    return Calibration(
        intercept_seconds=float(c0), linear_seconds_per_1k_tokens=float(c1),
        quadratic_seconds_per_1k_tokens_squared=float(c2),
        decode_throughput_alpha=min(1.0, alone / mixed),
        fixed_step_seconds=max(float(f0), 1e-6),  # the router wants it > 0
        batch_step_seconds_per_request=float(f1), context_step_seconds_per_token=float(f2),
        prefill_max_rel_error=prefill_err, decode_max_rel_error=decode_err)


def scheduling_config(calibration: Calibration, token_capacity_per_replica: int, *,
                      metrics_interval_s: float = 0.5,
                      overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `--program-scheduling-config-json` object: the deployment mode its docs recommend
    (`global_queue`, MRU resume), each replica's KV capacity in tokens (so admission counts
    tokens, not programs), the calibrated cost models; every other field its default.
    `overrides` replaces top-level fields (e.g. ``{"binding_only": True}`` for the docs'
    affinity-only A/B)."""
    if token_capacity_per_replica <= 0:
        raise ValueError(f"token capacity must be positive, not {token_capacity_per_replica}")
    config: dict[str, Any] = {
        "program_scheduling_enable_key": "vllm_xargs.agentic_context",
        "global_queue": True, "resume_order": "mru",
        "token_capacity_per_dp_rank": int(token_capacity_per_replica),
        "metrics_interval_seconds": metrics_interval_s,
        **calibration.router_models()}
    config.update(overrides or {})
    return config


def config_argument(config: dict[str, Any]) -> list[str]:
    """The router's command-line options that switch program scheduling on with `config`."""
    return ["--enable-program-scheduling", "--program-scheduling-config-json",
            json.dumps(config, separators=(",", ":"))]


# -- its metrics ----------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric_totals(text: str, prefix: str = METRIC_PREFIX,
                  drop: Sequence[str] = ("target",)) -> dict[str, float]:
    """Every sample of a Prometheus text whose name starts with `prefix`, summed over the
    labels in `drop` (per replica: the totals are the router's), keyed by the name plus the
    remaining labels in order (``name{reason=ttl_expired}``). Histogram buckets are left out
    (their ``_count`` and ``_sum`` stay)."""
    totals: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None or not match.group(1).startswith(prefix):
            continue
        name, labels, value = match.groups()
        if name.endswith("_bucket"):
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        kept = [f"{k}={v}" for k, v in _LABEL.findall(labels or "") if k not in drop]
        totals[f"{name}{{{','.join(kept)}}}" if kept else name] += number
    return dict(totals)


def decision_counts(after: dict[str, float],
                    before: dict[str, float] | None = None) -> dict[str, Any]:
    """What program scheduling did between two `metric_totals` (``before`` None: since the
    router started): committed transitions by reason (``transitions``), requests dispatched
    through its RequestPool and their mean wait there (``pooled``, ``pool_wait_mean_s``), and
    the Progress-TTLs it armed after requests (``ttl_armed``, ``ttl_mean_s``; 0 s until its
    window of observed tool-call intervals is full)."""
    before = before or {}

    def delta(name: str) -> float:  # summed over the series' labels (`{source=fitted}`)
        return sum(after[k] - before.get(k, 0.0) for k in after
                   if k == name or k.startswith(name + "{"))

    transitions: dict[str, int] = {}
    for key in after:
        if key.startswith(TRANSITIONS + "{") or key == TRANSITIONS:
            labels = key[len(TRANSITIONS):].strip("{}") or "all"
            count = int(round(after[key] - before.get(key, 0.0)))
            if count:
                transitions[labels] = transitions.get(labels, 0) + count
    pooled = delta(QUEUE_WAIT + "_count")
    armed = delta(ARMED_TTL + "_count")
    return {"transitions": dict(sorted(transitions.items())), "pooled": int(round(pooled)),
            "pool_wait_mean_s": delta(QUEUE_WAIT + "_sum") / pooled if pooled else math.nan,
            "ttl_armed": int(round(armed)),
            "ttl_mean_s": delta(ARMED_TTL + "_sum") / armed if armed else math.nan}
