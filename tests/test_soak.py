"""`harness eval soak` (eval/experiments/soak*.py): the fault plan, the sampler on a fake
process tree and a fake server, the judge on hand-made samples, and one short soak against a
real `harness serve` on the emulated GPU."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from cli.main import main
from common.trace import Program, Trace, Turn, save_trace
from eval.experiments.soak import (
    SoakError,
    SoakOptions,
    fit_sessions,
    make_server,
    run_soak,
    stale_after_s,
)
from eval.experiments.soak_cluster import ClusterProcess, StatusTargets, status_targets
from eval.experiments.soak_faults import (
    FAULTS,
    FaultPlan,
    FaultsError,
    FaultyDriver,
    SessionFaults,
    Tally,
    parse_faults,
)
from eval.experiments.soak_judge import OLDEST_WAIT_S, RSS_GROWTH, answered, judge
from eval.experiments.soak_loop import Soak
from eval.experiments.soak_record import Record, plot
from eval.experiments.soak_sampler import engine_cores, parse_gauges, rss, summed, take_sample
from eval.replay.http_replay import Driver
from sim.conversation import ProgramState


# -- the fault plan ----------------------------------------------------------------------------
def test_faults_parse_all_none_and_leave_one_out() -> None:
    assert parse_faults("all") == frozenset(FAULTS)
    assert parse_faults("none") == frozenset()
    assert parse_faults("all,-restart") == frozenset(FAULTS) - {"restart"}
    assert parse_faults("kill-mid-tool,drop_events") == {"kill_mid_tool", "drop_events"}
    with pytest.raises(FaultsError, match="unknown fault 'explode'"):
        parse_faults("explode")


def test_fault_plan_is_drawn_from_seed_and_number() -> None:
    plan = FaultPlan(frozenset(FAULTS), seed=3)
    drawn = [plan.session(n, 5) for n in range(400)]
    assert drawn == [plan.session(n, 5) for n in range(400)]  # a resumed run draws the same
    tools = sum(d.kill_in_tool is not None for d in drawn)
    turns = sum(d.kill_in_turn is not None for d in drawn)
    ends = sum(d.no_end for d in drawn)
    assert 20 < tools < 70 and 15 < turns < 70 and 20 < ends < 70, (tools, turns, ends)
    assert all(d.kill_in_tool is None or 0 <= d.kill_in_tool < 4 for d in drawn)
    assert all(d.drop_share == 0.1 for d in drawn)
    quiet = FaultPlan(frozenset(), seed=3)
    assert all(quiet.session(n, 5) == quiet.session(0, 1) for n in range(50))
    assert not quiet.restarts and not quiet.bursts


# -- the sampler -------------------------------------------------------------------------------
class FakeProcess:
    def __init__(self, name: str, rss_bytes: int, children: list[FakeProcess] = ()) -> None:
        self._name, self._rss, self._children = name, rss_bytes, list(children)

    def memory_info(self) -> SimpleNamespace:
        return SimpleNamespace(rss=self._rss)

    def children(self, recursive: bool = False) -> list[FakeProcess]:
        out = list(self._children)
        if recursive:
            for child in self._children:
                out += child.children(True)
        return out

    def name(self) -> str:
        return self._name

    def cmdline(self) -> list[str]:
        return [self._name]


def test_rss_finds_the_engine_core_in_the_tree() -> None:
    core = FakeProcess("VLLM::EngineCore", 300)
    api = FakeProcess("python", 100, [FakeProcess("resource_tracker", 5, [core])])
    assert engine_cores(api) == [core]
    assert rss(api) == {"api_rss": 100, "engine_rss": 300}
    # a cluster's launcher: one engine core per replica, summed
    launcher = FakeProcess("python", 50, [FakeProcess("vllm", 10, [core]),
                                          FakeProcess("vllm", 10, [FakeProcess("EngineCore", 7)])])
    assert rss(launcher) == {"api_rss": 50, "engine_rss": 307}
    assert rss(FakeProcess("python", 7)) == {"api_rss": 7, "engine_rss": None}
    assert rss(None) == {"api_rss": None, "engine_rss": None}


def test_sample_reads_the_scheduler_status_and_gauges() -> None:
    metrics = ("# HELP x\nvllm:num_requests_waiting{engine=\"0\"} 3.0\n"
               "vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n"
               "vllm:kv_offload_used_bytes 1024\n")

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/agent/events":
            return httpx.Response(200, json={"scheduler": {
                "pinned_now": 2, "pinned_blocks": 40, "programs_tracked": 5,
                "oldest_pin_at": 0.0, "events_received": 9}})
        return httpx.Response(200, text=metrics)

    async def go() -> dict:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            return await take_sample(client, ["http://fake"], FakeProcess("p", 1),
                                     {"live_clients": 1})

    sample = asyncio.run(go())
    assert sample["pinned_blocks"] == 40 and sample["programs_tracked"] == 5
    assert sample["oldest_pin_s"] > 1e9  # pinned at the epoch: very old
    assert sample["server_waiting"] == 3.0 and sample["kv_usage"] == 0.25
    assert sample["host_tier"] == {"vllm:kv_offload_used_bytes": 1024.0}
    assert sample["api_rss"] == 1 and sample["live_clients"] == 1
    assert parse_gauges("garbage line\n") == {"host_tier": {}}


def test_a_clusters_replicas_are_read_and_summed() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/cluster":
            return httpx.Response(200, json={"programs_held": 4, "replicas": [
                {"url": "http://a", "alive": True}, {"url": "http://b", "alive": True},
                {"url": "http://dead", "alive": False}]})
        if request.url.path == "/v1/agent/events":
            pins = {"a": 1, "b": 2}[request.url.host]
            return httpx.Response(200, json={"scheduler": {
                "pinned_now": pins, "pinned_blocks": 10 * pins, "programs_tracked": None,
                "oldest_pin_at": None, "events_received": 5}})
        return httpx.Response(200, text="vllm:kv_offload_used_bytes 8\n")

    cluster = ClusterProcess("c.yaml", Path("/nonexistent"))

    async def go() -> tuple[StatusTargets, dict]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            targets = await status_targets(client, cluster)
            return targets, await take_sample(client, list(targets.bases), None, {})

    targets, sample = asyncio.run(go())
    assert targets == StatusTargets(("http://a", "http://b"), router_programs=4)
    assert sample["pinned_now"] == 3 and sample["pinned_blocks"] == 30
    assert sample["programs_tracked"] is None and sample["events_received"] == 10
    assert sample["host_tier"] == {"vllm:kv_offload_used_bytes": 16.0}
    assert summed([{"oldest_pin_s": 3.0}, {"oldest_pin_s": 9.0}]) == {
        "host_tier": {}, "oldest_pin_s": 9.0}


def test_killing_a_replica_kills_its_process_group_and_spares_the_last(monkeypatch) -> None:
    spared, victim = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                       start_new_session=True) for _ in range(2))
    try:
        cluster = ClusterProcess("c.yaml", Path("/nonexistent"))
        live = [{"name": "r0", "pid": spared.pid, "alive": True},
                {"name": "r1", "pid": victim.pid, "alive": True}]
        monkeypatch.setattr(cluster, "replicas", lambda: live)
        assert cluster.kill_replica() == "r1"
        assert victim.wait(10) == -signal.SIGKILL
        monkeypatch.setattr(cluster, "replicas", lambda: live[:1])
        assert cluster.kill_replica() is None  # the last one standing
        assert spared.poll() is None
    finally:
        for process in (spared, victim):
            process.kill()
            process.wait()


# -- the judge ---------------------------------------------------------------------------------
def samples(run_rss: list[int], drain: list[int]) -> list[dict]:
    out = [{"t": 10.0 * i, "phase": "run", "epoch": 0, "epoch_start": 0.0, "api_rss": r,
            "engine_rss": 1000, "oldest_wait_s": 1.0} for i, r in enumerate(run_rss)]
    start = 10.0 * len(run_rss)
    out += [{"t": start + 10.0 * i, "phase": "drain", "epoch": 0, "epoch_start": 0.0,
             "api_rss": run_rss[-1], "engine_rss": 1000, "programs_tracked": n,
             "pinned_now": n, "orphan_blocks": 4 * n, "oldest_wait_s": 0.0}
            for i, n in enumerate(drain)]
    return out


TALLY = {"sent": 10, "answered": 9, "refused": 1, "hangs": 0}


def by_name(checks: list) -> dict:
    return {c.name.split()[0]: c for c in checks}


def test_judge_passes_a_flat_run_that_drains() -> None:
    checks = judge(samples([1000] * 12, [3, 1, 0]), TALLY, run_s=120.0, drain_bound_s=30.0)
    assert all(c.passed for c in checks), [c.line() for c in checks]


def test_judge_fails_growth_hangs_slow_drain_and_starved_turns() -> None:
    grown = [1000, 1000, 1000] + [int(1000 * (1 + 2 * RSS_GROWTH))] * 9
    run = samples(grown, [3, 3, 3, 3, 3])
    run[4]["oldest_wait_s"] = OLDEST_WAIT_S + 1
    checks = by_name(judge(run, {**TALLY, "hangs": 1}, run_s=120.0, drain_bound_s=30.0))
    assert checks["api_rss"].passed is False
    assert checks["engine_rss"].passed is True
    assert checks["every"].passed is False
    assert checks["programs,"].passed is False
    assert checks["no"].passed is False


def test_judge_leaves_unchecked_what_the_run_was_too_short_for() -> None:
    checks = by_name(judge(samples([1000], [2, 2]), TALLY, run_s=6000.0, drain_bound_s=3600.0))
    assert checks["api_rss"].passed is None  # no sample after the warm-up
    assert checks["programs,"].passed is None  # drained 10 s of a 3,600 s bound


def test_judge_takes_a_new_baseline_after_a_restart() -> None:
    run = samples([1000] * 6, [0])
    for s in run[3:]:
        s.update(epoch=1, epoch_start=30.0, api_rss=5000)  # a new process, other RSS
    checks = by_name(judge(run, TALLY, run_s=60.0, drain_bound_s=30.0))
    assert checks["api_rss"].passed is True


def counted(**counts: int) -> Tally:
    tally = Tally(timeout_s=120.0)
    for key, value in counts.items():
        setattr(tally, key, value)
    return tally


def test_every_request_sent_is_counted_exactly_once() -> None:
    whole = dict(sent=20, answered=12, refused=2, killed_turns=3, left_at_end=3)
    check = answered(counted(**whole).record())
    assert check.passed is True, check.line()
    assert check.detail.startswith("20 sent = 12 answered + 2 refused with an error + 0 hung + "
                                   "3 cancelled by the fault plan + 3 left at the end + "
                                   "0 client errors"), check.detail
    missing = answered(counted(**{**whole, "sent": 21}).record())
    assert missing.passed is False and "1 unaccounted for" in missing.detail
    twice = answered(counted(**{**whole, "answered": 13}).record())
    assert twice.passed is False and "1 counted twice" in twice.detail
    broke = answered(counted(**{**whole, "sent": 21, "client_errors": 1}).record())
    assert broke.passed is False and "our client broke" in broke.detail


def test_an_exception_group_is_named_by_what_it_holds(capsys) -> None:
    tally = Tally()
    group = ExceptionGroup("unhandled errors in a TaskGroup",
                           [ExceptionGroup("inner", [httpx.ConnectError("refused")])])
    tally.error(group)
    assert tally.errors == ["ExceptionGroup: ConnectError: refused"]
    for exc in (group, ExceptionGroup("again", [httpx.ConnectError("other")]),
                ValueError("bad chunk")):
        try:
            raise exc
        except Exception as raised:  # noqa: BLE001 - a traceback to log
            tally.log_once(raised)
    logged = capsys.readouterr().err
    assert logged.count("Traceback") == 2, logged  # once per kind: ConnectError, ValueError
    assert "ExceptionGroup: ConnectError: refused" in logged and "bad chunk" in logged
    assert "logged" not in tally.record()


class _Stuck(Driver):
    """A server that never answers."""

    async def complete(self, state: ProgramState, i: int) -> None:
        await asyncio.Event().wait()


class _Broken(Driver):
    """Our own client code failing mid-request."""

    async def complete(self, state: ProgramState, i: int) -> None:
        raise ValueError("a chunk our client could not read")


class _StuckFaulty(FaultyDriver, _Stuck):
    pass


class _BrokenFaulty(FaultyDriver, _Broken):
    pass


def faulty_complete(kind: type[FaultyDriver], tally: Tally, *, cancel_after_s: float) -> None:
    """One request through `kind`'s `complete`, cancelled after `cancel_after_s` as the run's
    end cancels the clients."""
    program = Program(id="p", arrival_s=0.0, turns=[Turn(input_tokens=8, output_tokens=2)])

    async def go() -> None:
        async with httpx.AsyncClient() as client:
            driver = kind(Trace(name="t", programs=[program]), client, "http://x", "m", "r",
                          None, faults=SessionFaults(), tally=tally)
            task = asyncio.create_task(driver.complete(ProgramState(program), 0))
            await asyncio.sleep(cancel_after_s)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    asyncio.run(go())


def test_a_request_in_flight_at_the_end_is_left_at_the_end() -> None:
    tally = Tally()
    faulty_complete(_StuckFaulty, tally, cancel_after_s=0.05)
    assert (tally.sent, tally.left_at_end, tally.waiting) == (1, 1, {})
    assert answered(tally.record()).passed is True


def test_a_request_our_client_failed_is_a_client_error(capsys) -> None:
    tally = Tally()
    faulty_complete(_BrokenFaulty, tally, cancel_after_s=0.05)
    assert (tally.sent, tally.client_errors, tally.left_at_end) == (1, 1, 0)
    assert "a chunk our client could not read" in capsys.readouterr().err
    check = answered(tally.record())
    assert check.passed is False and "unaccounted" not in check.detail, check.detail


def test_options_refuse_bad_values() -> None:
    with pytest.raises(SoakError, match="--trace is required"):
        SoakOptions()
    with pytest.raises(SoakError, match="--minutes"):
        SoakOptions(trace="x", minutes=0)
    with pytest.raises(SoakError, match="together"):
        SoakOptions(trace="x", device="cpu")
    with pytest.raises(FaultsError):
        SoakOptions(trace="x", faults="nope")
    with pytest.raises(SoakError, match="--cluster: the cluster file says"):
        SoakOptions(trace="x", cluster="c.yaml", offload_gib=4.0)


def test_a_cluster_soak_gives_its_scaled_bound_to_every_replica_and_the_router(tmp_path) -> None:
    # as for one server: 3,600 s times the time scale, or --stale-after-s, on the command line
    # of `harness cluster serve`, which sets it for the replicas and the router alike
    options = SoakOptions(trace="x", cluster="c.yaml", time_scale=0.01)
    assert stale_after_s(options) == pytest.approx(36.0)
    server = make_server(options, tmp_path)
    assert isinstance(server, ClusterProcess)
    command = server.command()
    assert command[command.index("--stale-after-s") + 1] == "36"
    given = make_server(SoakOptions(trace="x", cluster="c.yaml", stale_after_s=5.0), tmp_path)
    assert given.command()[-2:] == ["--stale-after-s", "5"]
    assert "--stale-after-s" not in ClusterProcess("c.yaml", tmp_path).command()


def test_the_drain_waits_for_the_routers_program_books_too() -> None:
    run = samples([1000] * 12, [0, 0])
    run[-2]["router_programs"] = 3  # the replicas are empty, the router still holds three
    checks = by_name(judge(run, TALLY, run_s=120.0, drain_bound_s=5.0))
    assert checks["programs,"].passed is False
    assert checks["programs,"].detail.startswith("zero 10 s after the last client left")
    run[-2]["router_programs"] = None  # one server: no router books
    assert by_name(judge(run, TALLY, run_s=120.0, drain_bound_s=5.0))["programs,"].passed


def test_sessions_are_cut_at_the_first_turn_longer_than_the_context() -> None:
    trace = tiny_trace()  # every first turn 72 tokens, every second one more than 90
    kept, lines = fit_sessions(trace, 90)
    assert [p.n_turns for p in kept] == [1, 1, 1]
    assert kept[0].turns[-1].tool is None and kept[0].turns[-1].tool_seconds == 0.0
    assert lines[0].startswith("p0: cut to its first 1 turns (turn 1 needs ")
    assert lines[0].endswith(" tokens > the engine's 90)")
    kept, lines = fit_sessions(trace, 50)
    assert kept == [] and lines[0].startswith("p0: left out (turn 0 needs 72 tokens")
    assert fit_sessions(trace, None)[1] == []


def test_a_session_cut_after_a_persons_turn_ends_without_a_gap() -> None:
    """A real session's turn before the cut may have handed the turn to a person (a version-2
    trace's gap kind): the cut session's last turn has no gap at all, of any kind."""
    program = tiny_trace().programs[0]
    turns = [t.model_copy(update={"gap_kind": "person"}) if i == 0 else t
             for i, t in enumerate(program.turns)]
    trace = Trace(name="v2", programs=[Program.model_validate(
        {**program.model_dump(), "turns": [t.model_dump() for t in turns]})])
    kept, _ = fit_sessions(trace, 90)
    assert [p.n_turns for p in kept] == [1]
    assert kept[0].turns[-1].gap_kind == "tool" and kept[0].turns[-1].tool is None



def claude_like_trace() -> Trace:
    """Two sessions whose first prompts (12k, 20k tokens) no small model's context holds; the
    second's big tool return makes its second turn too long even at a tenth of its size."""
    a = [Turn(input_tokens=12_000, output_tokens=300, tool="bash", tool_seconds=5.0,
              tool_return_tokens=2_000),
         Turn(input_tokens=500, output_tokens=200, kept_tokens=9_000)]  # a compaction
    b = [Turn(input_tokens=20_000, output_tokens=400, tool="read", tool_seconds=1.0,
              tool_return_tokens=70_000),
         Turn(input_tokens=100, output_tokens=50)]
    return Trace(name="cc", programs=[Program(id="a", arrival_s=0.0, turns=a),
                                      Program(id="b", arrival_s=1.0, turns=b)])


