#!/usr/bin/env python3
"""Build the harness tokenizer into ``server/tokenizer/``.

A byte-level BPE tokenizer (HF ``tokenizers``) trained on the Python standard
library source of the interpreter running this script: its code gives the code
side, its docstrings, comments and ``pydoc_data/topics.py`` (the language
reference text) give the English prose side.  Nothing from the corpus is copied
into the repository; only the trained tokenizer is written.

The pre-tokenizer (regex split + byte-level), the special-token layout and the
chat template header format follow Llama 3, so that emulated Llama-3.1 models
served by vLLM can use it.  Tool calls use the Hermes format
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) so vLLM's
``hermes`` tool parser can read them.

Usage (from the repository root, with the project venv)::

    .venv/bin/python datasets/tokenizer/build_tokenizer.py            # build
    .venv/bin/python datasets/tokenizer/build_tokenizer.py --vocab-size 16000 --out /tmp/tok

Output is deterministic for a given interpreter (same stdlib files) and
``tokenizers`` version.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import sysconfig
import tokenize
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_OUT = REPO / "server" / "tokenizer"
CHAT_TEMPLATE_FILE = HERE / "chat_template.jinja"

DEFAULT_VOCAB_SIZE = 32000

# Fixed ids: the emulated models' config.json files rely on these.
# (token, special) -- special=False tokens are never skipped on decode.
SPECIAL_TOKENS: list[tuple[str, bool]] = [
    ("<|begin_of_text|>", True),  # 0  bos
    ("<|end_of_text|>", True),  # 1
    ("<|start_header_id|>", True),  # 2
    ("<|end_header_id|>", True),  # 3
    ("<|eot_id|>", True),  # 4  eos for chat
    ("<tool_call>", False),  # 5  hermes tool-call start, kept in decoded text
    ("</tool_call>", False),  # 6  hermes tool-call end, kept in decoded text
    ("<|pad|>", True),  # 7
]
BOS, EOS, PAD = "<|begin_of_text|>", "<|eot_id|>", "<|pad|>"
MODEL_MAX_LENGTH = 131072

# The Llama 3 pre-tokenizer split pattern.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Parts of the stdlib left out of the corpus: tests (odd data, many scripts and
# encodings), codec tables (hex-escape tables), third-party packages.
EXCLUDED_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idle_test",
    "encodings",
    "__pycache__",
}


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        if rel.parts[0].startswith("config-"):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def read_source(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    return text.replace("\r\n", "\n")


def prose_of(source: str) -> list[str]:
    """Comments and docstring-like string literals of a Python source file."""
    out: list[str] = []
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return out
    for tok in toks:
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if len(text) > 20:
                out.append(text)
        elif tok.type == tokenize.STRING and tok.string.endswith(('"""', "'''")):
            body = tok.string
            # strip prefix and quotes
            i = 0
            while body[i] not in "\"'":
                i += 1
            body = body[i + 3 : -3]
            lines = [ln.strip() for ln in body.splitlines()]
            text = "\n".join(lines).strip()
            if len(text) > 40:
                out.append(text)
    return out


def corpus() -> tuple[list[str], list[str]]:
    """(code documents, prose documents), in a fixed order."""
    code, prose = [], []
    for path in stdlib_files():
        source = read_source(path)
        if not source:
            continue
        code.append(source)
        prose.extend(prose_of(source))
    return code, prose


def corpus_fingerprint(code: list[str], prose: list[str]) -> str:
    h = hashlib.sha256()
    for doc in code + prose:
        h.update(doc.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def train(vocab_size: int, code: list[str], prose: list[str], prose_weight: int):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[t for t, _ in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )

    def docs():
        yield from code
        for _ in range(prose_weight):
            yield from prose

    tok.train_from_iterator(docs(), trainer=trainer, length=len(code) + prose_weight * len(prose))
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS}:0 $A:0",
                pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1",
                special_tokens=[(BOS, 0)],
            ),
        ]
    )
    return tok


def finalize_tokenizer_json(tok) -> dict:
    """Serialize, fixing the added-token flags (ids 0..7, tool tags special=False)."""
    data = json.loads(tok.to_str())
    flags = {t: special for t, special in SPECIAL_TOKENS}
    added = data["added_tokens"]
    assert [a["content"] for a in added] == [t for t, _ in SPECIAL_TOKENS], added
    for i, a in enumerate(added):
        assert a["id"] == i, a
        a["special"] = flags[a["content"]]
        a["normalized"] = False
        a["single_word"] = False
        a["lstrip"] = False
        a["rstrip"] = False
    return data


def tokenizer_config() -> dict:
    chat_template = CHAT_TEMPLATE_FILE.read_text(encoding="utf-8")
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": MODEL_MAX_LENGTH,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for i, (t, special) in enumerate(SPECIAL_TOKENS)
        },
        "additional_special_tokens": [],
        "chat_template": chat_template,
    }


def stub_config(vocab_size: int) -> dict:
    """A minimal config.json so the folder loads on its own.

    vLLM's ``get_tokenizer(path)`` parses ``path/config.json`` before loading the
    tokenizer; without one it logs "Error parsing config ..." twice and sleeps
    on a retry.  This is not a model config (the served models' own config.json
    files live in server/models/); ``tokenizer_class`` in tokenizer_config.json
    still decides the tokenizer class.
    """
    return {
        "model_type": "llama",
        "vocab_size": vocab_size,
        "bos_token_id": 0,
        "eos_token_id": 4,
        "pad_token_id": 7,
    }


def special_tokens_map() -> dict:
    return {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}


def dump(path: Path, obj: dict, indent: int | None = 2) -> None:
    text = json.dumps(obj, ensure_ascii=False, indent=indent)
    path.write_text(text + "\n", encoding="utf-8")


def chars_per_token(tok, texts: list[str]) -> float:
    chars = sum(len(t) for t in texts)
    tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    return chars / max(tokens, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    ap.add_argument(
        "--prose-weight",
        type=int,
        default=1,
        help="times the extracted docstrings/comments are repeated on top of the full sources",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)

    code, prose = corpus()
    print(
        f"python {sys.version.split()[0]} stdlib: {len(code)} files, "
        f"{sum(map(len, code))} chars code, {len(prose)} prose pieces "
        f"({sum(map(len, prose))} chars); fingerprint {corpus_fingerprint(code, prose)}",
        file=sys.stderr,
    )
    tok = train(args.vocab_size, code, prose, args.prose_weight)
    data = finalize_tokenizer_json(tok)

    args.out.mkdir(parents=True, exist_ok=True)
    dump(args.out / "tokenizer.json", data, indent=None)
    dump(args.out / "tokenizer_config.json", tokenizer_config())
    dump(args.out / "special_tokens_map.json", special_tokens_map())
    dump(args.out / "config.json", stub_config(tok.get_vocab_size()))

    print(
        f"vocab {tok.get_vocab_size()}; chars/token in-corpus: "
        f"code {chars_per_token(tok, code):.3f}, prose {chars_per_token(tok, prose):.3f}",
        file=sys.stderr,
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
