"""P/D disaggregation through vLLM's own NixlConnector (pull mode) on the emulated GPU.

A 1P1D pair of in-process `VirtualEngine`s (each on its own virtual clock) runs a two-turn
program: turn 1 is prefilled on P and D pulls its blocks; turn 2 (turn 1's prompt + D's answer +
new tokens) is prefilled on P again and D pulls only the blocks its prefix cache lacks. With
`bidirectional_kv_xfer`, P first reads the history it lacks from D's export. Bytes and times are
worked out by hand: Llama-3.1-8B stores 2 (K, V) * 32 layers * 8 KV heads * 128 dims * 2 bytes =
131,072 bytes per token, so one 16-token block is 2,097,152 bytes.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import socket
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vLLM is imported (no GPU here)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

if importlib.util.find_spec("vllm") is None:  # not imported here: seconds of start-up
    pytest.skip("could not import 'vllm'", allow_module_level=True)

from cluster import pd  # noqa: E402
from server.clock import RealClock, VirtualClock, use_clock  # noqa: E402
from server.emulated.nixl_fabric import InprocFabric, ZmqFabric  # noqa: E402
from server.engine import Finished, VirtualEngine  # noqa: E402
from server.engine_spec import EngineSpec
from server.perf.hardware import Link  # noqa: E402
from server.perf.registry import load_profile  # noqa: E402
from server.policies.spec import PolicySpec

PROFILE = "h100-llama-3.1-8b"
VLLM = PolicySpec.named("vllm")
BLOCK_BYTES = 16 * 131_072
P_TO_D = Link(latency_s=10e-6, bandwidth=200e9)  # D reads from P over this
D_TO_P = Link(latency_s=20e-6, bandwidth=100e9)  # P reads from D over this (bidirectional)
PROMPT1 = list(range(100, 164))  # 64 tokens: 4 full blocks
ANSWER1 = 80  # D's turn-1 answer, EOS included
NEW2 = list(range(300, 348))  # 48 new tokens in turn 2 (prompt 2: 64 + 80 + 48 = 192)
_namespaces = itertools.count()


def test_block_bytes_by_hand() -> None:
    assert load_profile(PROFILE).kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072


def make_pair(autoclose, bidirectional: bool = False, lease_s: int = 30,
              export_ttl_s: int = 480) -> tuple[VirtualEngine, VirtualEngine]:
    """P and D, closed when the test ends (the `autoclose` fixture)."""
    fabric = f"inproc:test-{next(_namespaces)}"
    options = dict(bidirectional=bidirectional, lease_s=lease_s, export_ttl_s=export_ttl_s,
                   fabric=fabric)
    common = dict(profile=PROFILE, num_gpu_blocks=64, max_model_len=1000)
    p = autoclose(VirtualEngine(VLLM, EngineSpec(**common, kv_transfer=pd.kv_transfer_config(
        "p", "prefill", {"d": D_TO_P}, **options))))
    d = autoclose(VirtualEngine(VLLM, EngineSpec(**common, kv_transfer=pd.kv_transfer_config(
        "d", "decode", {"p": P_TO_D}, **options))))
    return p, d


def drive(*engines: VirtualEngine) -> dict[str, Finished]:
    """Step the busy engine with the earliest clock until none has work (the cluster loop)."""
    done: dict[str, Finished] = {}
    for _ in range(100_000):
        busy = [e for e in engines if e.has_work()]
        if not busy:
            return done
        engine = min(busy, key=lambda e: e.clock.now())
        done.update((f.request_id, f) for f in engine.step())
    raise AssertionError("the engines never went idle")


def prefill(p: VirtualEngine, rid: str, prompt: list[int], at: float,
            exported: dict | None = None) -> Finished:
    p.advance_to(at)
    p.add_request(rid, prompt, output_tokens=1, kv_transfer_params=pd.prefill_params(exported))
    fin = drive(p)[rid]
    assert fin.output_tokens == 1 and fin.kv_transfer_params is not None
    return fin


def decode(p: VirtualEngine, d: VirtualEngine, rid: str, prompt: list[int],
           handed: Finished, output_tokens: int) -> Finished:
    d.advance_to(handed.finished)
    d.add_request(rid, prompt, output_tokens=output_tokens,
                  kv_transfer_params=pd.decode_params(handed.kv_transfer_params))
    return drive(p, d)[rid]


def first_token_after_read(read_done: float, context: int) -> float:
    """D learns the read is done at the end of its idle step (at `read_done`), then computes the
    prompt's last token itself (vLLM recomputes it to sample) in one step."""
    return read_done + load_profile(PROFILE).step_seconds([(1, context)], [])


