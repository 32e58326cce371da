"""`harness sandbox build` and `harness sandbox prune`: the Docker sandbox image and what dead
runs left on the engine.

`build` makes the image the bash tool runs agent commands in (`harness.tools.sandbox_image`:
offline with debootstrap, or from a pulled base with --pull); `prune` removes containers of
dead runs and stale task images (`harness.sandbox_prune`), saying what it removed.
"""

from __future__ import annotations

import argparse
import sys

from common.errors import UserError
from harness.sandbox_prune import prune
from harness.tools.docker_client import shared_client
from harness.tools.sandbox_image import (
    DEFAULT_IMAGE,
    DEFAULT_SUITE,
    SandboxImageError,
    build_offline_image,
    pull_or_build,
)


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sandbox_command", required=True, metavar="ACTION")
    build = sub.add_parser(
        "build", help="build the sandbox image offline if missing (--help: options)",
        description="Build the Docker image the bash tool runs agent commands in.")
    add_build_arguments(build)
    build.set_defaults(func=run_build)
    pruning = sub.add_parser("prune", help="remove containers of dead runs and stale task "
                                           "images, saying what was removed")
    add_prune_arguments(pruning)
    pruning.set_defaults(func=run_prune)


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--name", default=DEFAULT_IMAGE, help=f"image name (default {DEFAULT_IMAGE})"
    )
    parser.add_argument(
        "--force", action="store_true", help="rebuild even if the image exists"
    )
    parser.add_argument(
        "--suite", default=DEFAULT_SUITE, help="Debian suite for debootstrap"
    )
    parser.add_argument(
        "--pull",
        action="store_true",
        help="try pulling --base from a registry first, build offline if that fails",
    )
    parser.add_argument(
        "--base", default="python:3.11-slim", help="base image for --pull"
    )


def run_build(args: argparse.Namespace) -> int:
    """Build the sandbox image offline (default) or via a pulled base (--pull). A build that
    fails (no engine, no root, debootstrap failed) is `error: ...` and status 1: not always a
    mistake of the user's, and the message says what to do."""

    def progress(msg: str) -> None:
        print(msg, flush=True)

    try:
        if args.pull:
            pull_or_build(
                args.name, base=args.base, force=args.force, progress=progress
            )
        else:
            build_offline_image(
                args.name, suite=args.suite, force=args.force, progress=progress
            )
    except SandboxImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def add_prune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="list, remove nothing")
    parser.add_argument("--run", default=None, metavar="RUN_ID",
                        help="only what this run left (its id: the `harness.run` label)")


def run_prune(args: argparse.Namespace) -> int:
    try:
        client = shared_client()
    except SandboxImageError as exc:  # no engine answers: the user's to start (the message)
        raise UserError(str(exc)) from None
    removed, failed = prune(client, args.run, args.dry_run)
    containers = sum(i.kind == "container" for i in removed)
    verb = "would remove" if args.dry_run else "removed"
    if not removed and not failed:
        print("nothing to remove: no container of a dead run, no stale task image")
    else:
        print(f"{verb} {containers} container(s) and {len(removed) - containers} "
              f"image(s)" + (f"; {len(failed)} kept (in use or refused)" if failed else ""))
    return 0
