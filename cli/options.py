"""Options more than one command takes, defined once so their flags and help agree."""

from __future__ import annotations

import argparse

from server.perf.copy_model import (
    DEFAULT_OFFLOAD_COPY_MODEL,
    OFFLOAD_COPY_MODEL_HELP,
    OFFLOAD_COPY_MODELS,
)


def add_offload_copy_model_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """The ``--offload-copy-model`` option, one definition for every command that takes it
    (`harness serve`, the bench): `what` names the copies it times, for the help."""
    parser.add_argument("--offload-copy-model", default=DEFAULT_OFFLOAD_COPY_MODEL,
                        choices=list(OFFLOAD_COPY_MODELS),
                        help=OFFLOAD_COPY_MODEL_HELP.format(what=what))