@pytest.mark.engine
def test_two_turns_pull_only_missing_blocks(autoclose) -> None:
    p, d = make_pair(autoclose)
    # turn 1: P prefills 64 tokens and holds its 4 blocks for D
    fin_p1 = prefill(p, "t1@p", PROMPT1, 0.0)
    params = fin_p1.kv_transfer_params
    assert params["do_remote_prefill"] is True and params["remote_engine_id"] == "p"
    assert len(params["remote_block_ids"][0]) == 4 and params["remote_num_tokens"] == 64
    assert p.held_blocks() == 4
    fin_d1 = decode(p, d, "t1", PROMPT1, fin_p1, ANSWER1)
    (read1,) = d.nixl.transfers
    assert (read1.src, read1.dst, read1.blocks) == ("p", "d", 4)
    assert read1.nbytes == 4 * BLOCK_BYTES == 8_388_608
    assert read1.seconds == pytest.approx(10e-6 + 8_388_608 / 200e9)  # 51.94 us
    assert read1.start == pytest.approx(fin_p1.finished)
    assert fin_d1.first_token == pytest.approx(first_token_after_read(read1.done, 63))
    assert fin_d1.output_tokens == ANSWER1 and fin_d1.finish_reason == "stop"
    assert fin_d1.token_ids[-1] == d._eos() and len(fin_d1.token_ids) == ANSWER1
    assert fin_d1.kv_transfer_params is None  # no export without bidirectional
    # P freed its blocks on D's notification, not at the lease's end
    assert p.held_blocks() == 0 and not p.nixl.holding() and p.nixl.expired_leases == 0

    # turn 2: P hits its own 64 cached tokens and computes 128; D holds the history (its
    # 143 computed tokens = 8 full blocks) and pulls only the last 4 of P's 12 blocks
    prompt2 = PROMPT1 + fin_d1.token_ids + NEW2
    assert len(prompt2) == 192
    fin_p2 = prefill(p, "t2@p", prompt2, fin_d1.finished + 1.0)
    assert fin_p2.cached_tokens == 64
    assert len(fin_p2.kv_transfer_params["remote_block_ids"][0]) == 12
    fin_d2 = decode(p, d, "t2", prompt2, fin_p2, 5)
    read2 = d.nixl.transfers[-1]
    assert read2.blocks == 4 and read2.nbytes == 4 * BLOCK_BYTES
    assert fin_d2.first_token == pytest.approx(first_token_after_read(read2.done, 191))
    assert d.kv_transfer_stats() == (8 * BLOCK_BYTES, pytest.approx(2 * read1.seconds))
    assert p.kv_transfer_stats() == (0, 0.0)
    assert p.held_blocks() == 0 and d.held_blocks() == 0
    assert not p.has_work() and not d.has_work()


