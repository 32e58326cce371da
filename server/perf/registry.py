"""Profiles by name: ``{gpu}[xN]-{model}`` for the roofline, or the path to a table.

Why names: a profile is chosen on the command line (`harness serve --profile`, the bench), in
cluster files and in settings passed to vLLM's engine process, so one string must say which
GPU, how many of them and which model, or which measured table. This is the one place that
reads such a string.
"""

from __future__ import annotations

import re
from pathlib import Path

from common.errors import UserError
from server.perf.copy_model import DEFAULT_OFFLOAD_COPY_MODEL
from server.perf.hardware import DEFAULT_EFFICIENCY, GPUS, Efficiency
from server.perf.model_shapes import DEFAULT_TP, available_models, model_spec
from server.perf.profile import Profile
from server.perf.roofline import RooflineProfile
from server.perf.table import load_table

_NAME = re.compile(r"^(?P<gpu>[a-z][a-z0-9]*?)(?:x(?P<n>\d+))?-(?P<model>.+)$")


def profile_names() -> list[str]:
    """Valid profile names with default TP sizes ({gpu}xN-{model} picks another N)."""
    names = []
    for model in available_models():
        n = DEFAULT_TP.get(model, 1)
        for gpu in sorted(GPUS):
            names.append(f"{gpu}{'' if n == 1 else f'x{n}'}-{model}")
    return names


class UnknownProfileError(UserError):
    """A profile name that names no GPU and model (a `ValueError` too)."""


def load_profile(name_or_path: str | Path, efficiency: Efficiency = DEFAULT_EFFICIENCY,
                 offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL) -> Profile:
    """``{gpu}[xN]-{model}`` (e.g. ``h100-llama-3.1-8b``, ``h100x8-llama-3.1-70b``) or the
    path to a JSON step-time table. `offload_copy_model`: how the offloading connector's
    copies are priced (`OFFLOAD_COPY_MODELS`; the profile checks the name)."""
    s = str(name_or_path)
    if s.endswith(".json") or Path(s).is_file():
        return load_table(s, efficiency, offload_copy_model)
    m = _NAME.match(s.lower())
    help_ = (
        f"valid names: {', '.join(profile_names())}; or {{gpu}}xN-{{model}} for N GPUs "
        f"tensor-parallel (gpu in {', '.join(sorted(GPUS))}), or a path to a profile table "
        "(.json)"
    )
    if not m or m["gpu"] not in GPUS or m["model"] not in available_models():
        raise UnknownProfileError(f"unknown profile {s!r}; {help_}")
    model_name = m["model"]
    tp = int(m["n"]) if m["n"] else DEFAULT_TP.get(model_name, 1)
    if tp < 1:
        raise UnknownProfileError(f"unknown profile {s!r}: the GPU count must be >= 1; {help_}")
    model = model_spec(model_name, tp)
    return RooflineProfile(name=s.lower(), gpu_key=m["gpu"], model=model, efficiency=efficiency,
                           offload_copy_model=offload_copy_model)
