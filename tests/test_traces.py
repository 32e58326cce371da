"""The trace format (eval/traces.py), its generators and the importers (eval/trace_import.py)."""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from eval import trace_import as ti
from eval import traces as tr
from eval.traces import Program, TraceFormatError, Turn

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
    trace = tr.parse_trace(block.group(1).splitlines(), origin="README")
    assert [p.id for p in trace.programs] == ["p0", "p1"]
    assert trace.programs[0].processed_tokens == 8870  # the number the README states


def test_round_trip(tmp_path):
    trace = tr.merge(
        tr.swe_like(20, 1.0, 1), tr.bfcl_like(10, 1.0, 2, scale=0.5), tr.infercept_mix(30, 2.0, 3)
    )
    path = trace.save(tmp_path / "sub" / "m.jsonl")
    loaded = tr.load_trace(path)
    assert loaded == trace
    assert loaded.programs == trace.programs
    # written sorted by arrival, one header and one line per program, nothing left behind
    assert len(path.read_text().splitlines()) == len(trace) + 1
    assert [p.name for p in path.parent.iterdir()] == ["m.jsonl"]


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tr.save_trace(tr.swe_like(3, 1.0, 0), tmp_path / "t.jsonl")
    before = path.read_bytes()
    calls = {"n": 0}
    real = tr._dumps

    def failing(obj):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("disk full")
        return real(obj)

    monkeypatch.setattr(tr, "_dumps", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        tr.save_trace(tr.swe_like(5, 1.0, 9), path)
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
        tr.load_trace(path)


def test_missing_file_and_shared_prefix_rules(tmp_path):
    with pytest.raises(TraceFormatError, match="no such trace file"):
        tr.load_trace(tmp_path / "nope.jsonl")
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


# --- distributions and arrivals ---------------------------------------------------------------


@pytest.mark.parametrize(
    "dist",
    [
        tr.ClippedLogNormal(0.925, 3.55, 0.01, 60.0),
        tr.ClippedLogNormal(3.4025, 7.333, 0.05, 120.0),
        tr.ClippedLogNormal(9e-5, 3e-5, 1e-5, 1e-3),
        tr.ClippedLogNormal(1.923, 2.133, 0.02, 60.0),
    ],
)
def test_clipped_lognormal_has_the_fitted_moments(dist):
    x = dist.sample(np.random.default_rng(0), 2_000_000)
    assert x.min() >= dist.lo and x.max() <= dist.hi
    assert x.mean() == pytest.approx(dist.mean, rel=0.01)
    assert x.std() == pytest.approx(dist.sd, rel=0.03)


def test_discrete_normal_pmf_is_exact():
    d = tr.DiscreteNormal(6.3, 2.3, 2, 20)
    assert d.pmf.sum() == pytest.approx(1.0)
    assert d.moment(lambda n: n) == pytest.approx(6.3, abs=1e-6)
    assert math.sqrt(d.moment(lambda n: n * n) - 6.3**2) == pytest.approx(2.3, abs=1e-6)
    with pytest.raises(ValueError):
        tr.DiscreteNormal(1.0, 1.0, 2, 10)


def test_poisson_arrivals_have_the_rate():
    t = tr.poisson_arrivals(20_000, 3.0, np.random.default_rng(1))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert np.all(gaps >= 0)
    assert len(t) / t[-1] == pytest.approx(3.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)  # exponential: CV 1


def test_gamma_arrivals_have_rate_and_cv():
    t = tr.gamma_arrivals(20_000, 2.0, 3.0, np.random.default_rng(2))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert len(t) / t[-1] == pytest.approx(2.0, rel=0.08)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.08)


@pytest.mark.parametrize("rate", [0, -1.0, math.inf, math.nan])
def test_bad_rates_are_refused(rate):
    with pytest.raises(ValueError, match="positive number"):
        tr.swe_like(3, rate, 0)


def test_generator_arrivals_follow_jps():
    s = tr.swe_like(3000, 5.0, 4).stats()
    assert s.arrival_rate_jps == pytest.approx(5.0, rel=0.08)


# --- generators --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(tr.TRACES))
def test_generators_are_deterministic(name, tmp_path):
    gen = tr.TRACES[name]
    a, b, c = gen(40, 1.0, 7), gen(40, 1.0, 7), gen(40, 1.0, 8)
    assert a.save(tmp_path / "a").read_bytes() == b.save(tmp_path / "b").read_bytes()
    assert [p.turns for p in a.programs] != [p.turns for p in c.programs]
    # the load changes the arrivals, not the programs (same seed, other jps)
    d = gen(40, 3.0, 7)
    by_id = {p.id: p for p in d.programs}
    assert all(by_id[p.id].turns == p.turns for p in a.programs)
    assert [p.arrival_s for p in a.programs] != [by_id[p.id].arrival_s for p in a.programs]


