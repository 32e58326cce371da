"""The served comparison: `vllm-router`'s program scheduling against session-routed vLLM and our
policies, on the same emulated replicas, trace and memory, over HTTP in real time.

Why: `vllm-router` 0.1.17 ships "program scheduling" (Continuum's ideas at the router: programs
identified by `vllm_xargs.agentic_context`, a Progress-TTL fitted from observed tool-call
intervals, a RequestPool that holds a program's request while its replica lacks KV capacity,
cross-replica resume, prefill/decode cost models calibrated per deployment). It is the
strongest agent scheduler that exists outside this project; this experiment sets it beside
ours. Each *system* is a router in front of N `harness serve` replicas of one policy:

* ``vr-programs``: `vllm-router --enable-program-scheduling`, configured as its docs say
  (`eval.replay.program_scheduling`: global queue, MRU resume, each replica's KV capacity in tokens,
  prefill/decode cost models calibrated on the replicas' profile), replicas running stock vLLM
  scheduling (policy ``vllm``). Its decisions are counted from its own
  `vllm_router_agent_aware_*` metrics (committed transitions by reason, requests held in its
  RequestPool and their mean wait).
* ``vr-binding``: the same with ``binding_only`` (its docs' A/B: program-to-replica affinity
  without admission, Progress-TTL or resume).
* ``vr-hash``: `vllm-router --policy consistent_hash` on the ``X-Session-ID`` header, no
  program scheduling (affinity only).
* ``session:POLICY``: our router (`cluster.router_app`, strategy ``session``) in front of
  replicas running ``POLICY`` (``session:vllm`` is session-routed vLLM; ``session:continuum``
  our best per-request policy; any policy name works, so a new one slots in).
* ``programs:POLICY``: our router with strategy ``programs`` (`cluster.program_router`:
  placement by each replica's free KV room, programs kept home while they fit) in front of
  replicas running ``POLICY`` (``programs:lookahead``: our program scheduler in both places).
* ``programs+kv:POLICY``: the same with ``carry_kv`` (a moved program's KV goes along over
  NIXL instead of being recomputed): its replicas run vLLM's NIXL connector (``kv_both``;
  beside the CPU tier's, stacked, for a policy that needs one), so they are a set of their
  own.
* ``program-queue:POLICY``: our router with strategy ``program-queue``
  (`cluster.program_queue`: ThunderAgent's program scheduler in the router, a paused
  program's turns held there in a global queue); ``program-queue:vllm`` is ThunderAgent as
  its paper runs it, in front of unmodified engines.

Same trace for all (`eval.replay.http_replay`, ``--time-scale`` as in `harness bench --url`);
every request carries our hints *and* the canonical ``vllm_xargs.agentic_context`` (which
`vllm-router` forwards as it came, and our replicas accept: `server.intake.agentic_context`), so the
bodies are the same whatever reads them. Systems are grouped by replica policy: one set of
replicas per policy, started with the same profile and KV size (``--num-gpu-blocks``), their
prefix caches reset and the run's ids salted between systems (`eval.replay.routers.run_front`,
which also reads each replica's counters and request log: preemptions, programs whose turns
went to more than one replica).

    harness eval served-comparison --trace swe --programs 8 --jps 1 --time-scale 0.2
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.atomic import write_json_atomic
from common.processes import free_port, sigterm_unwinds
from eval import ExperimentError
from eval.bench.traces import make_trace
from eval.replay.http_replay import HttpReplayError, scale_trace
from eval.replay.program_scheduling import (
    Calibration,
    calibrate,
    config_argument,
    decision_counts,
    scheduling_config,
)
from eval.replay.routers import (
    ModeResult,
    OurRouter,
    RouterError,
    RouterProcess,
    VllmRouter,
    check_replicas_fit,
    jsonable,
    run_front,
    start_replicas,
    vllm_router_missing,
)
from harness.server_process import ServerProcess
from server.perf.registry import load_profile
from server.policies.spec import PolicySpec

BLOCK_SIZE = 16  # tokens per KV block on the emulated GPU (`server.launch`)
DEFAULT_SYSTEMS = "vr-programs,vr-hash,session:vllm,session:continuum"
VLLM_ROUTER_SYSTEMS = {
    "vr-programs": "vllm-router program scheduling (calibrated), consistent_hash fallback",
    "vr-binding": "vllm-router program scheduling, binding_only (affinity, no admission/TTL)",
    "vr-hash": "vllm-router consistent_hash on X-Session-ID",
}


class ServedComparisonInputError(ExperimentError):
    """The run cannot start as asked (unknown system or policy, a trace that does not load,
    vllm-router not installed): reported before any replica starts."""


@dataclass(frozen=True)
class System:
    """One row: which router (`vr-*` or our `session` router) in front of which policy."""

    name: str
    policy: str  # the replicas' policy
    about: str

    @property
    def ours(self) -> bool:
        return self.strategy is not None

    @property
    def strategy(self) -> str | None:
        """Our router's strategy as a system names it (``session``, ``programs``,
        ``programs+kv`` or ``program-queue``); None for vllm-router."""
        head = self.name.split(":", 1)[0]
        return head if head in OUR_STRATEGIES and ":" in self.name else None

    @property
    def carries_kv(self) -> bool:
        """Its replicas run the NIXL connector (our router moves programs with their KV)."""
        return self.strategy == CARRY_STRATEGY


#: our router's strategies a system may name (``STRATEGY:POLICY``); ``programs+kv`` is
#: ``programs`` with the router's ``carry_kv``
CARRY_STRATEGY = "programs+kv"
OUR_STRATEGIES = ("session", "programs", CARRY_STRATEGY, "program-queue")


def parse_systems(text: str) -> list[System]:
    """``vr-programs,session:continuum,...`` as `System`s, in order; a bad name is a
    `ServedComparisonInputError` naming the choices."""
    systems: list[System] = []
    for name in (n.strip() for n in text.split(",")):
        if not name:
            continue
        if name in VLLM_ROUTER_SYSTEMS:
            systems.append(System(name, "vllm", VLLM_ROUTER_SYSTEMS[name]))
        elif name.split(":", 1)[0] in OUR_STRATEGIES and name.split(":", 1)[1:] not in ([], [""]):
            strategy, policy = name.split(":", 1)
            try:
                PolicySpec.named(policy)
            except ValueError as exc:
                raise ServedComparisonInputError(f"--systems {name}: {exc}") from None
            systems.append(System(name, policy,
                                  f"our router ({strategy}) in front of {policy}"))
        else:
            raise ServedComparisonInputError(
                f"--systems: unknown system {name!r}; choose from "
                f"{', '.join(VLLM_ROUTER_SYSTEMS)}, session:POLICY (e.g. session:continuum), "
                "programs:POLICY (e.g. programs:lookahead), programs+kv:POLICY or "
                "program-queue:POLICY (ThunderAgent in the router: program-queue:vllm)")
    if not systems:
        raise ServedComparisonInputError("--systems: name at least one system")
    if len({s.name for s in systems}) != len(systems):
        raise ServedComparisonInputError("--systems: a system is named twice")
    return systems


def by_policy(systems: Sequence[System]) -> list[tuple[tuple[str, bool], list[System]]]:
    """The systems grouped by replica set (one each): (policy, whether the replicas carry
    the NIXL connector), first-seen order."""
    groups: dict[tuple[str, bool], list[System]] = {}
    for system in systems:
        groups.setdefault((system.policy, system.carries_kv), []).append(system)
    return list(groups.items())


@dataclass(frozen=True)
class ServedComparisonOptions:
    """One run (each field is an option of `harness eval served-comparison`, its help the
    metadata's)."""

    trace: str = field(default="swe", metadata={
        "help": "trace name (swe, swe-long, bfcl, mix, merge) or file"})
    programs: int = field(default=8, metadata={"help": "programs to replay"})
    jps: float = field(default=1.0, metadata={"help": "arrival rate, jobs/s"})
    seed: int = field(default=3, metadata={"help": "trace seed"})
    time_scale: float = field(default=0.2, metadata={
        "help": "multiply arrival gaps and tool durations"})
    systems: str = field(default=DEFAULT_SYSTEMS, metadata={
        "help": f"comma-separated rows: {', '.join(VLLM_ROUTER_SYSTEMS)}, session:POLICY "
        "(our router in front of POLICY replicas), programs:POLICY (our router placing "
        "programs by KV room, e.g. programs:lookahead), programs+kv:POLICY (the same, a "
        "moved program's KV carried over NIXL) or program-queue:POLICY (ThunderAgent's "
        "global queue in our router)"})
    repeats: int = field(default=1, metadata={
        "help": "run every system this many times (program ids, hence placement, differ per "
        "run) and print the means too"})
    replicas: int = field(default=2, metadata={"help": "emulated replicas behind each router"})
    profile: str = field(default="h100-llama-3.1-8b", metadata={
        "help": "the replicas' emulated GPU-MODEL (vllm-router's cost models are calibrated "
        "on it)"})
    num_gpu_blocks: int = field(default=1024, metadata={
        "help": "KV cache per replica in 16-token blocks, for every system"})
    #: vllm-router's `stats_window_size`: samples before its growth reserve and Progress-TTL
    #: turn on (its default, 100, is more requests than a short run makes: TTLs stay 0)
    vr_stats_window: int = field(default=20, metadata={
        "help": "vllm-router's stats_window_size: observed requests before its growth "
        "reserve and Progress-TTL turn on (its own default, 100, is more than a short run "
        "makes, so its TTLs stay 0)"})
    out: str = field(default="runs/served-comparison", metadata={
        "help": "folder for summary.json and the replicas' and routers' logs"})

    def __post_init__(self) -> None:
        parse_systems(self.systems)
        if (self.replicas < 1 or self.repeats < 1 or self.num_gpu_blocks < 16
                or self.vr_stats_window < 1):
            raise ServedComparisonInputError("--replicas, --repeats and --vr-stats-window "
                                             "must be >= 1, --num-gpu-blocks >= 16")


# -- the routers ------------------------------------------------------------------------------
def our_router_argv(workers: Sequence[str], port: int, strategy: str = "session") -> list[str]:
    """Our served router (`cluster.router_app`) over ``workers``, as a process of its own
    (`python -m eval.experiments.served_comparison route ...`), as vllm-router runs in one."""
    return [sys.executable, "-m", "eval.experiments.served_comparison", "route", strategy,
            str(port), *workers]


def router_spec(strategy: str) -> Any:
    """Our router's `RouterSpec` for a system's strategy (``programs+kv``: ``programs`` with
    ``carry_kv``)."""
    from cluster.config import RouterSpec  # pydantic: start-up cost, the router's process

    if strategy == CARRY_STRATEGY:
        return RouterSpec(strategy="programs", carry_kv=True)
    return RouterSpec(strategy=strategy)


def serve_our_router(strategy: str, port: int, workers: Sequence[str]) -> None:
    """Serve `cluster.router_app` with ``strategy`` (``programs+kv``: ``programs`` carrying
    moved programs' KV) in front of ``workers`` until SIGINT."""
    # uvicorn, FastAPI (cluster.router_app): start-up cost, paid only by the router process
    import uvicorn

    from cluster.router_app import create_app
    from cluster.router_state import ReplicaEndpoint

    endpoints = [ReplicaEndpoint(name=f"r{i}", role="colocated", url=url)
                 for i, url in enumerate(workers)]
    app = create_app(endpoints, router_spec(strategy), name="served-comparison")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def front_for(system: System, workers: Sequence[str], out: Path, calibration: Calibration,
              capacity_tokens: int, stats_window: int | None = None) -> RouterProcess:
    """The router process of ``system`` (not started); ``stats_window``: vllm-router's
    `stats_window_size` (None: its default)."""
    log = out / f"router-{system.name.replace(':', '-')}.log"
    if system.ours:
        port = free_port()
        return OurRouter(our_router_argv(workers, port, system.strategy or "session"),
                         port, log, name="our router")
    if system.name == "vr-hash":
        return VllmRouter("consistent_hash", workers, log)
    overrides: dict[str, Any] = {"binding_only": True} if system.name == "vr-binding" else {}
    if stats_window is not None:
        overrides["stats_window_size"] = stats_window
    config = scheduling_config(calibration, capacity_tokens, overrides=overrides)
    return VllmRouter("consistent_hash", workers, log, extra=config_argument(config))


# -- output -----------------------------------------------------------------------------------
def _seconds(value: Any) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:.1f} s"


