"""Claude Code sessions in kv-cache-tester's format (eval/workloads/importers/claude_code.py):
hand-made session files with a compaction, sub-agents (waited for and launched apart), end_turn
and streaming gaps; the round trip against the source; a missing field; a folder as a trace;
the replayer's prompts for a turn that keeps part of the conversation; kv-cache-tester's warm
prefix (`--warm-prefix-pct`), the same share of the largest tool + system prompt opening every
program's first prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.trace import ParentLink, Program, Trace, TraceFormatError, Turn, load_trace, save_trace
from eval.bench.runs import Workload
from eval.bench.specs import BenchError
from eval.bench.traces import make_traces
from eval.workloads.arrivals import arrival_times, retime, round_time, streams
from eval.workloads.importers import (
    check_round_trip,
    detect_format,
    import_file,
    import_file_programs,
    programs_from_claude_code,
)
from eval.workloads.registry import load_or_generate
from eval.workloads.warm_prefix import WARM_PREFIX_ID, warm_prefix_tokens, with_warm_prefix
from sim.conversation import FIRST_ID, LAST_ID, ProgramState


def _request(t: float, tokens: int, out: int, hashes: list[int], stop: str = "tool_use",
             new: str = "tool_result", **timing: float) -> dict:
    return {"t": t, "type": "n", "model": "claude-opus", "in": tokens, "out": out,
            "hash_ids": hashes, "input_types": [new], "output_types": ["text"], "stop": stop,
            **timing}


def _session(sid: str = "s") -> dict:
    """Blocks of 4 tokens. r0 -> [sub-agent A, waited for] -> r1 (appended) -end_turn-> r2
    (a person's text) -> [sub-agent B, launched apart] -> r3 (keeps 2 blocks: a compaction)
    -tool_use-> r4 (appended) -tool_use-> r5 (keeps r4's prompt, not all of its answer)."""
    agent_a = {"t": 5.0, "type": "subagent", "agent_id": "agent_001", "subagent_type": "Explore",
               "duration_ms": 3000, "status": "completed", "models": ["claude-haiku"],
               "requests": [_request(0.0, 8, 1, [100, 101], api_time=0.5, think_time=0.0),
                            _request(1.5, 12, 3, [100, 101, 102], stop="end_turn",
                                     api_time=0.4, think_time=1.0)]}
    agent_b = {"t": 31.5, "type": "subagent", "agent_id": "agent_002", "duration_ms": None,
               "status": "async_launched", "requests": [_request(0.0, 6, 1, [200])]}
    return {"id": sid, "models": ["claude-opus"], "block_size": 4, "hash_id_scope": "local",
            "tool_tokens": 5, "system_tokens": 3, "requests": [
                _request(0.0, 10, 2, [1, 2], new="text", api_time=1.0, think_time=0.0),
                agent_a,
                _request(8.0, 20, 3, [1, 2, 3, 4, 5], stop="end_turn", api_time=1.0,
                         think_time=7.0),
                _request(30.0, 30, 2, [1, 2, 3, 4, 5, 6, 7], stop="", new="text",
                         think_time=21.0),
                agent_b,
                _request(40.0, 16, 1, [1, 2, 9, 10], new="text", api_time=2.0),
                _request(45.0, 18, 3, [1, 2, 9, 10], think_time=4.0),
                _request(50.0, 20, 1, [1, 2, 9, 10, 11], think_time=2.0),
            ], "totals": {}}


def test_a_session_and_its_subagents():
    session, a, b = programs_from_claude_code(_session())
    assert [t.input_tokens for t in session.turns] == [10, 0, 7, 8, 0, 0]
    assert [t.output_tokens for t in session.turns] == [2, 3, 2, 1, 3, 1]
    assert [t.kept_tokens for t in session.turns] == [None, None, None, 8, None, 18]
    assert [t.gap_kind for t in session.turns[:-1]] == ["subagent", "person", "person", "tool",
                                                         "tool"]
    assert [t.tool for t in session.turns] == ["subagent", "person", "person", "tool", "tool",
                                               None]
    # think_time, else the starts' difference less api_time (r2 has none: 40 - 30)
    assert [t.tool_seconds for t in session.turns] == [7.0, 21.0, 10.0, 4.0, 2.0, 0.0]
    # new tokens after a tool or sub-agent gap are its return, after a person's the input
    assert [t.tool_return_tokens for t in session.turns] == [8, 0, 0, 1, 2, 0]
    assert [before for before, _ in session.contexts()] == [10, 20, 30, 16, 18, 20]
    assert session.reused_tokens(3) == 8 and session.reused_tokens(5) == 18
    assert session.meta["session"] == "s" and session.benchmark == "claude-code"
    # A ended at 5 after 3 s: it started at 2, 1 s after r0's answer (t 0 + api 1)
    assert (a.id, a.arrival_s, a.parent) == ("s/agent_001", 2.0,
                                              ParentLink(id="s", after_turn=0, delay_s=1.0))
    assert [t.tool_return_tokens for t in a.turns] == [3, 0] and a.meta["duration_s"] == 3.0
    # B was launched at 31.5, 1.5 s after r2 (no api_time: its start), and not waited for
    assert (b.arrival_s, b.parent) == (31.5, ParentLink(id="s", after_turn=2, delay_s=1.5))
    assert check_round_trip(_session(), [session, a, b]) == []


def test_round_trip_names_what_differs():
    programs = programs_from_claude_code(_session())
    wrong = programs[0].turns[3].model_copy(update={"kept_tokens": 4, "input_tokens": 12})
    tampered = programs[0].model_copy(update={"turns": [*programs[0].turns[:3], wrong,
                                                        *programs[0].turns[4:]]})
    assert check_round_trip(_session(), [tampered, *programs[1:]]) == [
        "s turn 3: shares 4 tokens with the previous prompt, the hashes say 8"]
    source = _session()
    source["requests"][2]["in"] = 21  # r1 one token longer than the program says
    found = check_round_trip(source, programs)
    assert "s turn 1: prompt 20 != in 21" in found
    assert check_round_trip(_session(), programs[:2]) == [
        "requests[4].requests: no program 's/agent_002'"]


def test_a_missing_field_names_the_file_and_request(tmp_path):
    session = _session()
    del session["requests"][3]["in"]
    path = tmp_path / "trace_0007.json"
    path.write_text(json.dumps(session))
    with pytest.raises(TraceFormatError,
                       match=r"trace_0007\.json: requests\[3\]: missing \"in\""):
        import_file_programs(path)
    session = _session()
    session["requests"][1]["requests"][0]["hash_ids"] = "abc"
    path.write_text(json.dumps(session))
    with pytest.raises(TraceFormatError, match=r"requests\[1\]\.requests\[0\]\.hash_ids must"):
        import_file(path)


def test_the_registry_knows_the_format(tmp_path):
    assert detect_format(_session()) == "claude-code"
    path = tmp_path / "one.json"
    path.write_text(json.dumps(_session("one")))
    assert import_file(path).id == "one"  # the session's own program
    assert [p.id for p in import_file_programs(path)] == ["one", "one/agent_001",
                                                          "one/agent_002"]


def test_a_folder_is_a_trace_and_sub_agents_follow_their_parent(tmp_path):
    for sid in ("a", "b"):
        (tmp_path / f"{sid}.json").write_text(json.dumps(_session(sid)))
    trace = load_or_generate(tmp_path)
    assert len(trace) == 6 and trace.version == 2
    assert [p.id for p in trace.top_level()] == ["a", "b"]
    assert [p.id for p in trace.head(1).programs] == ["a", "a/agent_001", "a/agent_002"]
    moved = load_or_generate(tmp_path, n=2, jps=0.5, seed=3)
    by_id = {p.id: p for p in moved.programs}
    for sid in ("a", "b"):
        assert by_id[f"{sid}/agent_001"].arrival_s == pytest.approx(by_id[sid].arrival_s + 2.0)
        assert by_id[f"{sid}/agent_002"].arrival_s == pytest.approx(by_id[sid].arrival_s + 31.5)
    # the converted file replays the same programs
    saved = load_trace(save_trace(trace, tmp_path / "converted.jsonl"))
    assert saved.programs == trace.programs
    with pytest.raises(TraceFormatError, match="no recorded runs"):
        load_or_generate(_empty(tmp_path))


def _empty(tmp_path: Path) -> Path:
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


def test_retime_of_a_trace_without_sub_agents_is_what_it_was():
    plain = Trace(name="t", programs=[
        Program(id=f"p{i}", arrival_s=float(i), turns=[Turn(input_tokens=5, output_tokens=1)])
        for i in range(5)])
    drawn = arrival_times(5, 2.0, streams(7)[1])
    assert [p.arrival_s for p in retime(plain, 2.0, 7).programs] == [round_time(t) for t in drawn]
    assert plain.top_level() == plain.programs and plain.head(3).programs == plain.programs[:3]


def test_parent_links_may_not_cycle():
    def program(pid: str, parent: str) -> Program:
        return Program(id=pid, arrival_s=0.0, turns=[Turn(input_tokens=5, output_tokens=1)],
                       parent=ParentLink(id=parent, after_turn=0, delay_s=0.0))

    with pytest.raises(ValueError, match="form a cycle"):
        Trace(name="t", programs=[program("a", "b"), program("b", "a")])


def test_a_kept_prefix_is_rendered_exactly():
    """The prompt of a turn that keeps K tokens starts with the first K tokens of the
    conversation before it and its next token differs, so a prefix cache hits exactly K (to
    its block size)."""
    session = programs_from_claude_code(_session())[0]
    state = ProgramState(session)
    for i in range(2):
        state.extend(i, [7] * session.turns[i].output_tokens)
    assert len(state.tokens) == session.context_before(2) == 30
    left = [*state.tokens, 7, 7]  # the conversation turn 2 leaves: its prompt and answer
    state.extend(2, [7, 7])
    assert len(state.tokens) == session.context_before(3) == 16
    assert state.tokens[:8] == left[:8] and state.tokens[8] != left[8]
    assert state.computed == 8  # only the kept tokens' KV can serve the next turn


def test_the_first_new_token_never_continues_the_dropped_conversation():
    program = Program(id="c", arrival_s=0.0, turns=[
        Turn(input_tokens=4, output_tokens=4, tool="t", tool_return_tokens=0),
        Turn(kept_tokens=6, input_tokens=3, output_tokens=1)])

    def kept_then_new(answer: list[int]) -> list[int]:
        state = ProgramState(program)
        state.extend(0, answer)
        return state.tokens

    drawn = kept_then_new([7, 7, 7, 7])[6]  # ids are drawn from 8 on: no clash with 7
    clashing = kept_then_new([drawn] * 4)  # the same draw, now equal to the token it replaces
    assert clashing[6] != drawn and FIRST_ID <= clashing[6] < LAST_ID
    assert clashing[4:6] == [drawn, drawn] and len(clashing) == 9  # the kept answer, 3 new


@pytest.mark.engine
def test_vllm_prefix_cache_hits_the_kept_tokens(autoclose):
    """In the virtual-time engine, a turn keeping 200 tokens gets 192 from the prefix cache
    (vLLM's 16-token blocks); the appended turn before it gets all of its previous context."""
    from server.engine import VirtualEngine
    from server.engine_spec import EngineSpec
    from server.policies.spec import PolicySpec
    from sim.replay import replay

    trace = Trace(name="kept", programs=[Program(id="p", arrival_s=0.0, turns=[
        Turn(input_tokens=600, output_tokens=20, tool="bash", tool_seconds=0.5,
             tool_return_tokens=40),
        Turn(input_tokens=30, output_tokens=10, tool="bash", tool_seconds=0.5),
        Turn(kept_tokens=200, input_tokens=50, output_tokens=5)])])
    engine = autoclose(VirtualEngine(PolicySpec.named("vllm"),
                                     EngineSpec(profile="h100-llama-3.1-8b")))
    turns = replay(trace, engine).programs["p"].turns
    assert [t.prompt_tokens for t in turns] == [600, 690, 250]
    assert turns[1].cached_tokens == 608  # 619 computed tokens: 38 whole blocks
    assert turns[2].cached_tokens == 192


def _sessions_folder(tmp_path, tools: dict[str, tuple[int, int]]):
    """Sessions named by `tools`, each recording (tool_tokens, system_tokens)."""
    for sid, (tool, system) in tools.items():
        data = _session(sid)
        data.update(tool_tokens=tool, system_tokens=system)
        (tmp_path / f"{sid}.json").write_text(json.dumps(data))
    return tmp_path


def test_every_first_prompt_opens_with_the_same_share_of_the_largest_tool_and_system_prompt(
        tmp_path):
    trace = load_or_generate(_sessions_folder(tmp_path, {"a": (5, 3), "b": (9, 3)}))
    assert warm_prefix_tokens(trace, 0.5) == 6  # half of b's 12
    warm = with_warm_prefix(trace, 0.5)
    # sessions' first prompts are 10 tokens, a's sub-agents' 8 and 6: all open with 6
    assert [p.shared_prefix_tokens for p in warm.programs] == [6] * 6
    assert {p.shared_prefix_id for p in warm.programs} == {WARM_PREFIX_ID}
    assert warm.params["warm_prefix_pct"] == 0.5
    first = [ProgramState(p).tokens[:6] for p in warm.programs]
    assert all(tokens == first[0] for tokens in first)
    # as recorded the sessions share nothing: their first tokens differ
    plain = [ProgramState(p).tokens[:6] for p in trace.top_level()]
    assert plain[0] != plain[1]
    # a prompt shorter than the prefix is all of it
    whole = {p.id: p.shared_prefix_tokens for p in with_warm_prefix(trace, 1.0).programs}
    assert whole == {"a": 10, "a/agent_001": 8, "a/agent_002": 6,
                     "b": 10, "b/agent_001": 8, "b/agent_002": 6}
    assert with_warm_prefix(trace, 0.0) is trace


def test_a_trace_the_warm_prefix_cannot_apply_to_is_refused(tmp_path):
    trace = load_or_generate(_sessions_folder(tmp_path, {"a": (0, 0)}))
    with pytest.raises(ValueError, match="record their tool and system tokens"):
        with_warm_prefix(trace, 0.5)
    swe = load_or_generate("swe", 2, 1.0, 0)  # a generated trace shares its own system prompt
    with pytest.raises(ValueError, match="already shares a prefix"):
        with_warm_prefix(swe.model_copy(update={"programs": [
            p.model_copy(update={"meta": {"tool_tokens": 10}}) for p in swe.programs]}), 0.5)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        with_warm_prefix(trace, 1.5)


def test_the_bench_replays_the_warm_prefix_and_refuses_a_bad_share(tmp_path):
    folder = _sessions_folder(tmp_path, {"a": (5, 3), "b": (9, 3)})
    closed = Workload(str(folder), concurrency=(2,), warm_prefix_pct=0.5)
    (trace,) = make_traces(closed).values()
    assert {p.shared_prefix_tokens for p in trace.programs} == {6}
    with pytest.raises(BenchError, match="--warm-prefix-pct must be in"):
        Workload(str(folder), concurrency=(2,), warm_prefix_pct=-0.1)
    with pytest.raises(BenchError, match="--warm-prefix-pct needs Claude Code sessions"):
        make_traces(Workload("swe", jps=(1.0,), warm_prefix_pct=0.5))
