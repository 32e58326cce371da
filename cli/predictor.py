"""`harness predictor train | eval | predict | gaps`: the output-length and tool-duration
predictor, and the gap model's calibration.

    harness predictor train [--data FILE] --out DIR [--epochs N] [--seed N] [--init CKPT]
    harness predictor eval --model DIR [--data FILE] [--split auto|held-out|all]
    harness predictor predict --model DIR TEXT...
    harness predictor gaps --trace FILE_OR_FOLDER [--elapsed 0,300] [--json FILE]

`train` splits the data by program with the seed (`predictor.data.split`), trains the TF-IDF
ridge baseline and the BERT model on the training part and prints the held-out figures of the
model, the baseline and the constant predictor. `eval` recomputes them; when `--data` is the
file the model was trained on (same sha256) it evaluates the same held-out part, otherwise all
of the file, and says which. `gaps` runs the gap model (`predictor.gaps`) and its two baselines
online over a trace's gaps and prints the calibration (`predictor.gaps.calibration`). Bad input
(`DataError`, `PredictorError`, `CheckpointError`, a trace that cannot be read or has no gaps)
ends with `harness: error: ...` and exit status 2 (`cli.errors`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.paths import (
    PREDICTOR_MODEL,
    Kind,
    PathSpec,
    add_path_argument,
    output_file,
    output_folder,
)
from common.atomic import write_json_atomic
from common.errors import UserError
from common.trace import GAP_KINDS, Trace, TraceFormatError
from eval.workloads.registry import load_or_generate
from predictor import lengths
from predictor.buckets import bucket_label
from predictor.data import DEFAULT_DATA, DataError, file_digest, load_examples, split
from predictor.gaps import CalibrationReport, GapModel, calibrate, default_models, trace_gaps

HELD_OUT = 0.2
#: `harness predictor gaps --trace`: a trace file or a folder of recorded runs (no generated
#: trace: their gaps are drawn, not recorded).
GAP_TRACE = PathSpec(Kind.FILE_OR_FOLDER, "a trace file (.jsonl) or a folder of recorded runs")

#: `--data`: examples, one JSON object per line (predictor/data.py).
EXAMPLES = PathSpec(Kind.FILE, "a JSONL file of examples (predictor/data.py)")
#: `--init`: a BERT checkpoint folder with its tokenizer.
CHECKPOINT = PathSpec(Kind.FOLDER, "a BERT checkpoint folder (with its tokenizer)")


def register(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="predictor_command", required=True, metavar="ACTION")
    t = sub.add_parser("train", help="train the BERT predictor and the baseline on a JSONL file",
                       description="Train on the training split of --data; print held-out "
                                   "figures. Data schema: predictor/data.py.")
    add_path_argument(t, "--data", spec=EXAMPLES, type=Path, default=DEFAULT_DATA,
                      help="JSONL examples (default: %(default)s)")
    add_path_argument(t, "--out", spec=output_folder("the trained model"), type=Path,
                      required=True, help="model directory to write")
    t.add_argument("--epochs", type=int, default=8, help="BERT epochs (default: %(default)s)")
    t.add_argument("--seed", type=int, default=0,
                   help="seed of the split, the initial weights and the batch order")
    t.add_argument("--held-out", type=float, default=HELD_OUT,
                   help="share of the examples (whole programs) held out (default: %(default)s)")
    add_path_argument(t, "--init", spec=CHECKPOINT, type=Path, default=None,
                      help="a BERT checkpoint directory (with its tokenizer) to start from")
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--threads", type=int, default=1,
                   help="torch threads while training (default 1: the same weights everywhere)")
    t.add_argument("--baseline-only", action="store_true",
                   help="train only the TF-IDF ridge baseline (seconds, no torch)")
    t.set_defaults(predictor_func=_train)

    e = sub.add_parser("eval", help="print accuracy and MAE of a trained predictor",
                       description="Evaluate --model on --data: the model's held-out split when "
                                   "the file is the training file, else the whole file.")
    add_path_argument(e, "--model", spec=PREDICTOR_MODEL, type=Path, required=True,
                      help="model directory")
    add_path_argument(e, "--data", spec=EXAMPLES, type=Path, default=DEFAULT_DATA,
                      help="JSONL examples (default: %(default)s)")
    e.add_argument("--split", choices=("auto", "held-out", "all"), default="auto",
                   help="which examples: auto (held-out part if --data is the training file, "
                        "else all), held-out, or all")
    add_path_argument(e, "--json", spec=output_file("a file for the figures (JSON)"), type=Path,
                      default=None, help="also write the figures here")
    e.set_defaults(predictor_func=_eval)

    p = sub.add_parser("predict", help="predict for request texts given on the command line")
    add_path_argument(p, "--model", spec=PREDICTOR_MODEL, type=Path, required=True,
                      help="model directory")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.set_defaults(predictor_func=_predict)

    g = sub.add_parser(
        "gaps", help="calibration of the gap model (when a program will be back) on a trace",
        description="Forecast every gap of a trace before learning it (the gap model, the "
                    "pooled empirical CDF per kind, and the mean tool duration read as an "
                    "exponential); print per model and gap kind the mean predicted P(back "
                    "within t) against the observed share, pinball losses and the CRPS on "
                    "ln(1 + gap). Model: predictor/gaps/; figures: docs/predictors.md.")
    add_path_argument(g, "--trace", spec=GAP_TRACE, type=Path, required=True,
                      metavar="FILE_OR_FOLDER",
                      help="a harness trace (JSONL; version 1: every gap a tool call) or a "
                           "folder of recorded runs, e.g. Claude Code sessions "
                           "(kv-cache-tester's traces/ files), imported with their gap kinds")
    g.add_argument("--elapsed", default="0,300", metavar="S,S",
                   help="seconds a program has been gone when forecast, one table each, over "
                        "the gaps longer than that (default: %(default)s)")
    add_path_argument(g, "--json", spec=output_file("a file for the figures (JSON)"), type=Path,
                      default=None, help="also write the figures here")
    g.set_defaults(predictor_func=_gaps)


def run(args: argparse.Namespace) -> int:
    return int(args.predictor_func(args) or 0)


# -- train ---------------------------------------------------------------------------------


def _train(args: argparse.Namespace) -> int:
    if args.epochs < 1:
        raise UserError(f"--epochs must be at least 1, got {args.epochs}")
    examples = load_examples(args.data)
    if not 0 < args.held_out < 1:  # `split` checks it too, for callers from Python
        raise UserError(f"held_out must be in (0, 1), got {args.held_out}")
    train_set, held_out = split(examples, args.seed, args.held_out)
    digest = file_digest(args.data)
    print(f"data: {args.data} ({len(examples)} examples, sha256 {digest[:12]})")
    print(f"split: seed {args.seed}, by program: {len(train_set)} training / "
          f"{len(held_out)} held-out examples ({args.held_out:.0%} held out)")
    info = {"data": str(args.data), "data_sha256": digest, "split_seed": args.seed,
            "held_out": args.held_out}
    started = time.perf_counter()
    with _Progress(enabled=not args.baseline_only) as progress:
        predictor = lengths.train(
            train_set, seed=args.seed, neural=not args.baseline_only,
            training=lengths.NeuralTraining(epochs=args.epochs, batch_size=args.batch_size,
                                            lr=args.lr, threads=args.threads, init=args.init),
            progress=progress.update, info=info)
    elapsed = time.perf_counter() - started
    arch = predictor.info.get("architecture")
    if arch:
        print(f"model: BERT {arch['layers']} layers x {arch['hidden']} hidden, "
              f"{arch['parameters'] / 1e6:.1f} M parameters, "
              f"{'from ' + str(args.init) if args.init else 'trained from scratch'}; "
              f"{args.epochs} epochs in {predictor.info['train_seconds']:.1f} s "
              f"(baseline {predictor.info['baseline_seconds']:.1f} s)")
    results = lengths.evaluate(predictor, held_out)
    predictor.info["held_out_figures"] = results
    predictor.info["total_train_seconds"] = round(elapsed, 1)
    predictor.save(args.out)
    _print_figures(results, f"held-out split (seed {args.seed}, {len(held_out)} examples)")
    print(f"training took {elapsed:.1f} s; model written to {args.out}")
    return 0


class _Progress:
    """A rich progress bar over the training steps (plain lines when not on a terminal)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None
        self.task: Any = None
        self.started = time.perf_counter()

    def __enter__(self) -> _Progress:
        if self.enabled and sys.stdout.isatty():
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                TextColumn("{task.completed}/{task.total} steps"),
                                TimeElapsedColumn())
            self.bar.__enter__()
        return self

    def update(self, state: dict[str, Any]) -> None:
        text = f"epoch {state['epoch']}/{state['epochs']} loss {state['loss']:.3f}"
        if self.bar is not None:
            if self.task is None:
                self.task = self.bar.add_task(text, total=state["steps"])
            self.bar.update(self.task, completed=state["step"], description=text)
        elif state["epoch_done"]:
            print(f"  {text} ({time.perf_counter() - self.started:.0f} s)", flush=True)

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


