"""Real models for tests that run the CPU engine on one (not a test module: a helper).

`smollm2_folder()` is the SmolLM2-135M-Instruct folder a real-model test serves, or None when
the CPU engine's virtualenv is absent (such a test then skips). `bash scripts/setup.sh
--cpu-engine` adds the model; where it has not, the first call adds it (download and
conversion, once, into the models home).
"""

from __future__ import annotations

from pathlib import Path

from server.cpu.engine import is_cpu_build
from server.launch import CPU_VENV
from server.models.store import added_model, resolve_model

SMOLLM2 = "smollm2-135m-instruct"


def smollm2_folder() -> Path | None:
    if not (CPU_VENV / "bin" / "python").is_file() and not is_cpu_build():
        return None
    added = added_model(SMOLLM2)
    return (added or resolve_model(SMOLLM2)).folder
