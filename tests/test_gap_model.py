"""The gap model (predictor.gaps): heavy-tailed forecasts learnt online per kind and session,
conditioned on how long a program has been gone; its calibration and `harness predictor gaps`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from common.trace import Program, Trace, Turn, save_trace
from predictor.gaps import (
    POOLED,
    Exponential,
    Gap,
    GapForecast,
    GapModel,
    GapModelConfig,
    TailedEmpirical,
    calibrate,
    trace_gaps,
)
from predictor.gaps.calibration import pinball
from server.intake.events import EventError, parse_events
from server.policies.spec import HINT_MODES
from sim.client import ClientPredictions


def _fed(samples: np.ndarray, kind: str = "tool", sessions: int = 50) -> GapModel:
    """A model that has seen `samples`, spread over `sessions` sessions in turn."""
    model = GapModel()
    for i, x in enumerate(samples):
        model.observe(f"s{i % sessions}", kind, None, float(x))
    return model


# -- heavy tails -------------------------------------------------------------------------------


def test_log_normal_gaps_give_their_quantiles() -> None:
    rng = np.random.default_rng(1)
    mu, sigma = math.log(10.0), 1.5
    model = _fed(rng.lognormal(mu, sigma, 2000))
    forecast = model.predict("someone new", "tool")
    for q, z in ((0.1, -1.2816), (0.5, 0.0), (0.9, 1.2816), (0.99, 2.3263)):
        assert forecast.quantile(q) == pytest.approx(math.exp(mu + sigma * z), rel=0.2), q
    assert forecast.source == "tool" and forecast.session_gaps == 0


def test_pareto_gaps_extrapolate_past_the_data() -> None:
    """A power law (alpha 1.2, from 1 s): the body from the data, the tail fitted by Hill's
    estimator, and a survival past the largest gap seen that is not zero."""
    rng = np.random.default_rng(2)
    alpha = 1.2
    samples = (1.0 - rng.random(2000)) ** (-1.0 / alpha)
    forecast = _fed(samples).predict("x", "tool")
    for q in (0.5, 0.9, 0.99, 0.999):
        assert forecast.quantile(q) == pytest.approx((1.0 - q) ** (-1.0 / alpha), rel=0.35), q
    largest = float(samples.max())
    assert 0.0 < forecast.survival(2 * largest) < forecast.survival(largest)
    tail = TailedEmpirical.fit(samples, 0.01)
    assert tail.alpha == pytest.approx(alpha, rel=0.5)
    assert math.isinf(forecast.quantile(1.0))


def test_without_a_tail_the_empirical_cdf_ends_at_the_largest_gap() -> None:
    shape = TailedEmpirical.fit([1.0, 2.0, 3.0, 4.0], tail_fraction=0.0)
    assert shape.cdf(np.array([0.5, 2.0, 4.0, 9.0])).tolist() == [0.0, 0.5, 1.0, 1.0]
    forecast = GapForecast(shape, elapsed_s=5.0)  # gone past every gap: back any moment
    assert forecast.cdf(5.0) == 1.0 and forecast.quantile(0.5) == 5.0


def test_prior_before_a_kind_has_gaps_enough() -> None:
    model = GapModel()
    tool, person = model.predict("s", "tool"), model.predict("s", "person")
    assert tool.source == "prior" and tool.quantile(0.5) == pytest.approx(9.0)
    assert person.quantile(0.9) == pytest.approx(1506.0)
    with pytest.raises(ValueError, match="gap kind 'nap'"):
        model.predict("s", "nap")
    with pytest.raises(ValueError, match="finite number"):
        model.observe("s", "tool", None, float("nan"))


def test_tool_keys_use_the_duration_chain() -> None:
    """Gaps after `bash:pytest` are forecast from their own pool once it has 10, from the
    kind's before."""
    model = GapModel()
    for _ in range(30):
        model.observe("a", "tool", "bash:ls", 1.0)
    for i in range(9):
        model.observe("a", "tool", "bash:pytest", 60.0)
        if i == 0:
            assert model.predict("b", "tool", "bash:pytest").source == "tool"
    model.observe("a", "tool", "bash:pytest", 60.0)
    forecast = model.predict("b", "tool", "bash:pytest")
    assert forecast.source == "command" and forecast.quantile(0.5) == 60.0


