"""Action parsing (three formats) and benchmark scoring."""

from __future__ import annotations

import pytest

from common.actions import FormatError, parse_action
from common.metrics import percentile, summarize
from harness.benchmarks.scoring import exact_match, f1_score, numeric_match


def test_openai_tool_call_wins():
    calls = [{"id": "c1", "function": {"name": "bash", "arguments": '{"command": "ls -la"}'}}]
    action = parse_action("I will look around.", calls)
    assert (action.tool, action.argument, action.call_id) == ("bash", "ls -la", "c1")


def test_fenced_bash_block():
    text = "THOUGHT: list files\n\n```bash\nls -la /testbed\n```\n"
    assert parse_action(text).argument == "ls -la /testbed"
    assert parse_action(text).tool == "bash"


def test_two_fenced_blocks_are_a_format_error():
    with pytest.raises(FormatError, match="exactly one"):
        parse_action("```bash\nls\n```\nand\n```bash\npwd\n```")


def test_react_action_line_last_one_counts():
    text = "Thought: first search.\nAction: Search[Blue River]\nThought 2: hmm\n" \
           "Action 2: lookup[source]"
    action = parse_action(text)
    assert (action.tool, action.argument) == ("lookup", "source")


def test_react_argument_with_brackets():
    assert parse_action("Action: calculator[(3 + 4) * [2]]").argument == "(3 + 4) * [2]"


def test_no_action_is_a_format_error():
    with pytest.raises(FormatError, match="no action"):
        parse_action("I think the answer is 42.")


def test_numeric_match_gsm8k_style():
    assert numeric_match("The answer is $1,234.", "1234")
    assert numeric_match("585.20", "585.2")
    assert not numeric_match("585", "585.2")
    assert not numeric_match(None, "3")


def test_exact_match_and_f1_squad_normalisation():
    assert exact_match("The Blue  River!", "blue river")
    assert not exact_match("Blue River delta", "blue river")
    assert f1_score("Blue River delta", "the blue river") == pytest.approx(0.8)
    assert f1_score("red", "blue") == 0.0


def test_percentiles():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    stats = summarize([1.0, 2.0, 3.0], "jct")
    assert stats["jct_mean_s"] == 2.0 and stats["jct_p95_s"] == pytest.approx(2.9)


def test_a_benchmarks_format_parses_only_its_own_actions():
    from harness.benchmarks.gsm8k import FORMAT as GSM8K
    from harness.benchmarks.swebench import FORMAT as SWEBENCH

    assert parse_action("Thought: x\nAction: Calculator[1 + 2]", fmt=GSM8K).tool == "calculator"
    with pytest.raises(FormatError, match="no bash tool") as bare_fence:
        parse_action("```\necho 1\n```", fmt=GSM8K)
    assert "Action: NAME[argument]" in bare_fence.value.message
    with pytest.raises(FormatError, match="unknown action 'search'"):
        parse_action("Action: search[x]", fmt=GSM8K)
    # the coding agent's format: one fenced block; an Action line is no action there
    assert parse_action("THOUGHT: look\n\n```bash\nls\n```", fmt=SWEBENCH).argument == "ls"
    with pytest.raises(FormatError, match="no ```bash``` block found") as no_block:
        parse_action("Action: bash[ls]", fmt=SWEBENCH)
    assert "exactly one ```bash``` block" in no_block.value.message
    # without a format (reading recordings of any origin) every format and name is accepted
    assert parse_action("```\necho 1\n```").tool == "bash"
    assert parse_action("Action: anything[x]").tool == "anything"