@pytest.mark.engine
def test_bidirectional_prefill_reads_history_from_decode(autoclose) -> None:
    p, d = make_pair(autoclose, bidirectional=True)
    fin_p1 = prefill(p, "t1@p", PROMPT1, 0.0)
    fin_d1 = decode(p, d, "t1", PROMPT1, fin_p1, ANSWER1)
    assert d.nixl.transfers[-1].nbytes == 4 * BLOCK_BYTES
    # D exports its finished turn: 143 computed tokens in 9 blocks, held for the next prefill
    exported = fin_d1.kv_transfer_params
    assert exported["do_remote_decode"] is True and exported["remote_engine_id"] == "d"
    assert exported["remote_num_tokens"] == 64 + ANSWER1 - 1
    assert len(exported["remote_block_ids"][0]) == 9
    assert exported["remote_blocks_expiry_time"] == pytest.approx(fin_d1.finished + 480)
    assert d.held_blocks() == 9 and not d.has_work()  # held, but nothing to step for

    # turn 2 on P: its cache has the 64 prompt tokens; the other 79 of D's 143 (5 blocks)
    # come from D over D->P, then P computes the last 49 tokens itself
    prompt2 = PROMPT1 + fin_d1.token_ids + NEW2
    t2 = fin_d1.finished + 1.0
    fin_p2 = prefill(p, "t2@p", prompt2, t2, exported=exported)
    (back,) = p.nixl.transfers
    assert (back.src, back.dst, back.blocks) == ("d", "p", 5)
    assert back.nbytes == 5 * BLOCK_BYTES == 10_485_760
    assert back.seconds == pytest.approx(20e-6 + 10_485_760 / 100e9)
    assert back.start == pytest.approx(t2)
    assert fin_p2.cached_tokens == 64 + 79 and fin_p2.external_tokens == 79
    # P's notification ended D's export (D woke up for it): the blocks are free again
    drive(p, d)
    assert d.held_blocks() == 0 and d.nixl.expired_leases == 0

    # D still has the history cached and pulls only the 4 new blocks from P
    fin_d2 = decode(p, d, "t2", prompt2, fin_p2, 5)
    assert d.nixl.transfers[-1].nbytes == 4 * BLOCK_BYTES
    assert d.kv_transfer_stats()[0] == 8 * BLOCK_BYTES
    assert p.kv_transfer_stats()[0] == 5 * BLOCK_BYTES
    # the program ends: the router releases D's last export instead of waiting 480 s
    d.release_export(fin_d2.kv_transfer_params)
    drive(p, d)
    assert p.held_blocks() == 0 and d.held_blocks() == 0
    assert not p.has_work() and not d.has_work()


@pytest.mark.engine
def test_lease_expires_when_decode_never_reads(autoclose) -> None:
    p, d = make_pair(autoclose, lease_s=2)
    fin = prefill(p, "t1@p", PROMPT1, 0.0)
    assert p.held_blocks() == 4 and not p.has_work()
    assert p.next_wakeup() == pytest.approx(fin.finished + 2)
    p.advance_to(fin.finished + 1.0)
    assert p.held_blocks() == 4
    p.advance_to(fin.finished + 5.0)  # reaped at the deadline on the way
    assert p.held_blocks() == 0 and p.nixl.expired_leases == 1
    assert p.clock.now() == pytest.approx(fin.finished + 5.0)


@pytest.mark.engine
def test_expired_export_is_declined_and_prefill_recomputes(autoclose) -> None:
    # D exports for 6 s; the next prefill comes 2 s later, inside vLLM's 5 s safety margin
    p, d = make_pair(autoclose, bidirectional=True, export_ttl_s=6)
    fin_p1 = prefill(p, "t1@p", PROMPT1, 0.0)
    fin_d1 = decode(p, d, "t1", PROMPT1, fin_p1, ANSWER1)
    prompt2 = PROMPT1 + fin_d1.token_ids + NEW2
    fin_p2 = prefill(p, "t2@p", prompt2, fin_d1.finished + 2.0,
                     exported=fin_d1.kv_transfer_params)
    assert p.nixl.declined_reads == 1 and not p.nixl.transfers
    assert fin_p2.output_tokens == 1
    assert d.held_blocks() == 9  # nobody read it: held until its TTL
    d.advance_to(fin_d1.finished + 7.0)
    assert d.held_blocks() == 0 and d.nixl.expired_leases == 1


