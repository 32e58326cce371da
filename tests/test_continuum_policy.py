"""`ContinuumPolicy`: hand-worked TTL decisions, cold start, eta, expiry and queue order.

Unless a test says otherwise: reload = 2 s (a stub cost model), T_wait = 1 s (the default
before any sample), eta = 1 (no finished programs), so B = T_wait * eta + reload = 3 s.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from server.policies import make_policy
from server.policies.base import AgentEvent, Hints, RequestView
from server.policies.continuum import MIN_SAMPLES as K
from server.policies.continuum import ContinuumPolicy

ROOT = Path(__file__).resolve().parents[1]


class Reload:
    """Cost model stub: every reload takes `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def prefill_seconds(self, context_tokens: int) -> float:
        return self.seconds

    def swap_seconds(self, tokens: int) -> float:
        return 0.0


def policy(reload: float = 2.0, t_wait: float = 1.0) -> ContinuumPolicy:
    return ContinuumPolicy(Reload(reload), t_wait_default_s=t_wait)


def req(rid: str, program: str | None, arrival: float, *, tool: str | None = None,
        predicted_s: float | None = None, last: bool = False, turn: int | None = None,
        preemptions: int = 0, prompt: int = 1000) -> RequestView:
    return RequestView(rid, program, arrival, prompt, output_tokens=0,
                       num_preemptions=preemptions,
                       hints=Hints(turn=turn, tool=tool, predicted_s=predicted_s, last=last))


def feed(p: ContinuumPolicy, tool: str, seconds: float, n: int) -> None:
    for _ in range(n):
        p.durations.observe(tool, seconds)


def ev(kind: str, program: str, **kw: object) -> AgentEvent:
    return AgentEvent(kind, program, **kw)  # type: ignore[arg-type]


# -- the TTL --------------------------------------------------------------------------
def test_ttl_with_a_known_cdf() -> None:
    p = policy()
    feed(p, "ls", 0.5, K)
    # candidates {0, 0.5}: U(0) = 0, U(0.5) = P(d <= 0.5) * 3 - 0.5 = 1 * 3 - 0.5 = 2.5
    d = p.ttl_for("ls", 1000)
    assert (d.ttl, d.source, d.benefit, d.reload) == (0.5, "tool", 3.0, 2.0)
    feed(p, "sleep", 30.0, K)
    # candidates {0, 30}: U(30) = 1 * 3 - 30 = -27 < U(0) = 0, so no pin
    assert p.ttl_for("sleep", 1000).ttl == 0.0


def test_ttl_picks_the_utility_maximum_of_a_two_point_cdf() -> None:
    p = policy()
    feed(p, "grep", 1.0, K // 2)
    feed(p, "grep", 10.0, K // 2)
    # B = 3: U(1) = 0.5 * 3 - 1 = 0.5, U(10) = 1 * 3 - 10 = -7 -> tau* = 1
    assert p.ttl_for("grep", 1000).ttl == 1.0
    # B = 25 (reload 24): U(1) = 12.5 - 1 = 11.5, U(10) = 25 - 10 = 15 -> tau* = 10
    p2 = policy(reload=24.0)
    feed(p2, "grep", 1.0, K // 2)
    feed(p2, "grep", 10.0, K // 2)
    assert p2.ttl_for("grep", 1000).ttl == 10.0


def test_cold_start_chain_at_0_99_and_100_samples() -> None:
    # the paper's K = 100 (it was 10 here before)
    assert K == 100
    p = policy()
    assert p.ttl_for("ls", 1000).source == "prior"  # 0 samples
    feed(p, "ls", 0.5, 99)
    assert p.ttl_for("ls", 1000).source == "prior"  # 99: neither the tool nor all tools
    feed(p, "ls", 0.5, 1)
    assert p.ttl_for("ls", 1000).source == "tool"  # 100 of its own
    # "cat" has none of its own: the CDF of all tools (100 0.5 s calls), so tau* = 0.5
    d = p.ttl_for("cat", 1000)
    assert (d.source, d.ttl) == ("global", 0.5)


def test_prior_closed_form() -> None:
    # Exp(mean 1 s): U(tau) = B (1 - e^-tau) - tau, U'(tau) = B e^-tau - 1 = 0 -> tau = ln B
    assert policy().ttl_for("ls", 1000).ttl == pytest.approx(math.log(3.0))  # B = 3: 1.0986
    assert policy(reload=0.0, t_wait=1.0).ttl_for("ls", 1000).ttl == 0.0  # B = 1: ln 1 = 0
    assert policy(reload=0.5, t_wait=0.0).ttl_for("ls", 1000).ttl == 0.0  # B < 1: never pin


def test_fallback_reload_without_a_cost_model() -> None:
    p = ContinuumPolicy()  # 0.1 ms per token, T_wait 0, eta 1
    # 20 000 tokens -> reload 2 s = B, prior tau* = ln 2
    d = p.ttl_for("ls", 20_000)
    assert d.reload == pytest.approx(2.0)
    assert d.ttl == pytest.approx(math.log(2.0))


def test_client_prediction_replaces_the_cdf() -> None:
    p = policy()
    feed(p, "ls", 0.5, K)
    # predicted 2 s -> tau = 2 * 1.2 = 2.4 < B = 3: pin for 2.4 s
    d = p.ttl_for("ls", 1000, predicted_s=2.0)
    assert (d.ttl, d.source) == (pytest.approx(2.4), "hint")
    # predicted 2.5 s -> tau = 3.0, not < B = 3: the pin would not pay for itself
    assert p.ttl_for("ls", 1000, predicted_s=2.5).ttl == 0.0


def test_on_finish_pins_and_sets_the_deadline() -> None:
    p = policy()
    feed(p, "ls", 0.5, K)
    r = req("r1", "p1", 0.0, tool="ls")
    p.on_arrival(r, 0.0)
    assert p.on_finish(r, 4.0) is True
    assert p.deadline("p1") == 4.5  # 4 + 0.5
    # a program's last call, and requests outside any program, are never pinned
    assert p.on_finish(req("r2", "p2", 0.0, tool="ls", last=True), 4.0) is False
    assert p.on_finish(req("r3", None, 0.0, tool="ls"), 4.0) is False
    # a long tool is not worth a pin
    feed(p, "sleep", 30.0, K)
    assert p.on_finish(req("r4", "p4", 0.0, tool="sleep"), 4.0) is False
    assert p.deadline("p4") is None
    stats = p.stats()
    assert stats["pins_made"] == 1 and stats["ttl_sources"]["tool"] == 2


# -- eta --------------------------------------------------------------------------------
def finish_program(p: ContinuumPolicy, pid: str, turns: int) -> None:
    for k in range(turns):
        p.on_arrival(req(f"{pid}-{k}", pid, float(k), turn=k), float(k))
    p.on_event(ev("program_end", pid), float(turns))


def test_eta_is_one_for_equal_length_programs() -> None:
    p = policy()
    for i in range(3):
        finish_program(p, f"p{i}", 4)  # (k, 4 - k) lies on a line: corr = -1
    assert p.eta() == 1.0
    assert p.stats()["eta_programs"] == 3


def test_eta_is_lower_for_mixed_lengths() -> None:
    p = policy()
    finish_program(p, "a", 1)  # (0, 1)
    assert p.eta() == 1.0  # one program: the default
    finish_program(p, "b", 3)  # (0, 3), (1, 2), (2, 1)
    # k = 0, 0, 1, 2 (mean 0.75); r = 1, 3, 2, 1 (mean 1.75)
    # sum dk*dr = .5625 - .9375 + .0625 - .9375 = -1.25; sum dk^2 = sum dr^2 = 2.75
    # corr = -1.25 / 2.75 = -5/11 -> eta = 5/11
    assert p.eta() == pytest.approx(5 / 11)
    # and it enters B: T_wait 1 s * 5/11 + reload 2 s
    assert p.ttl_for("ls", 1000).benefit == pytest.approx(2 + 5 / 11)


def test_eta_counts_a_program_once_when_it_ends_by_last_hint_and_event() -> None:
    p = policy()
    for k in range(2):
        r = req(f"a-{k}", "a", float(k), turn=k, last=(k == 1))
        p.on_arrival(r, float(k))
        p.on_finish(r, float(k) + 0.5)
    p.on_event(ev("program_end", "a"), 3.0)
    finish_program(p, "b", 5)
    assert p.stats()["eta_programs"] == 2
    assert p.eta() < 1.0


# -- expiry -----------------------------------------------------------------------------
def test_expiry_is_held_while_the_next_turn_waits() -> None:
    p = policy()
    feed(p, "ls", 0.5, K)
    r = req("r1", "p1", 0.0, tool="ls")
    p.on_arrival(r, 0.0)
    assert p.on_finish(r, 1.0)  # deadline 1.5
    assert p.pin_expired("p1", 1.2, has_waiting=False) is False
    assert p.pin_expired("p1", 1.5, has_waiting=False) is True
    assert p.pin_expired("p1", 9.0, has_waiting=True) is False  # its turn is queued
    p.on_event(ev("program_end", "p1"), 9.0)
    assert p.pin_expired("p1", 9.0, has_waiting=True) is True  # ended: at once


def test_program_end_expires_immediately() -> None:
    p = policy()
    feed(p, "ls", 0.5, K)
    r = req("r1", "p1", 0.0, tool="ls")
    assert p.on_finish(r, 1.0)
    p.on_event(ev("program_end", "p1"), 1.1)  # well within the TTL
    assert p.pin_expired("p1", 1.1, has_waiting=False) is True
    p.on_unpin("p1", "program_end", 1.1)
    # a late finish of the ended program is not pinned
    assert p.on_finish(req("r2", "p1", 1.0, tool="ls"), 1.2) is False


def test_tool_start_recomputes_the_deadline_from_the_pin_time() -> None:
    p = policy()
    feed(p, "ls", 0.5, K)
    feed(p, "sleep", 30.0, K)
    r = req("r1", "p1", 0.0)  # no tool hint: the chain has 20 samples in all ->
    # global CDF {0.5: 0.5, 30: 1}: U(0.5) = 0.5 * 3 - 0.5 = 1, U(30) = 3 - 30 -> tau* = 0.5
    p.on_arrival(r, 0.0)
    assert p.on_finish(r, 10.0)
    assert p.deadline("p1") == 10.5
    # the harness says it is "sleep" (30 s): tau* = 0 -> deadline = pin time, expires now
    p.on_event(ev("tool_start", "p1", tool="sleep"), 10.2)
    assert p.deadline("p1") == 10.0
    assert p.pin_expired("p1", 10.2, has_waiting=False) is True
    # a prediction of 2 s arrives: tau = 2.4 < B = 3 -> deadline 12.4
    p.on_event(ev("tool_start", "p1", tool="sleep", predicted_s=2.0), 10.3)
    assert p.deadline("p1") == pytest.approx(12.4)


def test_replaced_unpin_keeps_the_new_pin() -> None:
    p = policy()
    feed(p, "ls", 0.5, K)
    assert p.on_finish(req("r1", "p1", 0.0, tool="ls"), 1.0)
    assert p.on_finish(req("r2", "p1", 1.0, tool="ls"), 2.0)  # the scheduler then...
    p.on_unpin("p1", "replaced", 2.0)  # ...releases the old pin
    assert p.deadline("p1") == 2.5
    p.on_unpin("p1", "expired", 2.5)
    assert p.deadline("p1") is None


# -- ordering ---------------------------------------------------------------------------
def test_queue_order_preempted_then_pinned_then_program_arrival() -> None:
    p = policy()
    feed(p, "ls", 0.5, K)
    p.on_event(ev("program_start", "early"), 0.0)
    p.on_event(ev("program_start", "pinned"), 1.0)
    p.on_event(ev("program_start", "late"), 2.0)
    p.on_event(ev("program_start", "preempted"), 3.0)
    # "pinned" finishes a turn at t = 5 and keeps its KV until 5.5; its next turn arrives at 5.2
    first = req("pinned-0", "pinned", 4.0, tool="ls")
    p.on_arrival(first, 4.0)
    p.on_scheduled(first, 4.0)
    assert p.on_finish(first, 5.0)
    waiting = [
        req("late-0", "late", 2.1),
        req("early-3", "early", 5.1),  # the earliest program, its turn arrived late
        req("pinned-1", "pinned", 5.2),
        req("solo", None, 0.5),  # no program: its own arrival is its program arrival
        req("preempted-0", "preempted", 3.1, preemptions=1),
    ]
    for r in waiting:
        p.on_arrival(r, r.arrival_time)
    now = 5.3
    order = [r.request_id for r in sorted(waiting, key=lambda r: p.queue_key(r, now))]
    assert order == ["preempted-0", "pinned-1", "early-3", "solo", "late-0"]
    # the pinned turn keeps its place after the TTL (expiry is held while it waits)...
    assert p.queue_key(waiting[2], 9.0)[0] == 1.0
    # ...but not once the KV is gone (released under memory pressure)
    p.on_unpin("pinned", "pressure", 9.0)
    assert p.queue_key(waiting[2], 9.0) == (2.0, 1.0, 5.2)


def test_victim_is_the_latest_arrived_program() -> None:
    p = policy()
    for t, pid in [(0.0, "a"), (2.0, "c"), (1.0, "b")]:
        p.on_event(ev("program_start", pid), t)
    assert p.pin_victim(["a", "c", "b"]) == "c"
    assert p.pin_victim(["b", "a"]) == "b"
    # a program first seen through its request counts from that request's arrival
    p.on_arrival(req("d-0", "d", 3.0), 3.5)
    assert p.pin_victim(["a", "d", "c"]) == "d"


def test_program_arrival_is_the_first_sighting() -> None:
    p = policy()
    p.on_arrival(req("x-0", "x", 1.0), 1.0)
    p.on_event(ev("program_start", "x"), 2.0)  # later than the request: ignored
    assert p.queue_key(req("x-1", "x", 7.0), 7.0) == (2.0, 1.0, 7.0)
    p.on_event(ev("program_start", "y"), 3.0)
    p.on_arrival(req("y-0", "y", 4.0), 4.0)
    assert p.queue_key(req("y-0", "y", 4.0), 4.0) == (2.0, 3.0, 4.0)


# -- measurements ----------------------------------------------------------------------
def test_t_wait_samples_only_turns_that_arrived_without_a_pin() -> None:
    p = ContinuumPolicy(Reload(0.1))  # B = 0.1 s: the prior never pins
    r0 = req("p-0", "p", 0.0)
    p.on_arrival(r0, 0.0)
    p.on_scheduled(r0, 5.0)  # a first turn: not counted
    assert p.stats()["t_wait_samples"] == 0 and p.t_wait() == 0.0
    assert p.on_finish(r0, 6.0) is False  # evicted
    r1 = req("p-1", "p", 10.0)
    p.on_arrival(r1, 10.0)
    p.on_scheduled(r1, 12.0)  # waited 2 s after eviction
    assert p.t_wait() == 2.0
    # a turn that finds its pin waits too, but is not an eviction sample
    feed(p, "ls", 0.05, K)  # B = 2 s * 1 + 0.1 s; U(0.05) = 2.1 - 0.05 > 0: pin 0.05 s
    r1b = req("p-1b", "p", 12.0, tool="ls")
    assert p.on_finish(r1b, 13.0)
    r2 = req("p-2", "p", 13.01)
    p.on_arrival(r2, 13.01)
    p.on_scheduled(r2, 20.0)
    p.on_unpin("p", "handoff", 20.0)
    assert p.t_wait() == 2.0 and p.stats()["t_wait_samples"] == 1


def test_server_side_duration_fallback() -> None:
    p = policy()
    r0 = req("p-0", "p", 0.0, tool="ls")
    p.on_arrival(r0, 0.0)
    p.on_finish(r0, 5.0)
    p.on_arrival(req("p-1", "p", 7.5), 7.5)  # no tool_end: the gap 7.5 - 5 is the duration
    assert p.durations.counts() == {"__global__": 1, "ls": 1}
    assert p.durations.distribution("ls") is None  # 1 < K samples: still the prior
    assert p.durations.own("ls").support()  # type: ignore[union-attr] == [2.5]
    # with a tool_end the reported seconds are used and the gap is not
    p.on_finish(req("p-1", "p", 7.5, tool="ls"), 8.0)
    p.on_event(ev("tool_end", "p", tool="ls", seconds=1.2), 9.0)
    p.on_arrival(req("p-2", "p", 9.7), 9.7)
    assert p.durations.own("ls").support()  # type: ignore[union-attr] == [1.2, 2.5]
    # no tool known at all: recorded as "unknown"
    q0 = req("q-0", "q", 0.0)
    p.on_arrival(q0, 0.0)
    p.on_finish(q0, 1.0)
    p.on_arrival(req("q-1", "q", 4.0), 4.0)
    assert p.durations.count("unknown") == 1


def test_made_by_name_and_free_of_vllm_and_torch() -> None:
    assert isinstance(make_policy("continuum"), ContinuumPolicy)
    code = ("import sys, server.policies, predictor.durations; "
            "bad = [m for m in ('vllm', 'torch') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_hinted_prediction_lasts_until_a_tool_start_names_another_tool() -> None:
    p = policy()
    r = req("r1", "p1", 0.0, tool="ls", predicted_s=1.0)  # tau = 1.2 < B = 3
    assert p.on_finish(r, 10.0)
    assert p.deadline("p1") == pytest.approx(11.2)
    p.on_event(ev("tool_start", "p1", tool="ls"), 10.1)  # same tool: prediction stands
    assert p.deadline("p1") == pytest.approx(11.2)
    p.on_event(ev("tool_start", "p1", tool="python"), 10.2)  # another tool: prior, ln 3
    assert p.deadline("p1") == pytest.approx(10.0 + math.log(3.0))
    assert p.stats()["ttl_sources"] == {"hint": 2, "command": 0, "tool": 0, "global": 0,
                                        "prior": 1}


# -- command classes (tool:class keys) ---------------------------------------------------
def test_tool_end_events_teach_the_command_class_chain() -> None:
    # B = 3 s. Durations arrive as tool_end events named the way the harness names them.
    p = policy()
    for i in range(K):
        p.on_event(ev("tool_end", f"ls-{i}", tool="bash:ls", seconds=0.5), float(i))
    assert p.durations.counts() == {"__global__": K, "bash": K, "bash:ls": K}
    # pytest never seen: bash's CDF (all 0.5 s), U(0.5) = 3 - 0.5 > 0
    d = p.ttl_for("bash:pytest", 1000)
    assert (d.ttl, d.source, d.tool) == (0.5, "tool", "bash:pytest")
    for i in range(K):
        p.on_event(ev("tool_end", f"py-{i}", tool="bash:pytest", seconds=30.0), 20.0 + i)
    # its own K samples now: U(30) = 3 - 30 < 0, no pin
    assert (p.ttl_for("bash:pytest", 1000).ttl, p.ttl_for("bash:pytest", 1000).source) == (
        0.0, "command")
    assert p.ttl_for("bash:ls", 1000).ttl == 0.5
    # plain bash: both classes, P(<= 0.5) = 1/2: U(0.5) = 1.5 - 0.5 = 1 > U(30) < 0
    assert (p.ttl_for("bash", 1000).ttl, p.ttl_for("bash", 1000).source) == (0.5, "tool")
    # on_finish counts the decision under its level
    p.on_event(ev("tool_start", "q", tool="bash:pytest"), 40.0)
    assert p.on_finish(req("q-0", "q", 40.0), 41.0) is False  # the program's tool is pytest
    assert p.stats()["ttl_sources"]["command"] == 1


def test_a_hint_for_the_tool_holds_for_its_command_class() -> None:
    p = policy()
    # a prediction hinted for bash stands when tool_start names bash:pytest without one
    assert p.on_finish(req("r1", "p1", 0.0, tool="bash", predicted_s=1.0), 10.0)
    p.on_event(ev("tool_start", "p1", tool="bash:pytest"), 10.1)
    assert p.deadline("p1") == pytest.approx(11.2)  # 10 + 1.2 * 1
    # one hinted for another class does not: prior, ln B = ln 3
    assert p.on_finish(req("r2", "p2", 0.0, tool="bash:ls", predicted_s=1.0), 10.0)
    p.on_event(ev("tool_start", "p2", tool="bash:pytest"), 10.1)
    assert p.deadline("p2") == pytest.approx(10.0 + math.log(3.0))
    # and the other way round: a hint for bash:pytest holds when tool_start says just bash
    assert p.on_finish(req("r3", "p3", 0.0, tool="bash:pytest", predicted_s=1.0), 10.0)
    p.on_event(ev("tool_start", "p3", tool="bash"), 10.1)
    assert p.deadline("p3") == pytest.approx(11.2)


# -- reload from the host tier ----------------------------------------------------------
class Linear:
    """Prefill 0.1 ms per token, PCIe load 0.01 ms per token."""

    def prefill_seconds(self, context_tokens: int) -> float:
        return context_tokens * 1e-4

    def swap_seconds(self, tokens: int) -> float:
        return tokens * 1e-5


def test_a_context_in_host_memory_reloads_over_pcie_not_by_re_prefill() -> None:
    gpu_only = ContinuumPolicy(Linear(), t_wait_default_s=1.0)
    tiered = ContinuumPolicy(Linear(), t_wait_default_s=1.0)
    tiered.configure(max_batch_tokens=2048, total_blocks=1000, block_size=16, host_tier=True)
    # 20 000 tokens: re-prefill 2 s, B = 1 + 2 = 3 -> prior tau* = ln 3;
    # PCIe load 0.2 s, B = 1 + 0.2 = 1.2 -> tau* = ln 1.2 = 0.1823
    assert gpu_only.ttl_for("ls", 20_000).reload == pytest.approx(2.0)
    assert gpu_only.ttl_for("ls", 20_000).ttl == pytest.approx(math.log(3.0))
    d = tiered.ttl_for("ls", 20_000)
    assert (d.reload, d.benefit, d.ttl) == pytest.approx((0.2, 1.2, math.log(1.2)))
    # a 2.5 s tool: worth pinning against a 3 s re-prefill (U = 3 - 2.5 = 0.5), not against
    # a cheap load (U = 1.2 - 2.5 < 0)
    for p in (gpu_only, tiered):
        feed(p, "pytest", 2.5, K)
    assert gpu_only.ttl_for("pytest", 20_000).ttl == 2.5
    assert tiered.ttl_for("pytest", 20_000).ttl == 0.0
    # no cost model: the documented fallbacks, 0.1 ms (prefill) or 4 us (load) per token
    fallback = ContinuumPolicy()
    fallback.configure(max_batch_tokens=2048, total_blocks=1000, block_size=16, host_tier=True)
    assert fallback.ttl_for("ls", 20_000).reload == pytest.approx(0.08)


# -- the authors' public-code pressure rule (continuum-code) -----------------------------
def test_continuum_code_keeps_pins_while_others_run_and_orders_preemption() -> None:
    p = make_policy("continuum-code")
    assert isinstance(p, ContinuumPolicy) and p.orders_running
    assert not p.unpin_under_pressure(others_running=True)  # vLLM preempts instead
    assert p.unpin_under_pressure(others_running=False)  # nothing runs: give a pin up
    assert make_policy("continuum").unpin_under_pressure(others_running=True)  # the paper
    for pid, t in (("a", 0.0), ("b", 1.0), ("c", 2.0)):
        p.on_event(ev("program_start", pid), t)
    running = [req("c-0", "c", 5.0), req("a-3", "a", 6.0), req("b-9", "b", 4.0, last=True),
               req("b-2", "b", 3.0)]
    # last steps first (spared), then program arrival a < b < c: vLLM preempts from the end,
    # so c's turn goes first, then b's non-last turn, then a's; b's last step goes last
    ordered = sorted(running, key=lambda r: p.running_key(r, 7.0))
    assert [r.request_id for r in ordered] == ["b-9", "a-3", "b-2", "c-0"]