# -- eval ----------------------------------------------------------------------------------


def _eval(args: argparse.Namespace) -> int:
    predictor = lengths.LengthPredictor.load(args.model)
    examples = load_examples(args.data)
    digest = file_digest(args.data)
    same = digest == predictor.info.get("data_sha256")
    choice = args.split
    if choice == "auto":
        choice = "held-out" if same else "all"
    if choice == "held-out":
        if not same:
            raise DataError(f"{args.data} is not the file {args.model} was trained on (sha256 "
                            "differs), so its held-out split is unknown; use --split all")
        seed = int(predictor.info.get("split_seed", 0))
        _, chosen = split(examples, seed, float(predictor.info.get("held_out", HELD_OUT)))
        title = f"held-out split (seed {seed}, {len(chosen)} of {len(examples)} examples)"
    else:
        chosen = examples
        note = " (includes the training examples)" if same else ""
        title = f"all {len(chosen)} examples of {args.data}{note}"
    results = lengths.evaluate(predictor, chosen)
    print(f"model: {args.model} ({predictor.backend}); data: {args.data}")
    _print_figures(results, title)
    if args.json is not None:
        write_json_atomic(args.json, {"split": choice, "examples": len(chosen),
                                      "figures": results})
    return 0


def _print_figures(results: dict[str, dict[str, float]], title: str) -> None:
    table = Table(title=f"predictor figures: {title}")
    table.add_column("model")
    for name in ("accuracy", "within one", "MAE tokens", "MAE s (call)", "MAE s (request)"):
        table.add_column(name, justify="right")
    for model, r in results.items():
        table.add_row(model, f"{r['accuracy']:.3f}", f"{r['within_one']:.3f}",
                      f"{r['mae_tokens']:.1f}",
                      f"{r['mae_seconds_call']:.3f}" if "mae_seconds_call" in r else "-",
                      f"{r['mae_seconds_request']:.3f}" if "mae_seconds_request" in r else "-")
    Console(width=110).print(table)
    any_row = next(iter(results.values()))
    print(f"accuracy / within one / MAE tokens over {any_row['n']} requests; MAE s over the "
          f"{any_row['n_timed']} with a measured tool call (call: from the call at tool_start; "
          "request: from the request text alone)")


