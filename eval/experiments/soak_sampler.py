"""What the soak samples every few seconds: memory of the server's processes, what the
scheduler holds for programs, the host tier's use, and the client's own oldest waiting turn.

Why from outside: a leak must be seen the way an operator would see it, without a debugger in
the engine: RSS from the process tree (`psutil`: the API server is the process `harness serve`
became; the engine core is its child named ``EngineCore``), the scheduler's counters from
``GET /v1/agent/events`` (its status file, `server.scheduler.PolicyScheduler.status`), vLLM's
gauges from ``/metrics``.
"""

from __future__ import annotations

import re
import time
from typing import Any, Protocol

import httpx

#: vLLM gauges sampled from /metrics (name -> sample field); with every gauge whose name has
#: ``offload`` in it (the host tier's, where the connector exports them) under ``host_tier``
GAUGES = {"vllm:num_requests_waiting": "server_waiting",
          "vllm:num_requests_running": "server_running",
          "vllm:kv_cache_usage_perc": "kv_usage"}

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)")


class ProcessLike(Protocol):
    """What the sampler reads of a process (`psutil.Process` has it)."""

    def memory_info(self) -> Any: ...
    def children(self, recursive: bool = False) -> list[Any]: ...
    def name(self) -> str: ...
    def cmdline(self) -> list[str]: ...


def engine_cores(api: ProcessLike) -> list[Any]:
    """The engine-core processes under the API server's (vLLM names one ``VLLM::EngineCore``;
    a cluster's launcher has one per replica), none while they start."""
    cores = []
    for child in api.children(recursive=True):
        try:
            if "EngineCore" in child.name() or any("EngineCore" in a for a in child.cmdline()):
                cores.append(child)
        except Exception:  # noqa: BLE001 - a child that exited or is not ours: skip it
            continue
    return cores


def rss(api: ProcessLike | None) -> dict[str, int | None]:
    """RSS in bytes of the top process (the API server; a cluster's launcher and router) and
    of the engine cores under it, summed (None for what is not found)."""
    out: dict[str, int | None] = {"api_rss": None, "engine_rss": None}
    if api is None:
        return out
    try:
        out["api_rss"] = int(api.memory_info().rss)
        cores = engine_cores(api)
        if cores:
            out["engine_rss"] = sum(int(core.memory_info().rss) for core in cores)
    except Exception:  # noqa: BLE001 - the server is restarting or gone: a gap in the series
        pass
    return out


async def scheduler_status(client: httpx.AsyncClient, base: str) -> dict[str, Any] | None:
    """The scheduler's status (the ``scheduler`` part of ``GET /v1/agent/events``), None when
    the server does not answer or the engine has written none yet."""
    try:
        response = await client.get(f"{base}/v1/agent/events", timeout=5.0)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    status = body.get("scheduler") if isinstance(body, dict) else None
    return status if isinstance(status, dict) else None


def status_fields(status: dict[str, Any] | None, now: float) -> dict[str, Any]:
    """The sample's scheduler fields; ``oldest_pin_s``, the oldest pin's age, from its clock
    time (the engine's clock is the wall clock, `time.time()`, on this machine)."""
    if status is None:
        return {"programs_tracked": None, "pinned_now": None, "pinned_blocks": None,
                "oldest_pin_s": None, "events_received": None}
    oldest = status.get("oldest_pin_at")
    return {"programs_tracked": status.get("programs_tracked"),
            "pinned_now": status.get("pinned_now"),
            "pinned_blocks": status.get("pinned_blocks"),
            "oldest_pin_s": round(now - oldest, 3) if oldest is not None else None,
            "events_received": status.get("events_received")}


def parse_gauges(text: str) -> dict[str, Any]:
    """`GAUGES` (summed over label sets) and the host tier's gauges from a /metrics page."""
    out: dict[str, Any] = {"host_tier": {}}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        metric, _labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        if metric in GAUGES:
            out[GAUGES[metric]] = out.get(GAUGES[metric], 0.0) + number
        elif "offload" in metric and not metric.endswith(("_created", "_bucket")):
            out["host_tier"][metric] = out["host_tier"].get(metric, 0.0) + number
    return out


async def gauges(client: httpx.AsyncClient, base: str) -> dict[str, Any]:
    try:
        response = await client.get(f"{base}/metrics", timeout=5.0)
    except httpx.HTTPError:
        return {"host_tier": {}}
    return parse_gauges(response.text) if response.status_code == 200 else {"host_tier": {}}


def summed(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several replicas' fields as one: numbers added, the oldest pin the oldest, the host
    tier's gauges added by name; a field no replica reported stays None."""
    out: dict[str, Any] = {"host_tier": {}}
    for part in parts:
        for key, value in part.items():
            if key == "host_tier":
                for name, number in value.items():
                    out["host_tier"][name] = out["host_tier"].get(name, 0.0) + number
            elif value is None:
                out.setdefault(key, None)
            elif key == "oldest_pin_s":
                out[key] = max(out.get(key) or 0.0, value)
            else:
                out[key] = (out.get(key) or 0) + value
    return out


async def take_sample(client: httpx.AsyncClient, bases: list[str], api: ProcessLike | None,
                      client_side: dict[str, Any]) -> dict[str, Any]:
    """One sample (without its time and phase, which the caller adds) from the servers at
    `bases` (one, or a cluster's live replicas, summed). `client_side`: what the driver knows
    (live clients, requests in flight, the oldest waiting turn's age)."""
    parts = []
    for base in bases:
        part = status_fields(await scheduler_status(client, base), time.time())
        part.update(await gauges(client, base))
        parts.append(part)
    sample: dict[str, Any] = {**rss(api), **client_side}
    sample.update(summed(parts) if parts else status_fields(None, 0.0))
    return sample
