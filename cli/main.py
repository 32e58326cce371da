"""The `harness` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from cli import (
    bench,
    cluster,
    compare,
    demo,
    experiments,
    model,
    plan,
    predictor,
    profile,
    run,
    sandbox,
    serve,
)
from cli.errors import exit_status

#: Every subcommand, in the order `harness --help` lists them: each adds its parser (with
#: `func`, what runs it) to the subparsers it is given.
COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    serve.register, run.register, compare.register, demo.register, cluster.register,
    bench.register, plan.register, sandbox.register, profile.register, predictor.register,
    experiments.register, model.register)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    return parser


#: Commands whose figures must not depend on Python's per-process string-hash seed: vLLM's
#: offloading connector walks a set of request ids (`finished_req_ids`) to number its store jobs
#: and refresh its host-memory LRU, so with a random seed two runs of the same replay can evict
#: differently (seen: mean JCT 342.2 s against 343.2 s for the same swe-long run).
_DETERMINISTIC_COMMANDS = frozenset({"bench", "plan", "cluster"})


def _pin_hash_seed(args: Sequence[str]) -> None:
    """Re-run this command under PYTHONHASHSEED=0 when the seed is unset (a user's explicit
    seed is kept), so the same command gives the same numbers; worker processes inherit it."""
    command = next((a for a in args if not a.startswith("-")), None)
    if command not in _DETERMINISTIC_COMMANDS or "PYTHONHASHSEED" in os.environ:
        return
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    script = sys.argv[0]
    if script.endswith(".py"):  # `python -m cli`: run the module again, not the file
        cmd = [sys.executable, "-m", "cli", *args]
    else:  # the `harness` console script
        cmd = [sys.executable, script, *args]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, cmd, env)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse and run one command. Its user mistakes (`common.errors.UserError`, whatever the
    layer that found them) are one line on stderr and status 2, Ctrl-C is 130 (`cli.errors`);
    any other exception keeps its traceback."""
    if argv is None:
        _pin_hash_seed(sys.argv[1:])
    parser = build_parser()
    # a command that passes its options on unparsed (`profile`) names the argument that holds
    # them (`passthrough`); argparse's REMAINDER does not take options that come first
    # (`harness profile --device cpu`), so collect those too
    args, unknown = parser.parse_known_args(argv)
    passthrough = getattr(args, "passthrough", None)
    if unknown and passthrough is None:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if passthrough is not None:
        setattr(args, passthrough, unknown + getattr(args, passthrough))
    return exit_status(lambda: int(args.func(args) or 0))


if __name__ == "__main__":
    sys.exit(main())
