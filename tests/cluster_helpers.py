"""What the cluster tests share (not a test module): the NIXL transfer counters a served
engine reports, and `harness cluster bench` options parsed as the command line would."""

from __future__ import annotations

import argparse
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


def bench_args(**over: Any) -> argparse.Namespace:
    """`harness cluster bench`'s defaults with `over` set, as its parser would give them."""
    parser = argparse.ArgumentParser()
    cluster_cli.add_bench_arguments(parser)
    args = parser.parse_args([])
    for key, value in over.items():
        setattr(args, key, value)
    return args
