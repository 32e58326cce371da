"""Routers in front of emulated replicas, as processes, and one replay of a trace through them.

`RouterProcess` runs a router (any command) in its own process group; `VllmRouter` is
`vllm-router` with a routing policy (`router_argv`; the program-scheduling options come from
`eval.replay.program_scheduling`). `start_replicas` starts N emulated `harness serve` replicas
that log the requests they serve, and `run_front` replays a trace through a router in front of
them (`eval.replay.http_replay`, every request tagged ``rb.<session>.<turn>`` so each replica's
log says which turns it served), resetting their prefix caches first and reading their counters
and logs around it: a `ModeResult`. The experiments that compare routers stand on it
(`eval.experiments.router_baseline`, `eval.experiments.served_comparison`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx

from cluster import pd
from common.processes import free_port, stop_process_group, wait_until_answers
from common.trace import Trace
from eval.replay.http_replay import (
    SERVER_COUNTERS,
    Driver,
    DriverFactory,
    RequestOptions,
    http_replay_metrics,
    replay_over_http,
    scrape_counters,
)
from eval.replay.program_scheduling import metric_totals
from harness.model_client import SESSION_HEADER
from harness.server_process import ServerProcess, ServerStartError
from server.max_model_len import BLOCK_SIZE, SERVED_MAX_MODEL_LEN, served_max_model_len
from server.perf.hardware import NVLINK
from sim.conversation import too_long_turns


class RouterError(RuntimeError):
    """A router or replica would not start, or what it needs is missing; the message says
    what."""


# -- vllm-router ---------------------------------------------------------------------------------
#: the vllm-router release whose behaviour with our traffic was read and is relied on
VLLM_ROUTER_REQUIREMENT = "vllm-router==0.1.17"


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
        state = wait_until_answers(self.process, f"{self.url}/v1/models",
                                   self.startup_timeout_s, poll_s=0.5)
        if state == "ready":
            return self
        if state == "exited":
            raise RouterError(f"{self.name} exited with {self.process.returncode} "
                              f"(log {self.log_path}):\n{self._tail()}")
        self.stop()
        raise RouterError(f"{self.name} did not answer within "
                          f"{self.startup_timeout_s:.0f} s (log {self.log_path}):\n"
                          f"{self._tail()}")

    def stop(self) -> None:
        if self.process is not None:
            stop_process_group(self.process, grace_s=10.0)

    def __enter__(self) -> RouterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: our router's counters a comparison records (`GET /v1/cluster`), as ``ours:NAME``: turns
#: whose program moved, turns a global queue held; and a program scheduler's books where the
#: router keeps them (``ours:programs.pauses``, ...)
OUR_ROUTER_COUNTERS = ("rebinds", "held")


class OurRouter(RouterProcess):
    """Our served router (`cluster.router_app`) as a child process, whose own decisions a
    comparison records from its `GET /v1/cluster` (`router_metrics`)."""

    def router_metrics(self) -> dict[str, float]:
        try:
            response = httpx.get(f"{self.url}/v1/cluster", timeout=5)
        except httpx.HTTPError:
            return {}
        if response.status_code != 200:
            return {}
        body = response.json()
        counters = body.get("counters") or {}
        out = {f"ours:{k}": float(counters[k]) for k in OUR_ROUTER_COUNTERS if k in counters}
        for key, value in (body.get("programs") or {}).items():
            out[f"ours:programs.{key}"] = float(value)
        return out


def vllm_router_missing() -> str | None:
    """What to do when the `vllm-router` package is not installed (None: it is), for each
    caller to raise as its own error before anything starts."""
    if importlib.util.find_spec("vllm_router") is not None:
        return None
    return ("the `vllm-router` package is not installed; run "
            f"`.venv/bin/pip install {VLLM_ROUTER_REQUIREMENT}`")


class VllmRouter(RouterProcess):
    """`vllm-router` with ``policy`` in front of ``workers`` (``extra``: more options)."""

    def __init__(self, policy: str, workers: Sequence[str], log_path: Path,
                 startup_timeout_s: float = 60.0, extra: Sequence[str] = ()) -> None:
        port = free_port()
        self.metrics_port = free_port()
        super().__init__(router_argv(policy, workers, port, self.metrics_port, extra), port,
                         log_path, name="vllm-router", startup_timeout_s=startup_timeout_s)

    def start(self) -> RouterProcess:
        missing = vllm_router_missing()
        if missing:
            raise RouterError(missing)
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
    mode measures the body alone. Everything else is the wrapped client's."""

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