def test_swe_like_hits_continuum_table_2():
    spec = tr._swe_spec()
    # the distributions themselves hit the targets exactly
    assert spec.tool_seconds_moments() == pytest.approx((0.925, 3.55), rel=1e-3)
    assert spec.expected_tokens()[0] == pytest.approx(70_000, rel=1e-6)
    s = tr.swe_like(4000, 2.0, 0).stats()
    assert s.turns_mean == pytest.approx(10.9, rel=0.02)
    assert s.turns_sd == pytest.approx(2.1, rel=0.06)
    assert s.tool_s_mean == pytest.approx(0.925, rel=0.10)
    assert s.tool_s_sd == pytest.approx(3.55, rel=0.20)
    assert s.tool_s_p50 < 0.5 < 3.0 < s.tool_s_p95  # long tail: most calls fast
    assert s.tokens_per_program_mean == pytest.approx(70_000, rel=0.03)
    # plausible SWE contexts: a few thousand tokens at the start, ~10k at the end
    assert 1500 < s.first_prompt_mean < 4000
    assert 6000 < s.final_context_mean < 15_000
    assert 100 < s.output_tokens_per_turn_mean < 300


def test_swe_long_like_hits_the_public_mini_swe_agent_runs():
    """Means and medians of the 500 public runs (SWE_LONG_TARGETS), from 1,000 programs."""
    t = tr.SWE_LONG_TARGETS
    trace = tr.swe_long_like(1000, 0.1, 0)
    s = trace.stats()
    assert s.turns_mean == pytest.approx(t["turns_mean"], rel=0.05)
    assert s.turns_sd == pytest.approx(t["turns_sd"], rel=0.10)
    assert s.first_prompt_mean == pytest.approx(t["first_prompt_mean"], rel=0.03)
    assert s.output_tokens_per_turn_mean == pytest.approx(t["output_tokens_per_turn_mean"],
                                                          rel=0.06)
    assert s.tool_return_tokens_mean == pytest.approx(t["tool_return_tokens_mean"], rel=0.06)
    assert s.final_context_mean == pytest.approx(t["final_context_mean"], rel=0.08)
    outputs = [x.output_tokens for p in trace.programs for x in p.turns]
    returns = [x.tool_return_tokens for p in trace.programs for x in p.turns[:-1]]
    # heavy tails: the medians sit far below the means, as in the runs
    assert np.median(outputs) == pytest.approx(t["output_tokens_per_turn_median"], rel=0.08)
    assert np.median(returns) == pytest.approx(t["tool_return_tokens_median"], rel=0.08)
    # a fifth of them outgrow a 32k context; every tool is a `bash:<class>` command
    assert 0.1 < sum(p.final_context_tokens > 32_768 for p in trace.programs) / 1000 < 0.35
    assert {x.tool for p in trace.programs for x in p.turns[:-1]} == {
        "bash:edit", "bash:grep", "bash:python"}


def test_bfcl_like_hits_continuum_table_2():
    assert tr._bfcl_spec().expected_tokens() == pytest.approx((93_000, 69_000), rel=1e-4)
    s = tr.bfcl_like(4000, 2.0, 0).stats()
    assert s.turns_mean == pytest.approx(6.3, rel=0.03)
    assert s.turns_sd == pytest.approx(2.3, rel=0.06)
    assert s.tool_s_mean == pytest.approx(1.923, rel=0.05)
    assert s.tool_s_sd == pytest.approx(2.133, rel=0.10)
    assert s.tokens_per_program_mean == pytest.approx(93_000, rel=0.06)
    assert s.tokens_per_program_sd == pytest.approx(69_000, rel=0.12)


def test_bfcl_scale_multiplies_tokens():
    base, half = tr.bfcl_like(50, 1.0, 3), tr.bfcl_like(50, 1.0, 3, scale=0.5)
    ratio = half.stats().tokens_total / base.stats().tokens_total
    assert ratio == pytest.approx(0.5, rel=0.01)
    assert [p.n_turns for p in half.programs] == [p.n_turns for p in base.programs]
    with pytest.raises(ValueError, match="scale"):
        tr.bfcl_like(5, 1.0, 0, scale=0)


