"""What the emulated P/D worker changes in vLLM's NIXL connector scheduler side, which runs
unchanged inside our scheduler (`server.emulated.nixl` plays the worker side).

Time: the connector's scheduler side stamps leases with `time.perf_counter()`. So that leases
follow the engine's clock (`server.clock`, virtual or real), `follow_process_clock()` points the
`time` name of exactly two vLLM modules (`nixl/base_scheduler.py`, `nixl/pull_scheduler.py`) at a
shim whose `perf_counter()` is `clock().now()`; every other `time` use in the process is
untouched. Lease deadlines and export expiry times are then clock readings, which the engines of
one virtual cluster share, and which served replicas on one machine share (wall time).

One vLLM 0.32 bug is worked around (`fix_readback_retry`, the prefill side of bidirectional
transfer re-offering a read it will never start).
"""

from __future__ import annotations

import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_scheduler, pull_scheduler
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)

from server.clock import clock


class _ClockTime:
    """`time` for the NIXL scheduler modules: perf_counter/monotonic read the process clock."""

    @staticmethod
    def perf_counter() -> float:
        return clock().now()

    @staticmethod
    def monotonic() -> float:
        return clock().now()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def follow_process_clock() -> None:
    """Make the NIXL connector's scheduler side stamp leases with `server.clock` time."""
    for module in (base_scheduler, pull_scheduler):
        if not isinstance(module.time, _ClockTime):
            module.time = _ClockTime()  # type: ignore[attr-defined]


def fix_readback_retry() -> None:
    """Work around a vLLM 0.32 bug on the prefill side of `bidirectional_kv_xfer`.

    `update_state_after_alloc` starts at most one read per request (`_remote_blocks_processed`),
    but `get_num_new_matched_tokens` offers the decode replica's tokens again whenever the
    request is scheduled anew: after a failed or declined read-back with
    `kv_load_failure_policy="recompute"` (or after a preemption) the request goes back to
    `WAITING_FOR_REMOTE_KVS` with no read to end the wait, and hangs. The decode side clears
    `do_remote_prefill` for the same purpose; here the prefill side's offer is withdrawn once
    its one read has been made, so the request recomputes what its prefix cache lacks."""
    original = NixlPullConnectorScheduler.get_num_new_matched_tokens
    if getattr(original, "_harness_fixed", False):
        return

    def get_num_new_matched_tokens(self: Any, request: Any,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params
        if params and params.get("do_remote_decode") and params.get("_remote_blocks_processed"):
            return 0, False
        return original(self, request, num_computed_tokens)

    get_num_new_matched_tokens._harness_fixed = True  # type: ignore[attr-defined]
    NixlPullConnectorScheduler.get_num_new_matched_tokens = (  # type: ignore[method-assign]
        get_num_new_matched_tokens)
