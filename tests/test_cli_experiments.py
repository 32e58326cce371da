"""`harness eval NAME`: every experiment is listed, and a user's mistake is one line, exit 2.

Fast: only the parser and the checks that run before any server or engine starts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ("load", "fidelity", "served-vs-virtual", "sched-overhead", "event-overhead",
               "bash-overhead", "router-baseline", "served-comparison", "langchain-example",
               "perf-table", "step-interference", "real-model", "router-overhead")


def test_eval_help_lists_every_experiment(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for name in EXPERIMENTS:
        assert f"\n    {name}" in out, name


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_each_experiment_has_its_help(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["eval", name, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: harness eval {name} ")


def test_a_bad_option_value_exits_2_naming_it(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "load", "--programs", "many"])
    assert exit_.value.code == 2
    assert "harness eval load: error: argument --programs: invalid int value: 'many'" in (
        capsys.readouterr().err)


def test_an_unknown_router_mode_exits_2_naming_the_choices(capsys):
    # checked by the options' own __post_init__: one line, before any replica starts
    assert main(["eval", "router-baseline", "--modes", "vr-hash,nope"]) == 2
    assert capsys.readouterr().err == (
        "harness: error: --modes: unknown nope; choose from vr-hash, vr-hash-body, vr-rr\n")


def test_an_unknown_served_system_is_a_user_error_naming_the_choices(capsys):
    assert main(["eval", "served-comparison", "--systems", "vr-programs,session:nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harness: error: --systems session:nope: unknown policy 'nope'")
    assert main(["eval", "served-comparison", "--systems", "vr-fast"]) == 2
    assert "choose from vr-programs, vr-binding, vr-hash, session:POLICY" in (
        capsys.readouterr().err)


def test_a_user_error_is_one_line_and_exit_2(capsys):
    assert main(["eval", "perf-table", "no-such-gpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harness: error: unknown profile 'no-such-gpu'")
    assert len(err.strip().splitlines()) == 1


def test_perf_table_prints_the_tables(capsys):
    assert main(["eval", "perf-table", "h100-llama-3.1-8b"]) == 0
    out = capsys.readouterr().out
    assert "| batch shape | h100-llama-3.1-8b |" in out and "Coefficients" in out


def test_step_interference_prints_published_and_emulated_inflation(capsys):
    assert main(["eval", "step-interference", "h20x4-llama-3.1-70b", "--chunks", "512"]) == 0
    out = capsys.readouterr().out
    assert "| GT lab week 8 (H100, vLLM) | h100-llama-3.1-8b | 30 x 1024 | 512 |" in out
    assert "| h20x4-llama-3.1-70b |" in out and "+512 chunk" in out


def test_step_interference_refuses_a_bad_chunk_list(capsys):
    with pytest.raises(SystemExit) as exit_:  # not whole numbers: argparse's type refuses it
        main(["eval", "step-interference", "--chunks", "512,lots"])
    assert exit_.value.code == 2
    assert ("argument --chunks: '512,lots': give comma-separated whole numbers"
            in capsys.readouterr().err)
    assert main(["eval", "step-interference", "--chunks", "512,0"]) == 2  # a value: the options
    assert "--chunks '512,0': give positive token counts" in capsys.readouterr().err


def test_the_parser_does_not_import_langchain():
    # the LangChain example's module costs about 1 s to import; every `harness` command
    # builds this parser, so only the example's own run may import it
    code = ("import sys; from cli.main import build_parser; build_parser(); "
            "print('langchain_core' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_every_option_is_a_field_of_its_experiments_options():
    """The registry's options dataclass is the whole schema: each parser's options are its
    fields (and nothing else), each with the field's default."""
    import argparse
    import dataclasses

    from cli.experiments import EXPERIMENTS, register

    eval_parser = argparse.ArgumentParser()
    register(eval_parser)
    subparsers = next(a for a in eval_parser._actions
                      if isinstance(a, argparse._SubParsersAction)).choices
    for experiment in EXPERIMENTS:
        actions = {a.dest: a for a in subparsers[experiment.name]._actions if a.dest != "help"}
        fields = {f.name: f for f in dataclasses.fields(experiment.options)}
        assert set(actions) == set(fields), experiment.name
        for name, f in fields.items():
            if f.default is not dataclasses.MISSING:
                assert actions[name].default == f.default, (experiment.name, name)


def test_the_langchain_options_have_run_examples_defaults():
    import inspect

    from cli.experiments import LangchainExampleOptions
    from eval.examples.langchain_agent import run_example

    defaults = {name: p.default for name, p in inspect.signature(run_example).parameters.items()}
    assert defaults == {"server": LangchainExampleOptions.server,
                        "model": LangchainExampleOptions.model,
                        "free": LangchainExampleOptions.free,
                        "device": LangchainExampleOptions.device}


@pytest.mark.parametrize("argv, message", [
    (["fidelity", "--real-runs", "0"], "--real-runs 0: give 1 or more"),
    (["fidelity", "--tool-scale", "0"], "--tool-scale 0.0: give a positive factor"),
    (["served-vs-virtual", "--cluster", "1p3d", "--strategies", "pd"],
     "--strategies: give at least two to rank"),
    (["load", "--programs", "0"], "--programs must be at least 1"),
    (["load", "--mix", "gsm8k=-1"], "--mix: 'gsm8k=-1': the weight must be positive"),
    (["sched-overhead", "--policies", "vllm,nope"], "--policies: unknown nope"),
    (["router-overhead", "--url", "http://127.0.0.1:9", "--turns", "0"], "--turns"),
    (["real-model", "--limit", "0"], "--limit 0: give at least 1"),
    (["bash-overhead", "-n", "0"], "-n 0: give at least 1 run"),
])
def test_a_bad_value_is_refused_by_the_options_in_one_line(argv, message, capsys):
    assert main(["eval", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harness: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1
