"""Sessions scaled down for a small engine keep their shape: every count scaled, the format's
rules kept (a kept prefix within what it keeps from), times untouched."""

from __future__ import annotations

import pytest

from common.trace import Program, Trace, Turn
from eval.workloads.token_scale import scale_tokens


def _trace() -> Trace:
    turns = [Turn(input_tokens=20_000, output_tokens=300, tool="bash", tool_seconds=9.0,
                  tool_return_tokens=1_500),
             Turn(input_tokens=40, output_tokens=1, tool="person", tool_seconds=120.0,
                  gap_kind="person", tool_return_tokens=0),
             # compaction: keeps all of the conversation as left (the bound is exact)
             Turn(input_tokens=900, output_tokens=250, kept_tokens=21_841)]
    program = Program(id="s", arrival_s=0.0, turns=turns, shared_prefix_tokens=12_000,
                      shared_prefix_id="claude")
    return Trace(name="t", programs=[program])


def test_every_count_is_scaled_and_the_format_still_holds():
    trace = _trace()
    small = scale_tokens(trace, 0.1)
    p, q = trace.programs[0], small.programs[0]
    assert [t.input_tokens for t in q.turns] == [2_000, 4, 90]
    assert [t.output_tokens for t in q.turns] == [30, 1, 25]
    assert q.turns[0].tool_return_tokens == 150 and q.shared_prefix_tokens == 1_200
    # the kept prefix is bounded by the scaled conversation (2,000 + 30 + 150 + 4 + 1)
    assert q.turns[2].kept_tokens == 2_185
    assert [t.tool_seconds for t in q.turns] == [t.tool_seconds for t in p.turns]
    assert [t.gap_kind for t in q.turns] == [t.gap_kind for t in p.turns]
    assert abs(q.context_before(2) - 0.1 * p.context_before(2)) < 5
    assert small.params["token_scale"] == 0.1


@pytest.mark.parametrize("factor", [0.0, -1.0, 1.5, float("nan")])
def test_a_scale_outside_zero_to_one_is_refused(factor):
    with pytest.raises(ValueError, match="token scale"):
        scale_tokens(_trace(), factor)


def test_a_scale_of_one_is_the_trace_itself():
    trace = _trace()
    assert scale_tokens(trace, 1.0) is trace
