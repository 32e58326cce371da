"""`harness cluster bench` (eval.ampd.bench): a tiny AMPD-vs-baseline sweep end to end on the
real virtual-time cluster, the layouts it builds, and the errors a user mistake gets."""

from __future__ import annotations

import json
import math

import pytest
from cluster_helpers import bench_args

from cli import cluster as cluster_cli
from common.metrics import SLO
from eval.ampd import bench as ampd_bench
from eval.ampd.bench import (
    STRATEGIES,
    AmpdBenchError,
    Fleet,
    Outputs,
    RunConfig,
    Workload,
    cluster_config,
    node_of,
)
from eval.workloads.registry import load_or_generate

PROFILE = "h100-llama-3.1-8b"


@pytest.mark.engine
def test_tiny_sweep_routes_local_and_remote_and_writes_rows(tmp_path):
    """AMPD on 1P1D with a TTFT SLO near the prefill replica's own latency (its prefills take
    about 0.04 s here): while its windowed TTFT is <= 0.9 x the SLO a later turn goes remote,
    otherwise local (the decode replica has ITL slack), so both kinds occur; co-located vLLM
    prefills everything locally. Every row has finite metrics and the files are written."""
    slo = SLO(ttft_s=0.04, tpot_s=0.1)
    configs = [RunConfig(STRATEGIES["ampd"], (1, 1)), RunConfig(STRATEGIES["vllm"], None)]
    summary = ampd_bench.bench(Workload(["hotpotqa"], 6, 1), configs, [2.0],
                               Fleet(2, PROFILE, num_gpu_blocks=4096), slo=slo,
                               outputs=Outputs(tmp_path), plot=True)
    rows = {r["config"]: r for r in summary["rows"]}
    assert set(rows) == {"ampd 1P1D", "vllm"}
    ampd, vllm = rows["ampd 1P1D"], rows["vllm"]
    turns = 6 * 3  # hotpotqa programs have exactly 3 rounds
    for row in (ampd, vllm):
        assert row["programs"] == 6 and row["turns"] == turns
        for key in ("jct_mean_s", "jct_p90_s", "ttft_mean_s", "itl_mean_s", "slo_attainment",
                    "ttft_slo_attainment", "itl_slo_attainment"):
            assert math.isfinite(row[key]), (row["config"], key)
        assert 0.0 <= row["slo_attainment"] <= min(row["ttft_slo_attainment"],
                                                   row["itl_slo_attainment"])
        assert row["jct_p90_s"] >= row["jct_mean_s"] * 0.5
    decisions = ampd["decisions"]
    assert sum(v for k, v in decisions.items() if k.startswith("initial_")) == 6
    assert sum(decisions.values()) == turns  # every prefill, initial ones too (D1)
    local = sum(v for k, v in decisions.items() if "local_" in k)
    remote = turns - local
    assert local > 0 and remote > 0
    assert ampd["local_prefills"] == local and ampd["remote_prefills"] == remote
    assert 0.0 < ampd["local_prefill_share"] < 1.0
    assert ampd["kv_bytes_moved"] > 0
    # history pull (the default): a remote prefill after a local turn reads the history from
    # the decode replica's export instead of recomputing it
    assert ampd["kv_bytes_to_prefill"] > 0
    assert vllm["decisions"] == {} and vllm["local_prefill_share"] == 1.0
    assert vllm["kv_bytes_moved"] == 0
    written = json.loads((tmp_path / "rows.json").read_text())
    assert written["slo"] == {"ttft_s": 0.04, "itl_s": 0.1}
    assert [r["config"] for r in written["rows"]] == ["ampd 1P1D", "vllm"]
    report = (tmp_path / "report.md").read_text()
    assert "| hotpotqa | 2 | ampd 1P1D |" in report
    assert "init " in report
    assert (tmp_path / "slo_vs_load.png").stat().st_size > 0


@pytest.mark.engine
def test_history_recompute_recomputes_what_pull_reads(tmp_path):
    """The same AMPD run with `recompute`: no KV flows decode -> prefill, and the history a
    prefill replica lacks after a local turn is computed again."""
    trace = load_or_generate("hotpotqa", 6, 2.0, 1)
    run = RunConfig(STRATEGIES["ampd"], (1, 1))
    rows = {h: ampd_bench.run_one(trace, run, Fleet(2, PROFILE, num_gpu_blocks=4096, history=h),
                                  slo=SLO(0.04, 0.1), seed=1)
            for h in ("pull", "recompute")}
    assert rows["recompute"]["kv_bytes_to_prefill"] == 0
    assert rows["pull"]["kv_bytes_to_prefill"] > 0
    assert rows["recompute"]["recomputed_tokens"] > rows["pull"]["recomputed_tokens"]
    with pytest.raises(AmpdBenchError, match="--history 'fetch'"):
        ampd_bench.run_one(trace, run, Fleet(2, PROFILE, history="fetch"), slo=SLO(), seed=1)


