"""An existing router as a baseline: the `vllm-router` package (Rust, PyPI) in front of two
emulated `harness serve` replicas, replaying a trace over HTTP once per routing mode.

Why: our own multi-replica routing (`cluster.routing`, served by `harness cluster serve`) needs
something it did not write to be measured against. `vllm-router` is what a vLLM user would put
in front of N replicas today (consistent hashing for session affinity, round robin, P/D with
NIXL). Same replicas, same trace, same client (`eval.replay.http_replay`), only the router changes.

What one run does: start two colocated replicas (`ServerProcess`, policy ``vllm`` by default,
a small KV cache via ``--num-gpu-blocks-override`` so programs contend, ``--enable-log-requests``
so each replica logs the requests it served), then per mode: reset both replicas' prefix caches
(vLLM's dev-mode ``POST /reset_prefix_cache``; each replay also salts the cache and suffixes
the program ids with its own run id, so nothing carries over either way), start `vllm-router`
in its own process group, replay the trace against it with
`eval.replay.http_replay.replay_over_http` (``--time-scale`` shortens arrival gaps and tool calls
as `harness bench --url` does), stop the router. Replicas and router are stopped whatever
happens (Ctrl-C and SIGTERM included).

Modes (``--modes``):

* ``vr-hash``: ``vllm-router --policy consistent_hash``; the client sends the program id as the
  ``X-Session-ID`` header besides the body's ``session_id`` (as every client of ours does:
  `harness.model_client.session_headers`).
* ``vr-hash-body``: the same router, with the header taken away, the program id only in the
  body (what our clients sent before they added the header). vllm-router 0.1.17 does not read
  body fields on this path (see below), so this is scatter by prompt length.
* ``vr-rr``: ``vllm-router --policy round_robin`` (every turn to the next replica).

Per mode: JCT mean / P95, prefix hit rate (cached / prompt tokens, from the usage the client
got), how many programs had turns on both replicas (each request carries a body ``request_id``
``rb.<session>.<turn>``, which vLLM logs as ``Received request cmpl-rb...`` in that replica's
log; it plays no part in routing), turns and interception events per replica, and preemptions
summed over the replicas' ``/metrics``.

What vllm-router 0.1.17 does with our traffic (read in its packaged help, the upstream source
`src/policies/hash_key.rs`, and checked against recording fake workers):

* ``consistent_hash`` key: the first non-empty header of ``x-session-id``, ``x-user-id``,
  ``x-tenant-id``, ``x-correlation-id``, ``x-request-id``, ``x-trace-id`` (key
  ``header:x-session-id:<id>``); 160 virtual nodes per worker. Without one, it hashes the
  request's *routing text*, not the JSON body: for ``/v1/completions`` with a token-id prompt
  that is ``token_ids:<prompt length>``, for a string prompt the prompt, for chat completions
  an empty string (every chat turn without a header goes to the same worker). The body fields
  its docs list (``session_params.session_id``, ``user``, ``session_id``, ``user_id``) are not
  used on this path. So our clients must send ``X-Session-ID``.
* Unknown POST paths are passed through (a transparent proxy): ``POST /v1/agent/events`` reaches
  *one* worker, chosen by the policy (consistent hash without a session header: a hash of the
  raw body, so each batch lands on an arbitrary worker; round robin: the next one), with the
  ``Content-Type`` rewritten to ``application/json`` (our replicas parse NDJSON anyway). An
  event batch holds several programs' events, so events cannot follow programs' KV caches;
  harmless for the ``vllm`` policy, fatal for pinning policies (pins never released by the
  replica that holds them).
* ``GET /metrics`` and ``POST /reset_prefix_cache`` are proxied to one worker too, so the
  server counters `http_replay` scrapes through the router are one replica's (under round robin
  a different replica before and after): this benchmark scrapes each replica itself.
* The body passes through byte for byte: ``session_id``, ``vllm_xargs``, ``cache_salt``,
  ``priority``, ``request_id``, token-id ``prompt`` lists and ``stream_options`` all arrive.

Our own router (`cluster.router_app`) as more rows on the same replicas, beside vllm-router:
`harness eval served-comparison` (`eval.experiments.served_comparison`).

    harness eval router-baseline --trace swe --programs 6 --jps 1 --seed 3 --time-scale 0.2
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.atomic import write_json_atomic
from common.processes import sigterm_unwinds
from common.trace import Trace
from eval import ExperimentError
from eval.bench.traces import make_trace
from eval.replay.http_replay import HttpReplayError, scale_trace
from eval.replay.routers import (
    ModeResult,
    RouterError,
    VllmRouter,
    check_replicas_fit,
    jsonable,
    run_front,
    start_replicas,
    vllm_router_missing,
)
from harness.server_process import ServerProcess


class RouterBaselineInputError(ExperimentError):
    """The run cannot start as asked (a trace or time scale that does not load, vllm-router
    not installed): a user's mistake, reported before any replica starts."""


@dataclass(frozen=True)
class Mode:
    name: str
    policy: str  # vllm-router --policy
    session_header: bool  # the client sends X-Session-ID
    about: str


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("vr-hash", "consistent_hash", True,
         "vllm-router consistent_hash, X-Session-ID header"),
    Mode("vr-hash-body", "consistent_hash", False,
         "vllm-router consistent_hash, session_id in the body only"),
    Mode("vr-rr", "round_robin", True, "vllm-router round_robin"),
)}
DEFAULT_MODES = "vr-hash,vr-rr"


