"""The trace format (common/trace.py): token accounting, the file's round trip and its errors,
and the statistics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from common import trace as trace_format
from common.trace import Program, TraceFormatError, Turn, load_trace, parse_trace, save_trace
from eval.workloads.bfcl import bfcl_like
from eval.workloads.infercept import infercept_mix
from eval.workloads.registry import merge
from eval.workloads.swe import swe_like

ROOT = Path(__file__).resolve().parent.parent
TRACES_DIR = ROOT / "datasets" / "traces"


def _program(pid: str = "p0", arrival: float = 0.0) -> Program:
    return Program(
        id=pid,
        arrival_s=arrival,
        benchmark="swe",
        source="hand",
        shared_prefix_tokens=800,
        shared_prefix_id="swe-system",
        turns=[
            Turn(
                input_tokens=2000,
                output_tokens=150,
                tool="bash",
                tool_seconds=0.4,
                tool_return_tokens=600,
            ),
            Turn(
                input_tokens=0,
                output_tokens=120,
                tool="python",
                tool_seconds=3.2,
                tool_return_tokens=900,
            ),
            Turn(input_tokens=0, output_tokens=80),
        ],
    )


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _header(n: int | None = 1, **extra) -> str:
    obj = {"format": "harness-trace", "version": 1, "name": "t", "n_programs": n, **extra}
    return json.dumps(obj)


def _good_line(pid: str = "a") -> str:
    return _program(pid).model_dump_json()



# --- the format --------------------------------------------------------------------------------


def test_token_accounting_helpers():
    p = _program()
    assert [p.context_before(i) for i in range(3)] == [2000, 2750, 3770]
    assert [p.context_after(i) for i in range(3)] == [2150, 2870, 3850]
    assert [p.new_tokens(i) for i in range(3)] == [2000, 600, 900]
    assert p.prompt_tokens(1) == p.context_before(1)
    assert p.contexts() == [(2000, 2150), (2750, 2870), (3770, 3850)]
    assert p.processed_tokens == 8870
    assert p.final_context_tokens == 3850
    assert p.n_tool_calls == 2
    assert p.tool_seconds == pytest.approx(3.6)
    with pytest.raises(IndexError, match="no turn 3"):
        p.context_before(3)


def test_readme_example_is_a_valid_trace(tmp_path):
    text = (TRACES_DIR / "README.md").read_text()
    block = re.search(r"```json\n(.*?)```", text, re.S)
    assert block, "README has a json example"
    trace = parse_trace(block.group(1).splitlines(), origin="README")
    assert [p.id for p in trace.programs] == ["p0", "p1"]
    assert trace.programs[0].processed_tokens == 8870  # the number the README states


def test_round_trip(tmp_path):
    trace = merge(
        swe_like(20, 1.0, 1), bfcl_like(10, 1.0, 2, scale=0.5), infercept_mix(30, 2.0, 3)
    )
    path = trace.save(tmp_path / "sub" / "m.jsonl")
    loaded = load_trace(path)
    assert loaded == trace
    assert loaded.programs == trace.programs
    # written sorted by arrival, one header and one line per program, nothing left behind
    assert len(path.read_text().splitlines()) == len(trace) + 1
    assert [p.name for p in path.parent.iterdir()] == ["m.jsonl"]


def test_save_is_atomic(tmp_path, monkeypatch):
    path = save_trace(swe_like(3, 1.0, 0), tmp_path / "t.jsonl")
    before = path.read_bytes()
    calls = {"n": 0}
    real = trace_format._dumps

    def failing(obj):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("disk full")
        return real(obj)

    monkeypatch.setattr(trace_format, "_dumps", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        save_trace(swe_like(5, 1.0, 9), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]


@pytest.mark.parametrize(
    ("lines", "pattern"),
    [
        (
            [_header(2), _good_line("a"), '{"id": "b", "arrival_s": 1,'],
            r"t\.jsonl:3: not valid JSON",
        ),
        ([_header(1), json.dumps({"id": "a", "arrival_s": 0})], r"t\.jsonl:2: program 'a': turns"),
        (
            [_header(1), _good_line("a").replace('"output_tokens":150', '"output_tokens":-1')],
            r"t\.jsonl:2: program 'a': turns\.0\.output_tokens",
        ),
        (
            [_header(1), _good_line("a").replace('"tool":null', '"tool":"bash"')],
            r"t\.jsonl:2: .*last turn",
        ),
        (
            [_header(1), _good_line("a").replace('"tool":"python"', '"tool":null')],
            r"t\.jsonl:2: .*must name the tool",
        ),
        ([_header(1), _good_line("a").replace('"turns"', '"turnz"')], r"t\.jsonl:2: .*turnz"),
        ([_good_line("a")], r"t\.jsonl:1: the first line is a program"),
        ([json.dumps({"format": "other"})], r"t\.jsonl:1: not a trace header"),
        ([_header(1, version=7)], r"t\.jsonl:1: trace format version 7"),
        ([_header(1, extra_field=1)], r"t\.jsonl:1: unknown header field"),
        (
            [_header(3), _good_line("a"), _good_line("b")],
            r"t\.jsonl:1: the header says 3 programs but the file has 2",
        ),
        ([_header(2), _good_line("a"), _good_line("a")], r"appears twice"),
        (["[1, 2]"], r"t\.jsonl:1: expected a JSON object"),
        ([""], r"empty file"),
    ],
)
def test_bad_files_name_the_line(tmp_path, lines, pattern):
    path = _write(tmp_path, lines)
    with pytest.raises(TraceFormatError, match=pattern):
        load_trace(path)


def test_missing_file_and_shared_prefix_rules(tmp_path):
    with pytest.raises(TraceFormatError, match="no such trace file"):
        load_trace(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="shared_prefix_id"):
        Program(
            id="x",
            arrival_s=0,
            shared_prefix_tokens=5,
            turns=[Turn(input_tokens=10, output_tokens=1)],
        )
    with pytest.raises(ValueError, match="more than turns"):
        Program(
            id="x",
            arrival_s=0,
            shared_prefix_tokens=50,
            shared_prefix_id="s",
            turns=[Turn(input_tokens=10, output_tokens=1)],
        )
    with pytest.raises(ValueError, match="initial prompt"):
        Program(id="x", arrival_s=0, turns=[Turn(input_tokens=0, output_tokens=1)])



def test_stats_markdown():
    text = swe_like(10, 1.0, 0).stats().markdown()
    assert text.startswith("| statistic | value |") and "tokens / program" in text