def test_infercept_mix_follows_its_table():
    trace = tr.infercept_mix(6000, 2.0, 0)
    groups = tr.summarize_by(trace)
    assert set(groups) == {row.kind for row in tr.INFERCEPT_TABLE}
    contexts: dict[str, list[int]] = defaultdict(list)
    returns: dict[str, list[int]] = defaultdict(list)
    for p in trace.programs:
        contexts[p.benchmark] += [after for _, after in p.contexts()[:-1]]
        returns[p.benchmark] += [t.tool_return_tokens for t in p.turns[:-1]]
        assert p.shared_prefix_id == f"infercept-{p.benchmark}"
    for row in tr.INFERCEPT_TABLE:
        s = groups[row.kind]
        assert 800 < s.n_programs < 1200  # equal shares
        n = s.n_programs
        assert s.turns_mean == pytest.approx(
            row.interceptions + 1, abs=5 * row.interceptions_sd / math.sqrt(n)
        )
        assert s.tool_s_mean == pytest.approx(row.seconds, rel=0.06)
        assert np.mean(returns[row.kind]) == pytest.approx(row.returned, rel=0.08)
        # mean context at an interception is the table's
        assert np.mean(contexts[row.kind]) == pytest.approx(row.context, rel=0.05)
    tools = {p.benchmark: p.turns[0].tool for p in trace.programs}
    assert tools["math"] == "calculator" and tools["ve"] == "alfworld"


def test_infercept_mix_kinds_and_weights():
    only = tr.infercept_mix(30, 1.0, 0, kinds=["math", "qa"], weights=[1, 0])
    assert {p.benchmark for p in only.programs} == {"math"}
    with pytest.raises(ValueError, match="unknown InferCept kind"):
        tr.infercept_mix(3, 1.0, 0, kinds=["poker"])


def test_merge_interleaves_by_arrival():
    a, b = tr.swe_like(30, 1.0, 0), tr.bfcl_like(30, 1.0, 0)
    m = tr.merge(a, b)
    assert len(m) == 60
    arrivals = [p.arrival_s for p in m.programs]
    assert arrivals == sorted(arrivals)
    assert {p.benchmark for p in m.programs[:20]} == {"swe", "bfcl"}
    with pytest.raises(ValueError, match="unique ids"):
        tr.merge(a, tr.swe_like(5, 2.0, 1))


def test_load_or_generate(tmp_path):
    gen = tr.load_or_generate("bfcl", n=10, jps=1.0, seed=3, scale=0.5)
    assert gen == tr.bfcl_like(10, 1.0, 3, scale=0.5)
    with pytest.raises(ValueError, match="give n"):
        tr.load_or_generate("swe")
    with pytest.raises(FileNotFoundError, match="neither a trace name"):
        tr.load_or_generate("nope")
    path = gen.save(tmp_path / "g.jsonl")
    assert tr.load_or_generate(path) == gen
    few = tr.load_or_generate(str(path), n=4)
    assert [p.id for p in few.programs] == [p.id for p in gen.programs[:4]]
    fast = tr.load_or_generate(path, jps=50.0, seed=1)
    assert [p.turns for p in fast.programs] == [p.turns for p in gen.programs]
    assert fast.programs[-1].arrival_s < gen.programs[-1].arrival_s


def test_committed_traces_are_current_and_small():
    for name, (generator, n, jps, seed) in {
        "swe-100.jsonl": ("swe", 100, 0.5, 100),
        "bfcl-100.jsonl": ("bfcl", 100, 0.5, 200),
        "mix-200.jsonl": ("mix", 200, 2.0, 300),
    }.items():
        path = TRACES_DIR / name
        assert path.stat().st_size < 1_000_000
        assert tr.load_trace(path) == tr.TRACES[generator](n, jps, seed), (
            f"{name} is out of date: run datasets/traces/build.py"
        )


def test_stats_markdown():
    text = tr.swe_like(10, 1.0, 0).stats().markdown()
    assert text.startswith("| statistic | value |") and "tokens / program" in text


# --- importers ---------------------------------------------------------------------------------


def words(text: str) -> int:
    """A tokenizer stand-in whose counts are easy to do by hand."""
    return len(text.split())


# with `words`: "assistant" is 1, so the generation prompt is 1 + 3 = 4 tokens, and a message
# is count(role) + count(content) + 4 = content + 5 for one-word roles.


