"""Options more than one command takes, defined once so their flags and help agree; and the
builder that makes a command's options from a dataclass (`add_options`)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any

from cli.paths import PathAction, PathSpec
from server.perf.copy_model import (
    DEFAULT_OFFLOAD_COPY_MODEL,
    OFFLOAD_COPY_MODEL_HELP,
    OFFLOAD_COPY_MODELS,
)


def parse_loads(text: str, error: type[Exception], example: str) -> list[float]:
    """``--jps A,B,...``: positive loads in jobs/s, sorted, each once (`harness bench` and
    `harness cluster bench` take it alike); `error` is the command's `UserError` class."""
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise error(f"--jps {text!r}: give numbers separated by commas, e.g. {example}") \
            from None
    if not loads or any(not (x > 0 and math.isfinite(x)) for x in loads):
        raise error(f"--jps {text!r}: loads must be positive numbers of jobs/s")
    return sorted(set(loads))


def add_offload_copy_model_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """The ``--offload-copy-model`` option, one definition for every command that takes it
    (`harness serve`, the bench): `what` names the copies it times, for the help."""
    parser.add_argument("--offload-copy-model", default=DEFAULT_OFFLOAD_COPY_MODEL,
                        choices=list(OFFLOAD_COPY_MODELS),
                        help=OFFLOAD_COPY_MODEL_HELP.format(what=what))


# -- an options dataclass as the schema of a command's options ---------------------------------
#
# Why: an experiment's options were written three times (the dataclass field, an
# `add_argument` whose help repeated the default, and glue copying one to the other by name,
# which broke silently when the names differed). Now the dataclass is the only place: each field
# is one option, its type and default are the field's, its help is the field's
# ``metadata["help"]`` with the default appended here, and the parsed values come back into the
# dataclass by the field names argparse was given (`options_of`), so its `__post_init__` checks
# them as it checks any other caller's.
#
# Field metadata the builder reads: ``help``; ``flags`` (the option strings, instead of
# ``--field-name``; a bool defaulting to True becomes ``--no-field-name``); ``positional``
# (with ``nargs``); ``metavar``; ``choices``. A field without a default is a required option.
# A ``tuple[X, ...]`` field takes comma-separated X values (or, positional, one value each).
# A field that names a file or a folder gets its `cli.paths.PathSpec` from the command line
# (`add_options`'s `paths`): the rule is the command line's, the dataclasses live below it.


T = typing.TypeVar("T")


def add_options(parser: argparse.ArgumentParser, cls: type,
                paths: Mapping[str, PathSpec] | None = None) -> None:
    """One argument of `parser` per field of the dataclass `cls` (see above); the fields named
    in `paths` are path options checked by their spec (`cli.paths`)."""
    hints = typing.get_type_hints(cls)
    paths = paths or {}
    unknown = set(paths) - {f.name for f in dataclasses.fields(cls) if f.init}
    if unknown:
        raise TypeError(f"{cls.__name__} has no option field {', '.join(sorted(unknown))}")
    for f in dataclasses.fields(cls):
        if f.init:
            _add_field(parser, f, hints[f.name], paths.get(f.name))


def options_of(cls: type[T], args: argparse.Namespace) -> T:
    """The dataclass `cls` from arguments parsed by a parser `add_options(parser, cls)` made;
    its `__post_init__` refuses a bad value (a `UserError`, one line)."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.init})


def _add_field(parser: argparse.ArgumentParser, f: dataclasses.Field[Any], hint: Any,
               path: PathSpec | None) -> None:
    meta = f.metadata
    required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    default = None if required else (f.default if f.default is not dataclasses.MISSING
                                     else f.default_factory())  # type: ignore[misc]
    kind, item = _kind(hint)
    help_text = meta.get("help", "").replace("%", "%%")  # argparse formats help with %
    kwargs: dict[str, Any] = {"help": help_text}
    if "metavar" in meta:
        kwargs["metavar"] = meta["metavar"]
    if "choices" in meta:
        kwargs["choices"] = meta["choices"]
    if path is not None:  # a file or folder: checked as parsed, one line naming the option
        kwargs.update(action=PathAction, spec=path)
    if kind is bool:
        flags = meta.get("flags") or (_flag(f.name, negate=bool(default)),)
        parser.add_argument(*flags, dest=f.name, default=default,
                            action="store_false" if default else "store_true", **kwargs)
        return
    if meta.get("positional"):
        kwargs["nargs"] = meta.get("nargs")
        kwargs["help"] = _with_default(help_text, default, " ")
        convert = item if kind is tuple else kind
        parser.add_argument(f.name, type=None if convert is str else convert,
                            default=default, **kwargs)
        return
    flags = meta.get("flags") or (_flag(f.name),)
    if not required:
        kwargs["help"] = _with_default(help_text, default, ",")
    parser.add_argument(*flags, dest=f.name, required=required, default=default,
                        type=_comma_list(item) if kind is tuple else kind, **kwargs)


def _kind(hint: Any) -> tuple[Any, Any]:
    """(the type argparse converts to, a tuple's item type): ``int | None`` -> int,
    ``tuple[int, ...]`` -> (tuple, int), ``str`` -> (None: argparse's own, as given)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin is tuple:
        return tuple, args[0]
    if origin is not None and len(args) == 1:  # X | None
        hint = args[0]
    return (None if hint is str else hint), None


def _flag(name: str, negate: bool = False) -> str:
    return ("--no-" if negate else "--") + name.replace("_", "-")


def _with_default(help_text: str, default: Any, sep: str) -> str:
    """The help with the default appended (none for None: the help says what None means)."""
    if default is None:
        return help_text
    shown = sep.join(map(str, default)) if isinstance(default, tuple) else f"{default:g}" \
        if isinstance(default, float) else str(default)
    shown = shown.replace("%", "%%")  # argparse formats help with %
    if not help_text:
        return f"default {shown}"
    if help_text.endswith(")"):  # a closing remark: the default joins it
        return f"{help_text[:-1]}; default {shown})"
    return f"{help_text} (default {shown})"


def _comma_list(item: Any) -> Any:
    """argparse's type for a ``tuple[X, ...]`` option: ``a,b`` -> (X(a), X(b))."""
    def parse(text: str) -> tuple[Any, ...]:
        try:
            return tuple(item(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: give comma-separated {_ITEM_WORDS.get(item, item.__name__)}"
            ) from None

    parse.__name__ = f"comma-separated {getattr(item, '__name__', item)}"
    return parse


_ITEM_WORDS = {int: "whole numbers, e.g. 512,2048", float: "numbers, e.g. 0.5,1",
               str: "names"}