#: The TTFT per turn, its mean and its tail, in one cell of the tables.
TTFT_KEYS = ("ttft_mean_s", "ttft_p95_s", "ttft_p99_s")


def _ttft(m: dict[str, Any]) -> str:
    """``mean / P95 / P99`` TTFT in seconds (``n/a`` where a figure is missing)."""
    values = [m.get(key) for key in TTFT_KEYS]
    return " / ".join("n/a" if v is None or (isinstance(v, float) and math.isnan(v))
                      else f"{v:.2f}" for v in values) + " s"


def decisions_text(router_metrics: dict[str, float]) -> str:
    """The router's program-scheduling decisions in one cell: vllm-router's, or ours
    (``ours:*``: turns held in its queue, moves, pauses; empty for routers that keep none)."""
    if not router_metrics:
        return ""
    ours = {k.removeprefix("ours:"): v for k, v in router_metrics.items()
            if k.startswith("ours:")}
    if ours:  # counts, then seconds; zeros left out
        names = {k: k.removeprefix("programs.") for k in ours}
        parts = [f"{names[k]} {int(v)}" for k, v in ours.items() if v and not k.endswith("_s")]
        parts += [f"{names[k].removesuffix('_s')} {v:.0f} s" for k, v in ours.items()
                  if v and k.endswith("_s")]
        return ", ".join(parts) or "none"
    counts = decision_counts(router_metrics)
    parts = [", ".join(f"{reason.removeprefix('reason=')} {n}"
                       for reason, n in counts["transitions"].items())]
    if counts["pooled"]:
        parts.append(f"RequestPool wait mean {counts['pool_wait_mean_s']:.2f} s over "
                     f"{counts['pooled']}")
    if counts["ttl_armed"]:
        parts.append(f"TTL mean {counts['ttl_mean_s']:.2f} s over {counts['ttl_armed']}")
    return "; ".join(parts) or "none"


