"""`eval.replay.program_scheduling` and `eval.experiments.served_comparison` on small inputs:
the calibration against the profile it comes from, the router's configuration and command line,
its metrics counted, the systems parsed and grouped, and the table. No server, no router
process."""

from __future__ import annotations

import json

import pytest

from eval.experiments.served_comparison import (
    ServedComparisonInputError,
    aggregate,
    by_policy,
    decisions_text,
    format_means,
    format_table,
    our_router_argv,
    parse_systems,
    router_spec,
)
from eval.replay.program_scheduling import (
    calibrate,
    config_argument,
    decision_counts,
    metric_totals,
    scheduling_config,
)
from eval.replay.routers import ModeResult, router_argv
from server.perf.registry import load_profile

ROUTER_METRICS = """\
# HELP vllm_router_agent_aware_transitions_total Committed Program scheduling transitions
# TYPE vllm_router_agent_aware_transitions_total counter
vllm_router_agent_aware_transitions_total{target="http://a:1",reason="program_admit"} 5
vllm_router_agent_aware_transitions_total{target="http://b:2",reason="program_admit"} 3
vllm_router_agent_aware_transitions_total{target="http://a:1",reason="ttl_expired"} 4
vllm_router_agent_aware_queue_wait_seconds_bucket{target="http://a:1",le="0.5"} 2
vllm_router_agent_aware_queue_wait_seconds_sum{target="http://a:1"} 0.75
vllm_router_agent_aware_queue_wait_seconds_count{target="http://a:1"} 2
vllm_router_agent_aware_queue_wait_seconds_sum{target="http://b:2"} 0.25
vllm_router_agent_aware_queue_wait_seconds_count{target="http://b:2"} 1
vllm_router_agent_aware_rank_queue_size{target="http://a:1"} 0
vllm_router_agent_aware_armed_ttl_seconds_sum{target="http://a:1",source="fitted"} 3
vllm_router_agent_aware_armed_ttl_seconds_count{target="http://a:1",source="fitted"} 3
vllm_router_agent_aware_armed_ttl_seconds_count{target="http://a:1",source="request"} 1
vllm_router_requests_total{route="/v1/completions"} 12
"""


def test_calibration_reproduces_the_profile() -> None:
    profile = load_profile("h100-llama-3.1-8b")
    c = calibrate(profile)
    for n in (1000, 8000, 30000):  # the router's cold-prefill estimate vs the profile's
        x = n / 1000
        estimate = (c.intercept_seconds + c.linear_seconds_per_1k_tokens * x
                    + c.quadratic_seconds_per_1k_tokens_squared * x * x)
        assert estimate == pytest.approx(profile.prefill_seconds(n), rel=0.05)
    step = (c.fixed_step_seconds + c.batch_step_seconds_per_request * 32
            + c.context_step_seconds_per_token * 32 * 2000)
    assert step == pytest.approx(profile.step_seconds([], [2000] * 32), rel=0.05)
    assert 0 < c.decode_throughput_alpha < 1  # a full prefill chunk slows the decode step
    assert min(c.intercept_seconds, c.linear_seconds_per_1k_tokens,
               c.quadratic_seconds_per_1k_tokens_squared, c.batch_step_seconds_per_request,
               c.context_step_seconds_per_token) >= 0
    assert c.prefill_max_rel_error < 0.05 and c.decode_max_rel_error < 0.05


def test_config_and_command_line_switch_program_scheduling_on() -> None:
    c = calibrate(load_profile("h100-llama-3.1-8b"))
    config = scheduling_config(c, 16384, overrides={"binding_only": True})
    assert config["token_capacity_per_dp_rank"] == 16384
    assert config["program_scheduling_enable_key"] == "vllm_xargs.agentic_context"
    assert config["global_queue"] is True and config["binding_only"] is True
    assert set(config["prefill_cost_model"]) == {
        "intercept_seconds", "linear_seconds_per_1k_tokens",
        "quadratic_seconds_per_1k_tokens_squared", "decode_throughput_alpha"}
    argv = router_argv("consistent_hash", ["http://a:1"], 9000, 9001, config_argument(config))
    i = argv.index("--program-scheduling-config-json")
    assert argv[i - 1] == "--enable-program-scheduling"
    assert json.loads(argv[i + 1]) == config
    with pytest.raises(ValueError):
        scheduling_config(c, 0)


