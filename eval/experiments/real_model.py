"""A real model under every policy: do the policies change what it says, and what do they buy?

``harness eval real-model [--bench gsm8k] [--model smollm2-135m-instruct] [--policies
vllm,continuum,autellix] [--kv-tokens 4096]``

Why: the mission promises the same pass rate in less time; with a real model the first half is
checkable. For each policy the benchmark runs on the CPU engine (`harness serve --device cpu`,
real forward passes) with greedy decoding and a KV cache small enough that the policies matter
(pins released under pressure, preemptions, recomputation: the cases where KV is rebuilt rather
than kept), and every run is compared turn by turn with the first policy's
(`eval.experiments.agreement`). The first policy runs twice: that pair's differences are what the
engine's floating point does on its own (the same prompt through another batch or cache path),
the yardstick for the others.

Each run records its trajectories (token ids), the server's step log (pin counters), its
preemption and prefix-cache counters (`/metrics`) and mean JCT. With `--table` (a CPU profile
of the same model, `harness profile --device cpu --served --model MODEL`) the recorded
trajectories are also replayed per policy on the emulator (`sim.replay`, virtual time) with the
same KV capacity, and its mean JCT is set beside the real one.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from common.atomic import write_json_atomic
from common.trace import Trace
from eval import ExperimentError
from eval.experiments.agreement import compare_runs
from eval.workloads.importers import from_harness_trajectory
from harness.run import RunSpec, run_benchmark
from harness.server_process import model_server
from harness.trajectory import token_ids
from server.cpu.engine import CPU_BLOCK_SIZE
from server.engine import VirtualEngine
from server.engine_spec import EngineSpec
from server.perf.table import load_table
from server.policies.spec import PolicySpec
from server.step_log import read_step_log
from sim.replay import replay

#: the Prometheus counters a run reports (vLLM's names on its `/metrics`)
COUNTERS = {"preemptions": "vllm:num_preemptions_total",
            "prefix_hits": "vllm:prefix_cache_hits_total",
            "prefix_queries": "vllm:prefix_cache_queries_total"}


class RealModelError(ExperimentError):
    pass


@dataclass(frozen=True)
class RealModelOptions:
    """One comparison (each field is an option of `harness eval real-model`, its help the
    metadata's)."""

    bench: str = field(default="gsm8k", metadata={"help": "benchmark"})
    model: str = field(default="smollm2-135m-instruct", metadata={"help": "NAME|DIR|FILE.gguf"})
    policies: str = field(default="vllm,continuum,autellix", metadata={
        "help": "comma-separated; the first runs twice"})
    limit: int = field(default=10, metadata={"help": "tasks"})
    concurrency: int = field(default=10, metadata={"help": "programs at once"})
    kv_tokens: int = field(default=4096, metadata={  # small, so that the policies matter
        "help": "KV cache in tokens, small for memory pressure"})
    max_model_len: int = field(default=4096, metadata={"help": "longest conversation, tokens"})
    max_tokens: int = field(default=192, metadata={"help": "output cap per reply"})
    max_steps: int = field(default=10, metadata={"help": "steps per program"})
    #: the first policy twice: the engine's own float differences
    repeat: bool = field(default=True, metadata={
        "help": "run the first policy once (no float-noise yardstick)"})
    table: Path | None = field(default=None, metadata={
        "help": "a CPU profile of the model (`harness profile --device cpu --served --model "
        "M`): also replay each run on the emulator"})
    out: Path = field(default=Path("runs/real-model"), metadata={"help": "output folder"})

    def __post_init__(self) -> None:
        if not [p for p in self.policies.split(",") if p.strip()]:
            raise RealModelError("--policies: name at least one policy")
        for name in ("limit", "concurrency", "kv_tokens", "max_model_len", "max_tokens",
                     "max_steps"):
            if getattr(self, name) < 1:
                raise RealModelError(f"--{name.replace('_', '-')} {getattr(self, name)}: give "
                                     "at least 1")


def counters(base_url: str) -> dict[str, float]:
    """vLLM's counters, summed over label sets (0 when the server does not export one)."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    found = {}
    for key, name in COUNTERS.items():
        values = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
        found[key] = sum(float(v) for v in values)
    return found


def run_policy(options: RealModelOptions, policy: str, label: str) -> dict[str, Any]:
    """One benchmark run on the CPU engine under `policy`, in `out/label`."""
    out = options.out / label
    step_log = out / "steps.jsonl"
    step_log.parent.mkdir(parents=True, exist_ok=True)
    step_log.unlink(missing_ok=True)
    server = model_server(
        options.model, device="cpu", policy=policy,
        serve_args=["--max-model-len", str(options.max_model_len),
                    "--step-log", str(step_log.resolve())],
        vllm_args=["--num-gpu-blocks-override", str(options.kv_tokens // CPU_BLOCK_SIZE + 1),
                   "--enforce-eager"],
        log_path=out / "server.log")
    with server:
        spec = RunSpec(benchmark=options.bench, policy=policy, model=server.served_model,
                       server=server.base_url, limit=options.limit,
                       concurrency=options.concurrency, out=str(out / "run"),
                       max_steps=options.max_steps, max_tokens=options.max_tokens,
                       temperature=0.0)
        status = run_benchmark(spec)
        found = counters(server.base_url)
    summary = json.loads((out / "run" / "summary.json").read_text())
    steps = read_step_log(step_log) if step_log.is_file() else []
    return {"policy": policy, "label": label, "status": status,
            "jct_mean_s": summary["jct_mean_s"], "passed": summary["passed"],
            "tasks": summary["tasks"], "statuses": summary["statuses"],
            "prefix_broken_turns": summary.get("prefix_broken_turns"),
            "token_id_turns": summary.get("token_id_turns"),
            **found, "pins": steps[-1].pins if steps else {}, "steps": len(steps)}


def trace_of(run_dir: Path) -> Trace:
    """The run's recorded programs as a benchmark trace (every program arrives at 0: the
    harness started them at once, `concurrency` >= tasks)."""
    programs = [from_harness_trajectory(json.loads(p.read_text()))
                for p in sorted((run_dir / "trajectories").glob("*.traj.json"))]
    return Trace(name=f"recorded-{run_dir.parent.name}", programs=programs)


def emulated_jct(run_dir: Path, policy: str, options: RealModelOptions) -> float:
    """Mean JCT of the run's recorded programs replayed on the emulator with `options.table`
    and the same KV capacity in tokens (the emulator's blocks are 16 tokens)."""
    assert options.table is not None
    engine = VirtualEngine(PolicySpec.named(policy), EngineSpec(
        profile=str(options.table), max_model_len=options.max_model_len,
        num_gpu_blocks=options.kv_tokens // 16 + 1))
    try:
        table = load_table(options.table)
        path = table.get("served_path") or {}
        result = replay(trace_of(run_dir), engine, intake_s=path.get("intake_s", 0.0),
                        delivery_s=path.get("delivery_s", 0.0))
    finally:
        engine.close()
    jcts = [p.jct for p in result.programs.values() if p.finished is not None]
    return statistics.fmean(jcts) if jcts else float("nan")


def top_two(base_url: str, model: str, prompt: list[int]) -> list[tuple[int, float]]:
    """The engine's two likeliest next tokens after `prompt`, alone in its batch, with their
    log-probabilities (greedy picks the first)."""
    reply = httpx.post(base_url + "/v1/completions", timeout=300, json={
        "model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "logprobs": 2,
        "return_tokens_as_token_ids": True}).raise_for_status().json()
    top = reply["choices"][0]["logprobs"]["top_logprobs"][0]
    ranked = sorted(top.items(), key=lambda kv: -kv[1])
    return [(int(key.removeprefix("token_id:")), value) for key, value in ranked]


def explain(options: RealModelOptions, reference: Path, runs: list[dict[str, Any]]) -> None:
    """For each divergence, the two choices at the first differing token as the engine scores
    them with the prompt alone: a margin of a few hundredths of a nat is a near-tie, which the
    rounding of another batch shape (CPU matmul kernels are not batch-invariant) can flip; a
    wide margin would point at the policy. Adds `alone` and `margin` to each divergence."""
    pending = [d for run in runs for d in (run.get("agreement") or {}).get("divergences", [])
               if d["token"] is not None]
    if not pending:
        return
    server = model_server(options.model, device="cpu", policy=runs[0]["policy"],
                          serve_args=["--max-model-len", str(options.max_model_len)],
                          vllm_args=["--enforce-eager"], log_path=options.out / "explain.log")
    with server:
        for d in pending:
            data = json.loads((reference / "trajectories" / f"{d['task_id']}.traj.json")
                              .read_text())
            prompt, output = token_ids(data)[d["turn"]]
            top = top_two(server.base_url, server.served_model, prompt + output[:d["token"]])
            d["alone"] = [t for t, _ in top]
            d["margin"] = round(top[0][1] - top[1][1], 4) if len(top) > 1 else None


def measure(options: RealModelOptions) -> dict[str, Any]:
    policies = [p.strip() for p in options.policies.split(",") if p.strip()]
    if not policies:
        raise RealModelError("--policies: name at least one policy")
    if options.table is not None and not options.table.is_file():
        raise RealModelError(f"--table {options.table}: no such file (make one with `harness "
                             f"profile --device cpu --served --model {options.model}`)")
    labels = [(policies[0], policies[0])]
    if options.repeat:
        labels.append((policies[0], f"{policies[0]}-again"))
    labels += [(p, p) for p in policies[1:]]
    runs = [run_policy(options, policy, label) for policy, label in labels]
    reference = options.out / labels[0][1] / "run"
    for run in runs[1:]:
        agreement = compare_runs(reference, options.out / run["label"] / "run")
        run["agreement"] = agreement.to_json()
    explain(options, reference, runs)
    if options.table is not None:
        for run in runs:
            run["emulated_jct_mean_s"] = emulated_jct(options.out / run["label"] / "run",
                                                      run["policy"], options)
    summary = {"options": {k: str(v) if isinstance(v, Path) else v
                           for k, v in asdict(options).items()}, "runs": runs}
    write_json_atomic(options.out / "report.json", summary)
    return summary


def report(summary: dict[str, Any]) -> str:
    runs = summary["runs"]
    reference = runs[0]["label"]
    lines = [f"{'run':<18}{'passed':>8}{'JCT s':>9}{'emu JCT':>9}{'preempt':>9}"
             f"{'pin/pressure':>14}{'hit %':>7}{'broken':>8}  same turns as {reference}"]
    for run in runs:
        hits = 100 * run["prefix_hits"] / run["prefix_queries"] if run["prefix_queries"] else 0
        pins = run["pins"]
        emu = run.get("emulated_jct_mean_s")
        agreement = run.get("agreement")
        same = (f"{agreement['identical_turns']}/{agreement['turns']} "
                f"({100 * agreement['identical_share']:.1f}%)") if agreement else "(reference)"
        lines.append(
            f"{run['label']:<18}{run['passed']:>4}/{run['tasks']:<3}{run['jct_mean_s']:>9.1f}"
            f"{(f'{emu:.1f}' if emu is not None else '-'):>9}{run['preemptions']:>9.0f}"
            f"{pins.get('pinned', 0):>8}/{pins.get('pressure', 0):<5}{hits:>7.1f}"
            f"{run['prefix_broken_turns'] or 0:>8}  {same}")
    for run in runs:
        for d in (run.get("agreement") or {}).get("divergences", []):
            lines.append(f"  {run['label']}: {d['task_id']} turn {d['turn']} token {d['token']}"
                         f" (cached {d['cached_a']} vs {d['cached_b']}"
                         f"{'' if d['same_cache_path'] else ': another cache path'})"
                         + (f"; alone the engine ranks {d['alone']}, margin {d['margin']} nats"
                            if d.get("alone") else ""))
    return "\n".join(lines)


def run_real_model(options: RealModelOptions) -> dict[str, Any]:
    summary = measure(options)
    print(report(summary))
    print(f"report: {options.out / 'report.json'}")
    return summary
