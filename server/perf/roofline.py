"""The roofline profile: a step's time from the GPU datasheet and the model's config.json.

Why a roofline: it needs no measurement, so any GPU of the catalogue (`server.perf.hardware`)
and any model (`server.perf.model_shapes`) can be emulated. A profile named such as
``h100-llama-3.1-8b`` is one (`server.perf.registry.load_profile`). ``c1 * max(T, T_knee)`` of
the step form (`server.perf.step_form`) is the roofline of the linear layers:
``max(2 * matmul_params * T / (peak * mfu), weight_bytes / (hbm * hbm_eff))``, i.e. below the
knee a step is bound by reading the weights once, above it by FLOPs. Attention is a roofline
per sequence (compute of the query-key pairs vs reading its KV). Tensor parallelism adds two
ring all-reduces per layer over NVLink.

All constants, their sources and the efficiency assumptions are in docs/emulated-gpu.md.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from server.perf.profile import Profile
from server.perf.step_form import Coefficients, check_batch


class RooflineProfile(Profile):
    """Step time from datasheet peaks, the model's shapes and :class:`Efficiency`."""

    kind = "roofline"

    def coefficients(self) -> Coefficients:
        """The step form's coefficients. Exact for decodes and for prefill chunks long enough
        to be compute-bound; step_seconds keeps the per-sequence attention roofline, which
        differs for short chunks over long contexts (memory-bound)."""
        m, e = self.model, self.eff
        flops = self.peak_flops * e.mfu
        bw = self.hbm_bandwidth * e.hbm
        c1 = 2.0 * m.matmul_params_per_token / flops
        c0 = e.step_overhead_s
        c5 = 0.0
        if self.tp > 1:
            latency = 2 * m.layers * e.allreduce_latency_s
            c0 += latency
            c5 = self.allreduce_seconds(1) - latency
        return Coefficients(
            c0=c0,
            c1=c1,
            knee=m.weight_bytes_read_per_step / bw / c1,
            c2=m.attention_flops_per_pair() / (self.peak_flops * e.attention_mfu),
            c3=self.kv_bytes_per_token / bw,
            c4=e.per_seq_overhead_s + 2.0 * m.vocab * m.hidden / flops,
            c5=c5,
        )

    @functools.cached_property
    def _step_constants(self) -> tuple[float, float, float, float, float, float, float, int]:
        """What `step_seconds` needs of the (frozen) model, GPU and efficiencies, computed
        once: the emulated executor prices every engine step, hundreds of thousands a replay.
        Each value is the same expression, in the same order, as it was inline."""
        m, e = self.model, self.eff
        flops = self.peak_flops * e.mfu
        attn_flops = self.peak_flops * e.attention_mfu
        bw = self.hbm_bandwidth * e.hbm
        return (flops, attn_flops, bw, 2.0 * m.matmul_params_per_token,
                m.weight_bytes_read_per_step / bw, 2.0 * m.vocab * m.hidden,
                m.attention_flops_per_pair(), self.kv_bytes_per_token)

    def step_seconds(self, prefill: Sequence[Sequence[int]], decode: Sequence[int]) -> float:
        check_batch(prefill, decode)
        seqs = len(prefill) + len(decode)
        if seqs == 0:
            return 0.0
        flops, attn_flops, bw, two_matmul, weights_s, two_lm_head, pair_flops, kvb = (
            self._step_constants)
        tokens = sum(c for c, _ in prefill) + len(decode)

        # Linear layers: FLOPs of every new token vs one read of the weights.
        linear = max(two_matmul * tokens / flops, weights_s)
        # LM head on each sequence's last position (vLLM computes logits per request).
        lm_head = two_lm_head * seqs / flops
        # Attention, a roofline per sequence: query-key pair FLOPs vs reading its KV.
        attention = 0.0
        for chunk, ctx in prefill:
            pairs = chunk * ctx + chunk * (chunk + 1) / 2
            attention += max(pairs * pair_flops / attn_flops, (ctx + chunk) * kvb / bw)
        for ctx in decode:
            attention += max(ctx * pair_flops / attn_flops, ctx * kvb / bw)
        return (
            self.cpu_overhead_seconds(seqs)
            + linear
            + lm_head
            + attention
            + self.allreduce_seconds(tokens)
        )

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["coefficients"] = asdict(self.coefficients())
        return d