# -- sessions ----------------------------------------------------------------------------------


def test_a_quick_session_is_shrunk_toward_the_pool() -> None:
    """A session whose gaps are all 1 s against a pool with median 10 s: with none, the pool;
    after a few, lower; never below its own gaps' level while it has few. The pool is one
    session, too few to fit the shrinkage: kappa is its default, 4."""
    rng = np.random.default_rng(3)
    model = _fed(rng.lognormal(math.log(10.0), 1.0, 2000), sessions=1)
    assert model.kappa("tool") == 4.0
    pool = model.predict("quick", "tool")
    fresh = model.predict("never seen", "tool")
    assert pool.quantile(0.5) == fresh.quantile(0.5) and pool.scale == 1.0
    medians = []
    for _ in range(8):
        model.observe("quick", "tool", None, 1.0)
        medians.append(model.predict("quick", "tool").quantile(0.5))
    assert all(b < a for a, b in zip(medians, medians[1:], strict=False))
    assert medians[2] < 0.7 * pool.quantile(0.5)
    assert medians[-1] > 1.0  # shrunk: eight gaps do not outweigh the pool entirely
    assert model.predict("quick", "tool").session_gaps == 8
    assert model.predict("quick", "person").scale == 1.0  # levels are per kind


def test_the_shrinkage_is_fitted_from_the_sessions() -> None:
    """Sessions whose levels differ a lot get a small kappa (their own gaps soon dominate);
    sessions that are all alike, a large one."""
    rng = np.random.default_rng(4)
    apart, alike = GapModel(), GapModel()
    for s in range(40):
        level = rng.normal(0.0, 1.5)
        for _ in range(20):
            apart.observe(f"s{s}", "tool", None, float(np.exp(2.0 + level + rng.normal(0, 0.5))))
            alike.observe(f"s{s}", "tool", None, float(np.exp(2.0 + rng.normal(0, 0.5))))
    assert apart.kappa("tool") < 1.0 < 20.0 < alike.kappa("tool")


def test_the_pooled_baseline_ignores_sessions() -> None:
    model = GapModel(POOLED)
    for x in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0):
        model.observe("a", "tool", None, x)
    assert model.predict("a", "tool").scale == 1.0
    assert model.predict("a", "tool").cdf(10.0) == 1.0  # no tail


# -- elapsed time ------------------------------------------------------------------------------


def test_a_program_gone_long_is_expected_to_stay_gone_longer() -> None:
    rng = np.random.default_rng(5)
    forecast = _fed(rng.lognormal(math.log(10.0), 1.5, 2000)).predict("x", "tool")
    later = forecast.given(600.0)
    assert later.cdf(600.0) == 0.0 and later.cdf(599.0) == 0.0
    assert later.quantile(0.0) >= 600.0
    # decreasing hazard: less likely back within a minute, and a longer expected wait
    assert later.p_back_within(60.0) < forecast.given(60.0).p_back_within(60.0) \
        < forecast.p_back_within(60.0)
    assert later.expected_wait_s() > forecast.given(60.0).expected_wait_s() \
        > forecast.expected_wait_s()
    assert later.quantile(0.5) - 600.0 > forecast.quantile(0.5)
    assert forecast.survival(30.0) == pytest.approx(1.0 - forecast.cdf(30.0))


def test_an_exponential_is_memoryless_and_its_mean_is_integrated() -> None:
    forecast = GapForecast(Exponential(10.0), source="point")
    assert forecast.mean() == pytest.approx(10.0, rel=0.01)
    assert forecast.given(100.0).p_back_within(5.0) == pytest.approx(
        forecast.p_back_within(5.0))
    assert forecast.mean(cap_s=10.0) == pytest.approx(10.0 * (1 - math.exp(-1)), rel=0.01)
    assert forecast.given(50.0).mean(cap_s=20.0) == 50.0


def test_the_hint_is_finite_quantiles() -> None:
    forecast = GapForecast(Exponential(10.0), scale=2.0)
    assert forecast.hint() == {"p50": pytest.approx(20 * math.log(2), abs=1e-3),
                               "p90": pytest.approx(20 * math.log(10), abs=1e-3),
                               "p99": pytest.approx(20 * math.log(100), abs=1e-3)}
    assert GapForecast(Exponential(1e9)).hint()["p99"] == 86_400.0


