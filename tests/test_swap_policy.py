"""`swap` on vLLM's native KV offloading: the real connector, the emulated worker side.

The engine tests run one program whose KV cache cannot stay on the GPU across its tool call
(another program's prompt takes the memory), under `swap`, `discard` and `swap` with the
reload declined, through the real `EngineCore` on a virtual clock.
"""

from __future__ import annotations

import json
import os
from contextlib import closing
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vLLM is imported (no GPU here)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from cluster.pd import kv_transfer_config  # noqa: E402
from server.clock import VirtualClock, use_clock  # noqa: E402
from server.engine import VirtualEngine  # noqa: E402
from server.engine_spec import EngineSpec
from server.launch import ServeError, build_command
from server.perf.registry import load_profile
from server.policies import RequestView, make_policy  # noqa: E402
from server.policies.spec import PolicySpec
from server.policies.swap import SwapPolicy  # noqa: E402
from server.settings import DEFAULT_OFFLOAD_GIB, ServeSettings

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingConnectorMetadata,
        TransferJob,
    )

    from server.emulated.offload import EmulatedOffloadWorker

PROFILE = "h100-llama-3.1-8b"
BLOCK = 16
FIRST = list(range(8, 1008))  # program A's first prompt: 1000 tokens
OTHER = list(range(2000, 4000))  # program B's prompt: 2000 tokens, evicts A's cached blocks
NEW = list(range(100, 200))  # A's tool return and next input
# A's first turn computes 1000 + 20 - 1 tokens (the last sampled token is never fed back)
A_COMPUTED_BLOCKS_TOKENS = (1000 + 20 - 1) // BLOCK * BLOCK


def intercepted_program(policy: str, copy_model: str = "peak80",
                        kv_transfer: dict | None = None) -> dict:
    """A0, then B0 (which takes A's memory) during A's 1 s tool call, then A1."""
    # 129 blocks: the null block plus 2048 tokens, just one max_model_len sequence
    with closing(VirtualEngine(PolicySpec.named(policy), EngineSpec(
            profile=PROFILE, num_gpu_blocks=129, max_model_len=2048,
            offload_copy_model=copy_model, kv_transfer=kv_transfer))) as engine:
        done = {}
        engine.add_request("a0", FIRST, program_id="A", output_tokens=20, tool="bash")
        done.update(run(engine))
        engine.add_request("b0", OTHER, program_id="B", output_tokens=8)
        done.update(run(engine))
        engine.advance_to(engine.clock.now() + 1.0)
        engine.add_request("a1", FIRST + done["a0"].token_ids + NEW, program_id="A",
                           output_tokens=5)
        done.update(run(engine))
        done["offload_gib"] = engine.offload_gib
        done["connector"] = type(engine.scheduler.connector).__name__
        cost = engine.scheduler.agent_policy.cost_model  # what the policy prices a reload by
        done["cost_model"] = (cost.offload_copy_model,
                              cost.swap_seconds(done["a1"].external_tokens))
        return done


def run(engine: VirtualEngine) -> dict:
    done = {}
    while engine.has_work():
        done.update((f.request_id, f) for f in engine.step())
    return done


@pytest.fixture(scope="module")
def runs():
    asked = []

    def decline(self, req):
        asked.append((req.request_id, req.program_id))
        return False

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SwapPolicy, "reload_from_cpu", decline)
        declined = intercepted_program("swap")
    return {"swap": intercepted_program("swap"), "again": intercepted_program("swap"),
            "discard": intercepted_program("discard"), "declined": declined,
            "sourced": intercepted_program("swap", "sourced"), "asked": asked,
            "stacked": intercepted_program("swap", kv_transfer=kv_transfer_config(
                "solo", "colocated", {}, fabric="inproc:test-swap-stacked"))}


@pytest.mark.engine
def test_swap_reloads_the_context_from_host_memory(runs):
    a1 = runs["swap"]["a1"]
    profile = load_profile(PROFILE)
    assert a1.cached_tokens == A_COMPUTED_BLOCKS_TOKENS  # all of A's full blocks came back
    assert 0 < a1.external_tokens < a1.cached_tokens  # most from the CPU, a little from GPU
    recomputed = a1.prompt_tokens - a1.cached_tokens
    assert recomputed == len(NEW) + 20 - (A_COMPUTED_BLOCKS_TOKENS - len(FIRST))
    # the load (PCIe, one direction) delays the turn, then it prefills only what is new
    load = profile.swap_seconds(a1.external_tokens)
    prefill = profile.step_seconds([(recomputed, a1.cached_tokens)], [])
    assert a1.first_token - a1.arrival == pytest.approx(load + prefill)
    assert runs["swap"]["offload_gib"] == DEFAULT_OFFLOAD_GIB


