"""A real model decides: SmolLM2-135M-Instruct on the CPU engine, end to end through
`harness run`, under two policies (`harness eval real-model`'s code path).

Skipped where the CPU engine's virtualenv is absent; CI makes it (`scripts/setup.sh
--cpu-engine`, which also adds the model).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_models import smollm2_folder

from eval.experiments.real_model import RealModelOptions, measure
from harness.trajectory import token_ids

pytestmark = [pytest.mark.server, pytest.mark.slow]


def test_two_gsm8k_programs_under_two_policies_say_the_same(tmp_path: Path) -> None:
    folder = smollm2_folder()
    if folder is None:
        pytest.skip("no CPU engine here (bash scripts/setup.sh --cpu-engine)")
    options = RealModelOptions(bench="gsm8k", model=str(folder), policies="vllm,continuum",
                               limit=2, concurrency=1, kv_tokens=4096, max_model_len=4096,
                               max_tokens=96, max_steps=3, repeat=False, out=tmp_path)
    # transformers: start-up cost, and only this test reads the model's own tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    summary = measure(options)
    first, second = summary["runs"]
    for run in (first, second):
        assert run["tasks"] == 2 and run["status"] == 0
        assert run["token_id_turns"] >= 2
        # every program ended with a stated reason, none of them the infrastructure's
        assert set(run["statuses"]) <= {"submitted", "format_error", "step_limit"}
        run_dir = tmp_path / run["label"] / "run"
        run_summary = json.loads((run_dir / "summary.json").read_text())
        assert run_summary["events_sent"] > 0
        assert run_summary["events_received_by_server"] == run_summary["events_sent"]
        assert run_summary["model"] == folder.name
        for path in (run_dir / "trajectories").glob("*.traj.json"):
            data = json.loads(path.read_text())
            assert data["steps"] and all(s["output_token_ids"] for s in data["steps"])
            assert_prefix_kept(tokenizer, token_ids(data))
    # greedy decoding, one program at a time (every batch the same under both policies, so a
    # float near-tie cannot flip differently): the policy changes nothing the model says
    agreement = second["agreement"]
    assert agreement["identical_turns"] == agreement["turns"] > 0, agreement["divergences"]


def assert_prefix_kept(tokenizer, turns: list[tuple[list[int], list[int]]]) -> None:
    """Each turn's prompt carries the previous prompt and reply unchanged as text. Token ids
    may still differ where the model wrote a word in pieces its tokenizer would not choose
    ('th' + 'ought' re-tokenises as 'thought' when the history is rendered again): that break
    is the chat API's (text in, not token ids), not a rewrite of the history by the harness."""
    for (prompt, output), (next_prompt, _) in zip(turns, turns[1:], strict=False):
        before = tokenizer.decode(prompt + output)
        assert tokenizer.decode(next_prompt).startswith(before)