def format_table(results: Sequence[ModeResult], policies: dict[str, str]) -> str:
    """The comparison as a markdown table, one row per system and repeat."""
    repeated = any(r.repeat for r in results)
    rows = ["| system | replicas' policy | JCT mean | JCT P95 | TTFT mean / P95 / P99 | "
            "prefix hit rate | programs on >1 replica | turns per replica | preemptions | "
            "router decisions |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        m = r.metrics
        label = f"{r.mode} #{r.repeat + 1}" if repeated else r.mode
        rows.append(f"| {label} | {policies.get(r.mode, '?')} | {_seconds(m.get('jct_mean_s'))} "
                    f"| {_seconds(m.get('jct_p95_s'))} | {_ttft(m)} | "
                    f"{m.get('prefix_hit_rate', math.nan):.3f} | "
                    f"{r.split_programs}/{r.programs} | "
                    f"{'/'.join(str(t) for t in r.turns_per_replica)} | {m.get('preemptions')} | "
                    f"{decisions_text(r.router_metrics)} |")
    return "\n".join(rows)


MEANS = ("jct_mean_s", "jct_p95_s", "prefix_hit_rate", *TTFT_KEYS)


def aggregate(results: Sequence[ModeResult]) -> dict[str, dict[str, float]]:
    """Per system, the mean over its repeats of JCT mean, JCT P95, prefix hit rate and TTFT
    mean, P95 and P99, with the spread of the JCT means (max - min) and the number of
    repeats: with few programs on few replicas, where the hash places programs (different ids
    each repeat) moves a run's JCT as much as the router does."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        runs.setdefault(r.mode, []).append(r.metrics)
    out: dict[str, dict[str, float]] = {}
    for system, metrics in runs.items():
        row = {key: sum(float(m.get(key, math.nan)) for m in metrics) / len(metrics)
               for key in MEANS}
        jcts = [float(m.get("jct_mean_s", math.nan)) for m in metrics]
        row["jct_mean_spread_s"] = max(jcts) - min(jcts)
        row["repeats"] = len(metrics)
        out[system] = row
    return out


def format_means(means: dict[str, dict[str, float]], policies: dict[str, str]) -> str:
    """`aggregate`'s means as a markdown table."""
    rows = ["| system | replicas' policy | repeats | JCT mean | (spread) | JCT P95 | "
            "TTFT mean / P95 / P99 | prefix hit rate |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for system, m in means.items():
        rows.append(f"| {system} | {policies.get(system, '?')} | {int(m['repeats'])} | "
                    f"{_seconds(m['jct_mean_s'])} | {_seconds(m['jct_mean_spread_s'])} | "
                    f"{_seconds(m['jct_p95_s'])} | {_ttft(m)} | {m['prefix_hit_rate']:.3f} |")
    return "\n".join(rows)


# -- the run ----------------------------------------------------------------------------------
def run_served_comparison(options: ServedComparisonOptions) -> int:
    """Every system once, grouped by replica policy; prints the table and writes
    `summary.json`. The exit status: 0; 1 when a router, a replica or the replay failed; 130
    when interrupted. What cannot start as asked raises `ServedComparisonInputError` first."""
    systems = parse_systems(options.systems)
    missing = vllm_router_missing() if any(not s.ours for s in systems) else None
    if missing:
        raise ServedComparisonInputError(missing)
    try:
        trace = make_trace(options.trace, options.programs, options.jps, options.seed)
        scale_trace(trace, options.time_scale)  # validates the scale
        check_replicas_fit(trace, options.num_gpu_blocks)
        calibration = calibrate(load_profile(options.profile))
    except (ExperimentError, ValueError) as exc:
        raise ServedComparisonInputError(str(exc)) from None
    capacity = options.num_gpu_blocks * BLOCK_SIZE

    out = Path(options.out)
    results: list[ModeResult] = []
    replicas: list[ServerProcess] = []
    with sigterm_unwinds():  # SIGTERM unwinds through `finally`: no server outlives us
        try:
            for (policy, carry), group in by_policy(systems):
                print(f"starting {options.replicas} replicas ({policy}, {options.profile}, "
                      f"{options.num_gpu_blocks} blocks each"
                      + (", NIXL connector" if carry else "") + ") ...", flush=True)
                # a busy machine takes minutes to start several vLLM servers side by side
                replicas = start_replicas(options.replicas, policy, options.profile,
                                          options.num_gpu_blocks,
                                          out / (policy + ("+kv" if carry else "")),
                                          startup_timeout_s=600.0, carry_kv=carry)
                workers = [r.base_url for r in replicas]
                for repeat in range(options.repeats):
                    for system in group:
                        print(f"{system.name}: {system.about} ...", flush=True)
                        front = front_for(system, workers, out, calibration, capacity,
                                          options.vr_stats_window)
                        result = run_front(system.name, system.about, front, trace, replicas,
                                           options.time_scale, agentic_context=True)
                        result.repeat = repeat
                        results.append(result)
                for r in replicas:
                    r.stop()
                replicas = []
        except (RouterError, HttpReplayError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted; replicas and routers stopped", file=sys.stderr)
            return 130
        finally:
            for r in replicas:
                r.stop()

    policies = {s.name: s.policy for s in systems}
    ours = {s.name for s in systems if s.ours}  # their decisions are ours:*, not vllm-router's
    means = aggregate(results)
    summary = {"options": asdict(options), "trace": trace.name, "means": means,
               "programs": len(trace.programs), "calibration": asdict(calibration),
               "token_capacity_per_replica": capacity,
               "results": [{**r.__dict__, "policy": policies[r.mode],
                            "decisions": decision_counts(r.router_metrics)
                            if r.router_metrics and r.mode not in ours else None,
                            "metrics": jsonable(r.metrics)} for r in results]}
    write_json_atomic(out / "summary.json", jsonable(summary))
    print()
    print(f"{len(trace.programs)} programs of {trace.name} at {options.jps:g} jobs/s, time "
          f"scale {options.time_scale:g}, {options.replicas} x {options.profile}, "
          f"{options.num_gpu_blocks} blocks ({capacity} tokens) each")
    print(format_table(results, policies))
    if options.repeats > 1:
        print(f"\nmeans over {options.repeats} repeats:")
        print(format_means(means, policies))
    print(f"\nvllm-router calibration (from {options.profile}): "
          f"{json.dumps(calibration.router_models())}")
    print(f"summary and logs in {out}/")
    return 0



if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "route":
        serve_our_router(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
        sys.exit(0)
    sys.exit("usage: python -m eval.experiments.served_comparison route STRATEGY PORT URL...  "
             "(internal; use `harness eval served-comparison`)")