def test_router_metrics_are_summed_over_replicas_and_counted() -> None:
    totals = metric_totals(ROUTER_METRICS)
    assert totals["vllm_router_agent_aware_transitions_total{reason=program_admit}"] == 8
    assert totals["vllm_router_agent_aware_queue_wait_seconds_count"] == 3
    assert not any("_bucket" in k or k.startswith("vllm_router_requests") for k in totals)
    before = {"vllm_router_agent_aware_transitions_total{reason=program_admit}": 2.0}
    counts = decision_counts(totals, before)
    assert counts["transitions"] == {"reason=program_admit": 6, "reason=ttl_expired": 4}
    assert counts["pooled"] == 3
    assert counts["pool_wait_mean_s"] == pytest.approx(1.0 / 3)
    assert (counts["ttl_armed"], counts["ttl_mean_s"]) == (4, 0.75)
    assert decisions_text(totals) == ("program_admit 8, ttl_expired 4; RequestPool wait mean "
                                      "0.33 s over 3; TTL mean 0.75 s over 4")
    assert decisions_text({}) == ""
    # our router's, from its `GET /v1/cluster` (`OurRouter.router_metrics`): counts, then
    # seconds; zeros left out
    ours = {"ours:rebinds": 0.0, "ours:held": 12.0, "ours:programs.pauses": 40.0,
            "ours:programs.paused_s": 120.4, "ours:programs.queued_s": 0.0}
    assert decisions_text(ours) == "held 12, pauses 40, paused 120 s"


def test_systems_are_parsed_and_grouped_by_replica_policy() -> None:
    systems = parse_systems("vr-programs, session:continuum,vr-hash,session:vllm")
    assert [(s.name, s.policy, s.ours) for s in systems] == [
        ("vr-programs", "vllm", False), ("session:continuum", "continuum", True),
        ("vr-hash", "vllm", False), ("session:vllm", "vllm", True)]
    groups = by_policy(systems)
    assert [(p, [s.name for s in g]) for p, g in groups] == [
        (("vllm", False), ["vr-programs", "vr-hash", "session:vllm"]),
        (("continuum", False), ["session:continuum"])]
    for bad in ("vr-nope", "session:nope", "session:", "", "vr-hash,vr-hash", "programs:",
                "programs:nope", "ring:vllm"):
        with pytest.raises(ServedComparisonInputError):
            parse_systems(bad)


def test_a_programs_system_runs_our_router_with_the_programs_strategy() -> None:
    (system,) = parse_systems("programs:lookahead")
    assert (system.policy, system.ours, system.strategy) == ("lookahead", True, "programs")
    assert parse_systems("session:vllm")[0].strategy == "session"
    assert parse_systems("vr-programs")[0].strategy is None
    argv = our_router_argv(["http://127.0.0.1:1"], 8000, system.strategy)
    assert "programs" in argv


def test_a_programs_system_that_carries_kv_has_replicas_of_its_own() -> None:
    """``programs+kv:POLICY``: our `programs` router with `carry_kv`, in front of replicas
    that run the NIXL connector, so never the same replicas as ``programs:POLICY``; a policy
    that needs the CPU tier runs there too (both connectors stacked)."""
    systems = parse_systems("programs:lookahead,programs+kv:lookahead,vr-programs")
    carry = systems[1]
    assert (carry.policy, carry.strategy, carry.carries_kv) == (
        "lookahead", "programs+kv", True)
    assert not systems[0].carries_kv
    assert [(key, [s.name for s in g]) for key, g in by_policy(systems)] == [
        (("lookahead", False), ["programs:lookahead"]),
        (("lookahead", True), ["programs+kv:lookahead"]),
        (("vllm", False), ["vr-programs"])]
    spec = router_spec(carry.strategy)
    assert (spec.strategy, spec.carry_kv) == ("programs", True)
    assert not router_spec("programs").carry_kv
    tier = parse_systems("programs+kv:mori")[0]  # NIXL and the CPU tier, stacked
    assert (tier.policy, tier.carries_kv) == ("mori", True)
    with pytest.raises(ServedComparisonInputError, match="unknown policy"):
        parse_systems("programs+kv:nonesuch")


