"""The emulated long-context profile: Qwen3-Coder-30B-A3B on an H200 (`server/models/
qwen3-coder-30b-a3b`, its YaRN variant `-1m`), whose context holds coding-agent prompts past
Llama-3.1's 131,072 tokens. Arithmetic only: no engine, no server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server.max_model_len import context_limit
from server.perf.hardware import GPUS, MiB
from server.perf.model_shapes import MODELS_DIR, ModelSpec
from server.perf.registry import load_profile, profile_names
from server.perf.roofline import RooflineProfile

NATIVE = "h200-qwen3-coder-30b-a3b"
YARN = "h200x2-qwen3-coder-30b-a3b-1m"
MODELS = ("qwen3-coder-30b-a3b", "qwen3-coder-30b-a3b-1m")
KV_PER_TOKEN = 2 * 48 * 4 * 128 * 2  # K and V, 48 layers, 4 KV heads of 128, bf16: 96 KiB


def test_profiles_load_and_are_listed() -> None:
    assert NATIVE in profile_names() and YARN in profile_names()
    p = load_profile(NATIVE)
    assert isinstance(p, RooflineProfile) and (p.gpu_key, p.tp) == ("h200", 1)
    m = p.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim) == (48, 2048, 32, 4, 128)
    assert (m.experts, m.active_experts, m.intermediate, m.vocab) == (128, 8, 768, 151936)
    assert not m.tie_embeddings
    # the YaRN variant is the same model, on two GPUs unless told otherwise
    y = load_profile("h200-qwen3-coder-30b-a3b-1m")
    assert y.tp == 2 and y.model.params == m.params


def test_moe_params_total_and_active_by_hand() -> None:
    """Per layer: Q 2048*4096 + K,V 2*2048*512 + O 4096*2048 + norms 2*2048 = 18,878,464;
    an expert 3*2048*768 = 4,718,592; router 2048*128 = 262,144. Held: 48 * (18,878,464 +
    128 experts + router) + 2 * 151936*2048 + 2048 = 30,532,110,336 (the card's "30.5B in
    total"); per token 48 * (18,878,464 + 8 experts + router) = 2,730,688,512, with the
    embedding and LM head 3,353,020,416 (its "3.3B activated")."""
    m = ModelSpec.from_config(MODELS_DIR / "qwen3-coder-30b-a3b")
    assert m.attention_params == 18_878_464 and m.expert_params == 4_718_592
    assert m.params == 48 * (18_878_464 + 128 * 4_718_592 + 262_144) + 2 * 151936 * 2048 + 2048
    assert m.params == 30_532_110_336
    assert m.matmul_params_per_token == 48 * (18_878_464 + 8 * 4_718_592 + 262_144)
    active = m.matmul_params_per_token + m.embedding_params + m.lm_head_params + m.hidden
    assert active == 3_353_020_416
    assert m.kv_bytes_per_token == KV_PER_TOKEN == 98_304
    # every expert is streamed each step (the stated simplification of model_shapes)
    assert m.weight_bytes_read_per_step == (m.params - 151936 * 2048) * 2


def test_kv_capacity_on_one_and_two_h200s() -> None:
    """(143,771 MiB * 0.9 - 61.06 GB of weights - 2.24 GiB reserve) / 96 KiB = 734,570 tokens:
    more than the native context, fewer than the 1M YaRN one; two H200s hold 2.08M."""
    p = load_profile(NATIVE)
    reserve = 512 * MiB + 1024 * 151936 * 4 * 3  # CUDA context + the sampler's dummy run
    assert p.activation_reserve_bytes() == reserve
    free = GPUS["h200"].memory_bytes * 0.9 - p.model.weight_bytes - reserve
    assert p.kv_capacity_tokens(0.9) == int(free // KV_PER_TOKEN) == 734_570
    assert load_profile(YARN).kv_capacity_tokens(0.9) == 2_079_396


def test_context_limits() -> None:
    """The native context, 262,144, on one H200; 1,048,576 with YaRN on two; both held by
    the KV cache (vLLM refuses to start with a context its cache cannot hold)."""
    assert context_limit(NATIVE, None) == 262_144
    assert context_limit(YARN, None) == 1_048_576
    assert context_limit(NATIVE, 4096) == 4095 * 16  # a small cache caps it, as before
    for name in (NATIVE, YARN):
        assert load_profile(name).kv_capacity_tokens(0.9) >= context_limit(name, None)
    with pytest.raises(ValueError, match="longer than the model's context"):
        context_limit(NATIVE, None, max_model_len=785_000)
    assert context_limit(YARN, None, max_model_len=785_000) == 785_000


def test_configs_carry_local_tokenizer_ids_and_tokenizer() -> None:
    for name in MODELS:
        folder = MODELS_DIR / name
        for file in ("config.json", "generation_config.json"):
            cfg = json.loads((folder / file).read_text())
            assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (0, 4)
        for file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            assert (folder / file).resolve() == (MODELS_DIR.parent / "tokenizer" / file)
    yarn = json.loads((MODELS_DIR / MODELS[1] / "config.json").read_text())
    assert yarn["rope_scaling"] == {"factor": 4.0, "original_max_position_embeddings": 262144,
                                    "rope_type": "yarn"}


def test_prefill_attention_is_quadratic_in_context() -> None:
    """A chunk's attention is priced against its whole context (chunk * ctx + causal half query-
    key pairs): an 8,192-token chunk at 200k context costs ~17x the same chunk at 2k, and the
    difference is exactly the extra pairs at 4 L H d FLOPs each over half the peak."""
    p = load_profile(NATIVE)
    chunk = 8192
    at_2k = p.step_seconds([(chunk, 2_048)], [])
    at_200k = p.step_seconds([(chunk, 200_000)], [])
    assert at_200k > 15 * at_2k
    pair_flops = 4 * 48 * 32 * 128
    extra = chunk * (200_000 - 2_048) * pair_flops / (989e12 * 0.5)
    assert at_200k - at_2k == pytest.approx(extra, rel=1e-9)
    # a whole prompt: twice the tokens, about four times the time once attention dominates
    assert p.prefill_seconds(262_144) > 3.5 * p.prefill_seconds(131_072)
    assert p.prefill_seconds(4_096) < 2.5 * p.prefill_seconds(2_048)
    # the linear form (coefficients) carries the same pairs
    c = p.coefficients()
    assert c.c2 == pytest.approx(pair_flops / (989e12 * 0.5))


@pytest.mark.parametrize("ctx", [131_072, 262_144])
def test_decode_reads_its_whole_kv(ctx: int) -> None:
    """A decode at 128k/256k context reads 12/24 GiB of KV: 3.3/6.7 ms at 0.8 of 4.8 TB/s,
    on top of the step's weight read."""
    p = load_profile(NATIVE)
    kv_read = ctx * KV_PER_TOKEN / (4.8e12 * 0.8)
    assert p.step_seconds([], [ctx]) - p.step_seconds([], [1]) == pytest.approx(
        kv_read - 1 * KV_PER_TOKEN / (4.8e12 * 0.8), rel=1e-9)
    assert p.step_seconds([], [ctx] * 4) > p.step_seconds([], [ctx]) + 3 * kv_read * 0.99


@pytest.mark.parametrize(("extra", "match"), [
    ({"mlp_only_layers": [0]}, "dense layers"),
    ({"decoder_sparse_step": 2}, "dense layers"),
    ({"shared_expert_intermediate_size": 1024}, "shared expert"),
])
def test_qwen_moe_configs_the_arithmetic_cannot_price_are_refused(
        tmp_path: Path, extra: dict, match: str) -> None:
    cfg = json.loads((MODELS_DIR / "qwen3-coder-30b-a3b" / "config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, **extra}))
    with pytest.raises(ValueError, match=match):
        ModelSpec.from_config(path)
