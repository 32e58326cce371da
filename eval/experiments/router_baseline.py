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

TODO: add our own router (`cluster.router_app`, strategies ``session`` and ``round_robin``)
as more rows on the same replicas once that module exists and serves.

    harness eval router-baseline --trace swe --programs 6 --jps 1 --seed 3 --time-scale 0.2
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from common.atomic import write_json_atomic
from common.errors import UserError
from common.trace import Trace
from eval.bench.specs import BenchError
from eval.bench.traces import make_trace
from eval.replay import http_replay
from eval.replay.http_replay import HttpReplayError, HttpReplayResult, http_replay_metrics
from eval.replay.program_scheduling import metric_totals
from harness.model_client import SESSION_HEADER
from harness.server_process import ServerProcess, ServerStartError, free_port
from server.max_model_len import served_max_model_len


class RouterBaselineError(RuntimeError):
    """Something this benchmark needs is missing or would not start; the message says what."""


class RouterBaselineInputError(UserError):
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
    """One run: the trace, the modes and repeats, the replicas, the output folder
    (`harness eval router-baseline --help` says what each means)."""

    trace: str = "swe"
    programs: int = 6
    jps: float = 1.0
    seed: int = 3
    time_scale: float = 0.2
    modes: tuple[str, ...] = tuple(DEFAULT_MODES.split(","))
    repeats: int = 1
    replicas: int = 2
    policy: str = "vllm"
    profile: str = "h100-llama-3.1-8b"
    num_gpu_blocks: int = 1024
    out: str = "runs/router-baseline"


# -- vllm-router ---------------------------------------------------------------------------------
def router_argv(policy: str, workers: Sequence[str], port: int, metrics_port: int,
                extra: Sequence[str] = ()) -> list[str]:
    """The `vllm-router` command for ``policy`` in front of ``workers``, plus ``extra``
    options (program scheduling: `eval.replay.program_scheduling.config_argument`). P/D would
    instead be ``--vllm-pd-disaggregation --prefill URL [BOOTSTRAP_PORT] ... --decode URL ...
    [--prefill-policy P] [--decode-policy P] [--kv-connector nixl|mooncake|moriio]``."""
    return [sys.executable, "-m", "vllm_router.launch_router",
            "--worker-urls", *workers, "--policy", policy,
            "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--log-level", "info", *extra]


class RouterProcess:
    """A router as a child in its own process group, ready once ``GET /v1/models`` answers
    (routers proxy it to a replica); `with RouterProcess(...) as r: r.url`. ``argv`` is its
    command, ``port`` the one it listens on, ``name`` what messages call it."""

    def __init__(self, argv: Sequence[str], port: int, log_path: Path, *,
                 name: str = "router", startup_timeout_s: float = 60.0) -> None:
        self.argv = list(argv)
        self.port = port
        self.name = name
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()[-lines:])

    def start(self) -> RouterProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RouterBaselineError(f"{self.name} exited with {self.process.returncode} "
                                          f"(log {self.log_path}):\n{self._tail()}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RouterBaselineError(f"{self.name} did not answer within "
                                  f"{self.startup_timeout_s:.0f} s (log {self.log_path}):\n"
                                  f"{self._tail()}")

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGINT, 10.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> RouterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class VllmRouter(RouterProcess):
    """`vllm-router` with ``policy`` in front of ``workers`` (``extra``: more options)."""

    def __init__(self, policy: str, workers: Sequence[str], log_path: Path,
                 startup_timeout_s: float = 60.0, extra: Sequence[str] = ()) -> None:
        port = free_port()
        self.metrics_port = free_port()
        super().__init__(router_argv(policy, workers, port, self.metrics_port, extra), port,
                         log_path, name="vllm-router", startup_timeout_s=startup_timeout_s)

    def start(self) -> RouterProcess:
        if importlib.util.find_spec("vllm_router") is None:
            raise RouterBaselineError("the `vllm-router` package is not installed; run "
                                      "`.venv/bin/pip install vllm-router==0.1.17`")
        return super().start()

    def router_metrics(self) -> dict[str, float]:
        """Its own `vllm_router_agent_aware_*` metrics now (`metric_totals`); {} if its
        Prometheus port does not answer."""
        try:
            response = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5)
        except httpx.HTTPError:
            return {}
        return metric_totals(response.text) if response.status_code == 200 else {}


