"""The token gaps an in-process engine reports per finished request (`server.engine`), which
per-token ITL SLOs are measured on (`sim.records.TurnRecord.itl_p90` / ``itl_max``)."""

from __future__ import annotations

from types import SimpleNamespace

from server.engine import Pending, collect_finished


def _outputs(request_id, tokens, finish=None):
    out = SimpleNamespace(request_id=request_id, new_token_ids=tokens, prefill_stats=None,
                          finish_reason=finish, kv_transfer_params=None)
    return {0: SimpleNamespace(outputs=[out])}


def test_gaps_are_the_times_between_output_tokens_after_the_first():
    pending = {"r": Pending(arrival=0.0, program_id="p", prompt_tokens=10)}
    assert collect_finished(_outputs("r", [1]), pending, 0.5) == []  # first token
    assert collect_finished(_outputs("r", []), pending, 0.6) == []  # a step without its token
    assert collect_finished(_outputs("r", [2]), pending, 0.8) == []
    (fin,) = collect_finished(_outputs("r", [3], finish="stop"), pending, 1.5)
    assert fin.first_token == 0.5 and fin.output_tokens == 3
    assert [round(g, 9) for g in fin.token_gaps] == [0.3, 0.7]  # the 0.7 s stall is kept
    assert "r" not in pending
