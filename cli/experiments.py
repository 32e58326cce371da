"""`harness eval NAME`: the experiments that print figures, one subcommand each.

Each experiment lives in `eval/experiments/` as a function taking its options dataclass; the
dataclass is the schema of the subcommand's options (each field one option, its help in the
field's metadata, its default the library's), so an option is written once, and its values are
checked in the dataclass's `__post_init__` whoever builds it. `EXPERIMENTS` lists them; the
argparse builder is `cli.options.add_options`. A user's mistake raises an `eval.ExperimentError`
(a `common.errors.UserError`) and reaches the user as `harness: error: MSG`, exit 2, through
`cli.main`. The AMPD benchmark is `harness cluster bench`, the policy benchmark `harness bench`.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.options import add_options, options_of
from cli.paths import (
    CLUSTER_FILE,
    MODEL,
    PROFILE,
    STEP_TABLE,
    TRACE,
    PathSpec,
    output_file,
    output_folder,
)
from eval.experiments import (
    bash_overhead,
    event_overhead,
    fidelity,
    load_bench,
    perf_table,
    real_model,
    router_baseline,
    router_overhead,
    sched_overhead,
    served_comparison,
    served_vs_virtual,
    soak,
    step_interference,
)

# the module imports langchain-core (about 1 s): only its docstring is read to build the parser
LANGCHAIN_EXAMPLE = "eval.examples.langchain_agent"


@dataclass(frozen=True)
class LangchainExampleOptions:
    """The LangChain example's options. Here, not beside `run_example`, because that module
    imports langchain-core, which every `harness` command would then pay for; the defaults are
    `run_example`'s (tests/test_cli_experiments.py holds them equal)."""

    server: str | None = field(default=None, metadata={
        "help": "a running server (default: start one)"})
    model: str = field(default="llama-3.1-8b", metadata={"help": "the model to ask"})
    free: bool = field(default=False, metadata={"help": "no recorded replies"})
    device: str | None = field(default=None, metadata={
        "choices": ("cpu", "gpu"),
        "help": "start the server on this device with --model (e.g. --device cpu --model "
        "smollm2-135m-instruct --free); default: the emulated GPU"})


def _langchain_example(options: LangchainExampleOptions) -> int:
    from eval.examples import langchain_agent  # langchain-core: start-up cost (about 1 s)

    langchain_agent.run_example(options.server, options.model, options.free, options.device)
    return 0


def _docstring(module: str) -> str | None:
    """A module's docstring read from its source, without importing the module."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    return ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8")))


def _first(doc: str | None) -> str | None:
    """A docstring's first paragraph (a description argparse may re-wrap)."""
    return None if doc is None else doc.split("\n\n")[0]


@dataclass(frozen=True)
class Experiment:
    """One `harness eval NAME`: its options dataclass and the function that runs it (taking
    the options; its exit status where it returns an int, else 0). `description`: the
    module's docstring, whole and as written (`raw`), or its first paragraph. `paths`: the
    option fields that name a file or a folder, and their rule (`cli.paths`)."""

    name: str
    help: str
    options: type
    run: Callable[[Any], int | None]
    description: str | None
    raw: bool = False
    paths: dict[str, PathSpec] = field(default_factory=dict)


_RESULTS = output_folder("the experiment's results")


