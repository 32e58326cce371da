"""The model arithmetic: parameters, weight bytes and KV bytes of a Llama-style model.

Why from config.json: the step time and the KV capacity follow from a model's shapes alone
(layers, widths, heads), so the emulator needs no weights, only the published architecture.

The model configs in ``server/models/<name>/config.json`` are the published Llama-3.1
architectures, except ``bos_token_id`` = 0 and ``eos_token_id`` = 4: the ids of
``<|begin_of_text|>`` and ``<|eot_id|>`` in our local tokenizer (datasets/tokenizer), not
Llama's 128000 / 128009. ``vocab_size`` stays 128256 (it sets the LM-head cost); our tokenizer
has fewer ids, so the emulated executor must sample ids below the tokenizer's size.

``qwen3-32b`` and ``mixtral-8x7b`` (AMPD's other two models, section 7.1) are written the same
way from their public config.json numbers (layers, hidden, heads, KV heads, head_dim,
intermediate, vocabulary, context; Mixtral's 8 experts of which 2 are active per token), with
the same token ids. Two things they have that the arithmetic here leaves out, each below 0.01 %
of the weights: Qwen3's per-head RMSNorm of Q and K (2 x 128 parameters a layer) and nothing
else; Mixtral's router is counted.

``qwen3-coder-30b-a3b`` (a model whose native context, 262,144 tokens, holds the long
sessions of a coding agent) is Qwen3-Coder-30B-A3B-Instruct's public config.json written the
same way (its sources: ``server/models/qwen3-coder-30b-a3b/README.md``): 48 layers, hidden
2048, 32 query and 4 KV heads of 128, 128 experts of width 768 of which 8 are active, vocabulary
151936, untied. Qwen-MoE configs name their experts ``num_experts`` and their width
``moe_intermediate_size`` (`_qwen_moe_experts`); its per-head Q/K RMSNorms (256 parameters a
layer) are left out, as for Qwen3-32B. ``qwen3-coder-30b-a3b-1m`` is the same model with the
YaRN extension its model card describes (factor 4 over the native 262,144: 1,048,576
positions); RoPE scaling changes no FLOP and no byte, so it is priced the same.

Mixture of experts (Mixtral, Qwen3-Coder): every expert's weights are held (memory,
`params`), a token multiplies through its ``active_experts`` only (`matmul_params_per_token`),
and a step is taken to stream *every* expert's weights from HBM
(`weight_bytes_read_per_step`). The last is exact once a step's tokens touch all experts, which
with 8 experts and 2 per token is 90 % likely from 8 tokens on (1 - (6/8)^8) and is the case for
every prefill chunk; a decode step of fewer sequences reads fewer experts, so the emulator
overstates Mixtral's decode step at small batches (at 1 sequence by up to ~3x in the
weight-read term). A stated simplification. With Qwen3-Coder's 128 experts, 8 per token, a
step of T tokens touches on average ``128 * (1 - (120/128)^T)`` of them: 8 at one sequence
(the weight-read term ~10x too high: 56 GiB read where attention, 8 experts and the LM head
are ~6 GB), 82 at 16, 126 at 64.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from common.errors import UserError
from server.perf.copy_model import OFFLOAD_BLOCK_TOKENS

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"


class ModelConfigError(UserError):
    """A config.json the user named cannot be read as a model's shapes."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only Llama-style model (GQA attention, SwiGLU MLP), possibly TP-sharded."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    tp: int = 1
    experts: int = 1  # MLP experts per layer (1: a dense model)
    active_experts: int = 1  # experts each token runs through
    bytes_per_param: int = 2

    @classmethod
    def from_config(cls, path: str | Path, tp: int = 1) -> ModelSpec:
        """Read a Hugging Face config.json (a file, or a folder holding one)."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        try:
            cfg = json.loads(p.read_text())
        except FileNotFoundError:
            raise ModelConfigError(f"model config not found: {p}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelConfigError(f"model config {p} is not valid JSON: {e}") from None
        if not isinstance(cfg, dict):
            raise ModelConfigError(f"model config {p}: expected a JSON object")
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            spec = cls(
                name=p.parent.name,
                layers=int(cfg["num_hidden_layers"]),
                hidden=hidden,
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads", heads)),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                intermediate=int(cfg["intermediate_size"]),
                vocab=int(cfg["vocab_size"]),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                tp=tp,
                experts=int(cfg.get("num_local_experts", 1)),
                active_experts=int(cfg.get("num_experts_per_tok", 1)),
            )
            if "num_experts" in cfg:  # Qwen-MoE names its experts and their width apart
                spec = replace(spec, **_qwen_moe_experts(cfg, p))
        except KeyError as e:
            raise ModelConfigError(f"model config {p} lacks {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelConfigError(f"model config {p} is malformed ({e})") from None
        spec.validate()
        return spec

    def validate(self) -> None:
        if not 1 <= self.active_experts <= self.experts:
            raise ValueError(f"{self.name}: {self.active_experts} active experts of "
                             f"{self.experts}; need 1 <= active <= experts")
        if self.tp < 1:
            raise ValueError(f"tensor-parallel size must be >= 1, got {self.tp}")
        if self.heads % self.tp:
            raise ValueError(
                f"{self.name}: {self.heads} attention heads do not split over tp={self.tp}; "
                "use a tp that divides the head count"
            )
        if self.kv_heads % self.tp and self.tp % self.kv_heads:
            raise ValueError(
                f"{self.name}: {self.kv_heads} KV heads do not split over tp={self.tp}"
            )

    # parameters ----------------------------------------------------------------------------
    @property
    def attention_params(self) -> int:
        """Q, K, V, O of one layer and its two RMSNorms (what every token runs through)."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return q + kv + o + 2 * self.hidden

    @property
    def expert_params(self) -> int:
        """One SwiGLU MLP (gate, up, down): the dense model's MLP, or one expert."""
        return 3 * self.hidden * self.intermediate

    @property
    def router_params(self) -> int:
        return self.hidden * self.experts if self.experts > 1 else 0

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (Q, K, V, O, every expert's gate, up, down, the
        router, two RMSNorms)."""
        return self.attention_params + self.experts * self.expert_params + self.router_params

    @property
    def active_layer_params(self) -> int:
        """Parameters of one layer a token multiplies through (its active experts only)."""
        return (self.attention_params + self.active_experts * self.expert_params
                + self.router_params)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All parameters (8,030,261,248 for Llama-3.1-8B)."""
        return (
            self.layers * self.layer_params
            + self.embedding_params
            + self.lm_head_params
            + self.hidden  # final norm
        )

    @property
    def matmul_params_per_token(self) -> int:
        """Weights every new token multiplies through (the decoder layers; the LM head runs
        only on each sequence's last token, the embedding is a lookup); a mixture of experts'
        token runs through its active experts only."""
        return self.layers * self.active_layer_params

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights held on the device group."""
        return self.params * self.bytes_per_param

    @property
    def weight_bytes_read_per_step(self) -> int:
        """Bytes of weights one forward step streams from HBM (all but the embedding table,
        of which only the looked-up rows are read)."""
        return (self.params - self.embedding_params) * self.bytes_per_param

    # KV cache ------------------------------------------------------------------------------
    @property
    def kv_heads_per_gpu(self) -> int:
        return max(1, self.kv_heads // self.tp)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers, summed over the TP group:
        2 * layers * kv_heads * head_dim * 2 bytes (131,072 for 8B; 327,680 for 70B). With
        tp > kv_heads vLLM replicates KV heads, so the group stores more."""
        heads = self.kv_heads_per_gpu * self.tp
        return 2 * self.layers * heads * self.head_dim * self.bytes_per_param

    @property
    def offload_page_bytes(self) -> int:
        """One (layer, 16-token block) page on one GPU, K and V together (vLLM 0.32's LBHNC
        layout under the offloading connector): 65,536 for 8B; 8,192 for 70B at TP 8."""
        return (OFFLOAD_BLOCK_TOKENS * self.kv_heads_per_gpu * self.head_dim * 2
                * self.bytes_per_param)

    def attention_flops_per_pair(self) -> float:
        """FLOPs of one query-key pair over all layers: QK^T and PV, 2 FLOPs per MAC each."""
        return 4.0 * self.layers * self.heads * self.head_dim


