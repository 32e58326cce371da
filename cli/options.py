"""Options more than one command takes, defined once so their flags and help agree."""

from __future__ import annotations

import argparse
import math

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
