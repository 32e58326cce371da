"""Path options: every `harness` option that names a file or a folder, checked as it is parsed.

Why: a folder given for a file, a missing, unreadable, empty or binary file, or an output whose
parent is a file otherwise fails deep inside a command (IsADirectoryError, UnicodeDecodeError),
with a traceback, sometimes after a server or an engine started. A path option is declared with
`add_path_argument` (an options dataclass field with ``metadata["path"]``, `cli.options`); its
action (`PathAction`) checks the value when argparse reads it, before the command imports or
starts anything heavy, and raises `PathError`: a `UserError`, so the user sees one line naming
the option (``harness: error: --trace runs/x: is a file; give ...``) and exit status 2
(`cli.errors`). The action's class also marks the option, so a test walks every path option of
every command. Defaults are not checked: the command resolves its own.

What a file's content means (JSON, a trace's header, a cluster's YAML) is its loader's to say;
`naming_path_options` puts the option in front of a loader's `UserError` about the file.
"""

from __future__ import annotations

import argparse
import codecs
import enum
import os
import re
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from common.errors import UserError

#: Bytes of an input file read to tell text from binary and empty from not.
HEAD_BYTES = 64 * 1024

#: Where `PathAction` lists the (option, value) pairs it checked, on the parsed namespace.
GIVEN = "path_options_given"


class PathError(UserError):
    """A path option's value cannot be what the option needs; the message names the option."""


class Kind(enum.Enum):
    """What a path option's value must be."""

    FILE = "file"  # an input file, read
    FOLDER = "folder"  # an input folder, read
    FILE_OR_FOLDER = "file or folder"  # an input, either (a trace file or a folder of runs)
    OUT_FILE = "output file"  # written (made, replaced or appended to)
    OUT_FOLDER = "output folder"  # written into (made if missing)

    @property
    def output(self) -> bool:
        return self in (Kind.OUT_FILE, Kind.OUT_FOLDER)


@dataclass(frozen=True)
class PathSpec:
    """One path option's rule. `what` completes "give ..." in its messages (e.g. "a trace
    file (.jsonl)"). With `names`, a value that does not look like a path (it does not exist,
    has no slash and none of `suffixes`) is a name the command resolves (a generated trace, a
    profile), not checked here; with `hub_ids`, so is ORG/NAME (a Hugging Face hub id or
    dataset) unless it starts with /, . or ~. `text`: an input file must be UTF-8 text, unless
    it ends with one of `binary_suffixes` (a task file may be Parquet); `magic`: its first
    bytes (a GGUF file's). `prefixed`: a value starting with the prefix is checked by that
    rule, after it (``replay:DIR``)."""

    kind: Kind
    what: str
    names: bool = False
    suffixes: tuple[str, ...] = ()
    hub_ids: bool = False
    text: bool = True
    binary_suffixes: tuple[str, ...] = ()
    magic: bytes | None = None
    prefixed: tuple[tuple[str, PathSpec], ...] = ()


def check_path(label: str, value: str, spec: PathSpec) -> str | None:
    """Raise `PathError` naming `label` (the option) when `value` cannot be what `spec` asks;
    the path checked (None: `value` is a name)."""
    for prefix, inner in spec.prefixed:
        if value.startswith(prefix):
            _raise_if(label, value, _problem(value[len(prefix):], inner))
            return value[len(prefix):]
    if not looks_like_path(value, spec):
        return None
    _raise_if(label, value, _problem(value, spec))
    return value


def looks_like_path(value: str, spec: PathSpec) -> bool:
    """Whether `value` is meant as a path: what exists or ends with one of the spec's suffixes
    is; else, for an option that takes them, a hub id (ORG/NAME, not starting with /, . or ~)
    and a bare name (no slash) are not."""
    if os.path.lexists(value) or value.endswith(spec.suffixes or ("\0",)):
        return True
    if spec.hub_ids and value.count("/") == 1 and not value.startswith(("/", ".", "~")):
        return False
    return not (spec.names and "/" not in value and os.sep not in value)


def _raise_if(label: str, value: str, problem: str | None) -> None:
    if problem is not None:
        shown = value if value.isprintable() and value else repr(value)
        raise PathError(f"{label} {shown}: {problem}")


