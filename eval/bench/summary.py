"""What a sweep wrote: `BenchSummary`, serialised as ``summary.json``.

Why a dataclass: the sweep's result is read by the report, the plots, the terminal table, the
experiments built on the bench and the tests; one declared shape says which keys there are and
what they mean, where a dict built in one place and read by string in five did not. The file
keeps its keys and their order (`to_json`), and the report still reads old files as dicts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass
class BenchSummary:
    """One sweep: what was replayed, on which engines, and one row per policy and load."""

    trace: str  # as given: a generated trace's name or a file
    trace_name: str  # the trace's own name
    programs: int  # replayed (after `skipped_too_long`)
    profile: str  # where the isolated JCTs were measured
    seed: int
    # the `EngineSpec` every engine of the run shared
    num_gpu_blocks: int | None
    max_model_len: int | None
    #: the batch limits the engines ran with (on the emulated GPU: `EngineSpec`
    #: `emulated_batch_limits`; None: a served engine's own)
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    long_prefill_token_threshold: int | None
    offload_gib: float | None
    offload_copy_model: str
    trace_stats: dict[str, Any]  # `common.trace.summarize`
    skipped_too_long: list[str]  # one line per program left out (`--too-long skip`)
    time_scale: float
    warm_prefix_pct: float  # kv-cache-tester's warm prefix (`eval.workloads.warm_prefix`)
    slo: dict[str, float]  # ttft_s, tpot_s
    mode: str  # ``virtual`` or ``http URL`` (`eval.bench.backends.Backend.mode`)
    cluster: dict[str, Any] | None  # the cluster file replayed
    policies: list[str]
    jps: list[float | None]
    concurrency: list[int] | None  # closed loops (then `jps` is [None])
    steady: float
    jobs: int
    isolated_jct_mean_s: float
    #: the throughput bound per load (`eval.bench.floor`): mean JCT, makespan, work
    floors: list[dict[str, Any]]
    #: measuring the isolated JCTs (None: not measured in this run, e.g. from the cache)
    isolated_wall_s: float | None
    isolated_cpu_s: float | None
    isolated_engine_steps: int | None
    wall_s: float
    results: list[dict[str, Any]]  # one row per policy and load (`eval.bench.rows.make_row`)

    def to_json(self) -> dict[str, Any]:
        """``summary.json``'s object: the fields in their order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
