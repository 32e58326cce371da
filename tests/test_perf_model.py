"""The emulated GPU: performance model (`server.perf`), profiler (`server.profilers.gpu`,
`harness profile`)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from server.perf.fit import fit_coefficients
from server.perf.hardware import GPUS
from server.perf.model_shapes import MODELS_DIR, ModelSpec
from server.perf.registry import load_profile
from server.perf.roofline import RooflineProfile
from server.perf.step_form import Coefficients, step_features
from server.perf.table import TableProfile

MiB = 1 << 20
H100_8B = "h100-llama-3.1-8b"
PROFILES = ["h100-llama-3.1-8b", "h200-llama-3.1-8b", "a100-llama-3.1-8b", "h100x8-llama-3.1-70b"]


# --- specs --------------------------------------------------------------------------------


def test_model_specs_match_published_sizes() -> None:
    m8 = ModelSpec.from_config(MODELS_DIR / "llama-3.1-8b")
    assert (m8.layers, m8.hidden, m8.heads, m8.kv_heads, m8.head_dim) == (32, 4096, 32, 8, 128)
    assert m8.params == 8_030_261_248  # "8.03B" on the model card
    assert m8.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    m70 = ModelSpec.from_config(MODELS_DIR / "llama-3.1-70b", tp=8)
    assert m70.params == 70_553_706_496  # "70.6B"
    assert m70.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2


def test_qwen3_32b_spec_by_hand() -> None:
    """Qwen3-32B's public config: 64 layers, hidden 5120, 64 heads of 128, 8 KV heads, MLP
    25600, vocabulary 151936, untied. Per layer: Q 5120*8192 + K,V 2*5120*1024 + O 8192*5120
    + norms 2*5120 = 94,382,080, MLP 3*5120*25600 = 393,216,000; x64 = 31,206,277,120
    ("non-embedding 31.2B" on the model card), + 2 * 151936*5120 + 5120 = 32,762,106,880
    ("32.8B")."""
    m = ModelSpec.from_config(MODELS_DIR / "qwen3-32b", tp=4)
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim) == (64, 5120, 64, 8, 128)
    assert m.matmul_params_per_token == 64 * (94_382_080 + 393_216_000) == 31_206_277_120
    assert m.params == 32_762_106_880
    assert m.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2 == 262_144


def test_mixtral_holds_every_expert_but_multiplies_through_two() -> None:
    """Mixtral-8x7B: 32 layers, hidden 4096, 32 heads, 8 KV heads, 8 experts of MLP 14336, 2
    active. Per layer: attention 41,951,232 (Q, K, V, O, norms), an expert 3*4096*14336 =
    176,160,768, router 4096*8 = 32,768. Held: 32 * (41,951,232 + 8 * 176,160,768 + 32,768) +
    2 * 32000*4096 + 4096 = 46,702,792,704 ("46.7B"); per token: 32 * (41,951,232 + 2 *
    176,160,768 + 32,768) = 12,617,777,152 ("12.9B active" with the two embeddings)."""
    m = ModelSpec.from_config(MODELS_DIR / "mixtral-8x7b", tp=2)
    assert (m.experts, m.active_experts) == (8, 2)
    assert m.params == 46_702_792_704
    assert m.matmul_params_per_token == 12_617_777_152
    assert m.weight_bytes_read_per_step == (m.params - 32000 * 4096) * 2  # every expert read
    with pytest.raises(ValueError, match="does not fit on 1 x h20"):
        load_profile("h20x1-mixtral-8x7b")  # 87 GiB of weights on one 96 GB H20
    dense = ModelSpec.from_config(MODELS_DIR / "llama-3.1-70b", tp=8)
    assert (dense.experts, dense.active_experts, dense.router_params) == (1, 1, 0)


def test_configs_carry_local_tokenizer_ids() -> None:
    for name in ("llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "mixtral-8x7b"):
        for file in ("config.json", "generation_config.json"):
            cfg = json.loads((MODELS_DIR / name / file).read_text())
            assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (0, 4)


# --- shape of the step-time function -------------------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_monotonic_in_tokens_and_context(name: str) -> None:
    p = load_profile(name)
    chunks = [1, 16, 128, 512, 2048, 8192]
    times = [p.step_seconds([(c, 0)], []) for c in chunks]
    assert times == sorted(times)
    assert times[-1] > 2 * times[3]  # compute-bound: 4x the tokens costs much more
    ctxs = [0, 1024, 8192, 32768]
    times = [p.step_seconds([(512, x)], []) for x in ctxs]
    assert all(a < b for a, b in zip(times, times[1:], strict=False))
    ctxs = [1, 1024, 8192, 65536]
    times = [p.step_seconds([], [x] * 32) for x in ctxs]
    assert all(a < b for a, b in zip(times, times[1:], strict=False))
    batches = [1, 8, 64, 256, 1024]
    times = [p.step_seconds([], [2048] * b) for b in batches]
    assert all(a < b for a, b in zip(times, times[1:], strict=False))
    # adding a decode to a prefill step never makes it cheaper
    assert p.step_seconds([(512, 0)], [4096]) > p.step_seconds([(512, 0)], [])
    assert p.step_seconds([], []) == 0.0


def test_small_batch_decode_is_memory_bound() -> None:
    p = load_profile(H100_8B)
    expected = p.model.weight_bytes / (p.hbm_bandwidth * p.eff.hbm) + p.eff.step_overhead_s
    got = p.step_seconds([], [1024])
    assert abs(got - expected) / expected < 0.25
    # one more sequence costs almost nothing below the knee
    assert p.step_seconds([], [1024] * 2) - got < 0.02 * got


def test_large_prefill_is_compute_bound() -> None:
    p = load_profile(H100_8B)
    tokens = 4096
    expected = 2 * p.model.params * tokens / (p.peak_flops * p.eff.mfu)
    got = p.step_seconds([(tokens, 0)], [])
    assert abs(got - expected) / expected < 0.25
    weights_read = p.model.weight_bytes / (p.hbm_bandwidth * p.eff.hbm)
    assert weights_read < 0.1 * got
    # doubling the tokens roughly doubles the time (plus quadratic attention)
    ratio = p.step_seconds([(2 * tokens, 0)], []) / got
    assert 1.9 < ratio < 2.6


def test_faster_memory_decodes_faster() -> None:
    h200, h100, a100 = (load_profile(f"{g}-llama-3.1-8b") for g in ("h200", "h100", "a100"))
    for decode in ([1024], [4096] * 64, [2048] * 256):
        assert h200.step_seconds([], decode) < h100.step_seconds([], decode)
        assert h100.step_seconds([], decode) < a100.step_seconds([], decode)
    # H100 and H200 have the same peak FLOP/s: a big prefill takes the same time
    big = [(8192, 0)]
    assert h200.step_seconds(big, []) == pytest.approx(h100.step_seconds(big, []))
    assert a100.step_seconds(big, []) > 2.5 * h100.step_seconds(big, [])


def test_roofline_coefficients_reproduce_decode_steps() -> None:
    for name in PROFILES:
        p = load_profile(name)
        assert isinstance(p, RooflineProfile)
        c = p.coefficients()
        for decode in ([1024], [4096] * 64, [2048] * 256, [100] * 1000):
            exact = p.step_seconds([], decode)
            assert c.evaluate(step_features([], decode)) == pytest.approx(exact, rel=1e-9)
        big = [(4096, 2048)]  # compute-bound chunk: the linear form is exact too
        assert c.evaluate(step_features(big, [])) == pytest.approx(p.step_seconds(big, []))


def test_tensor_parallel_adds_allreduce_and_scales_the_device() -> None:
    p = load_profile("h100x8-llama-3.1-70b")
    assert p.tp == 8 and load_profile("h100-llama-3.1-70b").tp == 8  # default TP for 70B
    assert p.memory_bytes == 8 * GPUS["h100"].memory_bytes
    tokens = 2048
    # 2 all-reduces per layer, ring: 2 (N-1)/N of tokens x hidden x 2 bytes over NVLink
    per = 10e-6 + 2 * 7 / 8 * tokens * 8192 * 2 / (450e9 * 0.8)
    assert p.allreduce_seconds(tokens) == pytest.approx(2 * 80 * per)
    assert load_profile("h100x4-llama-3.1-70b").allreduce_seconds(tokens) < p.allreduce_seconds(
        tokens
    )


# --- memory --------------------------------------------------------------------------------


def test_kv_capacity_h100_8b() -> None:
    p = load_profile(H100_8B)
    memory = 81559 * MiB  # nvidia-smi on an H100 80GB SXM
    weights = 8_030_261_248 * 2
    forward = 8192 * (3 * 4096 + (32 + 2 * 8) * 128 + 3 * 14336) * 2  # max_num_batched_tokens
    sampler = 1024 * 128256 * 4 * 3  # max_num_seqs rows of fp32 logits
    reserve = 512 * MiB + max(forward, sampler)
    expected = int((memory * 0.9 - weights - reserve) // 131072)
    assert p.kv_capacity_tokens() == expected
    assert 400_000 < expected < 500_000  # vLLM reports ~450k tokens for this setup
    assert p.kv_capacity_tokens(0.5) < expected
    assert load_profile("h200-llama-3.1-8b").kv_capacity_tokens() > 1.9 * expected
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        p.kv_capacity_tokens(1.5)
    with pytest.raises(ValueError, match="no memory left"):
        p.kv_capacity_tokens(0.15)


def test_70b_on_one_h100_does_not_fit() -> None:
    with pytest.raises(ValueError, match=r"does not fit on 1 x h100.*try h100x\d+-llama-3.1-70b"):
        load_profile("h100x1-llama-3.1-70b")


def test_swap_and_reload_costs() -> None:
    p = load_profile(H100_8B)
    assert p.swap_seconds(10_000) == pytest.approx(10_000 * 131072 / (64e9 * 0.8))
    assert p.swap_seconds(0) == 0.0
    # a reload is chunked at max_num_batched_tokens, one step per chunk
    chunks = p.step_seconds([(8192, 0)], []) + p.step_seconds([(1808, 8192)], [])
    assert p.prefill_seconds(10_000) == pytest.approx(chunks)
    assert p.prefill_seconds(20_000) > 2 * p.prefill_seconds(10_000)  # attention is quadratic


def test_peak80_is_the_default_and_unchanged() -> None:
    """The default copy model prices loads and stores as swap_seconds always did (bit for bit:
    the published tables were produced with it)."""
    for name in (H100_8B, "h100x8-llama-3.1-70b"):
        p, q = load_profile(name), load_profile(name, offload_copy_model="peak80")
        assert p.offload_copy_model == "peak80" and p.describe()["offload_copy_model"] == "peak80"
        for tokens in (0, 16, 2048, 23_000, 90_000):
            old = tokens * p.kv_bytes_per_token / (p.pcie_bandwidth * p.eff.pcie)
            assert p.swap_seconds(tokens) == p.load_seconds(tokens) == p.store_seconds(tokens)
            assert p.swap_seconds(tokens) == old == q.swap_seconds(tokens)


# The `sourced` copy model worked by hand (docs/reload-cost-sources.md, section 4):
# n = ceil(tokens / 16) * layers copies of a page s = 16 * kv_heads/GPU * 128 * 2 (K, V) * 2 B.
# DMA: t0 + max(n * 0.6 us, n * s / B_dma(s)), t0 = 0.6 us * min(n, 6000), and
# n * s / B_dma(s) = n * (0.17 us + s / 60 GB/s) while that stays under the 52 GB/s cap.
# Triton (loads, s < 28 KiB): 0.1 ms + n * s / 35 GB/s. DMA under 28 KiB: 12.5 GB/s.
_US = 1e-6
_DMA_64K = 0.17 * _US + 65536 / 60e9  # 1.26227 us per 64 KiB copy (51.9 GB/s)


@pytest.mark.parametrize(("name", "tokens", "load", "store"), [
    # Llama-3.1-8B, TP 1: 8 KV heads -> 64 KiB pages, 32 layers, DMA both ways
    (H100_8B, 2048, 4096 * 0.6 * _US + 4096 * _DMA_64K,  # n = 128 * 32 = 4096
     4096 * 0.6 * _US + 4096 * _DMA_64K),  # = 2.458 + 5.170 = 7.628 ms
    (H100_8B, 23_000, 6000 * 0.6 * _US + 46_016 * _DMA_64K,  # n = 1438 * 32 = 46,016
     6000 * 0.6 * _US + 46_016 * _DMA_64K),  # = 3.6 + 58.085 = 61.685 ms
    # Llama-3.1-70B, TP 8: 1 KV head per GPU -> 8 KiB pages, 80 layers: Triton loads, DMA
    # stores at 12.5 GB/s (8 KiB / 0.6 us = 13.7 GB/s is above it)
    ("h100x8-llama-3.1-70b", 2048, 0.1e-3 + 10_240 * 8192 / 35e9,  # 0.1 + 2.397 = 2.497 ms
     6000 * 0.6 * _US + 10_240 * 8192 / 12.5e9),  # 3.6 + 6.711 = 10.311 ms
    ("h100x8-llama-3.1-70b", 23_000, 0.1e-3 + 115_040 * 8192 / 35e9,  # 0.1 + 26.926 ms
     6000 * 0.6 * _US + 115_040 * 8192 / 12.5e9),  # 3.6 + 75.393 = 78.993 ms
])
def test_sourced_copy_model_by_hand(name: str, tokens: int, load: float, store: float) -> None:
    p = load_profile(name, offload_copy_model="sourced")
    assert p.offload_copy_model == "sourced"
    assert p.load_seconds(tokens) == pytest.approx(load, rel=1e-12)
    assert p.store_seconds(tokens) == pytest.approx(store, rel=1e-12)
    assert p.swap_seconds(tokens) == p.load_seconds(tokens)  # a reload is a load
    assert p.load_seconds(0) == p.store_seconds(0) == 0.0


def test_sourced_against_the_notes_table() -> None:
    """docs/reload-cost-sources.md 4.1 (its 8B 2k row with t0 = 0.6 us * min(n, 6000))."""
    p8 = load_profile(H100_8B, offload_copy_model="sourced")
    p70 = load_profile("h100x8-llama-3.1-70b", offload_copy_model="sourced")
    assert p8.model.offload_page_bytes == 64 * 1024 and p70.model.offload_page_bytes == 8 * 1024
    for p, tokens, ms in ((p8, 2048, 7.6), (p8, 23_000, 61.6), (p8, 90_000, 231),
                          (p70, 2048, 2.5), (p70, 23_000, 27.0), (p70, 90_000, 105)):
        assert p.load_seconds(tokens) * 1e3 == pytest.approx(ms, rel=0.01)
    p2 = load_profile("h100x2-llama-3.1-70b", offload_copy_model="sourced")  # 32 KiB, DMA
    assert p2.load_seconds(23_000) * 1e3 == pytest.approx(86, rel=0.01)


def test_offload_copy_model_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown offload copy model 'fast'.*peak80.*sourced"):
        load_profile(H100_8B, offload_copy_model="fast")
    with pytest.raises(ValueError, match="PCIe Gen5"):
        load_profile("a100-llama-3.1-8b", offload_copy_model="sourced")


# --- names and input errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["b200-llama-3.1-8b", "h100-llama-2-7b", "h100", "llama-3.1-8b", "missing.json"]
)
def test_unknown_profile_names_are_explained(name: str) -> None:
    with pytest.raises(ValueError) as info:
        load_profile(name)
    msg = str(info.value)
    assert name in msg
    if not name.endswith(".json"):
        assert "h100-llama-3.1-8b" in msg and "h100x8-llama-3.1-70b" in msg


def test_bad_batches_are_rejected() -> None:
    p = load_profile(H100_8B)
    with pytest.raises(ValueError):
        p.step_seconds([(0, 10)], [])
    with pytest.raises(ValueError):
        p.step_seconds([], [0])
    with pytest.raises(ValueError, match="tp=3"):
        load_profile("h100x3-llama-3.1-8b")


# --- fitting measured tables ---------------------------------------------------------------


def _grid() -> list[tuple[list[tuple[int, int]], list[int]]]:
    from server.profilers.gpu import full_grid

    return full_grid()


@pytest.mark.parametrize("knee", [0.0, 200.0])
def test_fit_recovers_known_coefficients(knee: float) -> None:
    true = Coefficients(c0=1.2e-3, c1=2.5e-5, knee=knee, c2=1.1e-9, c3=5e-8, c4=1.5e-5)
    shapes = _grid()
    feats = [step_features(pre, dec) for pre, dec in shapes]
    secs = [true.evaluate(f) for f in feats]
    fit = fit_coefficients(feats, secs)
    c = fit.coefficients
    assert fit.rms_relative_error < 1e-6
    for k in ("c0", "c1", "c2", "c3", "c4"):
        assert getattr(c, k) == pytest.approx(getattr(true, k), rel=1e-3), k
    if knee:
        assert c.knee == pytest.approx(knee, rel=0.05)
    else:
        assert c.knee <= min(f.new_tokens for f in feats)

    # with 2% multiplicative noise the fit still predicts within a few percent
    rng = random.Random(1)
    noisy = [s * (1 + rng.gauss(0, 0.02)) for s in secs]
    fit = fit_coefficients(feats, noisy)
    errors = [abs(fit.coefficients.evaluate(f) - s) / s for f, s in zip(feats, secs, strict=True)]
    assert max(errors) < 0.08
    assert fit.coefficients.c1 == pytest.approx(true.c1, rel=0.1)
    assert fit.coefficients.c3 == pytest.approx(true.c3, rel=0.1)


def _write_table(path: Path, coef: Coefficients, **extra: object) -> None:
    rows = [
        {"prefill": [list(x) for x in pre], "decode": dec, "seconds": coef.evaluate(f)}
        for pre, dec in _grid()
        for f in [step_features(pre, dec)]
    ]
    table = {"gpu": "h100", "model": "llama-3.1-8b", "tp": 1, "measurements": rows, **extra}
    path.write_text(json.dumps(table))


def test_table_profile_uses_the_fit_and_spec_memory(tmp_path: Path) -> None:
    coef = Coefficients(c0=2e-3, c1=3e-5, knee=150.0, c2=1e-9, c3=6e-8, c4=2e-5)
    path = tmp_path / "h100-measured.json"
    _write_table(path, coef)
    p = load_profile(str(path))
    assert isinstance(p, TableProfile) and p.name == "h100-measured"
    for pre, dec in ([(2048, 0)], []), ([], [1024] * 64), ([(300, 5000)], [77, 9000]):
        assert p.step_seconds(pre, dec) == pytest.approx(coef.evaluate(step_features(pre, dec)))
    assert p.kv_capacity_tokens() == load_profile(H100_8B).kv_capacity_tokens()
    assert p.describe()["kind"] == "table"

    # GPU-forward tables of a TP shard get the CPU overhead and the all-reduce added
    tp_path = tmp_path / "shard.json"
    _write_table(tp_path, coef, measured="gpu_forward")
    data = json.loads(tp_path.read_text())
    data.update(model="llama-3.1-70b", tp=8)
    tp_path.write_text(json.dumps(data))
    q = load_profile(tp_path)
    t = coef.evaluate(step_features([(512, 0)], []))
    assert q.step_seconds([(512, 0)], []) == pytest.approx(
        t + q.cpu_overhead_seconds(1) + q.allreduce_seconds(512)
    )


def test_bad_tables_are_explained(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"gpu": "tpu", "model": "llama-3.1-8b", "measurements": []}))
    with pytest.raises(ValueError, match="gpu 'tpu' unknown"):
        load_profile(path)
    path.write_text(json.dumps({"gpu": "h100", "model": "llama-3.1-8b", "measurements": []}))
    with pytest.raises(ValueError, match="at least 5"):
        load_profile(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_profile(path)


# --- the profiler ---------------------------------------------------------------------------


@pytest.mark.parametrize("model,tp", [("llama-3.1-8b", 1), ("llama-3.1-70b", 8)])
def test_profiler_cpu_quick_mode_writes_a_loadable_table(
    tmp_path: Path, model: str, tp: int
) -> None:
    pytest.importorskip("torch")
    from cli.main import main
    from server.profilers.gpu import quick_grid

    out = tmp_path / "table.json"
    argv = ["profile", "--model", model, "--tp", str(tp), "--device", "torch-cpu", "--layers",
            "1", "--quick"]
    assert main([*argv, "--iters", "2", "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["measured"] == "gpu_forward" and table["tp"] == tp
    assert len(table["measurements"]) == len(quick_grid())
    assert all(m["seconds"] > 0 for m in table["measurements"])
    p = load_profile(out)
    assert isinstance(p, TableProfile) and p.tp == tp
    assert p.step_seconds([(64, 0)], [128] * 4) > 0
    assert not list(tmp_path.glob(".table.json.*"))  # no temp file left behind


def test_profiler_reports_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from cli.main import main

    assert main(["profile", "--model", "gpt-5", "--device", "torch-cpu"]) == 2
    assert "unknown model 'gpt-5'" in capsys.readouterr().err
