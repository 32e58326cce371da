"""Benchmarks `harness run` knows, by name (modules loaded on demand)."""

from __future__ import annotations

from importlib import import_module

from harness.benchmarks.base import Benchmark, BenchmarkError, Task, TaskSetupError

BENCHMARKS: dict[str, str] = {
    "gsm8k": "harness.benchmarks.gsm8k:Gsm8k",
    "hotpotqa": "harness.benchmarks.hotpotqa:HotpotQA",
    "alfworld": "harness.benchmarks.alfworld:AlfWorld",
    "swe-bench": "harness.benchmarks.swebench:SweBench",
}


def get_benchmark(name: str) -> Benchmark:
    try:
        target = BENCHMARKS[name]
    except KeyError:
        raise BenchmarkError(f"unknown benchmark {name!r}; choose one of: "
                             f"{', '.join(sorted(BENCHMARKS))}") from None
    module, _, cls = target.partition(":")
    return getattr(import_module(module), cls)()


__all__ = ["BENCHMARKS", "Benchmark", "BenchmarkError", "Task", "TaskSetupError", "get_benchmark"]