def test_mini_swe_agent_import_with_timestamps():
    data = {
        "trajectory_format": "mini-swe-agent-1",
        "info": {"exit_status": "Submitted"},
        "messages": [
            {"role": "system", "content": "you are an agent"},  # 4 words
            {"role": "user", "content": "fix the bug please"},  # 4 words
            {"role": "assistant", "content": "look at files", "extra": {"timestamp": 100.0}},
            {
                "role": "tool",
                "content": "a.py b.py",
                "tool_call_id": "1",
                "extra": {"timestamp": 102.5, "returncode": 0},
            },
            {"role": "assistant", "content": "no action here", "extra": {"timestamp": 110.0}},
            {
                "role": "user",
                "content": "format error note",
                "extra": {"interrupt_type": "FormatError"},
            },
            {"role": "assistant", "content": "run tests now", "extra": {"timestamp": 120.0}},
            {"role": "tool", "content": "1 passed", "extra": {"timestamp": 127.0}},
            {"role": "assistant", "content": "submit", "extra": {"timestamp": 130.0}},
            {"role": "tool", "content": "COMPLETE", "extra": {"timestamp": 130.1}},
            {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}},
        ],
    }
    p = ti.from_mini_swe_agent(data, program_id="astropy-1", count_tokens=words)
    assert p.id == "astropy-1" and p.n_turns == 4 and p.source == "import:mini-swe-agent"
    assert p.turns[0].input_tokens == 1 + (4 + 5) + (4 + 5) + 4
    assert [t.output_tokens for t in p.turns] == [4, 4, 4, 2]
    assert [t.tool for t in p.turns] == ["bash", "format_error", "bash", None]
    assert [t.tool_seconds for t in p.turns] == [2.5, 0.0, 7.0, 0.0]
    assert [t.tool_return_tokens for t in p.turns] == [2 + 5 + 4, 3 + 5 + 4, 2 + 5 + 4, 0]
    assert p.meta["exit_status"] == "Submitted"


def test_mini_swe_agent_old_format_uses_default_seconds():
    data = {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": "```bash\nls\n```"},
            {"role": "user", "content": "<returncode>0</returncode>"},
            {"role": "assistant", "content": "done"},
        ]
    }
    p = ti.from_mini_swe_agent(
        data, count_tokens=words, default_tool_seconds=0.7, tool_namer=lambda m: "shell"
    )
    assert [t.tool for t in p.turns] == ["shell", None]
    assert p.turns[0].tool_seconds == 0.7
    with pytest.raises(TraceFormatError, match="no assistant message"):
        ti.from_mini_swe_agent({"messages": [{"role": "user", "content": "x"}]}, count_tokens=words)
    with pytest.raises(TraceFormatError, match='"messages" list'):
        ti.from_mini_swe_agent({"trajectory": []}, count_tokens=words)