def _problem(value: str, spec: PathSpec) -> str | None:
    """What is wrong with `value` for `spec`, or None."""
    if not value:
        return f"is empty; give {spec.what}"
    path = Path(value)
    if spec.kind.output:
        return _output_problem(path, spec)
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        if path.is_symlink():
            return f"is a broken link (to {os.readlink(path)}); give {spec.what}"
        return f"no such {spec.kind.value}; give {spec.what}"
    except OSError as exc:
        return f"cannot be read ({_reason(exc)}); give {spec.what}"
    if stat.S_ISDIR(mode):
        if spec.kind is Kind.FILE:
            return f"is a folder; give {spec.what}"
        return _folder_problem(path, spec)
    if spec.kind is Kind.FOLDER:
        return f"is {_file_kind(mode)}, not a folder; give {spec.what}"
    if not stat.S_ISREG(mode):  # a FIFO would block the read, a device never end
        return f"is {_file_kind(mode)}, not a regular file; give {spec.what}"
    return _file_problem(path, spec)


def _folder_problem(path: Path, spec: PathSpec) -> str | None:
    try:
        with os.scandir(path) as entries:
            next(entries, None)
    except OSError as exc:
        return f"cannot be read ({_reason(exc)}); give {spec.what}"
    return None


def _file_problem(path: Path, spec: PathSpec) -> str | None:
    """An input file's read, emptiness and (for text) encoding; a file over `HEAD_BYTES` is
    judged on its first part (its loader reads the rest)."""
    try:
        with path.open("rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as exc:
        return f"cannot be read ({_reason(exc)}); give {spec.what}"
    whole = len(head) < HEAD_BYTES
    if not head or (spec.text and whole and not head.strip()):
        return f"is empty; give {spec.what}"
    if spec.magic is not None and not head.startswith(spec.magic):
        return f"does not start with {spec.magic!r}; give {spec.what}"
    if not spec.text or path.name.endswith(spec.binary_suffixes or ("\0",)):
        return None
    nul = head.find(b"\0")
    if nul >= 0:
        return f"is binary, not text (a NUL byte at byte {nul}); give {spec.what}"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=whole)
    except UnicodeDecodeError as exc:
        return f"is not UTF-8 text (byte {exc.start}); give {spec.what}"
    return None


def _output_problem(path: Path, spec: PathSpec) -> str | None:
    """An output's own kind where it exists, else whether its nearest existing ancestor is a
    folder this process may write in (the command makes the folders in between)."""
    if os.path.lexists(path):
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            if path.is_symlink():
                return f"is a broken link (to {os.readlink(path)}); give {spec.what}"
            return f"cannot be used ({_reason(exc)}); give {spec.what}"
        if spec.kind is Kind.OUT_FOLDER and not stat.S_ISDIR(mode):
            return f"is {_file_kind(mode)}, not a folder; give {spec.what}"
        if spec.kind is Kind.OUT_FILE and stat.S_ISDIR(mode):
            return f"is a folder; give {spec.what}"
        if spec.kind is Kind.OUT_FILE and not stat.S_ISREG(mode):
            return f"is {_file_kind(mode)}, not a regular file; give {spec.what}"
        if not os.access(path, os.W_OK):
            return f"is not writable; give {spec.what}"
        return None
    parent = next((p for p in path.parents if os.path.lexists(p)), Path("."))
    if not parent.is_dir():
        return f"cannot be made: {parent} is not a folder; give {spec.what}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be made: {parent} is not writable; give {spec.what}"
    return None