# -- predict -------------------------------------------------------------------------------


def _predict(args: argparse.Namespace) -> int:
    predictor = lengths.LengthPredictor.load(args.model)
    for text, p in zip(args.texts, predictor.predict_many(args.texts), strict=True):
        print(json.dumps({"text": text[:60], "bucket": p.bucket,
                          "range": bucket_label(p.bucket, predictor.edges),
                          "predicted_output_tokens": p.predicted_output_tokens,
                          "predicted_seconds": round(p.predicted_seconds, 4)}))
    return 0


# -- gaps ----------------------------------------------------------------------------------


def _gaps(args: argparse.Namespace) -> int:
    elapsed = _elapsed(args.elapsed)
    trace = _gap_trace(args.trace)
    gaps = trace_gaps(trace)
    if not gaps:
        raise UserError(f"{args.trace}: no gaps to forecast (no program has two turns)")
    models = default_models()
    report = calibrate(gaps, models, elapsed_s=elapsed)
    model = models["gap model"]
    assert isinstance(model, GapModel)
    _print_gaps(report, str(args.trace))
    print("session shrinkage (kappa: a session's gaps weigh as much as its kind's pool after "
          "this many): " + ", ".join(f"{k} {model.kappa(k):.1f}" for k in GAP_KINDS
                                      if model.count(k)))
    if args.json is not None:
        write_json_atomic(args.json, dataclasses.asdict(report))
    return 0


def _elapsed(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise UserError(f"--elapsed {text!r}: give seconds separated by commas, e.g. 0,300") \
            from None
    if any(not 0 <= v < float("inf") for v in values):
        raise UserError(f"--elapsed {text!r}: seconds must be finite and >= 0")
    return values


def _gap_trace(path: Path) -> Trace:
    try:
        return load_or_generate(path)
    except (TraceFormatError, ValueError) as exc:
        raise UserError(str(exc)) from None


def _print_gaps(report: CalibrationReport, origin: str) -> None:
    kinds = {r.kind: r.n for r in report.rows if r.elapsed_s == report.elapsed_s[0]}
    counts = ", ".join(f"{k} {kinds[k]:,}" for k in GAP_KINDS if k in kinds)
    print(f"gap forecasts on {origin}: {report.n_gaps:,} gaps ({counts}) in "
          f"{report.n_sessions:,} sessions, each forecast before its gap is learnt")
    horizons = "".join(f"{f'{t:g} s':>11}" for t in report.grid_s)
    levels = "".join(f"{f'p{round(q * 100)}':>7}" for q in report.levels)
    for e in report.elapsed_s:
        title = "at the gap's start" if e == 0 else f"gone {e:g} s (gaps longer than that)"
        print(f"\n{title}: P(back within t more), predicted/observed; losses on ln(1 + gap)")
        print(f"{'model':<12}{'kind':<10}{'gaps':>7}{horizons}{'|err|':>7}  pinball{levels}"
              f"{'CRPS':>7}")
        for r in report.rows:
            if r.elapsed_s != e:
                continue
            cells = "".join(f"{f'{p:.2f}/{o:.2f}':>11}"
                            for p, o in zip(r.predicted, r.observed, strict=True))
            losses = "".join(f"{x:7.3f}" for x in r.pinball)
            print(f"{r.model:<12}{r.kind:<10}{r.n:>7,}{cells}{r.reliability_error:7.3f}  "
                  f"       {losses}{r.crps:7.3f}")