# -- the client: tag requests (and optionally add X-Session-ID) --------------------------------
class _TaggingClient:
    """Wraps `http_replay`'s httpx client: every completion gets a body ``request_id``
    ``rb.<session>.<turn>`` (vLLM uses it as the request id and logs it, so each replica's log
    says which turns it served), and strips the ``X-Session-ID`` header our clients send when a
mode measures the body alone. Everything else is
    the wrapped client's."""

    def __init__(self, client: httpx.AsyncClient, session_header: bool) -> None:
        self._client = client
        self._session_header = session_header

    def stream(self, method: str, url: str, *, json: dict[str, Any] | None = None,
               headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
        if json is not None and "session_id" in json:
            session = str(json["session_id"])
            turn = (json.get("vllm_xargs") or {}).get("turn", "x")
            json = {**json, "request_id": f"rb.{session}.{turn}"}
            if not self._session_header:  # our clients send it: take it away
                headers = {k: v for k, v in (headers or {}).items()
                           if k.lower() != SESSION_HEADER.lower()}
        return self._client.stream(method, url, json=json, headers=headers, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@contextlib.contextmanager
def tagged_requests(session_header: bool) -> Iterator[None]:
    """While open, `eval.replay.http_replay` drives its requests through `_TaggingClient`."""
    original = http_replay._Driver

    class Driver(original):  # type: ignore[misc, valid-type]
        def __init__(self, trace: Trace, client: httpx.AsyncClient, *args: Any,
                     **kwargs: Any) -> None:
            super().__init__(trace, _TaggingClient(client, session_header), *args, **kwargs)

    http_replay._Driver = Driver  # type: ignore[misc]
    try:
        yield
    finally:
        http_replay._Driver = original  # type: ignore[misc]


# -- replica observations -------------------------------------------------------------------
_RECEIVED = re.compile(r"Received request cmpl-rb\.(\S+)\.(\d+)(?:-\d+)?:")


def served_turns(log_path: Path, offset: int) -> list[tuple[str, int]]:
    """(session, turn) of every tagged request a replica logged after byte ``offset``."""
    with open(log_path, "rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    return [(m.group(1), int(m.group(2))) for m in _RECEIVED.finditer(text)]


def _scrape(url: str) -> dict[str, float]:
    async def go() -> dict[str, float]:
        async with httpx.AsyncClient() as client:
            return await http_replay._scrape(client, url)
    return asyncio.run(go())


def _events_received(url: str) -> int | None:
    try:
        response = httpx.get(f"{url}/v1/agent/events", timeout=5)
        return int(response.json()["received"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def reset_prefix_cache(url: str, attempts: int = 10) -> bool:
    """vLLM's dev-mode reset (the replicas run with VLLM_SERVER_DEV_MODE=1); False if refused."""
    for _ in range(attempts):
        try:
            response = httpx.post(f"{url}/reset_prefix_cache", timeout=10)
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            return False
        if response.json().get("success"):
            return True
        time.sleep(0.5)  # blocks still held (a request finishing): try again
    return False


@dataclass
class ModeResult:
    mode: str
    about: str
    router_argv: list[str]
    metrics: dict[str, Any]
    cache_reset: bool
    #: the router's own metrics over the replay (`metric_totals`; vllm-router only)
    router_metrics: dict[str, float] = field(default_factory=dict)
    programs: int = 0
    split_programs: int = 0  # programs with turns on more than one replica
    turns_per_replica: list[int] = field(default_factory=list)
    events_per_replica: list[int | None] = field(default_factory=list)
    untracked_turns: int = 0  # turns the client saw that no replica log named
    repeat: int = 0


def run_mode(mode: Mode, trace: Trace, replicas: Sequence[ServerProcess], out: Path,
             time_scale: float) -> ModeResult:
    router = VllmRouter(mode.policy, [r.base_url for r in replicas],
                        out / f"router-{mode.name}.log")
    return run_front(mode.name, mode.about, router, trace, replicas, time_scale,
                     session_header=mode.session_header)


def run_front(name: str, about: str, front: Any, trace: Trace,
              replicas: Sequence[ServerProcess], time_scale: float, *,
              session_header: bool = True, agentic_context: bool = False) -> ModeResult:
    """One replay of ``trace`` through ``front`` (a router in front of ``replicas``: a context
    manager whose entered value has ``url``, and ``argv`` saying what it runs; with a
    ``router_metrics()`` method, the router's own metrics are taken before and after), with
    the replicas' prefix caches reset first and their counters and logs read around it.
    ``agentic_context``: requests also carry the canonical ``vllm_xargs.agentic_context``."""
    urls = [r.base_url for r in replicas]
    reset = all(reset_prefix_cache(u) for u in urls)
    before = [_scrape(u) for u in urls]
    events_before = [_events_received(u) for u in urls]
    offsets = [r.log_path.stat().st_size for r in replicas]
    observe = getattr(front, "router_metrics", None)
    with front as entered, tagged_requests(session_header):
        router_before = observe() if observe else {}
        result: HttpReplayResult = http_replay.replay_over_http(
            trace, entered.url, time_scale=time_scale, agentic_context=agentic_context)
        router_after = observe() if observe else {}
    time.sleep(0.5)  # the last step's statistics reach /metrics (and the logs) just after
    after = [_scrape(u) for u in urls]
    events_after = [_events_received(u) for u in urls]
    # the router proxies /metrics to one replica: replace its figures with the replicas' sum
    server: dict[str, float] = {}
    for b, a in zip(before, after, strict=True):
        for key in http_replay.SERVER_COUNTERS:
            if key in b and key in a:
                server[key] = server.get(key, 0.0) + a[key] - b[key]
    result.server = server
    result.total_blocks = int(sum(a.get("num_gpu_blocks", 0) for a in after))
    steps = int(server.get("engine_steps", 0))
    result.engine_steps = result.sched_steps = steps
    metrics = http_replay_metrics(result)

    placed: dict[str, set[int]] = defaultdict(set)
    turns_per_replica = []
    for index, (replica, offset) in enumerate(zip(replicas, offsets, strict=True)):
        served = [(s, t) for s, t in served_turns(replica.log_path, offset)
                  if s.endswith(f"@{result.run_id}")]
        turns_per_replica.append(len(served))
        for session, _turn in served:
            placed[session].add(index)
    client_turns = sum(len(p.turns) for p in result.programs.values())
    return ModeResult(
        mode=name, about=about, router_argv=list(front.argv), metrics=metrics,
        cache_reset=reset, programs=len(result.programs),
        router_metrics={k: router_after.get(k, 0.0) - router_before.get(k, 0.0)
                        for k in router_after},
        split_programs=sum(1 for where in placed.values() if len(where) > 1),
        turns_per_replica=turns_per_replica,
        events_per_replica=[None if b is None or a is None else a - b
                            for b, a in zip(events_before, events_after, strict=True)],
        untracked_turns=client_turns - sum(turns_per_replica))


# -- replicas ---------------------------------------------------------------------------------
def start_replicas(n: int, policy: str, profile: str, num_gpu_blocks: int,
                   out: Path, startup_timeout_s: float = 240.0) -> list[ServerProcess]:
    """``n`` emulated replicas started side by side; all stopped again if one fails (or is
    not up within ``startup_timeout_s``)."""
    replicas = [ServerProcess(policy=policy, profile=profile,
                              serve_args=["--max-model-len",
                                          str(served_max_model_len(num_gpu_blocks))],
                              vllm_args=["--num-gpu-blocks-override", str(num_gpu_blocks),
                                         "--enable-log-requests"],
                              log_path=out / f"replica-{i}.log",
                              # INFO: the request log says which replica served a turn (a
                              # caller's VLLM_LOGGING_LEVEL=ERROR would hide it)
                              env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_LOGGING_LEVEL": "INFO"},
                              startup_timeout_s=startup_timeout_s)
                for i in range(n)]
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(r.start) for r in replicas]
        errors = [f.exception() for f in futures]
    failed = [e for e in errors if e is not None]
    if failed:
        for r in replicas:
            r.stop()
        if isinstance(failed[0], ServerStartError):
            raise RouterBaselineError(f"a replica did not start: {failed[0]}")
        raise failed[0]
    return replicas


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
    if importlib.util.find_spec("vllm_router") is None:
        raise RouterBaselineInputError("the `vllm-router` package is not installed; run "
                                       "`.venv/bin/pip install vllm-router==0.1.17`")
    try:
        trace = make_trace(options.trace, options.programs, options.jps, options.seed)
        http_replay.scale_trace(trace, options.time_scale)  # validates the scale
    except (BenchError, ValueError) as exc:
        raise RouterBaselineInputError(str(exc)) from None

    out = Path(options.out)
    # SIGTERM must unwind through the `finally` below, or the replicas outlive us
    previous = signal.signal(signal.SIGTERM, _interrupt)
    replicas: list[ServerProcess] = []
    results: list[ModeResult] = []
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
    except (RouterBaselineError, HttpReplayError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; replicas and router stopped", file=sys.stderr)
        return 130
    finally:
        for r in replicas:
            r.stop()
        signal.signal(signal.SIGTERM, previous)
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


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value