def _file_kind(mode: int) -> str:
    for test, word in ((stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a file"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return word
    return "not a file"


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


# -- the argparse side ------------------------------------------------------------------------


class PathAction(argparse.Action):
    """Store a path option's value after `check_path` (every value, for a list); note the
    (option, value) pairs given on the namespace (`GIVEN`) for `naming_path_options`."""

    def __init__(self, option_strings: Sequence[str], dest: str, spec: PathSpec,
                 label: str | None = None, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.spec = spec
        longest = max(option_strings, key=len) if option_strings else None
        self.label = label or longest or str(self.metavar or dest.upper())

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        items = values if isinstance(values, list | tuple) else [values]
        paths = [check_path(self.label, str(value), self.spec) for value in items]
        if not self.spec.kind.output:
            given = list(getattr(namespace, GIVEN, []))
            given += [(self.label, path) for path in paths if path is not None]
            setattr(namespace, GIVEN, given)
        setattr(namespace, self.dest, values)


def add_path_argument(parser: argparse.ArgumentParser, *flags: str, spec: PathSpec,
                      label: str | None = None, **kwargs: Any) -> argparse.Action:
    """``parser.add_argument(*flags, **kwargs)`` for a path option checked by `spec`; `label`
    names it in messages (default: its longest flag, or a positional's metavar)."""
    return parser.add_argument(*flags, action=PathAction, spec=spec, label=label, **kwargs)


@contextmanager
def naming_path_options(args: argparse.Namespace) -> Iterator[None]:
    """Put the option in front of a `UserError` about a file the user named with an input path
    option, when the message names the file but no option (a loader's ``x.jsonl: line 1 is
    not JSON`` becomes ``--trace x.jsonl: x.jsonl: line 1 is not JSON``): loaders know files,
    not the flags that named them, and live in layers below the command line."""
    try:
        yield
    except PathError:
        raise
    except UserError as exc:
        given = getattr(args, GIVEN, [])
        if any(_names_option(str(exc), label) for label, _ in given):
            raise
        named = [(label, value) for label, value in given if _mentions(str(exc), value)]
        if len(named) != 1:
            raise
        raise PathError(f"{named[0][0]} {named[0][1]}: {exc}") from exc


@contextmanager
def about(label: str, value: object) -> Iterator[None]:
    """Around the load of what option `label` named: a `UserError` that does not name the
    option gets it in front (for a loader whose message names neither the file nor the
    option)."""
    try:
        yield
    except UserError as exc:
        if _names_option(str(exc), label):
            raise
        raise PathError(f"{label} {value}: {exc}") from exc


def _names_option(message: str, label: str) -> bool:
    return re.search(rf"(^|\W){re.escape(label)}\b", message) is not None


def _mentions(message: str, value: str) -> bool:
    """Whether `message` names the path `value` as given or as the loader may write it."""
    forms = {value, str(Path(value)), os.path.abspath(value)}
    return any(re.search(rf"(?<![\w./-]){re.escape(form)}(?![\w/-]|\.\w)", message)
               for form in forms if form)


# -- the rules more than one command uses -----------------------------------------------------


def output_folder(what: str) -> PathSpec:
    """A folder a command writes `what` into (made if missing)."""
    return PathSpec(Kind.OUT_FOLDER, f"a folder for {what}")


def output_file(what: str) -> PathSpec:
    """A file a command writes (`what`: "a JSON file", ...)."""
    return PathSpec(Kind.OUT_FILE, what)


#: `--trace`: a generated trace's name, a trace file, or a folder of recorded runs.
TRACE = PathSpec(Kind.FILE_OR_FOLDER, "a trace file (.jsonl), a folder of recorded runs or a "
                 "generated trace's name", names=True, suffixes=(".jsonl", ".json"))
#: `--profile`: an emulated GPU-MODEL name or a step-time table.
PROFILE = PathSpec(Kind.FILE, "a profile name (GPU-MODEL) or a step-time table (.json)",
                   names=True, suffixes=(".json",))
#: A measured step-time table (`harness profile`'s output).
STEP_TABLE = PathSpec(Kind.FILE, "a step-time table (.json; `harness profile --device cpu "
                      "--served --out FILE` measures one)")
#: A cluster file, or a shipped example's name.
CLUSTER_FILE = PathSpec(Kind.FILE, "a cluster file (YAML) or the name of one in "
                        "cluster/examples/",
                        names=True, suffixes=(".yaml", ".yml", ".json"))
#: A real model: a folder, a GGUF file, an added or shipped model's name, or a hub id.
MODEL = PathSpec(Kind.FILE_OR_FOLDER, "a model folder, a GGUF file (.gguf), a model's name or "
                 "a hub id ORG/NAME", names=True, hub_ids=True, suffixes=(".gguf",),
                 text=False, magic=b"GGUF")
#: `harness run --model`: also ``replay:DIR``, recorded trajectories.
RUN_MODEL = replace(MODEL, prefixed=(
    ("replay:", PathSpec(Kind.FOLDER, "a folder of recorded trajectories after replay:")),))
#: A model folder `harness predictor train` wrote.
PREDICTOR_MODEL = PathSpec(Kind.FOLDER, "a model folder from `harness predictor train`")
