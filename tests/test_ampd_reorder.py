"""AMPD's prefill reordering (Algorithm 2), each decision worked out by hand.

Prefill times are exact by construction: n tokens take n ms (`Linear`).
"""

from __future__ import annotations

import json
import random

import pytest

from server.policies import make_policy
from server.policies.ampd import (
    POSTPONE_CAP,
    WINDOW,
    AMPDPolicy,
    PrefillTask,
    best_order,
    postponed_in,
    predicted_ttfts,
)
from server.policies.base import AgentEvent, Hints, RequestView
from server.policies.spec import PolicySpec


class Linear:
    def prefill_seconds(self, context_tokens: int) -> float:
        return context_tokens / 1000

    def swap_seconds(self, tokens: int) -> float:
        return 0.0


def test_constants_are_the_papers():
    assert WINDOW == POSTPONE_CAP == 3
    assert make_policy("ampd").name == "ampd"


# -- the pure decision ------------------------------------------------------------------------
# SLO 1 s. A waited 0.5 s and needs 0.3 s; B just came and needs 0.6 s; C waited 0.3 s, 0.1 s.
A, B, C = PrefillTask(0.5, 0.3), PrefillTask(0.0, 0.6), PrefillTask(0.3, 0.1)


def test_predicted_ttft_is_waited_plus_queue_ahead_plus_own_prefill():
    # FCFS: A 0.5 + 0.3; B 0 + 0.3 + 0.6; C 0.3 + 0.3 + 0.6 + 0.1
    assert predicted_ttfts([A, B, C], (0, 1, 2)) == pytest.approx([0.8, 0.9, 1.3])
    assert predicted_ttfts([A, B, C], (0, 2, 1)) == pytest.approx([0.8, 0.7, 1.0])


def test_postponed_are_the_tasks_something_from_behind_overtakes():
    assert postponed_in((0, 1, 2)) == set()
    assert postponed_in((0, 2, 1)) == {1}
    assert postponed_in((1, 2, 0)) == {0}
    assert postponed_in((2, 1, 0)) == {0, 1}


def test_best_order_maximises_tasks_meeting_the_slo():
    # FCFS meets 2 (C misses at 1.3 s); A, C, B meets all 3 (0.8, 0.7, 1.0)
    assert best_order([A, B, C], slo_s=1.0) == (0, 2, 1)


def test_fcfs_wins_ties():
    assert best_order([A, B, C], slo_s=10.0) == (0, 1, 2)  # every order meets all three
    # a long head that misses anyway: B, C, A and C, B, A both meet 2; the nearer FCFS wins
    long_head = [PrefillTask(0.0, 0.9), PrefillTask(0.0, 0.1), PrefillTask(0.0, 0.1)]
    assert best_order(long_head, slo_s=0.5) == (1, 2, 0)


def test_a_task_postponed_w_times_is_not_postponed_again():
    assert best_order([A, PrefillTask(0.0, 0.6, postponed=2), C], slo_s=1.0) == (0, 2, 1)
    capped = [A, PrefillTask(0.0, 0.6, postponed=POSTPONE_CAP), C]
    # (0, 2, 1) would postpone B; of the rest, FCFS and B, C, A meet 2, FCFS first
    assert best_order(capped, slo_s=1.0) == (0, 1, 2)


def test_short_windows():
    assert best_order([], slo_s=1.0) == ()
    assert best_order([B], slo_s=0.1) == (0,)
    assert best_order([PrefillTask(0.0, 0.9), PrefillTask(0.0, 0.1)], slo_s=0.5) == (1, 0)


# -- the policy on request views --------------------------------------------------------------
def view(rid: str, tokens: int, t: float = 0.0, program: str | None = None,
         last: bool = False) -> RequestView:
    return RequestView(rid, program or rid, arrival_time=t, prompt_tokens=tokens,
                       hints=Hints(last=last))


def arrive(policy: AMPDPolicy, *views: RequestView) -> list[RequestView]:
    for v in views:
        policy.on_arrival(v, v.arrival_time)
    return list(views)


def test_policy_reorders_only_the_window_at_the_head():
    policy = AMPDPolicy(Linear(), ttft_slo_s=0.5)
    waiting = arrive(policy, view("A", 900), view("B", 100), view("C", 100), view("D", 50))
    # A (0.9 s) misses the SLO whatever happens; B and C meet it only ahead of A; D stays last
    order = policy.order_waiting(list(reversed(waiting)), now=0.0)
    assert [v.request_id for v in order] == ["B", "C", "A", "D"]


def test_postponed_w_times_then_run():
    policy = AMPDPolicy(Linear(), ttft_slo_s=0.5)
    waiting = arrive(policy, view("A", 900), view("s0", 100), view("s1", 100))
    heads = []
    for k in range(2, 6):
        head = policy.order_waiting(waiting, now=0.01 * k)[0]
        heads.append(head.request_id)
        policy.on_scheduled(head, now=0.01 * k)  # run the head
        waiting.remove(head)
        waiting += arrive(policy, view(f"s{k}", 100, t=0.01 * k))  # another short one arrives
    # each short one admitted ahead of A postpones it once; after three, A runs
    assert heads == ["s0", "s1", "s2", "A"]
    assert "A" not in policy.postponed