def tagging_driver(session_header: bool) -> DriverFactory:
    """A `DriverFactory` for `replay_over_http` whose requests go through `_TaggingClient`."""
    def make(trace: Trace, client: httpx.AsyncClient, base: str, model: str, run_id: str,
             progress: Callable[[int], None] | None) -> Driver:
        tagged = cast(httpx.AsyncClient, _TaggingClient(client, session_header))
        return Driver(trace, tagged, base, model, run_id, progress)
    return make


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
            return await scrape_counters(client, url)
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
    """One replay through a front (a mode of `harness eval router-baseline`, a system of
    `harness eval served-comparison`): its metrics and where its turns went."""

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
    with front as entered:
        router_before = observe() if observe else {}
        result = replay_over_http(trace, entered.url, time_scale=time_scale,
                                  requests=RequestOptions(
                                      agentic_context=agentic_context,
                                      driver=tagging_driver(session_header)))
        router_after = observe() if observe else {}
    time.sleep(0.5)  # the last step's statistics reach /metrics (and the logs) just after
    after = [_scrape(u) for u in urls]
    events_after = [_events_received(u) for u in urls]
    # the router proxies /metrics to one replica: replace its figures with the replicas' sum
    server: dict[str, float] = {}
    for b, a in zip(before, after, strict=True):
        for key in SERVER_COUNTERS:
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
def check_replicas_fit(trace: Trace, num_gpu_blocks: int) -> None:
    """Refuse, before any replica starts, a trace with a turn longer than `start_replicas`'
    replicas take (`served_max_model_len`): the replica would answer it with a 400 mid-run,
    after minutes of the other systems' runs. A ValueError naming the programs and the
    `num_gpu_blocks` that would hold them."""
    limit = served_max_model_len(num_gpu_blocks)
    long = too_long_turns(trace, limit)
    if not long:
        return
    most = max(tokens for _, _, tokens in long)
    shown = "; ".join(f"{pid} turn {turn}: {tokens:,} tokens" for pid, turn, tokens in long[:3])
    more = f" (and {len(long) - 3} more)" if len(long) > 3 else ""
    fix = (f"give --num-gpu-blocks {-(-most // BLOCK_SIZE) + 1} or more"
           if most <= SERVED_MAX_MODEL_LEN else
           f"no replica takes over {SERVED_MAX_MODEL_LEN:,}: choose fewer programs or a seed")
    raise ValueError(f"{len(long)} program(s) have a turn longer than a replica of "
                     f"{num_gpu_blocks} blocks takes ({limit:,} tokens): {shown}{more}; {fix}")


def start_replicas(n: int, policy: str, profile: str, num_gpu_blocks: int,
                   out: Path, startup_timeout_s: float = 240.0,
                   carry_kv: bool = False) -> list[ServerProcess]:
    """``n`` emulated replicas started side by side; all stopped again if one fails (or is
    not up within ``startup_timeout_s``). ``carry_kv``: each runs vLLM's NIXL connector as
    `kv_both` (engine id ``r{i}``, links to its peers over NVLink, its own side channel), so
    a router may move a program's KV between them (`cluster.pd`)."""
    replicas = []
    for i in range(n):
        vllm_args = ["--num-gpu-blocks-override", str(num_gpu_blocks), "--enable-log-requests"]
        env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_LOGGING_LEVEL": "INFO"}
        if carry_kv:  # vLLM's own option, after `harness serve`'s
            vllm_args += pd.serve_args(pd.kv_transfer_config(f"r{i}", "colocated",
                                                             {"*": NVLINK}))
            env.update(pd.side_channel_env(free_port()))
        replicas.append(ServerProcess(
            policy=policy, profile=profile,
            serve_args=["--max-model-len", str(served_max_model_len(num_gpu_blocks))],
            vllm_args=vllm_args,
            log_path=out / f"replica-{i}.log",
            # INFO: the request log says which replica served a turn (a caller's
            # VLLM_LOGGING_LEVEL=ERROR would hide it)
            env=env, startup_timeout_s=startup_timeout_s))
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(r.start) for r in replicas]
        errors = [f.exception() for f in futures]
    failed = [e for e in errors if e is not None]
    if failed:
        for r in replicas:
            r.stop()
        if isinstance(failed[0], ServerStartError):
            raise RouterError(f"a replica did not start: {failed[0]}")
        raise failed[0]
    return replicas


def jsonable(value: Any) -> Any:
    """``value`` for JSON: NaN and infinities as None, keys as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value
