"""`cli.options.add_options`: an options dataclass as the schema of a parser's options — a
field's type, default and help reach argparse, and what comes back is the dataclass, checked by
its own `__post_init__`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli.options import add_options, options_of
from common.errors import UserError


class ToyError(UserError):
    """The toy experiment's mistakes."""


@dataclass(frozen=True)
class Toy:
    url: str = field(metadata={"help": "where"})  # no default: a required option
    runs: int = field(default=3, metadata={"help": "how many"})
    rate: float = field(default=0.5, metadata={"help": "how fast (per second)"})
    out: Path = field(default=Path("runs/toy"), metadata={"help": "folder"})
    label: str | None = field(default=None, metadata={"help": "a name (default: none)"})
    sizes: tuple[int, ...] = field(default=(1, 2), metadata={"help": "sizes"})
    loud: bool = field(default=False, metadata={"help": "say more"})
    cache: bool = field(default=True, metadata={"help": "do not reuse results"})
    mode: str = field(default="a", metadata={"choices": ("a", "b"), "help": "which"})
    n: int = field(default=1, metadata={"flags": ("-n",), "help": "count"})

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ToyError(f"--runs {self.runs}: give at least 1")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toy")
    add_options(parser, Toy)
    return parser


def test_defaults_types_and_flags_come_from_the_fields():
    toy = options_of(Toy, _parser().parse_args(["--url", "u"]))
    assert toy == Toy(url="u")
    toy = options_of(Toy, _parser().parse_args(
        ["--url", "u", "--runs", "7", "--rate", "2", "--out", "x", "--label", "l",
         "--sizes", "4,5,6", "--loud", "--no-cache", "--mode", "b", "-n", "9"]))
    assert toy == Toy("u", 7, 2.0, Path("x"), "l", (4, 5, 6), True, False, "b", 9)
    assert isinstance(toy.out, Path) and isinstance(toy.rate, float)


def test_help_is_the_fields_with_the_default_appended():
    text = " ".join(_parser().format_help().split())
    assert "--runs RUNS how many (default 3)" in text
    assert "--rate RATE how fast (per second; default 0.5)" in text  # joins a closing remark
    assert "--out OUT folder (default runs/toy)" in text
    assert "--sizes SIZES sizes (default 1,2)" in text
    assert "--label LABEL a name (default: none)" in text  # None: the help says it in words
    assert "--loud say more --no-cache do not reuse results" in text  # flags: no default
    assert "--mode {a,b} which (default a)" in text and "-n N count (default 1)" in text


def test_a_field_without_a_default_is_required_and_a_bad_type_is_argparses_error(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args([])
    assert "the following arguments are required: --url" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["--url", "u", "--runs", "many"])
    assert "argument --runs: invalid int value: 'many'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["--url", "u", "--sizes", "1,x"])
    assert "argument --sizes: '1,x': give comma-separated whole numbers" in (
        capsys.readouterr().err)


def test_a_bad_value_fails_in_post_init_with_a_one_line_error():
    args = _parser().parse_args(["--url", "u", "--runs", "0"])
    with pytest.raises(ToyError) as error:
        options_of(Toy, args)
    assert str(error.value) == "--runs 0: give at least 1"
