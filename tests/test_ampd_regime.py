"""AMPD's regime map (`eval.ampd.regime`, `harness cluster bench --gpus N --itl-slo ...`): the
deployments every strategy is tuned over, the map's verdict per cell from hand-made rows, the
errors a user mistake gets, and one tiny sweep end to end on the virtual-time cluster."""

from __future__ import annotations

import json
import math

import pytest
from cluster_helpers import bench_args

from cli import cluster as cluster_cli
from eval.ampd import regime as ampd_regime
from eval.ampd.bench import AmpdBenchError, Outputs, Workload
from eval.ampd.regime import Deployment, deployments, regime_map, regime_markdown


def test_deployments_of_8_h20_gpus_for_70b():
    """TP1 is skipped (70B does not fit on one H20); TP2 gives 4 replicas (co-located and the
    three P/D splits), TP4 two (co-located and 1P1D), TP8 one (co-located only); mixed: 2 x 2
    + 1 x 4 = 8 and 1 x 4 + 2 x 2 = 8 (TP8 leaves no GPU for the other role)."""
    deps = deployments("h20x4-llama-3.1-70b", 8, [1, 2, 4, 8])
    assert [d.label for d in deps] == ["TP2 x4", "TP2 1P3D", "TP2 2P2D", "TP2 3P1D",
                                       "TP4 x2", "TP4 1P1D", "TP8 x1",
                                       "TP2 2P + TP4 1D", "TP4 1P + TP2 2D"]
    mixed = deps[-2]
    assert (mixed.profile, mixed.decode_profile, mixed.layout) == (
        "h20x2-llama-3.1-70b", "h20x4-llama-3.1-70b", (2, 1))
    assert len(deployments("h20x4-llama-3.1-70b", 8, [1, 2, 4, 8], mixed=False)) == 7
    assert {d.profile for d in deps if d.tp == 2} == {"h20x2-llama-3.1-70b"}
    assert all(d.gpus == 8 for d in deps)
    # a degree that does not divide the GPUs is not tried
    assert [d.label for d in deployments("h20x4-llama-3.1-70b", 6, [2, 4])] == [
        "TP2 x3", "TP2 1P2D", "TP2 2P1D", "TP2 1P + TP4 1D", "TP4 1P + TP2 1D"]


def test_the_papers_dureader_plan_is_among_the_16_gpu_deployments():
    """AMPD's Table 2: Llama-3.1-70B on DuReader, P TP4 x2 + D TP8 x1 (16 GPUs)."""
    labels = [d.label for d in deployments("h20x4-llama-3.1-70b", 16, [4, 8])]
    assert "TP4 2P + TP8 1D" in labels and "TP8 1P + TP4 2D" in labels


def test_no_fitting_deployment_is_a_clear_error():
    with pytest.raises(AmpdBenchError, match="no deployment of 2 GPUs at TP \\[1\\]"):
        deployments("h20x4-llama-3.1-70b", 2, [1])


def test_ampd_runs_once_per_itl_slo_and_the_baselines_once():
    runs = ampd_regime._runs([Deployment("p", 2, 2, None), Deployment("p", 2, 2, (1, 1))],
                             [0.03, 0.1])
    assert [(k, s) for k, _, s in runs] == [("co-located", None), ("disaggregated", None),
                                            ("dynamo", None), ("ampd", 0.03), ("ampd", 0.1)]


def _row(kind, deployment, by_itl, itl_slo=None):
    return {"trace": "t", "jps": 1.0, "kind": kind, "deployment": deployment,
            "itl_slo": itl_slo, "slo_by_itl": by_itl}


def test_the_map_takes_each_kinds_best_deployment_and_names_the_winner():
    rows = [
        _row("co-located", "TP2 x4", {"0.03": 0.2, "0.1": 0.9}),
        _row("co-located", "TP8 x1", {"0.03": 0.4, "0.1": 0.7}),
        _row("disaggregated", "TP2 2P2D", {"0.03": 0.5, "0.1": 0.6}),
        _row("dynamo", "TP2 1P3D", {"0.03": 0.25, "0.1": 0.3}),
        _row("ampd", "TP2 2P2D", {"0.03": 0.8}, 0.03),
        _row("ampd", "TP2 1P3D", {"0.03": 0.6}, 0.03),
        _row("ampd", "TP2 2P2D", {"0.1": 0.9}, 0.1),
    ]
    tight, loose = regime_map(rows, [0.03, 0.1])
    assert (tight["ampd"], tight["ampd_deployment"]) == (0.8, "TP2 2P2D")
    assert (tight["co-located"], tight["co-located_deployment"]) == (0.4, "TP8 x1")
    assert tight["winner"] == "ampd"
    assert tight["gain_over_co-located"] == pytest.approx(1.0)  # 0.8 vs 0.4: +100 %
    assert tight["gain_over_disaggregated"] == pytest.approx(0.6)
    assert tight["gain_over_dynamo"] == pytest.approx(2.2)  # 0.8 vs 0.25
    assert tight["margin"] == pytest.approx(0.3)
    # a tie goes to the baseline: AMPD has to beat it
    assert loose["winner"] == "co-located" and loose["margin"] == pytest.approx(0.0)
    text = regime_markdown({"maps": {"mean": [tight, loose]}, "gpus": 8, "ttft_slo_s": 2.0,
                            "programs": 4, "seed": 0, "deployments": ["TP2 x4"],
                            "wall_s": 1.0, "command": "harness cluster bench --gpus 8"})
    assert "| t | 1 | 0.03 | 0.800 (TP2 2P2D) | 0.400 (TP8 x1) | 0.500 (TP2 2P2D) | " \
        "0.250 (TP2 1P3D) | ampd | +100% | +60% | +220% |" in text
    assert "AMPD beats every tuned baseline in 1 of 2 cells: t 1 jobs/s ITL 0.03 s" in text