@pytest.mark.engine
def test_prefill_blocked_by_its_own_leases_lets_time_pass(autoclose) -> None:
    """P's cache is full of a lease; a second prompt waits on P. P's idle steps must let time
    pass (not spin at one instant), so the decode replica, whose clock is ahead, gets its turn,
    reads, and the freed blocks admit the waiting prompt."""
    fabric = f"inproc:test-{next(_namespaces)}"
    common = dict(profile=PROFILE, num_gpu_blocks=20, max_model_len=300)
    p = autoclose(VirtualEngine(VLLM, EngineSpec(**common, kv_transfer=pd.kv_transfer_config(
        "p", "prefill", {"d": D_TO_P}, fabric=fabric))))
    d = autoclose(VirtualEngine(VLLM, EngineSpec(**common, kv_transfer=pd.kv_transfer_config(
        "d", "decode", {"p": P_TO_D}, fabric=fabric))))
    a, b = list(range(1000, 1200)), list(range(2000, 2200))  # 13 blocks each, 19 in all
    fin_a = prefill(p, "a@p", a, 0.0)
    p.add_request("b@p", b, output_tokens=1, kv_transfer_params=pd.prefill_params())
    d.advance_to(fin_a.finished + 0.05)  # D is busy elsewhere until then
    d.add_request("a", a, output_tokens=3,
                  kv_transfer_params=pd.decode_params(fin_a.kv_transfer_params))
    done = drive(p, d)
    assert {"a", "b@p"} <= set(done)
    (read,) = d.nixl.transfers
    assert read.start == pytest.approx(fin_a.finished + 0.05)
    assert done["b@p"].first_token > read.done  # admitted once P had its blocks back
    p.advance_to(done["b@p"].finished + 31)  # b's lease (nobody reads it) ends
    assert p.held_blocks() == 0 and d.held_blocks() == 0


def test_params_helpers() -> None:
    assert pd.prefill_params()["do_remote_decode"] is True
    with pytest.raises(pd.PDError, match="returned no kv_transfer_params"):
        pd.decode_params(None)
    with pytest.raises(pd.PDError, match="do_remote_prefill"):
        pd.decode_params({"do_remote_decode": True, "remote_block_ids": [[1]]})
    config = pd.kv_transfer_config("p0", "prefill", {"d0": P_TO_D, "*": D_TO_P})
    assert config["engine_id"] == "p0" and config["kv_role"] == "kv_producer"
    extra = config["kv_connector_extra_config"]
    assert extra["harness_links"]["d0"] == {"latency_s": 10e-6, "bandwidth": 200e9}
    assert extra["harness_fabric"] == "zmq" and "bidirectional_kv_xfer" not in extra
    assert pd.serve_args(config)[0] == "--kv-transfer-config"
    # a colocated replica both sends and reads (a router that carries moved programs' KV)
    assert pd.kv_transfer_config("c", "colocated", {})["kv_role"] == "kv_both"
    with pytest.raises(pd.PDError, match="role"):
        pd.kv_transfer_config("c", "router", {})
    assert pd.side_channel_env(5701) == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                                         "VLLM_NIXL_SIDE_CHANNEL_PORT": "5701"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.engine
