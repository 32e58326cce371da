"""`harness serve` option handling: the vLLM command it builds and the mistakes it refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from server.engine_spec import EngineSpec
from server.launch import (
    EXECUTOR,
    SCHEDULER,
    ServeCommand,
    ServeError,
    build_command,
    has_cuda,
    serve_policy,
)
from server.settings import ServeSettings


def settings_of(argv: list[str]) -> ServeSettings:
    """What the engine reads back from the `vllm serve` command (its `additional_config`)."""
    config = json.loads(argv[argv.index("--additional-config") + 1])
    return ServeSettings.from_vllm_config(SimpleNamespace(additional_config=config))


def command_for(policy: str = "continuum", *, port: int = 8000, extra: list[str] | None = None,
                **engine: Any) -> ServeCommand:
    """The command `harness serve` builds for these options (its policy and engine made as
    its command line makes them)."""
    return build_command(serve_policy(policy), EngineSpec(**engine), port=port, extra=extra)


def test_emulated_command_uses_our_scheduler_executor_and_events():
    command = command_for(policy="continuum", profile="h200-llama-3.1-8b", port=8123)
    argv = command.argv
    assert argv[argv.index("--scheduler-cls") + 1] == SCHEDULER
    assert argv[argv.index("--distributed-executor-backend") + 1] == EXECUTOR
    assert argv[argv.index("--block-size") + 1] == "16"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # loopback unless asked
    assert command.served_model_name == "llama-3.1-8b"
    settings = settings_of(argv)
    assert settings.policy == "continuum" and settings.profile == "h200-llama-3.1-8b"
    assert settings.events and "HARNESS_POLICY" not in command.env
    assert command.env["VLLM_PLUGINS"] == "harness_agent_events"
    assert command.env["HARNESS_EVENTS_IPC"].startswith("ipc://")


def test_the_emulated_gpu_takes_the_gpus_batch_limits_not_the_hosts():
    """On this CPU-only host vLLM would give an emulated H100 its CPU platform's 2,048 tokens
    and 128 requests a step; the command carries what `vllm serve` takes on the GPU, a limit
    given after `--` wins, and a small budget given lowers the requests (vLLM refuses more
    requests than tokens)."""
    def limits(argv: list[str]) -> tuple[str, str]:
        return (argv[argv.index("--max-num-batched-tokens") + 1],
                argv[argv.index("--max-num-seqs") + 1])

    assert limits(command_for(profile="h100-llama-3.1-8b").argv) == ("8192", "1024")
    assert limits(command_for(profile="a100-llama-3.1-8b").argv) == ("2048", "256")
    argv = command_for(profile="h100-llama-3.1-8b", extra=["--max-num-seqs", "64"]).argv
    assert argv.count("--max-num-seqs") == 1 and limits(argv) == ("8192", "64")
    assert EngineSpec(max_num_batched_tokens=512).emulated_batch_limits() == (512, 512)
    assert EngineSpec(max_num_seqs=8).emulated_batch_limits() == (8192, 8)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"policy": "fifo"}, "choose one of"),
    ({"profile": "h100-llama-3.1-8b", "model": "/models/x"}, "not both"),
    ({"profile": "tpu-llama-3.1-8b"}, "h100"),
    ({"policy": "oracle"}, "harness bench"),  # it needs the trace's future
])
def test_mistakes_are_refused_with_a_reason(kwargs, message):
    with pytest.raises(ServeError, match=message):
        command_for(**kwargs)


@pytest.mark.skipif(has_cuda(), reason="this machine has a GPU")
def test_a_real_model_without_a_gpu_is_refused():
    with pytest.raises(ServeError, match="needs a CUDA GPU"):
        command_for(model="/models/Llama-3.1-8B-Instruct")


@pytest.mark.server
def test_cli_prints_the_error_without_a_traceback():
    done = subprocess.run([sys.executable, "-m", "cli", "serve", "--policy", "fifo"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown policy 'fifo'" in done.stderr and "Traceback" not in done.stderr


def test_the_ttft_slo_travels_in_the_engines_config():
    command = command_for(policy="ampd", profile="h100-llama-3.1-8b", ttft_slo_s=1.5)
    assert settings_of(command.argv).ttft_slo_s == 1.5
    assert settings_of(command_for(policy="ampd").argv).ttft_slo_s == 1.0
    with pytest.raises(ServeError, match="--ttft-slo"):
        command_for(policy="ampd", ttft_slo_s=0.0)


def test_an_additional_config_of_the_user_is_merged_with_the_settings():
    argv = command_for(policy="vllm", extra=["--additional-config", '{"x": 1}',
                                             "--max-num-seqs", "8"]).argv
    assert argv.count("--additional-config") == 1 and argv[-2:] == ["--max-num-seqs", "8"]
    assert json.loads(argv[argv.index("--additional-config") + 1])["x"] == 1
    assert settings_of(argv).policy == "vllm"
    with pytest.raises(ServeError, match="JSON object"):
        command_for(extra=["--additional-config=[1]"])


def test_a_config_without_settings_falls_back_to_the_environment(monkeypatch):
    """A `vllm serve --scheduler-cls server.scheduler.PolicyScheduler` started by hand."""
    monkeypatch.setenv("HARNESS_POLICY", "preserve")
    assert ServeSettings.from_vllm_config(SimpleNamespace(additional_config={})).policy \
        == "preserve"
    with pytest.raises(ValueError, match="expected an object"):
        ServeSettings.from_vllm_config(SimpleNamespace(additional_config={"harness": {"p": 1}}))


def test_vllms_own_parser_carries_the_settings(monkeypatch):
    """The JSON goes through `vllm serve`'s argument parser unchanged (vLLM 0.32)."""
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")  # its defaults ask for a platform
    from vllm.engine.arg_utils import EngineArgs  # vLLM: start-up cost (~3 s)
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = command_for(policy="ampd", ttft_slo_s=2.5).argv
    at = argv.index("--additional-config")
    parsed = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(argv[at:at + 2])
    settings = ServeSettings.from_vllm_config(SimpleNamespace(
        additional_config=parsed.additional_config))
    assert (settings.policy, settings.ttft_slo_s) == ("ampd", 2.5)


def test_yield_cores_to_engine_lowers_the_servers_priority(tmp_path):
    """Measurements give the engine its core back: the API server's process (the pid
    `harness serve` execs into) drops to the given niceness; `client=False` spares the caller."""
    import os

    from harness.server_process import ServerProcess

    server = ServerProcess(log_path=tmp_path / "serve.log")
    server.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        caller = os.getpriority(os.PRIO_PROCESS, 0)  # the child starts with it
        if caller >= 19:
            pytest.skip("this process already runs at the lowest priority")
        target = min(caller + 5, 19)  # above the child's: the call must change it
        server.yield_cores_to_engine(niceness=target, client=False)
        assert os.getpriority(os.PRIO_PROCESS, server.process.pid) == target
        assert os.getpriority(os.PRIO_PROCESS, 0) == caller
    finally:
        server.process.kill()
        server.process.wait()
