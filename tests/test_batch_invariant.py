"""`harness serve --batch-invariant`: VLLM_BATCH_INVARIANT=1 on a GPU vLLM lists, a refusal
that says why on the CPU engine, the emulated GPU and older GPUs. Only the device detection
(`server.batch_invariant.detect_gpu`) is replaced; the command is built for real."""

from __future__ import annotations

import pytest

from cli.main import main
from server import batch_invariant
from server.batch_invariant import ENV, Gpu
from server.engine_spec import EngineSpec
from server.launch import ServeError, build_command
from server.policies.spec import PolicySpec

CONTINUUM = PolicySpec.named("continuum")

H100 = Gpu("NVIDIA H100 80GB HBM3", (9, 0))
A100 = Gpu("NVIDIA A100-SXM4-80GB", (8, 0))
T4 = Gpu("Tesla T4", (7, 5))
MI300X = Gpu("AMD Instinct MI300X", (9, 4), rocm_arch="gfx942:sramecc+:xnack-")
RX7900 = Gpu("AMD Radeon RX 7900 XTX", (11, 0), rocm_arch="gfx1100")


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


@pytest.mark.parametrize("gpu", [H100, A100, MI300X])
def test_a_supported_gpu_gets_the_mode_in_the_servers_environment(monkeypatch, model_dir, gpu):
    monkeypatch.setattr(batch_invariant, "detect_gpu", lambda: gpu)
    command = build_command(CONTINUUM, EngineSpec(model=model_dir), batch_invariant=True)
    assert command.env[ENV] == "1"
    assert ENV not in build_command(CONTINUUM, EngineSpec(model=model_dir)).env  # unless asked


@pytest.mark.parametrize(("gpu", "reason"), [(T4, "8.0 or higher, and this Tesla T4 is 7.5"),
                                             (RX7900, "not on this AMD Radeon RX 7900 XTX "
                                                      r"\(gfx1100\)")])
def test_a_gpu_vllm_does_not_list_is_refused(monkeypatch, model_dir, gpu, reason):
    monkeypatch.setattr(batch_invariant, "detect_gpu", lambda: gpu)
    with pytest.raises(ServeError, match=reason):
        build_command(CONTINUUM, EngineSpec(model=model_dir), batch_invariant=True)


def test_the_cpu_engine_is_refused_with_the_reason():
    with pytest.raises(ServeError, match="no batch-invariant kernels on the CPU"):
        build_command(CONTINUUM, EngineSpec(device="cpu"), batch_invariant=True)


def test_the_emulated_gpu_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(batch_invariant, "detect_gpu", lambda: H100)  # even beside a GPU
    with pytest.raises(ServeError, match="emulated GPU runs no model"):
        build_command(CONTINUUM, EngineSpec(profile="h100-llama-3.1-8b"), batch_invariant=True)


def test_the_command_line_says_it_in_one_line(capsys):
    assert main(["serve", "--device", "cpu", "--batch-invariant"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harness: error: --batch-invariant:") and err.count("\n") == 1
