"""InferCept's mix: the six augmentations of its Table 1 (math, QA, virtual environment,
chatbot, image generation, text to speech), each a kind of program with its own tool.

The table's means (and which numbers are uncertain) are in `INFERCEPT_TABLE`; AMPD's retrieval
workloads borrow its measured Wikipedia call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common.trace import Trace
from eval.workloads.arrivals import arrival_times, streams
from eval.workloads.distributions import ClippedLogNormal, DiscreteNormal
from eval.workloads.shapes import ShapeSpec, ToolSpec, check_n, draw_program

__all__ = ["INFERCEPT_TABLE", "InterceptRow", "infercept_mix"]


@dataclass(frozen=True)
class InterceptRow:
    """One augmentation type. ``seconds`` / ``interceptions`` / ``context`` / ``returned`` are
    the table's means; the ``*_sd`` values and ``output`` / ``prefix`` are our choices."""

    kind: str
    tool: str
    seconds: float
    seconds_sd: float
    seconds_range: tuple[float, float]
    interceptions: float
    interceptions_sd: float
    context: float  # mean context length at an interception
    returned: float  # tokens an interception returns
    returned_sd: float
    output: float  # tokens generated per segment (our choice)
    prefix: int  # few-shot / system prompt shared by programs of this kind (our choice)


#: InferCept (Abhyankar et al., ICML 2024; APIServe on arXiv), Table 1, as recalled: mean
#: interception time, interceptions per request, context length and returned tokens for six
#: augmentations. The means of Math, QA, VE and Chatbot are the table's as we remember them;
#: the Image and TTS rows and every sd are less certain (this machine has no copy of the
#: paper to check) and were chosen to be plausible: image generation ~20 s and TTS ~17 s per
#: call, chat users ~29 s per reply.
INFERCEPT_TABLE: tuple[InterceptRow, ...] = (
    InterceptRow("math", "calculator", 9e-5, 3e-5, (1e-5, 1e-3), 3.75, 1.5, 1422, 3, 2, 40, 900),
    InterceptRow("qa", "wikipedia", 0.69, 0.25, (0.05, 10.0), 2.52, 1.7, 1846, 43, 30, 45, 1200),
    InterceptRow("ve", "alfworld", 0.09, 0.05, (0.005, 2.0), 28.18, 10.0, 2185, 28, 13, 20, 1300),
    InterceptRow("chatbot", "human", 28.59, 15.0, (1.0, 300.0), 4.45, 2.0, 753, 99, 100, 100, 60),
    InterceptRow("image", "image_gen", 20.03, 8.0, (2.0, 120.0), 6.91, 3.9, 1267, 61, 15, 60, 500),
    InterceptRow("tts", "tts", 17.24, 7.0, (1.0, 120.0), 6.91, 3.9, 1845, 191, 54, 60, 500),
)


def _infercept_spec(row: InterceptRow) -> ShapeSpec:
    """Programs of ``k`` interceptions have ``k + 1`` turns. The first prompt's mean is solved
    so that the mean context at an interception (averaged over interceptions) is the table's:
    at interception ``j`` (0-based) the context is ``P + (j+1)*o + j*r``, whose average over
    ``j < k`` is ``P + o*(k+1)/2 + r*(k-1)/2``, weighted by ``k``."""
    k = DiscreteNormal(
        row.interceptions, row.interceptions_sd, 1, max(60, int(row.interceptions * 4))
    )
    turns = DiscreteNormal(row.interceptions + 1, row.interceptions_sd, 2, k.hi + 1)
    ek = k.moment(lambda x: x)
    o_w = k.moment(lambda x: x * (x + 1) / 2) / ek
    r_w = k.moment(lambda x: x * (x - 1) / 2) / ek
    p_total = max(row.context - row.output * o_w - row.returned * r_w, row.prefix + 50.0)
    p_unique = p_total - row.prefix
    return ShapeSpec(
        benchmark=row.kind,
        turns=turns,
        prompt=ClippedLogNormal(p_unique, 0.35 * p_unique, 10.0, 20.0 * p_unique),
        output=ClippedLogNormal(row.output, 0.5 * row.output, 2.0, 20.0 * row.output),
        tool_return=ClippedLogNormal(row.returned, row.returned_sd, 1.0, 30.0 * row.returned),
        tools=(
            ToolSpec(
                row.tool, 1.0, ClippedLogNormal(row.seconds, row.seconds_sd, *row.seconds_range)
            ),
        ),
        shared_prefix_tokens=row.prefix,
        shared_prefix_id=f"infercept-{row.kind}",
    )


def infercept_mix(
    n: int,
    jps: float,
    seed: int = 0,
    *,
    kinds: Sequence[str] | None = None,
    weights: Sequence[float] | None = None,
    cv: float | None = None,
) -> Trace:
    """The six augmentations of InferCept's Table 1, mixed (equal shares by default).

    Per kind (see :data:`INFERCEPT_TABLE` for the numbers and which are uncertain):

    * ``math`` — calculator, ~90 µs per call (effectively instant), 3.75 calls, returns ~3 tokens;
    * ``qa`` — Wikipedia search, 0.69 s, 2.52 calls, returns ~43 tokens;
    * ``ve`` — ALFWorld virtual environment, 0.09 s, 28.18 calls, returns ~28 tokens;
    * ``chatbot`` — a human's next message, 28.6 s, 4.45 rounds, ~99 tokens;
    * ``image`` — image generation, ~20 s, ~6.9 calls; ``tts`` — text to speech, ~17 s.

    A program with ``k`` interceptions has ``k + 1`` turns (``k`` from a discrete normal with
    the table's mean, at least 1). Interception times are clipped lognormals with the table's
    mean. The first prompt (with a per-kind shared few-shot/system prefix,
    ``infercept-<kind>``) is sized so the mean context at an interception is the table's;
    outputs per segment are our choice (20 tokens for ALFWorld actions up to 100 for chat
    replies). ``benchmark`` of each program is its kind.
    """
    check_n(n)
    table = {row.kind: row for row in INFERCEPT_TABLE}
    kinds = list(kinds) if kinds is not None else list(table)
    unknown = [k for k in kinds if k not in table]
    if unknown or not kinds:
        raise ValueError(f"unknown InferCept kind(s) {unknown}; choose from {sorted(table)}")
    w = np.array(weights if weights is not None else [1.0] * len(kinds), dtype=float)
    if w.shape != (len(kinds),) or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be one non-negative number per kind, not all zero")
    specs = [_infercept_spec(table[k]) for k in kinds]
    content, arr = streams(seed)
    times = arrival_times(n, jps, arr, cv)
    choice = content.choice(len(kinds), size=n, p=w / w.sum())
    programs = [
        draw_program(
            specs[int(c)], content, f"mix-{i:05d}", times[i], f"synthetic:infercept/{kinds[int(c)]}"
        )
        for i, c in enumerate(choice)
    ]
    return Trace(
        name=f"mix-{n}",
        description="InferCept Table 1 augmentations, mixed",
        params={
            "generator": "mix",
            "n": n,
            "jps": jps,
            "cv": cv,
            "kinds": kinds,
            "weights": [float(x) for x in w],
        },
        seed=seed,
        programs=programs,
    )
