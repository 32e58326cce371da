"""`harness serve` option handling: the vLLM command it builds and the mistakes it refuses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from server.launch import EXECUTOR, SCHEDULER, ServeError, build_command, has_cuda


def test_emulated_command_uses_our_scheduler_executor_and_events():
    command = build_command(policy="continuum", profile="h200-llama-3.1-8b", port=8123)
    argv = command.argv
    assert argv[argv.index("--scheduler-cls") + 1] == SCHEDULER
    assert argv[argv.index("--distributed-executor-backend") + 1] == EXECUTOR
    assert argv[argv.index("--block-size") + 1] == "16"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # loopback unless asked
    assert command.served_model_name == "llama-3.1-8b"
    assert command.env["HARNESS_POLICY"] == "continuum"
    assert command.env["HARNESS_PROFILE"] == "h200-llama-3.1-8b"
    assert command.env["VLLM_PLUGINS"] == "harness_agent_events"
    assert command.env["HARNESS_EVENTS_IPC"].startswith("ipc://")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"policy": "fifo"}, "choose one of"),
    ({"profile": "h100-llama-3.1-8b", "model": "/models/x"}, "not both"),
    ({"profile": "tpu-llama-3.1-8b"}, "h100"),
    ({"policy": "oracle"}, "harness bench"),  # it needs the trace's future
])
def test_mistakes_are_refused_with_a_reason(kwargs, message):
    with pytest.raises(ServeError, match=message):
        build_command(**kwargs)


@pytest.mark.skipif(has_cuda(), reason="this machine has a GPU")
def test_a_real_model_without_a_gpu_is_refused():
    with pytest.raises(ServeError, match="needs a CUDA GPU"):
        build_command(model="/models/Llama-3.1-8B-Instruct")


@pytest.mark.server
def test_cli_prints_the_error_without_a_traceback():
    done = subprocess.run([sys.executable, "-m", "cli", "serve", "--policy", "fifo"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown policy 'fifo'" in done.stderr and "Traceback" not in done.stderr


def test_the_ttft_slo_travels_in_the_environment():
    from server.settings import ServeSettings

    command = build_command(policy="ampd", profile="h100-llama-3.1-8b", ttft_slo_s=1.5)
    assert command.env["HARNESS_TTFT_SLO_S"] == "1.5"
    assert ServeSettings(ttft_slo_s=1.5).to_env()["HARNESS_TTFT_SLO_S"] == "1.5"
    assert build_command(policy="ampd").env["HARNESS_TTFT_SLO_S"] == "1.0"
    with pytest.raises(ServeError, match="--ttft-slo"):
        build_command(policy="ampd", ttft_slo_s=0.0)


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
