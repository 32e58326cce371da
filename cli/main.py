"""The `harness` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cli.errors import exit_status
from cli.paths import naming_path_options


@dataclass(frozen=True)
class Command:
    """One subcommand: the module whose `register(parser)` adds its options (imported only
    when the command runs or its own help is asked for) and its line in `harness --help`."""

    module: str
    help: str
    add_help: bool = True  # False: the module parses `-h` itself (`profile`)


#: Every subcommand, in the order `harness --help` lists them. Why a table and not imports: the
#: command modules import what their commands run (vLLM's config, eval/, the cluster, rich,
#: pydantic: about 0.6 s), and a process runs one command, so only its module is imported;
#: the one-line help lives here so `harness --help` needs none of them.
COMMANDS: dict[str, Command] = {
    "serve": Command("cli.serve", "start the vLLM server with a policy (emulated GPU if none)"),
    "run": Command("cli.run", "run a benchmark's agent programs and score them"),
    "compare": Command("cli.compare", "run a benchmark under several policies, side by side"),
    "demo": Command("cli.demo", "run a batch of agent programs through a co-located server"),
    "cluster": Command("cli.cluster", "serve a cluster file's replicas behind one router, or "
                       "check the file"),
    "bench": Command("cli.bench", "compare policies on a trace in virtual time (JCT vs load)"),
    "plan": Command("cli.plan", "choose prefill/decode replicas and TP degrees for N GPUs "
                    "(AMPD planner)"),
    "sandbox": Command("cli.sandbox", "the Docker sandbox image"),
    "profile": Command("cli.profile", "measure step times on a real GPU or the CPU engine "
                       "(--device cpu) and write a table for the emulator", add_help=False),
    "predictor": Command("cli.predictor", "train / evaluate the output-length and "
                         "tool-duration predictor"),
    "eval": Command("cli.experiments", "experiments that print figures: load, fidelity, "
                    "overheads, baselines"),
    "model": Command("cli.model", "add and list real models (GGUF, folders)"),
}


def build_parser(load: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The `harness` parser: every command listed with its help; the options of the commands
    in `load` (default: all of them) added by their modules, the others left empty."""
    wanted = set(COMMANDS if load is None else load)
    parser = argparse.ArgumentParser(prog="harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        child = sub.add_parser(name, help=command.help, add_help=command.add_help)
        if name in wanted:
            importlib.import_module(command.module).register(child)
    return parser


def command_of(args: Sequence[str]) -> str | None:
    """The subcommand a command line names: its first word that is not an option (the
    `harness` parser itself takes no option but --help)."""
    return next((a for a in args if not a.startswith("-")), None)


#: Commands whose figures must not depend on Python's per-process string-hash seed: vLLM's
#: offloading connector walks a set of request ids (`finished_req_ids`) to number its store jobs
#: and refresh its host-memory LRU, so with a random seed two runs of the same replay can evict
#: differently (seen: mean JCT 342.2 s against 343.2 s for the same swe-long run).
_DETERMINISTIC_COMMANDS = frozenset({"bench", "plan", "cluster"})


def _pin_hash_seed(args: Sequence[str]) -> None:
    """Re-run this command under PYTHONHASHSEED=0 when the seed is unset (a user's explicit
    seed is kept), so the same command gives the same numbers; worker processes inherit it."""
    command = command_of(args)
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
    layer that found them, a bad path option's value among them) are one line on stderr and
    status 2, Ctrl-C is 130 (`cli.errors`); any other exception keeps its traceback."""
    args_given = sys.argv[1:] if argv is None else list(argv)
    if argv is None:
        _pin_hash_seed(args_given)
    return exit_status(lambda: _parse_and_run(args_given))


def _parse_and_run(argv: Sequence[str]) -> int:
    """Parse (a path option's bad value raises a `UserError` here, `cli.paths`) and run."""
    command = command_of(argv)
    parser = build_parser([command] if command in COMMANDS else [])
    # a command that passes its options on unparsed (`profile`) names the argument that holds
    # them (`passthrough`); argparse's REMAINDER does not take options that come first
    # (`harness profile --device cpu`), so collect those too
    args, unknown = parser.parse_known_args(argv)
    passthrough = getattr(args, "passthrough", None)
    if unknown and passthrough is None:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if passthrough is not None:
        setattr(args, passthrough, unknown + getattr(args, passthrough))
    with naming_path_options(args):
        return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
