"""`harness demo`: a batch of synthetic agent programs through a co-located server
(`harness.demo`)."""

from __future__ import annotations

import argparse

from cli.paths import PROFILE, add_path_argument
from harness.demo import run_demo


def register(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default="continuum")
    add_path_argument(parser, "--profile", spec=PROFILE, default=None,
                      help="emulated GPU-MODEL or a step-time table (see harness serve)")
    parser.add_argument("--programs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server", default=None,
                        help="use a running server at this URL instead of starting one")


def run(args: argparse.Namespace) -> int:
    return run_demo(policy=args.policy, profile=args.profile, programs=args.programs,
                    seed=args.seed, server=args.server)