def _qwen_moe_experts(cfg: dict, path: Path) -> dict[str, int]:
    """The experts of a Qwen-MoE config (``qwen3_moe``): ``num_experts`` experts of
    ``moe_intermediate_size`` each (its ``intermediate_size`` is the width of dense MLP layers,
    of which the configs shipped here have none). A config that mixes dense and MoE layers
    (``mlp_only_layers``, ``decoder_sparse_step`` > 1) or has a shared expert is refused: the
    arithmetic here gives every layer the same MLP."""
    if cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step", 1)) != 1:
        raise ValueError(f"model config {path}: dense layers among the MoE ones "
                         "(mlp_only_layers, decoder_sparse_step) are not modelled")
    if int(cfg.get("shared_expert_intermediate_size") or 0):
        raise ValueError(f"model config {path}: a shared expert is not modelled")
    return {"experts": int(cfg["num_experts"]),
            "intermediate": int(cfg["moe_intermediate_size"])}


def available_models() -> list[str]:
    if not MODELS_DIR.is_dir():
        return []
    return sorted(p.parent.name for p in MODELS_DIR.glob("*/config.json"))


# Models too big for one GPU get a default tensor-parallel size (name without "xN"); so does
# a model whose whole context one GPU's KV cache cannot hold (vLLM refuses to start then):
# Qwen3-Coder's 1M positions need 96 GiB of KV, an H200 holds 734,570 tokens beside the
# weights, two hold 2,079,396.
DEFAULT_TP: dict[str, int] = {"llama-3.1-70b": 8, "qwen3-coder-30b-a3b-1m": 2}


def model_spec(model: str, tp: int) -> ModelSpec:
    """A shipped model's name (a folder of `MODELS_DIR`) or the path to a config.json or to a
    folder holding one, sharded over `tp` GPUs."""
    path = Path(model)
    if path.suffix == ".json" or path.is_dir():
        return ModelSpec.from_config(path, tp=tp)
    if model not in available_models():
        raise ValueError(
            f"unknown model {model!r}; known: {', '.join(available_models()) or '(none)'} "
            f"(configs live in {MODELS_DIR})"
        )
    return ModelSpec.from_config(MODELS_DIR / model / "config.json", tp=tp)
