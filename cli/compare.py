"""`harness compare BENCH --policies vllm,continuum`: the same tasks under each policy.

`harness run`'s options (but --policy) and --policies; the comparison itself is
`harness.compare.compare_policies`.
"""

from __future__ import annotations

import argparse

from cli import run as run_cli
from harness.compare import compare_policies


def register(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_cli.add_arguments(parser, policy=False)
    parser.add_argument("--policies", default="vllm,continuum",
                        help="comma-separated policies (default vllm,continuum)")


def run(args: argparse.Namespace) -> int:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    return compare_policies(run_cli.spec_of(args), policies)