def test_a_token_scale_keeps_sessions_a_small_context_leaves_out() -> None:
    trace = claude_like_trace()
    kept, lines = fit_sessions(trace, 8_192)
    assert kept == [] and [line.split(" (")[0] for line in lines] == ["a: left out", "b: left out"]
    # judged on the scaled size: a fits whole; b's second turn, 2,040 + 7,000 + 10 + 5 tokens
    kept, lines = fit_sessions(trace, 8_192, token_scale=0.1)
    assert [(p.id, p.n_turns) for p in kept] == [("a", 2), ("b", 1)]
    assert [t.input_tokens for t in kept[0].turns] == [1_200, 50]
    assert kept[0].turns[1].kept_tokens == 900
    assert lines == ["b: cut to its first 1 turns (turn 1 needs 9,055 tokens > the engine's "
                     "8,192)"]


@pytest.mark.parametrize("scale", [0.0, -0.1, 1.5, float("nan")])
def test_a_token_scale_outside_zero_to_one_is_refused(scale) -> None:
    with pytest.raises(SoakError, match=r"^--token-scale must be in \(0, 1\]"):
        SoakOptions(trace="x", token_scale=scale)


def test_a_bad_token_scale_on_the_command_line_is_one_line_exit_2(tmp_path, capsys) -> None:
    trace = save_trace(tiny_trace(), tmp_path / "tiny.jsonl")
    assert main(["eval", "soak", "--trace", str(trace), "--token-scale", "2",
                 "--out", str(tmp_path / "soak")]) == 2
    assert capsys.readouterr().err == "harness: error: --token-scale must be in (0, 1], not 2\n"
    assert not (tmp_path / "soak").exists()