def test_postponement_is_counted_once_per_decision():
    """Algorithm 2 line 7: the tasks the chosen ordering postpones count one postponement per
    decision. A(900), B(100), C(100), SLO 0.5 s: the ordering is B, C, A (A postponed). A step
    whose budget admits B and C together is one decision: A counts 1, not 2."""
    policy = AMPDPolicy(Linear(), ttft_slo_s=0.5)
    waiting = arrive(policy, view("A", 900), view("B", 100), view("C", 100))
    order = policy.order_waiting(waiting, now=0.0)
    assert [v.request_id for v in order] == ["B", "C", "A"]
    policy.on_scheduled(order[0], now=0.0)
    policy.on_scheduled(order[1], now=0.0)  # same step, no new ordering
    assert policy.postponed == {"A": 1} and policy.decisions == 1


def test_a_task_the_ordering_postpones_counts_before_anything_overtakes_it():
    """A(100), B(900), C(100), SLO 0.5 s: FCFS meets 1 (A), the ordering A, C, B meets 2. It
    postpones B (C from behind it placed ahead), so admitting its head A counts B once, though
    A was ahead of B anyway."""
    policy = AMPDPolicy(Linear(), ttft_slo_s=0.5)
    waiting = arrive(policy, view("A", 100), view("B", 900), view("C", 100))
    order = policy.order_waiting(waiting, now=0.0)
    assert [v.request_id for v in order] == ["A", "C", "B"]
    policy.on_scheduled(order[0], now=0.0)
    assert policy.postponed == {"B": 1, "C": 0}


def test_incremental_prefill_is_priced_on_top_of_the_programs_history():
    policy = AMPDPolicy(Linear())
    first = view("x#0", 700, program="x")
    first.output_tokens = 100
    policy.on_finish(first, now=1.0)
    assert policy.prefill_s(view("x#1", 900, program="x")) == pytest.approx(0.1)
    assert policy.prefill_s(view("y#0", 900, program="y")) == pytest.approx(0.9)
    policy.on_event(AgentEvent("program_end", "x"), now=2.0)
    assert policy.prefill_s(view("x#1", 900, program="x")) == pytest.approx(0.9)


def test_without_a_cost_model_the_queue_is_fcfs():
    policy = AMPDPolicy(None, ttft_slo_s=0.5)
    waiting = arrive(policy, view("A", 900), view("B", 100), view("C", 100, t=-1.0))
    assert [v.request_id for v in policy.order_waiting(waiting, 0.0)] == ["C", "A", "B"]
    assert policy.on_finish(view("B", 100), 1.0) is False  # retention: vLLM's


# -- the scheduler hook on the real vLLM scheduler ---------------------------------------------
@pytest.mark.engine
def test_policy_scheduler_runs_the_reordered_queue(monkeypatch):
    from vllm_driver import Driver, make_scheduler

    scheduler = make_scheduler("ampd", num_blocks=128)
    assert isinstance(scheduler.agent_policy, AMPDPolicy)
    scheduler.agent_policy = AMPDPolicy(Linear(), ttft_slo_s=0.5)
    d = Driver(scheduler)
    rng = random.Random(0)
    for rid, n in (("A", 900), ("B", 100), ("C", 100)):
        d.submit(rid, [rng.randrange(8, 30000) for _ in range(n)], rid, max_tokens=2)
    out = d.step()  # 512 tokens a step: FCFS would spend them all on A's first chunk
    assert [n.req_id for n in out.scheduled_new_reqs] == ["B", "C", "A"]
    assert out.num_scheduled_tokens == {"B": 100, "C": 100, "A": 312}
    d.close()


# -- the deployment's TTFT SLO reaches the policy, served and simulated alike ------------------
def test_make_policy_passes_the_slo_to_policies_that_take_it():
    assert make_policy("ampd", ttft_slo_s=2.5).ttft_slo_s == 2.5
    assert make_policy("ampd").ttft_slo_s == 1.0  # the module's default
    assert make_policy("vllm", ttft_slo_s=2.5).name == "vllm"  # not an option of its own


@pytest.mark.engine
def test_served_and_virtual_replicas_take_the_clusters_ttft_slo(monkeypatch, autoclose):
    """`harness cluster serve` -> `harness serve` -> the engine core's scheduler, and the
    virtual-time cluster's engines, all run Algorithm 2 against `router.ttft_slo_s` (2 s in
    this file), not the 1 s default."""
    from pathlib import Path

    from vllm_driver import make_scheduler

    from cluster.config import load_cluster
    from cluster.launcher import replica_command
    from server.engine_spec import EngineSpec
    from sim.engines import make_engine

    root = Path(__file__).resolve().parent.parent
    config = load_cluster(root / "cluster" / "examples" / "ampd-h20-1p3d.yaml")
    spec = config.replicas[0].model_copy(update={"policy": PolicySpec.named("ampd")})
    argv, _ = replica_command(config, spec, 8400, side_channel_port=8400,
                              events_ipc="ipc:///dev/null")
    served = json.loads(argv[argv.index("--additional-config") + 1])
    assert make_scheduler("ampd", additional_config=served).agent_policy.ttft_slo_s == 2.0
    engine = autoclose(make_engine(spec.policy, config.engine_spec(
        spec, EngineSpec(max_model_len=4096)), replica=spec, cluster=config))
    assert engine.scheduler.agent_policy.ttft_slo_s == 2.0
