"""Output-length buckets (AugServe's "output length ranges"), pure Python.

Why buckets and not a number: a reply's length is heavy-tailed and only partly predictable, so
a scheduler needs an order of magnitude more than a token count; classifying into ranges is
also what AugServe's predictor does. Powers of two make the ranges equally wide in log space:

=======  ================  ==================
bucket   output tokens     label
=======  ================  ==================
0        1 .. 15           ``<16``
1        16 .. 31          ``16-31``
2        32 .. 63          ``32-63``
3        64 .. 127         ``64-127``
4        128 .. 255        ``128-255``
5        256 .. 511        ``256-511``
6        512 .. 1023       ``512-1023``
7        1024 .. 2047      ``1024-2047``
8        2048 and more     ``>=2048``
=======  ================  ==================

A bucket is turned back into a token count by its *representative*: the median training
length that fell in it (a trained model stores them), else the geometric middle of its range.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

#: Lower edges of buckets 1..8: bucket b holds lengths in [edges[b-1], edges[b]).
BUCKET_EDGES: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048)


def check_edges(edges: Sequence[int]) -> tuple[int, ...]:
    edges = tuple(int(e) for e in edges)
    if not edges or edges[0] < 2 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise ValueError(f"bucket edges must be increasing integers >= 2, got {list(edges)}")
    return edges


def n_buckets(edges: Sequence[int] = BUCKET_EDGES) -> int:
    return len(edges) + 1


def bucket_of(tokens: int | float, edges: Sequence[int] = BUCKET_EDGES) -> int:
    """The bucket of a length: how many edges are <= it."""
    return bisect_right(edges, tokens)


def bucket_range(bucket: int, edges: Sequence[int] = BUCKET_EDGES) -> tuple[int, int | None]:
    """(lowest, highest) length of a bucket; highest None for the open last bucket."""
    if not 0 <= bucket <= len(edges):
        raise ValueError(f"bucket must be in 0..{len(edges)}, got {bucket}")
    low = 1 if bucket == 0 else edges[bucket - 1]
    high = edges[bucket] - 1 if bucket < len(edges) else None
    return low, high


def bucket_label(bucket: int, edges: Sequence[int] = BUCKET_EDGES) -> str:
    low, high = bucket_range(bucket, edges)
    if bucket == 0:
        return f"<{edges[0]}"
    return f">={low}" if high is None else f"{low}-{high}"


def default_representatives(edges: Sequence[int] = BUCKET_EDGES) -> list[int]:
    """The geometric middle of each range (the open last bucket: twice its lower edge)."""
    reps = []
    for b in range(n_buckets(edges)):
        low, high = bucket_range(b, edges)
        reps.append(2 * low if high is None else max(1, round(math.sqrt(low * (high + 1)))))
    return reps


def representatives(lengths: Sequence[int], edges: Sequence[int] = BUCKET_EDGES) -> list[int]:
    """Per bucket, the median of the `lengths` in it (the MAE-optimal value to predict once the
    bucket is chosen); buckets with no lengths get `default_representatives`."""
    by_bucket: list[list[int]] = [[] for _ in range(n_buckets(edges))]
    for n in lengths:
        by_bucket[bucket_of(n, edges)].append(int(n))
    reps = default_representatives(edges)
    for b, values in enumerate(by_bucket):
        if values:
            values.sort()
            reps[b] = values[(len(values) - 1) // 2]
    return reps