# -- calibration -------------------------------------------------------------------------------


class _Fixed:
    """Every gap Exp(mean 10 s); remembers what it was told."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def predict(self, session: str, kind: str, tool_key: str | None = None,
                elapsed_s: float = 0.0) -> GapForecast:
        return GapForecast(Exponential(10.0), elapsed_s=elapsed_s)

    def observe(self, session: str, kind: str, tool_key: str | None, gap_s: float) -> None:
        self.seen.append(gap_s)


def test_calibration_on_a_hand_made_case() -> None:
    gaps = [Gap("a", "tool", "bash", 5.0), Gap("a", "tool", "bash", 20.0),
            Gap("b", "person", "person", 100.0)]
    fixed = _Fixed()
    report = calibrate(gaps, {"fixed": fixed}, grid_s=(10.0,), levels=(0.5,),
                       elapsed_s=(0.0, 10.0))
    assert fixed.seen == [5.0, 20.0, 100.0]  # learnt after each forecast, in order
    back = 1.0 - math.exp(-1.0)  # P(Exp(10) <= 10), from the start and from 10 s on
    tool = report.row("fixed", "tool")
    assert tool.n == 2 and tool.predicted == pytest.approx((back,)) and tool.observed == (0.5,)
    median = 10.0 * math.log(2.0)
    expected = np.mean([0.5 * abs(math.log1p(g) - math.log1p(median)) for g in (5.0, 20.0)])
    assert tool.pinball == pytest.approx((expected,))
    everything = report.row("fixed")
    assert everything.n == 3 and everything.observed == pytest.approx((1 / 3,))
    # gone 10 s: only the gaps longer than that; back within 10 s more means gap <= 20 s
    gone = report.row("fixed", "tool", 10.0)
    assert gone.n == 1 and gone.predicted == pytest.approx((back,)) and gone.observed == (1.0,)
    assert report.row("fixed", "person", 10.0).observed == (0.0,)
    assert tool.reliability_error == pytest.approx(abs(back - 0.5))
    assert report.n_gaps == 3 and report.n_sessions == 2
    assert everything.crps > 0
    with pytest.raises(ValueError, match="no gaps"):
        calibrate([])


def test_pinball_loss_is_on_log_gaps() -> None:
    losses = pinball(np.array([9.0, 9.0]), np.array([0.1, 0.9]), 99.0)
    assert losses == pytest.approx([0.1 * math.log(10.0), 0.9 * math.log(10.0)])


def test_trace_gaps_read_kinds_and_treat_version_1_as_tools() -> None:
    trace = _trace()
    gaps = trace_gaps(trace)
    assert [(g.session, g.kind, g.tool_key) for g in gaps[:3]] == [
        ("p0", "tool", "bash"), ("p0", "person", "person"), ("p0", "tool", "bash")]
    v1 = Trace(name="v1", programs=[Program(id="x", arrival_s=0.0, turns=[
        Turn(input_tokens=5, output_tokens=1, tool="calculator", tool_seconds=0.5),
        Turn(input_tokens=0, output_tokens=1)])])
    assert trace_gaps(v1) == [Gap("x", "tool", "calculator", 0.5)]


# -- the command -------------------------------------------------------------------------------


def _trace() -> Trace:
    """Three sessions that alternate tool calls and a person's answers."""
    programs = []
    for p in range(3):
        turns = []
        for i in range(12):
            kind = "person" if i % 3 == 1 else "tool"
            seconds = (60.0 + 10 * p) if kind == "person" else float(1 + (i + p) % 5)
            turns.append(Turn(input_tokens=10, output_tokens=2, tool="bash" if kind == "tool"
                              else kind, tool_seconds=seconds, gap_kind=kind))
        turns.append(Turn(input_tokens=1, output_tokens=1))
        programs.append(Program(id=f"p{p}", arrival_s=float(p), turns=turns))
    return Trace(name="tiny", programs=programs)