@dataclass(frozen=True)
class RouterBaselineOptions:
    """One run: the trace, the modes and repeats, the replicas, the output folder (each field
    is an option of `harness eval router-baseline`, its help the metadata's)."""

    trace: str = field(default="swe", metadata={
        "help": "trace name (swe, bfcl, mix, merge) or file"})
    programs: int = field(default=6, metadata={"help": "programs to replay"})
    jps: float = field(default=1.0, metadata={"help": "arrival rate, jobs/s"})
    seed: int = field(default=3, metadata={"help": "trace seed"})
    time_scale: float = field(default=0.2, metadata={
        "help": "multiply arrival gaps and tool durations"})
    modes: tuple[str, ...] = field(default=tuple(DEFAULT_MODES.split(",")), metadata={
        "help": f"comma-separated, from {', '.join(MODES)}"})
    repeats: int = field(default=1, metadata={
        "help": "run every mode this many times (program ids, hence hash placement, differ "
        "per run)"})
    replicas: int = field(default=2, metadata={"help": "emulated replicas behind the router"})
    policy: str = field(default="vllm", metadata={"help": "the replicas' policy"})
    profile: str = field(default="h100-llama-3.1-8b", metadata={
        "help": "the replicas' emulated GPU-MODEL"})
    num_gpu_blocks: int = field(default=1024, metadata={
        "help": "KV cache per replica in 16-token blocks"})
    out: str = field(default="runs/router-baseline", metadata={
        "help": "folder for summary.json and the replicas' and routers' logs"})

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise RouterBaselineInputError(
                f"--modes: unknown {', '.join(unknown) or '(none given)'}; choose from "
                f"{', '.join(MODES)}")
        if self.replicas < 1 or self.repeats < 1 or self.num_gpu_blocks < 16:
            raise RouterBaselineInputError("--replicas and --repeats must be >= 1, "
                                           "--num-gpu-blocks >= 16")


def run_mode(mode: Mode, trace: Trace, replicas: Sequence[ServerProcess], out: Path,
             time_scale: float) -> ModeResult:
    router = VllmRouter(mode.policy, [r.base_url for r in replicas],
                        out / f"router-{mode.name}.log")
    return run_front(mode.name, mode.about, router, trace, replicas, time_scale,
                     session_header=mode.session_header)


# -- output ----------------------------------------------------------------------------------
def _s(value: Any) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:.1f} s"


def format_table(results: Sequence[ModeResult]) -> str:
    repeated = any(r.repeat for r in results)
    head = ("| mode | JCT mean | JCT P95 | prefix hit rate | programs on both replicas | "
            "turns per replica | events per replica | preemptions |")
    rows = [head, "|" + "---|" * 8]
    for r in results:
        m = r.metrics
        events = "/".join("?" if e is None else str(e) for e in r.events_per_replica)
        turns = "/".join(str(t) for t in r.turns_per_replica)
        if r.untracked_turns:
            turns += f" (+{r.untracked_turns} untracked)"
        label = f"{r.mode} #{r.repeat + 1}" if repeated else r.mode
        rows.append(f"| {label} | {_s(m.get('jct_mean_s'))} | {_s(m.get('jct_p95_s'))} | "
                    f"{m.get('prefix_hit_rate', math.nan):.3f} | "
                    f"{r.split_programs}/{r.programs} | {turns} | {events} | "
                    f"{m.get('preemptions')} |")
    return "\n".join(rows)


# -- the run ---------------------------------------------------------------------------------
def run_router_baseline(options: RouterBaselineOptions) -> int:
    """Every mode `options.repeats` times on the same replicas, the table printed and
    `summary.json` written; the exit status (0; 1 when the router, a replica or the replay
    failed; 130 when interrupted). What cannot start as asked raises
    `RouterBaselineInputError` before any replica starts."""
    missing = vllm_router_missing()
    if missing:
        raise RouterBaselineInputError(missing)
    try:
        trace = make_trace(options.trace, options.programs, options.jps, options.seed)
        scale_trace(trace, options.time_scale)  # validates the scale
        check_replicas_fit(trace, options.num_gpu_blocks)
    except (ExperimentError, ValueError) as exc:
        raise RouterBaselineInputError(str(exc)) from None

    out = Path(options.out)
    replicas: list[ServerProcess] = []
    results: list[ModeResult] = []
    with sigterm_unwinds():  # SIGTERM unwinds through `finally`: no server outlives us
        try:
            print(f"starting {options.replicas} replicas ({options.policy}, {options.profile}, "
                  f"{options.num_gpu_blocks} blocks each) ...", flush=True)
            replicas = start_replicas(options.replicas, options.policy, options.profile,
                                      options.num_gpu_blocks, out)
            for repeat in range(options.repeats):
                for name in options.modes:
                    print(f"{name}: {MODES[name].about} ...", flush=True)
                    result = run_mode(MODES[name], trace, replicas, out, options.time_scale)
                    result.repeat = repeat
                    results.append(result)
        except (RouterError, HttpReplayError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted; replicas and router stopped", file=sys.stderr)
            return 130
        finally:
            for r in replicas:
                r.stop()
    summary = {"trace": trace.name, "programs": len(trace.programs), "jps": options.jps,
               "seed": options.seed, "time_scale": options.time_scale, "policy": options.policy,
               "profile": options.profile, "num_gpu_blocks": options.num_gpu_blocks,
               "replicas": options.replicas,
               "results": [{**r.__dict__, "metrics": jsonable(r.metrics)} for r in results]}
    write_json_atomic(out / "summary.json", summary)
    print()
    print(f"{len(trace.programs)} programs of {trace.name} at {options.jps:g} jobs/s, time scale "
          f"{options.time_scale:g}, {options.replicas} x {options.profile} ({options.policy}, "
          f"{options.num_gpu_blocks} blocks)")
    print(format_table(results))
    print(f"\nsummary and logs in {out}/")
    return 0

