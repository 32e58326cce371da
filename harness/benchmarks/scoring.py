"""Pass/fail and partial-credit scoring, as the benchmarks themselves score.

* GSM8K: the final number equals the reference number (commas, `$`, trailing `.0` ignored).
* HotpotQA: exact match and F1 over tokens after SQuAD-style normalisation (lower case, strip
  punctuation and the articles a/an/the, collapse white space); pass = exact match.
* ALFWorld: the game engine's `won` (nothing to compute here).
"""

from __future__ import annotations

import re
import string
from collections import Counter

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def normalize_number(text: str | None) -> float | None:
    """The last number in `text`, as a float (GSM8K answers end with the number)."""
    if not text:
        return None
    matches = _NUMBER.findall(text.replace("$", ""))
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


def numeric_match(prediction: str | None, reference: str | float) -> bool:
    got = normalize_number(prediction)
    want = normalize_number(str(reference))
    return got is not None and want is not None and abs(got - want) < 1e-6 * max(1, abs(want))


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str | None, reference: str) -> bool:
    return prediction is not None and normalize_answer(prediction) == normalize_answer(reference)


def f1_score(prediction: str | None, reference: str) -> float:
    if prediction is None:
        return 0.0
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = Counter(pred) & Counter(ref)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred), overlap / len(ref)
    return 2 * precision * recall / (precision + recall)