def test_the_map_reads_the_per_token_metric_it_is_asked_for():
    rows = [_row("co-located", "a", {"0.1": 0.9}) | {"slo_by_itl_max": {"0.1": 0.2}},
            _row("disaggregated", "b", {"0.1": 0.5}) | {"slo_by_itl_max": {"0.1": 0.5}},
            _row("ampd", "b", {"0.1": 0.6}, 0.1) | {"slo_by_itl_max": {"0.1": 0.6}}]
    assert regime_map(rows, [0.1])[0]["winner"] == "co-located"
    assert regime_map(rows, [0.1], "max")[0]["winner"] == "ampd"


def test_a_baseline_with_zero_attainment_gives_an_infinite_gain():
    rows = [_row("co-located", "a", {"0.1": 0.0}), _row("disaggregated", "b", {"0.1": 0.0}),
            _row("ampd", "b", {"0.1": 0.5}, 0.1)]
    (cell,) = regime_map(rows, [0.1])
    assert math.isinf(cell["gain_over_co-located"]) and cell["winner"] == "ampd"


@pytest.mark.parametrize(("over", "message"), [
    ({"gpus": 1}, "--gpus must be at least 2"),
    ({"gpus": 8, "itl_slo": "0.03,fast"}, "--itl-slo '0.03,fast': give numbers"),
    ({"gpus": 8, "itl_slo": "0.03,-1"}, "every value must be positive"),
    ({"gpus": 8, "tp": "two"}, "--tp 'two': give numbers"),
    ({"itl_slo": "0.03,0.1"}, "--itl-slo sweeps the regime map: give --gpus too"),
])
def test_bad_regime_input_is_a_clear_error(over, message):
    with pytest.raises(AmpdBenchError, match=message.replace("(", r"\(")):
        cluster_cli.run_bench(bench_args(**over))


@pytest.mark.engine
def test_tiny_regime_sweep_end_to_end(tmp_path):
    """Two H100 GPUs of Llama-3.1-8B at TP1: co-located x2 and 1P1D; the baselines run once
    and are scored against both SLOs, AMPD once per SLO; a looser ITL SLO never lowers a
    baseline's attainment (same turns, a weaker bound)."""
    summary = ampd_regime.regime(
        Workload(["hotpotqa"], 4, 0), {"hotpotqa": [1.0]},
        ampd_regime.DeploymentSpace(2, "h100-llama-3.1-8b", [1]),
        ampd_regime.SloGrid([0.005, 0.1], 2.0), outputs=Outputs(tmp_path))
    kinds = [(r["kind"], r["deployment"], r["itl_slo"]) for r in summary["rows"]]
    assert kinds == [("co-located", "TP1 x2", None), ("disaggregated", "TP1 1P1D", None),
                     ("dynamo", "TP1 1P1D", None),
                     ("ampd", "TP1 1P1D", 0.005), ("ampd", "TP1 1P1D", 0.1)]
    for r in summary["rows"][:3]:
        assert r["slo_by_itl"]["0.005"] <= r["slo_by_itl"]["0.1"]
    assert [c["itl_slo"] for c in summary["maps"]["mean"]] == [0.005, 0.1]
    # per-token bounds are stricter than the mean: the same turns meet them less often
    for r in summary["rows"]:
        for x, mean in r["slo_by_itl"].items():
            assert r["slo_by_itl_max"][x] <= r["slo_by_itl_p90"][x] + 1e-9
            assert r["slo_by_itl_max"][x] <= mean + 1e-9
    written = json.loads((tmp_path / "regime.json").read_text())
    assert written["deployments"] == ["TP1 x2", "TP1 1P1D"]
    assert "| hotpotqa | 1 | 0.1 |" in (tmp_path / "regime.md").read_text()


def test_a_run_that_could_not_finish_is_no_candidate_and_is_listed():
    rows = [_row("co-located", "TP2 x4", {"0.1": 0.5}),
            _row("disaggregated", "TP2 2P2D", {}) | {"failed": "NoProgress: stuck with 5"},
            _row("ampd", "TP2 2P2D", {}, 0.1) | {"failed": "NoProgress: stuck"}]
    (cell,) = regime_map(rows, [0.1])
    assert math.isnan(cell["ampd"]) and cell["disaggregated_deployment"] == "-"
    assert cell["winner"] == "co-located"
    text = regime_markdown({"maps": {"max": [cell]}, "rows": rows, "gpus": 8, "ttft_slo_s": 2.0,
                            "programs": 4, "seed": 0, "deployments": [], "wall_s": 1.0})
    assert "## ITL SLO on every token gap of the turn (its longest)" in text
    assert "- t 1 jobs/s, disaggregated TP2 2P2D: NoProgress: stuck" in text
    assert "- t 1 jobs/s, ampd TP2 2P2D (ITL 0.1 s): NoProgress: stuck" in text
