"""The importers of recorded agent runs (eval/workloads/importers/): mini-swe-agent,
SWE-agent and our own harness's trajectories, into the trace format."""

from __future__ import annotations

import json

import pytest

from common.trace import TraceFormatError
from eval.workloads import importers as ti


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
