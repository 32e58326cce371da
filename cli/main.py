"""The `harness` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def _serve(args: argparse.Namespace) -> int:
    from harness import serve

    return serve.run(args)


def _run(args: argparse.Namespace) -> int:
    from harness import run

    return run.run(args)


def _compare(args: argparse.Namespace) -> int:
    from harness import compare

    return compare.run(args)


def _demo(args: argparse.Namespace) -> int:
    from harness import demo

    return demo.run(args)


def _sandbox_build(args: argparse.Namespace) -> int:
    from harness.tools import sandbox_image

    return sandbox_image.main(args.sandbox_args)


def _sandbox_prune(args: argparse.Namespace) -> int:
    from harness import sandbox_prune

    return sandbox_prune.run(args)


def _profile(args: argparse.Namespace) -> int:
    if "--served" in args.profile_args:  # over HTTP: needs harness's server process
        from harness import profile_served

        return profile_served.main(args.profile_args)
    from server import profile_gpu

    return profile_gpu.main(args.profile_args)


def _predictor(args: argparse.Namespace) -> int:
    from predictor import cli as predictor_cli

    return predictor_cli.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from harness import serve

    p = sub.add_parser("serve", help="start the vLLM server with a policy (emulated GPU if none)")
    serve.add_arguments(p)
    p.set_defaults(func=_serve)

    from harness import demo, run

    p = sub.add_parser("run", help="run a benchmark's agent programs and score them")
    run.add_arguments(p)
    p.set_defaults(func=_run)

    from harness import compare

    p = sub.add_parser("compare", help="run a benchmark under several policies, side by side")
    compare.add_arguments(p)
    p.set_defaults(func=_compare)

    p = sub.add_parser("demo", help="run a batch of agent programs through a co-located server")
    demo.add_arguments(p)
    p.set_defaults(func=_demo)

    from cli import bench as bench_cli
    from cli import cluster as cluster_cli
    from cli import plan as plan_cli

    cluster_cli.register(sub)
    bench_cli.register(sub)
    plan_cli.register(sub)

    p = sub.add_parser("sandbox", help="the Docker sandbox image")
    sandbox_sub = p.add_subparsers(dest="sandbox_command", required=True, metavar="ACTION")
    b = sandbox_sub.add_parser("build", add_help=False,
                               help="build the sandbox image offline if missing (--help: options)")
    b.add_argument("sandbox_args", nargs=argparse.REMAINDER)
    b.set_defaults(func=_sandbox_build)
    from harness import sandbox_prune

    b = sandbox_sub.add_parser("prune", help="remove containers of dead runs and stale task "
                                             "images, saying what was removed")
    sandbox_prune.add_arguments(b)
    b.set_defaults(func=_sandbox_prune)

    p = sub.add_parser("profile", help="measure step times on a real GPU or the CPU engine "
                       "(--device cpu) and write a table for the emulator",
                       add_help=False)
    p.add_argument("profile_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_profile)

    from predictor import cli as predictor_cli

    p = sub.add_parser("predictor", help="train / evaluate the output-length and tool-duration "
                                         "predictor")
    predictor_cli.add_arguments(p)
    p.set_defaults(func=_predictor)
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
    if argv is None:
        _pin_hash_seed(sys.argv[1:])
    parser = build_parser()
    # `profile` and `sandbox build` pass their options on unparsed; argparse's REMAINDER does not
    # take options that come first (`harness profile --device cpu`), so collect those too
    args, unknown = parser.parse_known_args(argv)
    passthrough = next((name for name in ("profile_args", "sandbox_args") if hasattr(args, name)),
                       None)
    if unknown and passthrough is None:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if passthrough is not None:
        setattr(args, passthrough, unknown + getattr(args, passthrough))
    from common.errors import UserError
    from harness.run import RunError
    from harness.server_process import ServerStartError
    from server.launch import ServeError

    try:
        return int(args.func(args) or 0)
    except (ServeError, RunError, ServerStartError, UserError) as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