# -- the record and resuming --------------------------------------------------------------------
def test_record_skips_a_torn_line_and_a_resume_continues_the_progress(tmp_path) -> None:
    record = Record(tmp_path)
    record.add_sample({"t": 1.0, "phase": "run"})
    with open(record.samples_path, "a") as f:
        f.write('{"t": 2.0, "ph')  # the soak was killed mid-write
    assert record.read_samples() == [{"t": 1.0, "phase": "run"}]
    record.save_progress({"t": 30.0, "next_session": 7, "epoch": 0, "restarted": True,
                          "server_pid": None, "tally": {"sent": 5, "hangs": 0}})
    options = SoakOptions(trace="x", sessions=2, request_timeout_s=9.0)
    soak = Soak(server=None, sessions=[], plan=FaultPlan(), record=record, options=options,
                run_s=60.0, drain_s=1.0)
    soak.restore(record.read_progress())
    assert (soak.t0, soak.next_session, soak.epoch, soak.restarted) == (30.0, 7, 1, True)
    assert soak.tally.sent == 5 and soak.tally.timeout_s == 9.0
    record.stop_leftover_server()  # no pid: nothing to stop
    plot([{"t": 0.0, "phase": "run", "api_rss": 1}, {"t": 5.0, "phase": "down"}],
         tmp_path / "soak.png")
    assert (tmp_path / "soak.png").stat().st_size > 0


