"""Sessions per GPU at a P95 TTFT bound (`harness bench --capacity`): the search finds the
exact flip, the command refuses what does not go with it, and a tiny replay-backed search
reports the flip it found with the P95 on both sides."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from common.metrics import SLO
from eval.bench.capacity import capacity, capacity_markdown, gpu_count, largest_passing
from eval.bench.runs import BenchSpec, Workload
from eval.bench.specs import BenchError
from eval.bench.virtual import SingleEngine
from server.engine_spec import EngineSpec
from server.policies.spec import PolicySpec


@pytest.mark.parametrize("upper", [1, 2, 7, 64, 100])
def test_the_search_finds_where_a_predicate_flips_asking_each_n_once(upper):
    for flip in range(upper + 1):  # passes up to `flip`, fails after
        asked: list[int] = []

        def passes(n: int, flip: int = flip, asked: list[int] = asked) -> bool:
            assert 1 <= n <= upper
            asked.append(n)
            return n <= flip

        assert largest_passing(passes, upper) == flip
        assert len(asked) == len(set(asked))
        if flip < upper:  # the P95 on both sides of the flip is known
            assert flip + 1 in asked
        assert len(asked) <= 2 * math.ceil(math.log2(upper + 1)) + 1


def test_the_search_needs_at_least_one_program():
    with pytest.raises(ValueError, match="upper must be at least 1"):
        largest_passing(lambda n: True, 0)


def test_sessions_per_gpu_divide_by_the_profiles_gpus():
    assert gpu_count("h100-llama-3.1-8b") == 1
    assert gpu_count("h100x4-llama-3.1-8b") == 4


@pytest.mark.parametrize("args, message", [
    (["--slo-ttft-p95", "2"], "--slo-ttft-p95 is the bound of a --capacity search"),
    (["--capacity", "--jps", "1"], "leave out --jps and --concurrency"),
    (["--capacity", "--concurrency", "4"], "leave out --jps and --concurrency"),
    (["--capacity", "--url", "http://127.0.0.1:9"], "leave out --url"),
    (["--capacity", "--cluster", "cluster/examples/colocated-1.yaml"], "leave out --cluster"),
    (["--capacity", "--slo-ttft-p95", "0"], "--slo-ttft-p95 must be a positive"),
    (["--capacity", "--slo-ttft-p95", "nan"], "--slo-ttft-p95 must be a positive"),
])
def test_capacity_refuses_bad_input_in_one_line(tmp_path, capsys, args, message):
    assert main(["bench", "--trace", "swe", "--programs", "2", *args,
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_the_report_marks_a_search_the_trace_cut_short():
    data = {"trace_name": "t", "programs": 4, "profile": "p", "seed": 0, "offload_gib": 64.0,
            "disk_gib": None, "slo_ttft_p95_s": 2.0,
            "results": [{"policy": "vllm", "sessions": 4, "gpus": 2, "sessions_per_gpu": 2.0,
                         "ttft_p95_s": 0.5, "next_ttft_p95_s": math.nan, "jct_mean_s": 9.0,
                         "limited_by_programs": True, "probes": [{}, {}, {}]}]}
    text = capacity_markdown(data)
    assert "host KV tier 64 GiB" in text
    assert "| vllm | 4+ | 2.00 | 0.500 | - | 9.00 | 3 |" in text


@dataclass(frozen=True)
class _NoIsolated(SingleEngine):
    """The search needs no isolated JCTs (only their ratio column does): skipping them keeps
    the test to its four probes."""

    def isolated(self, trace: Any, out: Path, progress: Any) -> tuple[dict[str, float], None]:
        return {p.id: 1.0 for p in trace.programs}, None


@pytest.mark.engine
def test_a_replayed_search_stops_where_the_p95_ttft_crosses_the_bound(tmp_path):
    """Three SWE programs on one engine: P95 TTFT 0.053 s one at a time, 0.099 s two at once,
    0.136 s all three; a 0.12 s bound flips between 2 and 3."""
    engine = EngineSpec(profile="h100-llama-3.1-8b")
    spec = BenchSpec(Workload("swe", 3), ("vllm",), slo=SLO())
    backend = _NoIsolated(engine, (PolicySpec.named("vllm"),))
    data = capacity(spec, backend, 0.12, tmp_path)
    (result,) = data["results"]
    probes = {row["concurrency"]: row["ttft_p95_s"] for row in result["probes"]}
    n = result["sessions"]
    assert n == 2 and probes[n] <= 0.12 < probes[n + 1]
    assert result["ttft_p95_s"] == probes[n] and result["sessions_per_gpu"] == n
    assert sorted(probes) == [1, 2, 3]
    # each probe is a bench run: its records where `harness bench --concurrency N` puts them
    assert (tmp_path / "runs" / f"vllm-jpsclosed{n}.json").exists()
    assert json.loads((tmp_path / "capacity.json").read_text())["slo_ttft_p95_s"] == 0.12
    assert "| vllm |" in (tmp_path / "capacity.md").read_text()
    with pytest.raises(BenchError, match="leave out --jps"):
        capacity(BenchSpec(Workload("swe", 4, jps=(1.0,)), ("vllm",)), backend, 2.0, tmp_path)