@pytest.mark.engine
def test_the_tier_stacked_beside_nixl_reloads_as_it_does_alone(runs):
    """A replica that also runs vLLM's NIXL connector (it carries moved programs' KV) keeps
    its CPU tier: both connectors in vLLM's MultiConnector, the emulated workers each given
    their share. The reload is the same one, at the same time, as with the tier alone."""
    stacked, alone = runs["stacked"], runs["swap"]
    assert (stacked["connector"], alone["connector"]) == ("MultiConnector", "OffloadingConnector")
    a1, base = stacked["a1"], alone["a1"]
    assert (a1.cached_tokens, a1.external_tokens) == (base.cached_tokens, base.external_tokens)
    assert a1.external_tokens > 0
    assert a1.first_token - a1.arrival == pytest.approx(base.first_token - base.arrival)
    assert stacked["offload_gib"] == DEFAULT_OFFLOAD_GIB


@pytest.mark.engine
def test_sourced_copy_model_times_the_reload_and_prices_it_for_the_policy(runs):
    """--offload-copy-model sourced: the emulated worker's load takes the sourced load time
    (a 64 KiB-page DMA job for the 8B: slower than peak80 by its start-up), and the policy's
    cost model is the same sourced profile."""
    a1, base = runs["sourced"]["a1"], runs["swap"]["a1"]
    sourced = load_profile(PROFILE, offload_copy_model="sourced")
    assert (a1.cached_tokens, a1.external_tokens) == (base.cached_tokens, base.external_tokens)
    load = sourced.load_seconds(a1.external_tokens)
    assert load > load_profile(PROFILE).load_seconds(a1.external_tokens)
    prefill = sourced.step_seconds([(a1.prompt_tokens - a1.cached_tokens,
                                     a1.cached_tokens)], [])
    assert a1.first_token - a1.arrival == pytest.approx(load + prefill)
    assert runs["sourced"]["cost_model"] == ("sourced", load)
    assert runs["swap"]["cost_model"][0] == "peak80"


@pytest.mark.engine
def test_discard_recomputes_what_the_gpu_lost(runs):
    a1 = runs["discard"]["a1"]
    assert a1.external_tokens == 0 and runs["discard"]["offload_gib"] is None
    assert a1.cached_tokens < 100  # B's prompt evicted nearly all of A's blocks
    profile = load_profile(PROFILE)
    recompute = profile.step_seconds([(a1.prompt_tokens - a1.cached_tokens,
                                       a1.cached_tokens)], [])
    assert a1.first_token - a1.arrival == pytest.approx(recompute)
    assert recompute > runs["swap"]["a1"].first_token - runs["swap"]["a1"].arrival


@pytest.mark.engine
def test_declined_reload_recomputes_and_the_policy_is_asked_only_for_a_host_hit(runs):
    declined, discard = runs["declined"]["a1"], runs["discard"]["a1"]
    assert declined.external_tokens == 0
    assert declined.cached_tokens == discard.cached_tokens
    assert declined.first_token - declined.arrival == pytest.approx(
        discard.first_token - discard.arrival)
    assert runs["asked"] == [("a1", "A")]  # not for a0 or b0: nothing of theirs was offloaded


@pytest.mark.engine
def test_write_through_stores_do_not_slow_the_steps(runs):
    for rid in ("a0", "b0"):
        swap, discard = runs["swap"][rid], runs["discard"][rid]
        assert (swap.first_token, swap.finished) == pytest.approx(
            (discard.first_token, discard.finished))


@pytest.mark.engine
def test_identical_runs_give_identical_results(runs):
    assert runs["swap"] == runs["again"]


def test_swap_policy_frees_at_interception_and_orders_by_program():
    policy = make_policy("swap")
    assert policy.needs_offload and not make_policy("discard").needs_offload
    a0 = RequestView("a0", "A", 0.0, prompt_tokens=100)
    policy.on_arrival(a0, 0.0)
    assert not policy.on_finish(a0, 1.0)  # the GPU blocks go back at once
    assert policy.reload_from_cpu(RequestView("a1", "A", 5.0, prompt_tokens=200))
    policy.on_arrival(RequestView("b0", "B", 2.0, prompt_tokens=100), 2.0)
    a1, b1 = RequestView("a1", "A", 5.0, 200), RequestView("b1", "B", 4.0, 200)
    assert policy.queue_key(a1, 6.0) < policy.queue_key(b1, 6.0)