def test_layouts_fill_nodes_and_carry_the_slo():
    """Replicas fill 8-GPU nodes in order, prefill and decode interleaved; the router gets the
    run's SLO and seed; co-located strategies get `session` routing."""
    slo = SLO(1.5, 0.05)
    config = cluster_config(RunConfig(STRATEGIES["ampd"], (2, 2)), replicas=4,
                            profile="h20x4-llama-3.1-70b", slo=slo, seed=3)
    assert [(r.name, r.role, r.node, str(r.policy)) for r in config.replicas] == [
        ("p0", "prefill", 0, "ampd"), ("d0", "decode", 0, "ampd"),
        ("p1", "prefill", 1, "ampd"), ("d1", "decode", 1, "ampd")]
    assert (config.router.strategy, config.router.ttft_slo_s, config.router.itl_slo_s,
            config.router.seed) == ("ampd", 1.5, 0.05, 3)
    one = cluster_config(RunConfig(STRATEGIES["pd"], (1, 3)), replicas=4,
                         profile="h20x4-llama-3.1-70b", slo=slo, seed=0)
    assert [(r.name, r.node) for r in one.replicas] == [("p0", 0), ("d0", 0), ("d1", 1),
                                                        ("d2", 1)]
    co = cluster_config(RunConfig(STRATEGIES["continuum"], None), replicas=4,
                        profile=PROFILE, slo=slo, seed=0)
    assert co.router.strategy == "session"
    assert {r.role for r in co.replicas} == {"colocated"}
    assert [r.node for r in co.replicas] == [0, 0, 0, 0]  # TP1: all four on one node


def test_mixed_tp_replicas_take_their_roles_profile_and_stay_inside_a_node():
    """The paper's DuReader plan, P TP4 x2 + D TP8 x1 on two 8-GPU nodes, interleaved p0, d0,
    p1, first fit: p0 takes 4 of node 0; d0 (8) does not fit its other 4, so node 1; p1 takes
    node 0's last 4."""
    config = cluster_config(RunConfig(STRATEGIES["ampd"], (2, 1)), replicas=3,
                            profile="h20x4-llama-3.1-70b", slo=SLO(2.0, 0.05), seed=0,
                            decode_profile="h20x8-llama-3.1-70b")
    assert [(r.name, r.profile, r.node) for r in config.replicas] == [
        ("p0", "h20x4-llama-3.1-70b", 0), ("d0", "h20x8-llama-3.1-70b", 1),
        ("p1", "h20x4-llama-3.1-70b", 0)]
    assert node_of([4, 4, 4, 4]) == [0, 0, 1, 1]  # one degree: k * tp // 8, as before
    assert node_of([2, 4, 2]) == [0, 0, 0]


@pytest.mark.parametrize(("over", "message"), [
    ({"layouts": "1p2d"}, "1p2d has 3 replicas but --replicas is 4"),
    ({"layouts": "3x1"}, "write prefill and decode replica counts as e.g. 1p3d"),
    ({"strategies": "ampd,sglang"}, "unknown 'sglang'"),
    ({"traces": "hotpot"}, "unknown 'hotpot'; AMPD's workloads are"),
    ({"jps": "1,fast"}, "give numbers separated by commas"),
    ({"jps": "0"}, "loads must be positive"),
    ({"slo_ttft": -1.0}, "--slo-ttft must be a positive number"),
    ({"programs": 0}, "--programs must be at least 1"),
    ({"profile": "h20x4-llama-9b"}, "--profile 'h20x4-llama-9b'"),
])
def test_bad_input_is_a_clear_error(over, message):
    with pytest.raises(AmpdBenchError, match=message.replace("(", r"\(")):
        cluster_cli.run_bench(bench_args(**over))


def test_cli_prints_the_error_without_a_traceback(capsys):
    from cli.main import main

    assert main(["cluster", "bench", "--layouts", "2p1d"]) == 2
    err = capsys.readouterr().err
    assert "harness: error: --layouts: 2p1d has 3 replicas" in err
    assert "Traceback" not in err
