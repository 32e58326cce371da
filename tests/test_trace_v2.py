"""Version 2 of the trace format (common/trace.py): gap kinds, turns that keep part of the
conversation, sub-agents linked to their parent; and that a trace without them is still
version 1, byte for byte."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from common.trace import (
    ParentLink,
    Program,
    Trace,
    TraceFormatError,
    Turn,
    load_trace,
    parse_trace,
    save_trace,
    summarize,
)
from eval.workloads.swe import swe_like

ROOT = Path(__file__).resolve().parent.parent


def _compacted() -> Program:
    """The docstring's example: the third turn keeps 64 of the 135 tokens before it."""
    return Program(id="p", arrival_s=0.0, turns=[
        Turn(input_tokens=100, output_tokens=10, tool="bash", tool_seconds=1.0,
             tool_return_tokens=20),
        Turn(input_tokens=0, output_tokens=5, tool="person", tool_seconds=30.0,
             tool_return_tokens=30, gap_kind="person"),
        Turn(kept_tokens=64, input_tokens=6, output_tokens=7),
    ])


def test_kept_tokens_accounting():
    p = _compacted()
    assert p.contexts() == [(100, 110), (130, 135), (100, 107)]
    assert [p.context_before(i) for i in range(3)] == [100, 130, 100]
    assert [p.new_tokens(i) for i in range(3)] == [100, 20, 36]
    assert [p.reused_tokens(i) for i in range(3)] == [0, 110, 64]
    assert p.processed_tokens == 110 + 135 + 107
    assert p.final_context_tokens == 107
    assert p.version == 2


def test_a_version_1_trace_is_written_as_before(tmp_path):
    trace = swe_like(20, 1.0, 3)
    assert trace.version == 1
    path = save_trace(trace, tmp_path / "t.jsonl")
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["version"] == 1
    assert all("gap_kind" not in line and "kept_tokens" not in line and '"parent"' not in line
               for line in lines[1:])
    assert "version" not in summarize(trace).model_dump()
    assert "longest prompt" not in summarize(trace).markdown()
    committed = ROOT / "datasets" / "traces" / "swe-100.jsonl"
    again = save_trace(load_trace(committed), tmp_path / "swe-100.jsonl")
    assert again.read_bytes() == committed.read_bytes()


def test_version_2_round_trip(tmp_path):
    child = Program(id="p/agent_001", arrival_s=12.5, parent=ParentLink(
        id="p", after_turn=1, delay_s=0.5), turns=[Turn(input_tokens=50, output_tokens=3)])
    trace = Trace(name="v2", programs=[_compacted(), child])
    path = save_trace(trace, tmp_path / "v2.jsonl")
    assert json.loads(path.read_text().splitlines()[0])["version"] == 2
    back = load_trace(path)
    assert back == trace
    stats = back.stats()
    assert (stats.version, stats.max_prompt, stats.kept_turns, stats.subagents) == (2, 130, 1, 1)
    assert stats.gap_s["person"].n == 1 and stats.gap_s["person"].p50 == 30.0
    assert stats.gap_s["tool"].max == 1.0
    assert "person gap s p50" in stats.markdown() and "longest prompt" in stats.markdown()


@pytest.mark.parametrize(("turns", "parent", "pattern"), [
    ([Turn(kept_tokens=5, input_tokens=10, output_tokens=1)], None, r"turns\[0\]\.kept_tokens"),
    ([Turn(input_tokens=10, output_tokens=1, tool="t"),
      Turn(kept_tokens=12, input_tokens=1, output_tokens=1)], None, "is more than"),
    ([Turn(input_tokens=10, output_tokens=1, gap_kind="person")], None, "gap_kind must keep"),
    ([Turn(input_tokens=10, output_tokens=1)], ParentLink(id="x", after_turn=0, delay_s=0),
     "the program itself"),
])
def test_version_2_rules(turns, parent, pattern):
    with pytest.raises(ValueError, match=pattern):
        Program(id="x", arrival_s=0, turns=turns, parent=parent)


def test_a_version_1_file_may_not_use_version_2_fields(tmp_path):
    path = save_trace(Trace(name="v2", programs=[_compacted()]), tmp_path / "t.jsonl")
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace('"version":2', '"version":1')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: program 'p' uses fields of format "
                                               r"version 2"):
        load_trace(path)


def test_readme_version_2_example_says_what_the_readme_states():
    text = (ROOT / "datasets" / "traces" / "README.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, re.S)
    trace = parse_trace(blocks[1].splitlines(), origin="README")
    session, child = trace.programs
    assert trace.version == 2 and child.parent == ParentLink(id="s", after_turn=0, delay_s=0.5)
    assert [before for before, _ in session.contexts()] == [100, 130, 100]
    assert [session.new_tokens(i) for i in range(3)] == [100, 20, 36]
    assert [t.gap_kind for t in session.turns[:2]] == ["subagent", "person"]
