"""Output-length and tool-duration prediction per request (AugServe's stage-I predictor).

What the rest of the project calls:

* the harness, once per LLM request, to send `vllm_xargs.predicted_output_tokens` (and
  `predicted_s`)::

      from predictor.lengths import LengthPredictor
      predictor = LengthPredictor.load("runs/predictor")         # once (~1 s)
      hints.update(predictor.hints(messages))     # {"predicted_output_tokens": n}, ~4 ms
      # or, for all three figures:
      from predictor.data import request_text
      bucket, tokens, seconds = predictor.predict(request_text(messages))

  and at `tool_start`, when the call is known: `predictor.predict_call(
  common.tool_keys.text_model_tool(duration_key), argument,
  request=request_text(messages_before_the_reply))`, the tool, argument and request text the
  training examples hold for that call (`predictor.data.examples_from_messages`);
* policies, with no torch: `predictor.buckets` (`bucket_of`, `BUCKET_EDGES`, labels) to turn
  a hint back into a range.

A model directory (`LengthPredictor.save`) holds: `predictor.json` (format, bucket edges and
representatives, the constant predictor, the log-seconds standardisation, the training data's
sha256 and split, training settings, time and held-out figures), `baseline.json` (the TF-IDF
ridge baseline, `predictor.baseline`), and for the neural model `encoder/` (a BERT checkpoint
with its tokenizer) plus `heads.safetensors`. A directory without `encoder/` is a
baseline-only predictor and loads without torch.

Seconds are regressed in log space (tool durations span 0.1 ms to minutes; an error of a factor
of two should cost the same at every scale) and predicted as `exp(log)`, the median under a
log-normal error. Durations below `MIN_SECONDS` (a calculator call) are clamped before the log.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from common.atomic import write_text_atomic
from common.errors import UserError
from predictor.baseline import TfidfRidge
from predictor.buckets import (
    BUCKET_EDGES,
    bucket_label,
    bucket_of,
    bucket_range,
    check_edges,
    n_buckets,
    representatives,
)
from predictor.data import Example, call_text, request_text

__all__ = [
    "BUCKET_EDGES", "FORMAT", "MIN_SECONDS", "LengthPredictor", "Prediction", "bucket_label",
    "bucket_of", "evaluate", "train",
]

FORMAT = "harness-length-predictor"
VERSION = 1
MIN_SECONDS = 1e-4
PREDICTOR_FILE = "predictor.json"
BASELINE_FILE = "baseline.json"


class PredictorError(UserError):
    """A model directory that cannot be used; the message says what is wrong."""


class Prediction(NamedTuple):
    bucket: int
    predicted_output_tokens: int
    predicted_seconds: float


def log_seconds(seconds: float) -> float:
    return math.log(max(seconds, MIN_SECONDS))


@dataclass
class Constant:
    """The reference a predictor must beat: always the training set's most common bucket,
    median length and median seconds."""

    bucket: int
    output_tokens: int
    seconds: float


@dataclass
class LengthPredictor:
    edges: tuple[int, ...]
    reps: list[int]
    baseline: TfidfRidge
    constant: Constant
    neural: Any = None  # text_models.NeuralModel, or None for a baseline-only predictor
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def backend(self) -> str:
        return "bert" if self.neural is not None else "baseline"

    # -- prediction ------------------------------------------------------------------------
    def predict(self, text: str) -> Prediction:
        """(bucket, predicted output tokens, predicted seconds of the tool call this request
        will make) from the request text; one encoder pass (a few ms on CPU)."""
        return self.predict_many([text])[0]

    def predict_many(self, texts: Sequence[str], model: str | None = None) -> list[Prediction]:
        """Batched `predict`; `model` "bert" / "baseline" / "constant" picks one explicitly
        (default: the neural model when there is one)."""
        which = model or self.backend
        if which == "constant":
            c = self.constant
            return [Prediction(c.bucket, c.output_tokens, c.seconds) for _ in texts]
        if which == "baseline":
            tokens = self.baseline.predict_tokens(texts)
            seconds = self.baseline.predict_seconds(texts)
            return [Prediction(bucket_of(round(t), self.edges), int(round(t)), float(s))
                    for t, s in zip(tokens, seconds, strict=True)]
        if self.neural is None:
            raise PredictorError("this predictor has no neural model (baseline only)")
        probs, log_tokens, log_secs = self.neural.predict(texts)
        buckets = probs.argmax(-1)
        return [Prediction(int(b), self._in_bucket(int(b), lt), float(math.exp(ls)))
                for b, lt, ls in zip(buckets, log_tokens, log_secs, strict=True)]

    def _in_bucket(self, bucket: int, log_tokens: float) -> int:
        """The regressed length, kept inside the classified bucket (so the two agree)."""
        low, high = bucket_range(bucket, self.edges)
        tokens = int(round(math.exp(min(log_tokens, 20.0))))
        return max(low, tokens if high is None else min(high, tokens))

    def hints(self, messages: Sequence[dict[str, Any]]) -> dict[str, int]:
        """The `vllm_xargs` entry for a request whose prompt is `messages` (OpenAI chat
        format): `{"predicted_output_tokens": n}` (`server.policies.base.Hints`)."""
        return self.hints_of(request_text(messages))

    def hints_of(self, request: str) -> dict[str, int]:
        """`hints` for a request already rendered by `request_text` (the agent renders it
        once per turn and also asks `predict_call` with it)."""
        return {"predicted_output_tokens": self.predict(request).predicted_output_tokens}

    def predict_call(self, tool: str | None, call: str | None, request: str | None = None,
                     model: str | None = None) -> float:
        """Predicted seconds of a known tool call (at `tool_start`)."""
        return self.predict_calls([(tool, call, request)], model)[0]

    def predict_calls(self, calls: Sequence[tuple[str | None, str | None, str | None]],
                      model: str | None = None) -> list[float]:
        texts = [call_text(tool, call, request) for tool, call, request in calls]
        return [p.predicted_seconds for p in self.predict_many(texts, model)]

    # -- files -----------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the model directory; files are written beside it first and the directory is
        swapped in whole, so a failed save leaves any old model as it was."""
        target = Path(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{target.name}.partial")
        if staging.exists():
            _remove_tree(staging)
        staging.mkdir()
        try:
            settings = self.neural.save(staging) if self.neural is not None else None
            umask = os.umask(0)
            os.umask(umask)
            for path in staging.rglob("*"):  # some writers leave 0600; give the usual mode
                if path.is_file():
                    path.chmod(0o666 & ~umask)
            self.baseline.save(staging / BASELINE_FILE)
            meta = {"format": FORMAT, "version": VERSION, "bucket_edges": list(self.edges),
                    "bucket_representatives": self.reps,
                    "constant": self.constant.__dict__, "neural": settings,
                    "baseline": BASELINE_FILE, **self.info}
            write_text_atomic(staging / PREDICTOR_FILE, json.dumps(meta, indent=1) + "\n")
            old = target.with_name(f".{target.name}.old")
            if target.exists():
                if old.exists():
                    _remove_tree(old)
                target.rename(old)
            staging.rename(target)
            if old.exists():
                _remove_tree(old)
        except BaseException:
            _remove_tree(staging)
            raise
        return target

    @classmethod
    def load(cls, directory: str | os.PathLike[str], neural: bool = True) -> LengthPredictor:
        """Load a model directory; `neural=False` loads only the baseline (no torch import)."""
        d = Path(directory)
        meta_file = d / PREDICTOR_FILE
        if not meta_file.is_file():
            raise PredictorError(f"{d}: not a predictor directory (no {PREDICTOR_FILE}); "
                                 "make one with `harness predictor train --out DIR`")
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise PredictorError(f"{meta_file}: not valid JSON ({exc})") from None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise PredictorError(f"{meta_file}: not a {FORMAT} v{VERSION} file")
        edges = check_edges(meta["bucket_edges"])
        try:
            baseline = TfidfRidge.load(d / meta.get("baseline", BASELINE_FILE))
        except (OSError, ValueError, KeyError) as exc:
            raise PredictorError(f"{d}: cannot load the baseline ({exc})") from None
        model = None
        if neural and meta.get("neural"):
            from predictor.text_models import NeuralModel  # torch: start-up cost

            try:
                model = NeuralModel.load(d, meta["neural"], n_buckets(edges))
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                raise PredictorError(f"{d}: cannot load the neural model ({exc})") from None
        info = {k: v for k, v in meta.items()
                if k not in ("format", "version", "bucket_edges", "bucket_representatives",
                             "constant", "neural", "baseline")}
        return cls(edges, list(meta["bucket_representatives"]), baseline,
                   Constant(**meta["constant"]), model, info)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# -- training ------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 1.0


@dataclass(frozen=True)
class NeuralTraining:
    """How `train` trains the BERT model, and only it (the baseline has no such settings):
    where its weights start (`init`, a BERT checkpoint directory, else random weights of
    `arch`) and the optimiser's settings (`predictor.text_models.TrainConfig`, whose defaults
    these are; the seed is `train`'s, shared with the baseline's record)."""

    epochs: int = 8
    batch_size: int = 32
    lr: float = 2e-3
    threads: int = 1
    duration_weight: float = 1.0
    arch: dict[str, int] | None = None
    init: str | os.PathLike[str] | None = None


def train(examples: Sequence[Example], *, seed: int = 0, edges: Sequence[int] = BUCKET_EDGES,
          neural: bool = True, training: NeuralTraining = NeuralTraining(),
          progress: Callable[[dict[str, Any]], None] | None = None,
          info: dict[str, Any] | None = None) -> LengthPredictor:
    """Train the baseline and (unless `neural=False`) the BERT model on `examples`, the latter
    as `training` says.

    Length rows: every example (its request text, its bucket). Duration rows: examples with
    `tool_seconds`, twice: by request text (stage I: before the reply) and by call text (at
    `tool_start`).
    """
    if not examples:
        raise ValueError("no training examples")
    edges = check_edges(edges)
    buckets = [bucket_of(e.output_tokens, edges) for e in examples]
    timed = [e for e in examples if e.tool_seconds is not None]
    logs = [log_seconds(e.tool_seconds) for e in timed]  # type: ignore[arg-type]
    counts = np.bincount(buckets, minlength=n_buckets(edges))
    constant = Constant(bucket=int(counts.argmax()),
                        output_tokens=int(_median([e.output_tokens for e in examples])),
                        seconds=float(math.exp(_median(logs))) if logs else 1.0)
    reps = representatives([e.output_tokens for e in examples], edges)
    started = time.perf_counter()
    duration_texts = [e.text for e in timed] + [call_text(e.tool, e.call, e.text) for e in timed]
    baseline = TfidfRidge.fit([e.text for e in examples],
                              [math.log(e.output_tokens) for e in examples],
                              duration_texts, logs + logs)
    baseline_s = time.perf_counter() - started
    info = dict(info or {})
    info.update({"trained_examples": len(examples), "timed_examples": len(timed),
                 "baseline_seconds": round(baseline_s, 2), "seed": seed})
    model = None
    if neural:
        from predictor.text_models import Item, NeuralModel, TrainConfig  # torch: start-up cost

        init = training.init
        if init is not None:
            model = NeuralModel.from_pretrained(init, n_buckets(edges), seed=seed)
        else:
            model = NeuralModel.new(n_buckets(edges), seed=seed, arch=training.arch)
        mean = float(np.mean(logs)) if logs else 0.0
        std = float(np.std(logs)) if len(logs) > 1 and np.std(logs) > 0 else 1.0
        model.seconds_mean, model.seconds_std = mean, std
        log_tokens = [math.log(e.output_tokens) for e in examples]
        t_mean, t_std = float(np.mean(log_tokens)), float(np.std(log_tokens)) or 1.0
        model.tokens_mean, model.tokens_std = t_mean, t_std
        items = [Item(e.text, b, (lt - t_mean) / t_std,
                      (log_seconds(e.tool_seconds) - mean) / std
                      if e.tool_seconds is not None else math.nan)
                 for e, b, lt in zip(examples, buckets, log_tokens, strict=True)]
        items += [Item(call_text(e.tool, e.call, e.text), -1, math.nan, (ls - mean) / std)
                  for e, ls in zip(timed, logs, strict=True)]
        config = TrainConfig(epochs=training.epochs, batch_size=training.batch_size,
                             lr=training.lr, seed=seed, threads=training.threads,
                             duration_weight=training.duration_weight)
        started = time.perf_counter()
        losses = model.fit(items, config, progress)
        info.update({"train_seconds": round(time.perf_counter() - started, 1),
                     "epoch_losses": [round(x, 4) for x in losses],
                     "train_config": config.__dict__, "init": str(init) if init else None,
                     "architecture": model.describe()})
    return LengthPredictor(edges, reps, baseline, constant, model, info)


# -- evaluation ----------------------------------------------------------------------------


def evaluate(predictor: LengthPredictor, examples: Sequence[Example],
             models: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Figures per model ("bert", "baseline", "constant"):

    * `accuracy`: predicted bucket == true bucket;
    * `within_one`: |predicted - true bucket| <= 1;
    * `mae_tokens`: mean |predicted - true output tokens|;
    * `mae_seconds_call`: mean |predicted - measured seconds| from the call text (at
      `tool_start`), over examples with `tool_seconds`;
    * `mae_seconds_request`: the same from the request text alone (before the reply);
    * `n`, `n_timed`: how many examples each figure is over.
    """
    names = list(models) if models else (["bert"] if predictor.neural is not None else []) + [
        "baseline", "constant"]
    texts = [e.text for e in examples]
    truth = np.array([bucket_of(e.output_tokens, predictor.edges) for e in examples])
    tokens = np.array([e.output_tokens for e in examples], dtype=np.float64)
    timed = [e for e in examples if e.tool_seconds is not None]
    secs = np.array([e.tool_seconds for e in timed], dtype=np.float64)
    results: dict[str, dict[str, float]] = {}
    for name in names:
        preds = predictor.predict_many(texts, name)
        b = np.array([p.bucket for p in preds])
        t = np.array([p.predicted_output_tokens for p in preds], dtype=np.float64)
        row = {"n": len(examples), "accuracy": float(np.mean(b == truth)),
               "within_one": float(np.mean(np.abs(b - truth) <= 1)),
               "mae_tokens": float(np.mean(np.abs(t - tokens))), "n_timed": len(timed)}
        if timed:
            by_request = predictor.predict_many([e.text for e in timed], name)
            by_call = predictor.predict_calls([(e.tool, e.call, e.text) for e in timed], name)
            row["mae_seconds_request"] = float(np.mean(np.abs(
                np.array([p.predicted_seconds for p in by_request]) - secs)))
            row["mae_seconds_call"] = float(np.mean(np.abs(np.array(by_call) - secs)))
        results[name] = row
    return results
