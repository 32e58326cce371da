"""The cheap non-neural baseline: TF-IDF words and word pairs, ridge regression, numpy only.

Why this baseline: it is what one would try first (scikit-learn is not installed here, and
the model is small enough to write in a page), it already sees the same text as the neural
model, so the gap between the two is the gain from the encoder and not from better inputs.

Two ridge regressions on the same features: log output tokens (its exp is the predicted
length, whose bucket is the predicted bucket) and log tool seconds (trained on request texts
and on call texts, as the neural duration head is). Features: lower-cased words, numbers and
punctuation marks, plus adjacent pairs; the `max_features` most frequent (document frequency
>= 2) in training; sublinear tf (1 + log tf) times smooth idf, rows scaled to unit length.
Parameters are kept as JSON (vocabulary, idf, weights, intercepts), so a policy or the harness
can load them without torch.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic import write_text_atomic

FORMAT = "harness-predictor-baseline"
VERSION = 1
MAX_FEATURES = 4000
ALPHA = 1.0
MIN_SECONDS = 1e-4

_WORD = re.compile(r"[a-z_]+|\d+|[^\sa-z_\d]")


def terms(text: str) -> list[str]:
    words = _WORD.findall(text.lower())
    return words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]


class TfidfRidge:
    """TF-IDF features with one ridge regression per target (`length`, `duration`)."""

    def __init__(self, vocab: Sequence[str], idf: Sequence[float],
                 heads: dict[str, dict[str, Any]]) -> None:
        self.vocab = list(vocab)
        self.index = {t: i for i, t in enumerate(self.vocab)}
        self.idf = np.asarray(idf, dtype=np.float64)
        self.heads = {name: {"w": np.asarray(h["w"], dtype=np.float64), "b": float(h["b"])}
                      for name, h in heads.items()}

    # -- features --------------------------------------------------------------------------
    def features(self, texts: Sequence[str]) -> np.ndarray:
        x = np.zeros((len(texts), len(self.vocab)), dtype=np.float64)
        for row, text in enumerate(texts):
            for term, tf in Counter(terms(text)).items():
                j = self.index.get(term)
                if j is not None:
                    x[row, j] = 1.0 + math.log(tf)
        x *= self.idf
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        np.divide(x, norms, out=x, where=norms > 0)
        return x

    # -- training --------------------------------------------------------------------------
    @classmethod
    def fit(cls, length_texts: Sequence[str], log_tokens: Sequence[float],
            duration_texts: Sequence[str], log_seconds: Sequence[float],
            max_features: int = MAX_FEATURES, alpha: float = ALPHA) -> TfidfRidge:
        corpus = list(length_texts) + list(duration_texts)
        df: Counter[str] = Counter()
        for text in corpus:
            df.update(set(terms(text)))
        # most frequent first, ties by the term itself: the same data gives the same vocabulary
        kept = sorted((t for t, c in df.items() if c >= 2), key=lambda t: (-df[t], t))
        vocab = sorted(kept[:max_features])
        n = len(corpus)
        idf = [math.log((1 + n) / (1 + df[t])) + 1.0 for t in vocab]
        model = cls(vocab, idf, {})
        model.heads["length"] = model._ridge(length_texts, log_tokens, alpha)
        model.heads["duration"] = model._ridge(duration_texts, log_seconds, alpha)
        return model

    def _ridge(self, texts: Sequence[str], y: Sequence[float], alpha: float
               ) -> dict[str, Any]:
        target = np.asarray(y, dtype=np.float64)
        if len(texts) == 0:  # no measured durations: predict the prior mean (1 s)
            return {"w": np.zeros(len(self.vocab)), "b": 0.0}
        x = self.features(texts)
        mean = float(target.mean())
        if x.shape[0] < x.shape[1]:  # fewer rows than features: the dual form is smaller
            gram = x @ x.T
            gram[np.diag_indices_from(gram)] += alpha
            w = x.T @ np.linalg.solve(gram, target - mean)
        else:
            gram = x.T @ x
            gram[np.diag_indices_from(gram)] += alpha
            w = np.linalg.solve(gram, x.T @ (target - mean))
        return {"w": w, "b": mean}

    # -- prediction ------------------------------------------------------------------------
    def predict(self, head: str, texts: Sequence[str]) -> np.ndarray:
        h = self.heads[head]
        return self.features(texts) @ h["w"] + h["b"]

    def predict_tokens(self, texts: Sequence[str]) -> np.ndarray:
        return np.maximum(1.0, np.exp(self.predict("length", texts)))

    def predict_seconds(self, texts: Sequence[str]) -> np.ndarray:
        return np.exp(self.predict("duration", texts))

    # -- files -----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        def r(values: np.ndarray) -> list[float]:
            return [float(f"{v:.6g}") for v in values]

        return {"format": FORMAT, "version": VERSION, "vocab": self.vocab, "idf": r(self.idf),
                "heads": {k: {"b": float(f"{h['b']:.9g}"), "w": r(h["w"])}
                          for k, h in self.heads.items()}}

    def save(self, path: str | os.PathLike[str]) -> Path:
        return write_text_atomic(path, json.dumps(self.to_json(), separators=(",", ":")))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TfidfRidge:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ValueError(f"{path}: not a {FORMAT} v{VERSION} file")
        return cls(data["vocab"], data["idf"], data["heads"])
