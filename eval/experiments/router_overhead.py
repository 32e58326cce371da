"""What the served router adds to each request: the same closed-loop load through a running
`harness cluster serve` (local launcher or Ray Serve) and straight to its replicas' engines.

Why: the router sits on every turn's path (on Ray: Serve's HTTP proxy, our ingress, then a
Serve call to the replica actor, which relays to its engine, or with `--transport http` the
engine itself); its latency is a cost
the routing must earn back. The engines are the router's own (their URLs from `GET
/v1/cluster`: `engine_url` on Ray, `url` for local replicas), so only the path differs.

Load: `programs` programs at once, each `turns` sequential one-token turns (`max_tokens` 1,
`emulate_output_tokens` 1) with its session id; direct, program i goes to engine i mod N.
Reported: P50 / P99 / mean of the per-request latency both ways, and their difference.

    harness eval router-overhead --url http://127.0.0.1:8000 --programs 64 --turns 8
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from eval import ExperimentError


class RouterOverheadError(ExperimentError):
    """A measurement that cannot be made as asked (printed without a traceback)."""


@dataclass(frozen=True)
class RouterOverheadOptions:
    """One measurement (each field is an option of `harness eval router-overhead`)."""

    url: str = field(metadata={"help": "the running `harness cluster serve` router"})
    programs: int = field(default=64, metadata={"help": "programs at once"})
    turns: int = field(default=8, metadata={"help": "one-token turns per program"})
    prompt_words: int = field(default=64, metadata={"help": "words of each turn's prompt"})

    def __post_init__(self) -> None:
        if self.programs < 1 or self.turns < 1 or self.prompt_words < 1:
            raise RouterOverheadError("--programs, --turns and --prompt-words must be at "
                                      "least 1")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


async def _load(targets: list[str], model: str, options: RouterOverheadOptions,
                tag: str) -> list[float]:
    """Per-request latencies (s) of the closed loop; program i goes to targets[i % N]."""
    limits = httpx.Limits(max_connections=options.programs * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def program(i: int) -> list[float]:
            target = targets[i % len(targets)]
            words = " ".join(f"w{i}-{k}" for k in range(options.prompt_words))
            out = []
            for turn in range(options.turns):
                body = {"model": model, "max_tokens": 1, "session_id": f"{tag}-{i}",
                        "messages": [{"role": "user", "content": f"{words} turn {turn}"}],
                        "vllm_xargs": {"turn": turn, "emulate_output_tokens": 1}}
                started = time.perf_counter()
                answer = await client.post(target + "/v1/chat/completions", json=body)
                if answer.status_code != 200:
                    raise ExperimentError(f"{target} answered {answer.status_code}: "
                                     f"{answer.text[:200]}")
                out.append(time.perf_counter() - started)
            return out

        runs = await asyncio.gather(*(program(i) for i in range(options.programs)))
    return [x for run in runs for x in run]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": percentile(values, 50) * 1e3, "p99_ms": percentile(values, 99) * 1e3,
            "mean_ms": statistics.fmean(values) * 1e3, "requests": len(values)}


def measure(options: RouterOverheadOptions) -> dict[str, Any]:
    """Both loads (direct first, then through the router) and their summaries."""
    url = options.url.rstrip("/")
    try:
        state = httpx.get(url + "/v1/cluster", timeout=10).json()
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise ExperimentError(f"no served cluster answers at {url}: {exc}") from None
    engines = [r.get("engine_url") or r["url"] for r in state["replicas"]
               if r["role"] == "colocated" and r["alive"]]
    if not engines:
        raise ExperimentError("router-overhead needs a colocated cluster with live replicas")
    stamp = f"{int(time.time())}"
    direct = asyncio.run(_load(engines, model, options, f"direct-{stamp}"))
    routed = asyncio.run(_load([url], model, options, f"routed-{stamp}"))
    d, r = summary(direct), summary(routed)
    return {"direct": d, "router": r,
            "added": {k: r[k] - d[k] for k in ("p50_ms", "p99_ms", "mean_ms")},
            "replicas": len(engines), "ray": any("engine_url" in x for x in state["replicas"])}


def run_router_overhead(options: RouterOverheadOptions) -> int:
    result = measure(options)
    print(f"router overhead at {options.url} ({'Ray Serve' if result['ray'] else 'local'}, "
          f"{result['replicas']} replicas), {options.programs} programs x {options.turns} "
          "one-token turns:")
    for name in ("direct", "router", "added"):
        row = result[name]
        print(f"  {name:7s} P50 {row['p50_ms']:8.1f} ms  P99 {row['p99_ms']:8.1f} ms  "
              f"mean {row['mean_ms']:8.1f} ms")
    return 0