# -- the emulated worker side alone ------------------------------------------------------------
# vLLM is imported in these tests only (seconds of start-up), not when the module is collected
def job(req_id: str, blocks: int, load: bool) -> TransferJob:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import TransferJob
    from vllm.v1.kv_offload.base import GPULoadStoreSpec
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    gpu = GPULoadStoreSpec(list(range(1, blocks + 1)), group_sizes=[blocks], block_indices=[0])
    cpu = CPULoadStoreSpec(list(range(blocks)))
    return TransferJob(req_id, src_spec=cpu, dst_spec=gpu) if load else \
        TransferJob(req_id, src_spec=gpu, dst_spec=cpu)


@pytest.fixture
def worker():
    from server.emulated.offload import EmulatedOffloadWorker  # vLLM: start-up cost

    clock = VirtualClock(10.0)
    previous = use_clock(clock)
    # 1 ms per 16-token block, polling every 0.5 ms when idle
    yield EmulatedOffloadWorker(lambda tokens: tokens / BLOCK * 1e-3, BLOCK, 2,
                                idle_poll_s=0.5e-3), clock
    use_clock(previous)


def idle_until_something_finishes(w: EmulatedOffloadWorker, clock: VirtualClock):
    """Idle engine steps (nothing computed) until the worker reports a finished copy."""
    for polls in range(1, 100):
        clock.sleep(w.idle_seconds())
        out = w.finished()
        if out.kv_connector_worker_meta is not None:
            return out, polls
    raise AssertionError("no copy finished")


def meta(loads=None, stores=None, flush=None) -> OffloadingConnectorMetadata:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingConnectorMetadata,  # vLLM: start-up cost
    )

    return OffloadingConnectorMetadata(load_jobs=loads or {}, store_jobs=stores or {},
                                       jobs_to_flush=flush or set())


@pytest.mark.engine
def test_stores_start_next_step_and_share_the_link_loads_do_not_wait(worker):
    w, clock = worker
    step = meta(stores={1: job("r", 4, load=False), 2: job("s", 2, load=False)})
    w.begin_step(step)
    clock.sleep(0.010)  # the forward
    w.after_forward(step)
    assert not w.finished().kv_connector_worker_meta  # nothing sent yet: deferred
    nxt = meta(loads={3: job("t", 3, load=True)})
    w.begin_step(nxt)  # t = 10.010: stores 1 and 2 go out, back to back
    clock.sleep(0.005)
    w.after_forward(nxt)  # t = 10.015: load 3 starts after the forward, on its own link
    out = w.finished()
    assert out.kv_connector_worker_meta.completed_jobs == {1: 1}  # done at 10.014
    assert out.finished_recving == set() and out.finished_sending == set()
    assert w.idle_seconds() == pytest.approx(0.5e-3)  # store 2 ends at 10.016: a poll first
    out, polls = idle_until_something_finishes(w, clock)
    assert out.kv_connector_worker_meta.completed_jobs == {2: 1} and polls == 2
    assert clock.now() == pytest.approx(10.016)
    out, polls = idle_until_something_finishes(w, clock)  # load 3 ends at 10.018
    assert clock.now() == pytest.approx(10.018) and polls == 4
    assert out.finished_recving == {"t"}
    assert out.kv_connector_worker_meta.transfer_stats.load.bytes == 3 * BLOCK * 2
    assert w.idle_seconds() == 0.0


@pytest.mark.engine
def test_a_flushed_store_is_waited_for_before_the_step(worker):
    w, clock = worker
    step = meta(stores={7: job("r", 5, load=False)}, flush={7})
    w.begin_step(step)  # its blocks are about to be reused: the step starts after the copy
    assert clock.now() == pytest.approx(10.005)
    w.after_forward(step)  # already sent, not deferred again
    assert w.finished().kv_connector_worker_meta.completed_jobs == {7: 1}
    w.begin_step(meta())
    assert w.finished().kv_connector_worker_meta is None