def test_import_matches_the_chat_template_token_counts():
    """With the project tokenizer, the imported prompt lengths are what vLLM would render."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(ti.TOKENIZER_DIR))
    messages = [
        {"role": "system", "content": "You are a careful software engineer. Think step by step."},
        {"role": "user", "content": "The function parse_date fails on leap years; fix it."},
        {"role": "assistant", "content": "Let me look.\n```bash\ngrep -n parse_date -r src\n```"},
        {"role": "user", "content": "src/dates.py:41: def parse_date(text):\n    return None"},
        {"role": "assistant", "content": "Found it; now I will edit the file."},
    ]

    def rendered(msgs):
        out = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        return len(out if isinstance(out, list) else out["input_ids"])

    p = ti.from_mini_swe_agent({"messages": messages})
    assert p.context_before(0) == rendered(messages[:2])
    assert p.context_before(1) == rendered(messages[:4])


def test_swe_agent_traj_import():
    data = {
        "environment": "swe_main",
        "info": {"exit_status": "submitted", "instance_id": "django-11099"},
        "history": [
            {"role": "system", "content": "you fix bugs", "message_type": "system_prompt"},
            {
                "role": "user",
                "content": "demo one two",
                "message_type": "demonstration",
                "is_demo": True,
            },
            {"role": "user", "content": "the issue text", "message_type": "observation"},
            {"role": "assistant", "content": "x", "message_type": "action"},
        ],
        "trajectory": [
            {
                "action": "find_file models.py",
                "observation": "found it here",
                "response": "I search\nfind_file models.py",
                "thought": "I search",
                "execution_time": 0.25,
                "state": {},
                "query": [],
                "extra_info": {},
            },
            {
                "action": "python reproduce.py",
                "observation": "Traceback error",
                "response": "",
                "thought": "run it",
                "execution_time": 4.0,
            },
            {
                "action": "submit",
                "observation": "diff --git",
                "response": "submit now",
                "thought": "",
                "execution_time": 0.5,
            },
        ],
    }
    p = ti.from_swe_agent(data, count_tokens=words)
    assert p.id == "django-11099" and p.source == "import:swe-agent"
    assert p.turns[0].input_tokens == 1 + (3 + 5) + (3 + 5) + (3 + 5) + 4
    assert [t.tool for t in p.turns] == ["find_file", "python", None]
    assert [t.tool_seconds for t in p.turns] == [0.25, 4.0, 0.0]
    # response, else thought + action; + <|eot_id|>
    assert [t.output_tokens for t in p.turns] == [4 + 1, 4 + 1, 2 + 1]
    assert [t.tool_return_tokens for t in p.turns] == [3 + 5 + 4, 2 + 5 + 4, 0]

    # a retry-agent file (only attempts) and a file without history (first query)
    no_history = {k: v for k, v in data.items() if k != "history"}
    no_history["trajectory"] = [dict(s) for s in data["trajectory"]]
    no_history["trajectory"][0]["query"] = data["history"][:3]
    assert ti.from_swe_agent(no_history, count_tokens=words).turns == p.turns
    wrapped = {"attempts": [no_history], "info": {"best_attempt_idx": 0}}
    assert ti.from_swe_agent(wrapped, count_tokens=words).turns == p.turns
    with pytest.raises(TraceFormatError, match="cannot size the first prompt"):
        ti.from_swe_agent({"trajectory": [{"action": "ls"}]}, count_tokens=words)


def test_harness_trajectory_import_reproduces_prompt_lengths():
    steps = [
        {
            "llm_s": 0.5,
            "prompt_tokens": 800,
            "output_tokens": 60,
            "cached_tokens": 0,
            "tool": "calculator",
            "argument": "2+2",
            "tool_s": 0.01,
            "ok": True,
            "return_tokens": 10,
        },
        {
            "llm_s": 0.3,
            "prompt_tokens": 880,
            "output_tokens": 40,
            "tool": "wikipedia",
            "tool_s": 0.8,
        },
        {"llm_s": 0.2, "prompt_tokens": 1000, "output_tokens": 20, "tool": None, "tool_s": 0.0},
    ]
    data = {
        "task_id": "gsm-1",
        "program_id": "p-9",
        "benchmark": "gsm8k",
        "messages": [],
        "steps": steps,
        "status": "submitted",
    }
    p = ti.from_harness_trajectory(data)
    assert p.id == "p-9" and p.benchmark == "gsm8k"
    assert [p.context_before(i) for i in range(3)] == [800, 880, 1000]
    # gap 880 - 860 = 20: 10 the tool's (recorded), 10 other input; gap 1000 - 920 = 80
    assert [t.tool_return_tokens for t in p.turns] == [10, 80, 0]
    assert [t.input_tokens for t in p.turns] == [800, 10, 0]
    assert [t.tool for t in p.turns] == ["calculator", "wikipedia", None]
    assert p.meta["llm_s"] == [0.5, 0.3, 0.2] and p.meta["negative_gaps"] == 0

    shrunk = {"steps": [dict(steps[0]), {**steps[1], "prompt_tokens": 700}, steps[2]]}
    q = ti.from_harness_trajectory(shrunk, program_id="q")
    assert q.meta["negative_gaps"] == 1 and q.turns[0].tool_return_tokens == 0
    with pytest.raises(TraceFormatError, match=r"steps\[1\]\.output_tokens"):
        ti.from_harness_trajectory({"steps": [steps[0], {"prompt_tokens": 5}]})


def test_import_files_into_a_trace(tmp_path):
    harness = {
        "task_id": "t1",
        "started_at": 1000.0,
        "steps": [
            {"prompt_tokens": 100, "output_tokens": 10, "tool": "bash", "tool_s": 1.0},
            {"prompt_tokens": 150, "output_tokens": 5},
        ],
    }
    (tmp_path / "t1.traj.json").write_text(json.dumps(harness))
    (tmp_path / "t2.traj.json").write_text(
        json.dumps({**harness, "task_id": "t2", "started_at": 1003.5})
    )
    trace = ti.trace_from_files(sorted(tmp_path.glob("*.json")), name="rec")
    assert [(p.id, p.arrival_s) for p in trace.programs] == [("t1", 0.0), ("t2", 3.5)]
    retimed = ti.trace_from_files(sorted(tmp_path.glob("*.json")), name="rec", jps=2.0, seed=1)
    assert [p.turns for p in retimed.programs] == [p.turns for p in trace.programs]
    assert ti.detect_format({"messages": []}) == "mini-swe-agent"
    assert ti.detect_format({"trajectory": []}) == "swe-agent"
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TraceFormatError, match=r"bad\.json: not a JSON trajectory"):
        ti.import_file(tmp_path / "bad.json")
    (tmp_path / "odd.json").write_text(json.dumps({"foo": 1}))
    with pytest.raises(TraceFormatError, match=r"odd\.json: unknown trajectory format"):
        ti.import_file(tmp_path / "odd.json")
