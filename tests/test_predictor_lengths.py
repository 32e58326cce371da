"""The output-length / tool-duration predictor (predictor/lengths.py and its modules).

The learnable set below is written here on purpose: replies are short or long depending on one
word of the request, and a tool is fast or slow depending on its name, so any predictor that
reads the text must beat the constant one. Models are tiny (1 layer, 32 wide) to keep the file
fast; the CLI test uses the default architecture on a tiny file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cli.main import main
from predictor.buckets import (  # noqa: E402
    BUCKET_EDGES,
    bucket_label,
    bucket_of,
    bucket_range,
    default_representatives,
    representatives,
)
from predictor.data import (  # noqa: E402
    DataError,
    Example,
    call_text,
    examples_from_trajectory,
    load_examples,
    reply_tokens,
    request_text,
    save_examples,
    split,
)
from predictor.lengths import LengthPredictor, NeuralTraining, evaluate, train  # noqa: E402

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 64}
ROOT = Path(__file__).resolve().parent.parent


def learnable(n: int, seed: int) -> list[Example]:
    """Requests asking for a `short` (~10 tokens), `medium` (~40) or `long` (~300) reply, each
    calling a `quick_tool` (~0.05 s) or a `slow_tool` (~5 s)."""
    rng = random.Random(seed)
    sizes = {"short": 10, "medium": 40, "long": 300}
    out = []
    for i in range(n):
        size = rng.choice(list(sizes))
        tool = rng.choice(["quick_tool", "slow_tool"])
        topic = rng.choice(["maps", "bees", "trains", "bread", "clocks"])
        seconds = (0.05 if tool == "quick_tool" else 5.0) * rng.uniform(0.9, 1.1)
        out.append(Example(
            text=f"system: assistant\ntask: give a {size} answer about {topic} using {tool}",
            output_tokens=max(1, int(sizes[size] * rng.uniform(0.9, 1.1))), tool=tool,
            call=f"{topic} query", tool_seconds=round(seconds, 4), group=f"p{i}",
            source="test"))
    return out


@pytest.fixture(scope="module")
def trained() -> tuple[LengthPredictor, list[Example]]:
    train_set, test_set = split(learnable(240, 1), seed=0)
    predictor = train(train_set, seed=0,
                      training=NeuralTraining(epochs=10, arch=TINY, lr=3e-3, batch_size=16))
    return predictor, test_set


# -- buckets -------------------------------------------------------------------------------


def test_bucket_edges_are_powers_of_two_from_16() -> None:
    assert BUCKET_EDGES == (16, 32, 64, 128, 256, 512, 1024, 2048)
    # worked by hand: bucket = how many edges are <= the length
    cases = {1: 0, 15: 0, 16: 1, 31: 1, 32: 2, 63: 2, 64: 3, 100: 3, 127: 3, 128: 4,
             255: 4, 256: 5, 511: 5, 512: 6, 1023: 6, 1024: 7, 2047: 7, 2048: 8, 10**6: 8}
    for tokens, bucket in cases.items():
        assert bucket_of(tokens) == bucket, tokens
    assert bucket_range(0) == (1, 15)
    assert bucket_range(3) == (64, 127)
    assert bucket_range(8) == (2048, None)
    assert [bucket_label(b) for b in (0, 1, 8)] == ["<16", "16-31", ">=2048"]
    assert bucket_of(50, edges=(10, 100)) == 1 and bucket_of(100, edges=(10, 100)) == 2


def test_bucket_representatives() -> None:
    # geometric middles: sqrt(1*16)=4, sqrt(16*32)=22.6 -> 23, ..., open bucket 2*2048
    assert default_representatives()[:3] == [4, 23, 45]
    assert default_representatives()[-1] == 4096
    # medians of what fell in each bucket (lower median for an even count)
    reps = representatives([3, 5, 7, 20, 30, 40, 44])
    assert reps[0] == 5 and reps[1] == 20 and reps[2] == 40 and reps[3] == 91


# -- data ----------------------------------------------------------------------------------


def test_request_text_keeps_the_deciding_parts() -> None:
    messages = [{"role": "system", "content": "You fix bugs.\n\nRules   here."},
                {"role": "user", "content": "Issue: parse() fails"},
                {"role": "assistant", "content": "THOUGHT: look\n```bash\nls\n```"},
                {"role": "user", "content": "Observation: README.md src/"}]
    text = request_text(messages)
    assert text.splitlines() == [
        "system: You fix bugs. Rules here.", "task: Issue: parse() fails", "turn 1",
        "did: THOUGHT: look ```bash ls ```", "got: Observation: README.md src/"]
    assert request_text(messages[:2]).splitlines()[-1] == "turn 0"
    long_obs = "x" * 1000
    got = request_text(messages[:3] + [{"role": "user", "content": long_obs}]).splitlines()[-1]
    assert len(got) < 200 and " ... " in got
    assert call_text("pytest", "python3 -m pytest -q", text).splitlines() == [
        "call pytest [4 words]: python3 -m pytest -q", "system: You fix bugs. Rules here.",
        "turn 1"]


def test_recorded_trajectory_becomes_one_example_per_reply() -> None:
    path = ROOT / "datasets" / "gsm8k" / "trajectories" / "gsm-001.traj.json"
    data = json.loads(path.read_text())
    replies = [m["content"] for m in data["messages"] if m["role"] == "assistant"]
    examples = examples_from_trajectory(path)
    assert len(examples) == len(replies)
    assert [e.output_tokens for e in examples] == [reply_tokens(r) for r in replies]
    assert examples[0].tool == "calculator" and examples[-1].tool == "finish"
    assert examples[0].tool_seconds is None
    assert len({e.group for e in examples}) == 1


def test_harness_run_trajectory_gives_measured_seconds(tmp_path: Path) -> None:
    traj = {"task_id": "t1", "program_id": "p1", "benchmark": "swe-bench",
            "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix"},
                         {"role": "assistant", "content": "```bash\npython3 -m pytest -q\n```"},
                         {"role": "user", "content": "Observation: 3 passed"}],
            "steps": [{"llm_s": 0.1, "prompt_tokens": 10, "output_tokens": 17,
                       "cached_tokens": 0, "tool": "bash", "argument": "python3 -m pytest -q",
                       "tool_s": 2.5, "ok": True, "return_tokens": 4}]}
    path = tmp_path / "t1.traj.json"
    path.write_text(json.dumps(traj))
    [example] = examples_from_trajectory(path)
    assert (example.output_tokens, example.tool, example.tool_seconds) == (17, "pytest", 2.5)


def test_split_keeps_programs_whole_and_is_seeded() -> None:
    examples = [Example(text=f"t{i}", output_tokens=5, group=f"g{i // 3}") for i in range(60)]
    train_a, test_a = split(examples, seed=3)
    train_b, test_b = split(examples, seed=3)
    assert test_a == test_b and train_a == train_b
    assert len(test_a) == 12 and len(train_a) == 48
    assert not {e.group for e in train_a} & {e.group for e in test_a}
    assert split(examples, seed=4)[1] != test_a


def test_bad_data_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_examples(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    good = json.dumps({"text": "hello", "output_tokens": 3})
    bad.write_text(f"{good}\n\n{{not json\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:3: not valid JSON"):
        load_examples(bad)
    bad.write_text(f"{good}\n" + json.dumps({"text": "x", "output_tokens": 0}) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:2: `output_tokens` must be an integer"):
        load_examples(bad)
    bad.write_text(json.dumps({"text": "x", "output_tokens": 2, "seconds": 1}) + "\n")
    with pytest.raises(DataError, match=r":1: unknown field\(s\) seconds"):
        load_examples(bad)
    bad.write_text(json.dumps({"text": "x", "output_tokens": 2, "tool_seconds": -1}) + "\n")
    with pytest.raises(DataError, match="tool_seconds"):
        load_examples(bad)
    bad.write_text("")
    with pytest.raises(DataError, match="no examples"):
        load_examples(bad)


def test_examples_round_trip_through_jsonl(tmp_path: Path) -> None:
    examples = learnable(5, 0) + [Example(text="only text", output_tokens=1)]
    path = save_examples(examples, tmp_path / "e.jsonl")
    assert load_examples(path) == examples
    assert "tool_seconds" not in path.read_text().splitlines()[-1]


# -- models --------------------------------------------------------------------------------


def test_models_beat_the_constant_predictor(trained: tuple[LengthPredictor, list[Example]]
                                            ) -> None:
    predictor, test_set = trained
    figures = evaluate(predictor, test_set)
    constant = figures["constant"]
    for model in ("bert", "baseline"):
        row = figures[model]
        assert row["accuracy"] >= 0.9 > constant["accuracy"] + 0.3, (model, figures)
        assert row["mae_tokens"] < 0.5 * constant["mae_tokens"], (model, figures)
        assert row["mae_seconds_call"] < 0.5 * constant["mae_seconds_call"], (model, figures)
    long_request = "system: assistant\ntask: give a long answer about maps using slow_tool"
    bucket, tokens, seconds = predictor.predict(long_request)
    assert bucket == bucket_of(300) and 200 < tokens < 400 and 2.0 < seconds < 10.0
    assert predictor.predict_call("quick_tool", "bees query") < 0.5
    hints = predictor.hints([{"role": "system", "content": "assistant"},
                             {"role": "user", "content": "give a short answer about bees"}])
    assert list(hints) == ["predicted_output_tokens"]
    assert isinstance(hints["predicted_output_tokens"], int)


def test_save_load_predicts_the_same(trained: tuple[LengthPredictor, list[Example]],
                                     tmp_path: Path) -> None:
    predictor, test_set = trained
    predictor.save(tmp_path / "model")
    assert {p.name for p in (tmp_path / "model").iterdir()} >= {
        "predictor.json", "baseline.json", "heads.safetensors", "encoder"}
    loaded = LengthPredictor.load(tmp_path / "model")
    texts = [e.text for e in test_set[:20]]
    for model in ("bert", "baseline", "constant"):
        a, b = predictor.predict_many(texts, model), loaded.predict_many(texts, model)
        assert [(x.bucket, x.predicted_output_tokens) for x in a] == \
            [(x.bucket, x.predicted_output_tokens) for x in b]
        assert [x.predicted_seconds for x in a] == pytest.approx(
            [x.predicted_seconds for x in b], rel=1e-5)
    assert loaded.edges == predictor.edges and loaded.reps == predictor.reps
    baseline_only = LengthPredictor.load(tmp_path / "model", neural=False)
    assert baseline_only.backend == "baseline"
    assert baseline_only.predict(texts[0]) == loaded.predict_many(texts[:1], "baseline")[0]
    predictor.save(tmp_path / "model")  # overwriting an existing model works
    assert not list(tmp_path.glob(".model*"))


def test_training_is_deterministic() -> None:
    data = learnable(60, 5)
    tiny = NeuralTraining(epochs=2, arch=TINY, batch_size=16)
    a = train(data, seed=7, training=tiny)
    b = train(data, seed=7, training=tiny)
    texts = [e.text for e in data[:10]]
    assert a.neural.predict(texts)[0].tolist() == b.neural.predict(texts)[0].tolist()
    assert a.baseline.to_json() == b.baseline.to_json()


def test_start_from_a_user_checkpoint(tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    from predictor.data import load_tokenizer

    tokenizer = load_tokenizer()
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=64, **TINY)
    BertModel(config).save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    predictor = train(learnable(40, 2), seed=0,
                      training=NeuralTraining(epochs=1, init=tmp_path / "ckpt"))
    assert predictor.neural.max_length == 64
    assert predictor.info["init"] == str(tmp_path / "ckpt")
    assert 0 <= predictor.predict("task: give a short answer").bucket < 9
    (tmp_path / "notbert").mkdir()
    (tmp_path / "notbert" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="only BERT"):
        train(learnable(10, 2), training=NeuralTraining(epochs=1, init=tmp_path / "notbert"))


# -- the command line ----------------------------------------------------------------------


def test_cli_train_and_eval_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    data = save_examples(learnable(100, 3), tmp_path / "tiny.jsonl")
    out = tmp_path / "model"
    assert main(["predictor", "train", "--data", str(data), "--out", str(out), "--epochs", "2",
                 "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert "split: seed 1, by program: 80 training / 20 held-out" in text
    for word in ("bert", "baseline", "constant", "accuracy", "within one", "MAE tokens",
                 "MAE s (call)", "epoch 2/2"):
        assert word in text, word
    meta = json.loads((out / "predictor.json").read_text())
    assert meta["split_seed"] == 1 and meta["held_out_figures"]["bert"]["n"] == 20

    assert main(["predictor", "eval", "--model", str(out), "--data", str(data),
                 "--json", str(tmp_path / "fig.json")]) == 0
    text = capsys.readouterr().out
    assert "held-out split (seed 1, 20 of 100 examples)" in text and "baseline" in text
    figures = json.loads((tmp_path / "fig.json").read_text())["figures"]
    assert figures["bert"] == pytest.approx(meta["held_out_figures"]["bert"])

    other = save_examples(learnable(30, 9), tmp_path / "other.jsonl")
    assert main(["predictor", "eval", "--model", str(out), "--data", str(other)]) == 0
    assert "all 30 examples" in capsys.readouterr().out

    assert main(["predictor", "predict", "--model", str(out), "task: give a long answer"]) == 0
    assert '"predicted_output_tokens"' in capsys.readouterr().out


def test_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.jsonl"
    assert main(["predictor", "train", "--data", str(missing), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harness: error:") and "nope.jsonl: no such file" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "a", "output_tokens": 2}) + "\n{\"text\": \"b\",\n")
    assert main(["predictor", "train", "--data", str(bad), "--out", str(tmp_path / "m")]) == 2
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err
    assert main(["predictor", "eval", "--model", str(tmp_path), "--data", str(bad)]) == 2
    assert "not a predictor directory" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