# -- end to end ----------------------------------------------------------------------------------
def tiny_trace() -> Trace:
    def turns(n: int) -> list[Turn]:
        last = n - 1
        return [Turn(input_tokens=64 + 16 * i, output_tokens=8,
                     tool=None if i == last else "bash", tool_seconds=0.0 if i == last else 20.0,
                     tool_return_tokens=0 if i == last else 16) for i in range(n)]
    return Trace(name="tiny", programs=[Program(id=f"p{i}", arrival_s=0.0, turns=turns(3 + i))
                                        for i in range(3)])


@pytest.mark.server
@pytest.mark.slow
def test_a_short_soak_against_a_real_server(tmp_path, capsys) -> None:
    trace = save_trace(tiny_trace(), tmp_path / "tiny.jsonl")
    out = tmp_path / "soak"
    # a program scheduler, whose table must drain: the faulted clients never say program_end
    options = SoakOptions(trace=str(trace), policy="lookahead", minutes=0.5, time_scale=0.05,
                          sessions=3, faults="all,-restart", sample_s=2.0, stale_after_s=4.0,
                          request_timeout_s=30.0, out=str(out))
    status = run_soak(options)
    summary = json.loads((out / "summary.json").read_text())
    tally = summary["tally"]
    assert tally["hangs"] == 0 and tally["answered"] > 0, tally
    assert tally["sessions_done"] >= 3, tally
    checks = {c["name"]: c for c in summary["checks"]}
    drained = checks["programs, pins and orphaned KV back to zero"]
    assert drained["passed"] is True, drained
    lines = (out / "samples.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert first["api_rss"] and first["engine_rss"], first
    assert any(json.loads(line)["phase"] == "drain" for line in lines)
    assert any(json.loads(line)["programs_tracked"] for line in lines)  # the table was seen
    assert (out / "soak.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "every request answered or refused" in printed
    assert status in (0, 1)
    with pytest.raises(SoakError, match="already holds a soak run"):
        run_soak(options)
