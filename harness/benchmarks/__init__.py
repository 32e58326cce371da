"""Benchmarks `harness run` knows, by name (modules loaded on demand)."""

from __future__ import annotations

from importlib import import_module

from harness.benchmarks.base import (
    NO_RUN,
    Benchmark,
    BenchmarkError,
    RunContext,
    Task,
    TaskSetupError,
)

BENCHMARKS: dict[str, str] = {
    "gsm8k": "harness.benchmarks.gsm8k:Gsm8k",
    "hotpotqa": "harness.benchmarks.hotpotqa:HotpotQA",
    "alfworld": "harness.benchmarks.alfworld:AlfWorld",
    "swe-bench": "harness.benchmarks.swebench:SweBench",
}


def get_benchmark(name: str, exemplars: bool = True) -> Benchmark:
    """The benchmark called `name`; `exemplars` False: its prompts leave out the worked
    examples (zero-shot), as `harness run --no-exemplars` and replayed recordings ask."""
    try:
        target = BENCHMARKS[name]
    except KeyError:
        raise BenchmarkError(f"unknown benchmark {name!r}; choose one of: "
                             f"{', '.join(sorted(BENCHMARKS))}") from None
    module, _, cls = target.partition(":")
    bench: Benchmark = getattr(import_module(module), cls)()
    bench.use_exemplars = exemplars
    return bench


__all__ = ["BENCHMARKS", "NO_RUN", "Benchmark", "BenchmarkError", "RunContext", "Task",
           "TaskSetupError", "get_benchmark"]
