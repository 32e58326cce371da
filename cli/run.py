"""`harness run BENCH`: many agent programs at once against a co-located server, scored.

The options and their check; the run itself (`harness.run.run_benchmark`: start the server,
run and score every task, resume, report what is unfinished) takes a `RunSpec`.
"""

from __future__ import annotations

import argparse

from harness.run import RunSpec, run_benchmark


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run", help="run a benchmark's agent programs and score them")
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser, policy: bool = True) -> None:
    parser.add_argument("benchmark", help="gsm8k, hotpotqa, alfworld or swe-bench")
    if policy:
        parser.add_argument("--policy", default="continuum")
    parser.add_argument("--model", default=None,
                        help="replay:DIR (recorded trajectories; default: the benchmark's own), "
                        "a served model NAME (with --server) or a model PATH (real GPU)")
    parser.add_argument("--server", default=None, help="URL of a running server to use")
    parser.add_argument("--profile", default=None, help="emulated GPU-MODEL for the server")
    parser.add_argument("--limit", type=int, default=None, help="run only the first N tasks")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tasks", default=None, help="a task file instead of the shipped one")
    parser.add_argument("--out", default=None,
                        help="output folder (default runs/BENCH-POLICY-TIMESTAMP)")
    parser.add_argument("--resume", action="store_true",
                        help="skip tasks already finished in --out")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--predictor", default=None, metavar="DIR",
                        help="a model from `harness predictor train`: each request then "
                        "carries its predicted output length, and tool calls a prediction "
                        "before the harness has durations of its own")
    parser.add_argument("--no-token-ids", action="store_true",
                        help="do not ask the server for token ids (`return_token_ids`, a vLLM "
                        "extension): for OpenAI-compatible servers that reject it")
    parser.add_argument("--agentic-context", action="store_true",
                        help="also send each request's hints as the canonical "
                        "`vllm_xargs.agentic_context` (program_id, step_id, expected_resume, "
                        "...), which vllm-router's program scheduling reads; `harness serve` "
                        "accepts it, a stock vLLM server rejects it (400)")


def spec_of(args: argparse.Namespace) -> RunSpec:
    """The run the parsed options ask for (`harness compare` has no --policy: the default)."""
    return RunSpec(benchmark=args.benchmark, policy=getattr(args, "policy", RunSpec.policy),
                   model=args.model, server=args.server, profile=args.profile,
                   limit=args.limit, concurrency=args.concurrency, tasks=args.tasks,
                   out=args.out, resume=args.resume, max_steps=args.max_steps,
                   predictor=args.predictor, token_ids=not args.no_token_ids,
                   agentic_context=args.agentic_context)


def run(args: argparse.Namespace) -> int:
    return run_benchmark(spec_of(args))