def test_cli_gaps_prints_the_calibration(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = save_trace(_trace(), tmp_path / "tiny.jsonl")
    out_json = tmp_path / "gaps.json"
    assert main(["predictor", "gaps", "--trace", str(path), "--elapsed", "0,30",
                 "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "36 gaps (tool 24, person 12) in 3 sessions" in out
    assert "gone 30 s (gaps longer than that)" in out
    for model in ("gap model", "pooled", "point (exp)"):
        assert model in out
    assert "1800 s" in out and "CRPS" in out and "kappa" in out
    assert '"rows"' in out_json.read_text()


def test_cli_gaps_bad_input_is_one_line(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["predictor", "gaps", "--trace", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harness: error: --trace") and "is empty" in err
    assert err.count("\n") == 1
    header_only = save_trace(Trace(name="none", programs=[]), tmp_path / "none.jsonl")
    assert main(["predictor", "gaps", "--trace", str(header_only)]) == 2
    assert "no gaps to forecast" in capsys.readouterr().err
    (tmp_path / "runs").mkdir()
    assert main(["predictor", "gaps", "--trace", str(tmp_path / "runs")]) == 2
    assert "no recorded runs" in capsys.readouterr().err
    single = save_trace(Trace(name="one", programs=[Program(id="x", arrival_s=0.0, turns=[
        Turn(input_tokens=5, output_tokens=1)])]), tmp_path / "one.jsonl")
    assert main(["predictor", "gaps", "--trace", str(single)]) == 2
    assert "no gaps to forecast" in capsys.readouterr().err
    assert main(["predictor", "gaps", "--trace", str(tmp_path / "nope")]) == 2
    assert "--trace" in (err := capsys.readouterr().err) and "no such file or folder" in err
    assert main(["predictor", "gaps", "--trace", str(single), "--elapsed", "-1"]) == 2
    assert ">= 0" in capsys.readouterr().err


def test_config_needs_every_prior() -> None:
    with pytest.raises(ValueError, match="priors lack"):
        GapModelConfig(priors={"tool": Exponential(1.0)})


# -- what a client sends ---------------------------------------------------------------------


def test_tool_start_carries_the_gap_only_when_asked() -> None:
    """`@gaps` sends `online`'s predicted_s plus the gap's kind and quantiles; the other modes
    send what they always did (a replay under them is unchanged)."""
    program = _trace().programs[0]
    clients = {mode: ClientPredictions(mode) for mode in HINT_MODES}
    for i in range(program.n_turns - 1):
        sent = {mode: c.tool_start(program, i) for mode, c in clients.items()}
        for mode in ("none", "online", "oracle"):
            assert list(sent[mode]) == ["predicted_s"]
        assert sent["none"]["predicted_s"] is None
        assert sent["oracle"]["predicted_s"] == program.turns[i].tool_seconds
        assert sent["gaps"]["predicted_s"] == sent["online"]["predicted_s"]
        assert sent["gaps"]["gap_kind"] == program.turns[i].gap_kind
        assert set(sent["gaps"]["predicted_q"]) == {"p50", "p90", "p99"}
        for c in clients.values():
            c.observe(program, i)
    assert clients["online"].durations.counts() == clients["gaps"].durations.counts()
    assert clients["gaps"].gaps is not None and clients["gaps"].gaps.count("person") == 4


def test_events_take_the_gap_fields() -> None:
    body = json.dumps({"type": "tool_start", "program_id": "p", "tool": "person",
                       "gap_kind": "person", "predicted_q": {"p90": 1500.0, "p50": 120}})
    (event,) = parse_events(body.encode())
    agent_event = event.to_event()
    assert agent_event.gap_kind == "person"
    assert agent_event.predicted_q == {"p50": 120.0, "p90": 1500.0}
    plain = parse_events(b'{"type": "tool_start", "program_id": "p", "predicted_s": 2}')[0]
    assert plain.model_dump(exclude_none=True) == {"type": "tool_start", "program_id": "p",
                                                   "predicted_s": 2.0}
    for bad, field in (({"predicted_q": {"p50": 10, "p90": 5}}, "must not decrease"),
                       ({"predicted_q": {"p42": 1}}, "predicted_q.p42"),
                       ({"predicted_q": {"p50": -1}}, "greater than or equal to 0"),
                       ({"gap_kind": "nap"}, "gap_kind")):
        line = json.dumps({"type": "tool_start", "program_id": "p", **bad})
        with pytest.raises(EventError, match=field):
            parse_events(line.encode())