@pytest.mark.engine
def test_loads_and_stores_take_their_own_times():
    """With separate load and store times (the sourced copy model), each link uses its own."""
    from server.emulated.offload import EmulatedOffloadWorker  # vLLM: start-up cost

    clock = VirtualClock(10.0)
    previous = use_clock(clock)
    try:
        w = EmulatedOffloadWorker(lambda tokens: tokens / BLOCK * 1e-3, BLOCK, 2,
                                  idle_poll_s=1.0, load_seconds=lambda tokens: 0.5e-3)
        w.begin_step(meta())
        w.after_forward(meta(loads={1: job("t", 4, load=True)},
                             stores={2: job("r", 4, load=False)}))
        w.begin_step(meta())  # the store goes out now, 4 ms; the load took 0.5 ms
        clock.sleep(0.5e-3)
        out = w.finished()
        assert out.finished_recving == {"t"} and out.kv_connector_worker_meta.completed_jobs \
            == {1: 1}
        clock.sleep(3.5e-3)
        assert w.finished().kv_connector_worker_meta.completed_jobs == {2: 1}
    finally:
        use_clock(previous)


# -- harness serve --------------------------------------------------------------------------
def test_serve_turns_offloading_on_for_policies_that_need_it():
    swap, emulated = PolicySpec.named("swap"), EngineSpec(profile=PROFILE)
    argv = build_command(swap, emulated).argv
    assert argv[argv.index("--kv-offloading-size") + 1] == f"{DEFAULT_OFFLOAD_GIB:g}"
    assert argv[argv.index("--kv-offloading-backend") + 1] == "native"
    options = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert options == {"kv_connector_extra_config": {"offload_prompt_only": False}}
    assert "--kv-offloading-size" not in build_command(PolicySpec.named("discard"),
                                                       emulated).argv
    argv = build_command(PolicySpec.named("vllm"), replace(emulated, offload_gib=8)).argv
    assert argv[argv.index("--kv-offloading-size") + 1] == "8"
    with pytest.raises(ServeError, match="positive"):
        build_command(swap, replace(emulated, offload_gib=0))


def test_serve_stacks_the_tier_beside_a_nixl_connector_in_one_config():
    """vLLM takes one --kv-transfer-config, and its --kv-offloading-size would overwrite the
    connector named there: a replica that carries KV and keeps a CPU tier gets both in one
    MultiConnector config, NIXL first, the engine id on the stack."""
    nixl = kv_transfer_config("r3", "colocated", {})
    extra = ["--kv-transfer-config", json.dumps(nixl), "--max-num-seqs", "64"]
    emulated = EngineSpec(profile=PROFILE)
    argv = build_command(PolicySpec.named("swap"), emulated, extra=extra).argv
    assert "--kv-offloading-size" not in argv and argv.count("--kv-transfer-config") == 1
    assert argv[argv.index("--max-num-seqs") + 1] == "64"  # the other options stay
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert (config["kv_connector"], config["engine_id"]) == ("MultiConnector", "r3")
    first, tier = config["kv_connector_extra_config"]["connectors"]
    assert first == {k: v for k, v in nixl.items() if k != "engine_id"}
    assert tier["kv_connector"] == "OffloadingConnector"
    assert tier["kv_connector_extra_config"] == {
        "offload_prompt_only": False, "cpu_bytes_to_use": int(DEFAULT_OFFLOAD_GIB * 2**30)}
    # without a tier the NIXL config passes through as given
    argv = build_command(PolicySpec.named("vllm"), emulated, extra=extra).argv
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1]) == nixl
    with pytest.raises(ServeError, match="only vLLM's NixlConnector stacks"):
        build_command(PolicySpec.named("swap"), emulated, extra=[
            "--kv-transfer-config", json.dumps({"kv_connector": "LMCacheConnectorV1"})])


def test_serve_passes_the_offload_copy_model_to_the_engine():
    def copy_model(argv: list[str]) -> str:
        config = json.loads(argv[argv.index("--additional-config") + 1])
        return ServeSettings.from_vllm_config(SimpleNamespace(
            additional_config=config)).offload_copy_model

    swap, emulated = PolicySpec.named("swap"), EngineSpec(profile=PROFILE)
    assert copy_model(build_command(swap, emulated).argv) == "peak80"
    assert copy_model(build_command(swap, replace(emulated, offload_copy_model="sourced")
                                    ).argv) == "sourced"
    with pytest.raises(ServeError, match="unknown offload copy model 'fast'"):
        build_command(swap, replace(emulated, offload_copy_model="fast"))
    with pytest.raises(ServeError, match="PCIe Gen5"):
        build_command(swap, EngineSpec(profile="a100-llama-3.1-8b",
                                       offload_copy_model="sourced"))