def test_zmq_fabric_notifies_across_processes_way() -> None:
    """Served replicas: D's worker tells P's over ZMQ (P's advertised side-channel address)
    that its read is done, and P reports the request in `finished_sending` (real clock)."""
    # vLLM's NIXL metadata and the emulated worker load vLLM (~6 s): imported by the two tests
    # that drive the worker, so collecting this file for the fast loop does not pay it
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
        NixlConnectorMetadata,
        RemoteMeta,
        ReqMeta,
    )

    from server.emulated.nixl import EmulatedNixlWorker

    previous = use_clock(RealClock())
    p_port, d_port = _free_port(), _free_port()
    workers = []
    try:
        def worker(name: str, port: int) -> EmulatedNixlWorker:
            w = EmulatedNixlWorker(name, block_size=16, kv_bytes_per_token=131_072,
                                   links={"*": P_TO_D}, fabric=ZmqFabric("127.0.0.1", port),
                                   lease_extension_s=20, bidirectional=False, idle_poll_s=0.001)
            workers.append(w)
            return w

        p, d = worker("p", p_port), worker("d", d_port)
        now = time.time()
        meta_p = NixlConnectorMetadata()
        meta_p.reqs_in_batch = {"r@p"}
        meta_p.reqs_to_send = {"r@p": now + 30}
        meta_p.scheduler_clock = now
        p.begin_step(meta_p)
        assert p.holding() == {"r@p"} and not p.finish_step().finished_sending

        meta_d = NixlConnectorMetadata()
        meta_d.reqs_to_recv["r"] = ReqMeta(
            local_block_ids=([7, 8],), local_physical_block_ids=([7, 8],), tp_size=1,
            awaiting_kvs=True,
            remote=RemoteMeta(block_ids=([1, 2, 3],), host="127.0.0.1", port=p_port,
                              engine_id="p", request_id="r@p"))
        d.begin_step(meta_d)
        (read,) = d._reads.values()
        assert read.transfer.blocks == 2 and read.transfer.nbytes == 2 * BLOCK_BYTES
        time.sleep(read.transfer.seconds + 0.01)
        assert d.finish_step().finished_recving == {"r"}
        for _ in range(200):  # ZMQ delivers asynchronously
            sent = p.finish_step().finished_sending
            if sent:
                break
            time.sleep(0.01)
        assert sent == {"r@p"} and not p.holding()

        # a router's release reaches an exporting engine the same way
        meta_p2 = NixlConnectorMetadata()
        meta_p2.reqs_in_batch = {"x@p"}
        meta_p2.reqs_to_send = {"x@p": time.time() + 30}
        p.begin_step(meta_p2)
        assert pd.release_export({"remote_request_id": "x@p", "remote_host": "127.0.0.1",
                                  "remote_port": p_port})
        for _ in range(200):
            sent = p.finish_step().finished_sending
            if sent:
                break
            time.sleep(0.01)
        assert sent == {"x@p"}
    finally:
        for w in workers:
            w.close()
        use_clock(previous)


@pytest.mark.engine
def test_heartbeat_extends_the_lease_in_virtual_time() -> None:
    """D's heartbeat for a request it still queues ("HB:" in NIXL) extends P's lease to
    now + 2/3 of kv_lease_duration."""
    # vLLM's NIXL metadata and the emulated worker load vLLM (~6 s): imported by the two tests
    # that drive the worker, so collecting this file for the fast loop does not pay it
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
        HeartbeatInfo,
        NixlConnectorMetadata,
    )

    from server.emulated.nixl import EmulatedNixlWorker

    namespace = f"hb-{next(_namespaces)}"
    the_clock = VirtualClock()
    previous = use_clock(the_clock)
    workers = [EmulatedNixlWorker(name, block_size=16, kv_bytes_per_token=131_072, links={},
                                  fabric=InprocFabric(namespace, name), lease_extension_s=20,
                                  bidirectional=False, idle_poll_s=0.001)
               for name in ("p", "d")]
    p, d = workers
    try:
        meta = NixlConnectorMetadata()
        meta.reqs_in_batch = {"r@p"}
        meta.reqs_to_send = {"r@p": 30.0}
        meta.scheduler_clock = 0.0
        p.begin_step(meta)
        assert p.next_deadline() == 30.0
        the_clock.advance_to(25.0)
        hb = NixlConnectorMetadata()
        hb.heartbeat_by_engine = {"p": HeartbeatInfo(req_ids={"r@p"}, host="h", port=1,
                                                     tp_size=1)}
        d.begin_step(hb)
        assert p.busy()  # the heartbeat waits in P's mailbox
        assert not p.finish_step().finished_sending
        assert p.next_deadline() == 45.0
        the_clock.advance_to(45.0)
        assert p.finish_step().finished_sending == {"r@p"} and p.expired_leases == 1
    finally:
        for w in workers:
            w.close()
        use_clock(previous)
