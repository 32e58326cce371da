"""What the cluster tests share (not a test module): the NIXL transfer counters a served
engine reports, one turn of a P/D program through a router, a cluster file written for the
launcher, the streamed lines a `RouterProxy` reply relays, and `harness cluster bench` options
parsed as the command line would."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cli import cluster as cluster_cli


def nixl_bytes(url: str) -> tuple[float, float]:
    """(bytes, reads) vLLM's NIXL connector metrics report on an engine (`/metrics`)."""
    total = count = 0.0
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == "vllm:nixl_bytes_transferred_sum":
                total += sample.value
            elif sample.name == "vllm:nixl_bytes_transferred_count":
                count += sample.value
    return total, count


def offload_store_bytes(url: str) -> float:
    """Bytes vLLM's offloading connector reports stored to the CPU tier on an engine."""
    return sum(sample.value
               for family in text_string_to_metric_families(httpx.get(url + "/metrics").text)
               for sample in family.samples
               if sample.name.startswith("vllm:kv_offload_store_bytes"))


def bench_args(**over: Any) -> argparse.Namespace:
    """`harness cluster bench`'s defaults with `over` set, as its parser would give them."""
    parser = argparse.ArgumentParser()
    cluster_cli.add_bench_arguments(parser)
    args = parser.parse_args([])
    for key, value in over.items():
        setattr(args, key, value)
    return args


def pd_turn(router_url: str, model: str, prompt: list[int], turn: int, answer: int
            ) -> tuple[httpx.Response, list[int]]:
    """Turn `turn` of program `pd-2` through a 1P1D router: prefilled on `p`, decoded on `d`
    (its `answer` tokens emulated); the reply and the output token ids."""
    reply = httpx.post(router_url + "/v1/completions", timeout=60, json={
        "model": model, "prompt": prompt, "max_tokens": answer, "session_id": "pd-2",
        "return_token_ids": True,
        "vllm_xargs": {"turn": turn, "emulate_output_tokens": answer}})
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-harness-prefill"] == "p"
    assert reply.headers["x-harness-replica"] == "d"
    return reply, reply.json()["choices"][0]["token_ids"]


def cluster_file(tmp_path: Path, replicas: list[dict[str, Any]], name: str = "t",
                 strategy: str = "session", **router: Any) -> Path:
    """A cluster file of `replicas` behind a `strategy` router (with `router`'s options)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "router": {"strategy": strategy, **router},
                                "replicas": replicas}))
    return path


async def relayed(reply: Any) -> list[str]:
    """The `data:` lines of a streamed `Reply`, read as a web framework would."""
    assert reply.stream is not None
    text = b"".join([chunk async for chunk in reply.stream]).decode()
    return [line for line in text.splitlines() if line.startswith("data: ")]