#: Every experiment, in the order `harness eval --help` lists them.
EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment("load", "many agent programs at once against one `harness serve`, real tools",
               load_bench.LoadOptions, load_bench.run_load_bench,
               _first(load_bench.__doc__), paths={"profile": PROFILE, "out": _RESULTS}),
    Experiment("fidelity", "the emulated GPU against the real CPU engine on one small trace",
               fidelity.FidelityOptions, fidelity.run_fidelity, fidelity.__doc__,
               paths={"table": STEP_TABLE, "out": _RESULTS}),
    Experiment("served-vs-virtual", "does a served cluster rank routing strategies as the "
               "virtual-time cluster does?", served_vs_virtual.ServedVsVirtualOptions,
               served_vs_virtual.run_served_vs_virtual, _first(served_vs_virtual.__doc__),
               paths={"cluster": CLUSTER_FILE, "trace": TRACE, "out": _RESULTS}),
    Experiment("sched-overhead",
               "the scheduler's CPU time per step, per policy, at large batches",
               sched_overhead.SchedOverheadOptions, sched_overhead.run_sched_overhead,
               sched_overhead.__doc__, raw=True,
               paths={"profile": PROFILE, "out": output_file("a JSON file for the rows")}),
    Experiment("event-overhead", "what interception events cost an agent per tool call",
               event_overhead.EventOverheadOptions, event_overhead.run_event_overhead,
               event_overhead.__doc__),
    Experiment("bash-overhead", "one BashTool.run against a bare `docker exec`",
               bash_overhead.BashOverheadOptions, bash_overhead.run_bash_overhead,
               bash_overhead.__doc__),
    Experiment("router-baseline",
               "vllm-router in front of emulated replicas, per routing mode",
               router_baseline.RouterBaselineOptions, router_baseline.run_router_baseline,
               _first(router_baseline.__doc__),
               paths={"trace": TRACE, "profile": PROFILE, "out": _RESULTS}),
    Experiment("served-comparison",
               "vllm-router program scheduling vs session-routed vllm vs our policies, served",
               served_comparison.ServedComparisonOptions,
               served_comparison.run_served_comparison, _first(served_comparison.__doc__),
               paths={"trace": TRACE, "profile": PROFILE, "out": _RESULTS}),
    Experiment("router-overhead", "what a served cluster's router adds per request",
               router_overhead.RouterOverheadOptions, router_overhead.run_router_overhead,
               router_overhead.__doc__, raw=True),
    Experiment("langchain-example",
               "a small tool-using langchain-core agent against `harness serve`",
               LangchainExampleOptions, _langchain_example, _docstring(LANGCHAIN_EXAMPLE),
               raw=True),
    Experiment("perf-table",
               "the emulated GPU's step times for standard batch shapes, markdown",
               perf_table.PerfTableOptions, perf_table.run_perf_table, perf_table.__doc__,
               raw=True, paths={"profiles": PROFILE}),
    Experiment("real-model", "a real model on the CPU engine under each policy: identical "
               "replies turn by turn, JCT, and the emulator replaying the same runs",
               real_model.RealModelOptions, real_model.run_real_model, real_model.__doc__,
               raw=True, paths={"model": MODEL, "table": STEP_TABLE, "out": _RESULTS}),
    Experiment("soak", "real sessions against one `harness serve` for an hour, with faults: "
               "memory, held state and waiting against stated bounds",
               soak.SoakOptions, soak.run_soak, _first(soak.__doc__),
               paths={"trace": TRACE, "cluster": CLUSTER_FILE, "model": MODEL,
                      "profile": PROFILE, "out": _RESULTS}),
    Experiment("step-interference",
               "a prefill chunk's inflation of a decode step, emulated beside published figures",
               step_interference.StepInterferenceOptions,
               step_interference.run_step_interference, step_interference.__doc__, raw=True,
               paths={"profiles": PROFILE}),
)


def register(parser: argparse.ArgumentParser) -> None:
    """The `eval` group's experiments on the parser `cli.main` made for it."""
    parser.description = _first(__doc__)
    experiments = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for experiment in EXPERIMENTS:
        formatter = (argparse.RawDescriptionHelpFormatter if experiment.raw
                     else argparse.HelpFormatter)
        p = experiments.add_parser(experiment.name, help=experiment.help,
                                   description=experiment.description,
                                   formatter_class=formatter)
        add_options(p, experiment.options, experiment.paths)
        p.set_defaults(func=lambda args, e=experiment: _run(e, args))


def _run(experiment: Experiment, args: argparse.Namespace) -> int:
    """Build the options (a bad value raises the experiment's error here) and run it."""
    status = experiment.run(options_of(experiment.options, args))
    return status if isinstance(status, int) else 0