def _result(system: str, jct: float, p95: float, hit: float, repeat: int = 0,
            router_metrics: dict[str, float] | None = None) -> ModeResult:
    return ModeResult(mode=system, about="", router_argv=[], cache_reset=True,
                      metrics={"jct_mean_s": jct, "jct_p95_s": p95, "prefix_hit_rate": hit,
                               "preemptions": 0, "ttft_mean_s": jct / 10,
                               "ttft_p95_s": p95 / 10, "ttft_p99_s": p95 / 5},
                      router_metrics=router_metrics or {}, programs=4, split_programs=0,
                      turns_per_replica=[20, 24], repeat=repeat)


def test_table_has_a_row_per_system_and_repeat() -> None:
    results = [_result("vr-programs", 12.34, 20.0, 0.8,
                       router_metrics=metric_totals(ROUTER_METRICS)),
               _result("session:continuum", 10.0, 15.5, 0.9)]
    policies = {"vr-programs": "vllm", "session:continuum": "continuum"}
    lines = format_table(results, policies).splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| vr-programs | vllm | 12.3 s | 20.0 s | 1.23 / 2.00 / 4.00 s | "
                               "0.800 | 0/4 | 20/24 | 0 | program_admit 8")
    assert lines[3] == ("| session:continuum | continuum | 10.0 s | 15.5 s | "
                        "1.00 / 1.55 / 3.10 s | 0.900 | 0/4 | 20/24 | 0 |  |")
    again = [*results, _result("session:continuum", 14.0, 16.5, 0.7, repeat=1)]
    assert "| session:continuum #2 |" in format_table(again, policies)


def test_repeats_are_averaged_per_system() -> None:
    results = [_result("vr-hash", 10.0, 20.0, 0.5), _result("session:vllm", 9.0, 15.0, 0.6),
               _result("vr-hash", 14.0, 22.0, 0.7, repeat=1),
               _result("session:vllm", 10.0, 17.0, 0.8, repeat=1)]
    means = aggregate(results)
    assert list(means) == ["vr-hash", "session:vllm"]
    assert means["vr-hash"] == pytest.approx({"jct_mean_s": 12.0, "jct_p95_s": 21.0,
                                              "prefix_hit_rate": 0.6, "jct_mean_spread_s": 4.0,
                                              "repeats": 2, "ttft_mean_s": 1.2,
                                              "ttft_p95_s": 2.1, "ttft_p99_s": 4.2})
    assert means["session:vllm"]["jct_mean_s"] == pytest.approx(9.5)
    table = format_means(means, {"vr-hash": "vllm", "session:vllm": "vllm"}).splitlines()
    assert table[2] == ("| vr-hash | vllm | 2 | 12.0 s | 4.0 s | 21.0 s | 1.20 / 2.10 / 4.20 s "
                        "| 0.600 |")


def test_our_router_runs_as_a_process_of_its_own() -> None:
    argv = our_router_argv(["http://a:1", "http://b:2"], 9100)
    assert argv[1:6] == ["-m", "eval.experiments.served_comparison", "route", "session", "9100"]
    assert argv[6:] == ["http://a:1", "http://b:2"]


def test_a_turn_no_replica_takes_is_refused_before_any_replica_starts() -> None:
    # seed 3's 32 SWE programs: swe-00025's turn 5 needs 17,294 tokens (prompt and output);
    # 1,024 blocks hold (1,024 - 1) x 16 = 16,368 (the null block), 1,082 hold 17,296.
    # (our router only: vllm-router need not be installed)
    from eval.experiments.served_comparison import (
        ServedComparisonOptions,
        run_served_comparison,
    )
    options = ServedComparisonOptions(programs=32, seed=3, num_gpu_blocks=1024,
                                      systems="session:vllm")
    with pytest.raises(ServedComparisonInputError,
                       match=r"swe-00025 turn 5: 17,294 tokens; give --num-gpu-blocks 1082"):
        run_served_comparison(options)
