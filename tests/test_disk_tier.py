"""The disk KV tier behind the host tier (issue 41), through vLLM's tiering layer: its connector
config (and none of it without a disk tier), the NVMe pricing, the emulated file-system tier's
timing on a virtual clock, and a virtual-time replay whose host tier is too small, so blocks
spill to disk and come back as prefix hits. The real CPU engine writing and reading real block
files: tests/test_disk_tier_cpu.py."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vLLM is imported (no GPU here)

import pytest  # noqa: E402

from common.trace import Program, Trace, Turn  # noqa: E402
from eval.bench.rows import tier_columns  # noqa: E402
from server.engine_spec import EngineSpec, default_disk_path  # noqa: E402
from server.kv_connectors import (  # noqa: E402
    DISK_BYTES_KEY,
    DiskTier,
    disk_tier_bytes,
    has_disk_tier,
    offload_options,
    offloading_config,
    stacked,
)
from server.launch import build_command  # noqa: E402
from server.perf.copy_model import disk_seconds  # noqa: E402
from server.perf.hardware import NVME_GEN4  # noqa: E402
from server.policies.spec import PolicySpec  # noqa: E402
from server.settings import DEFAULT_OFFLOAD_GIB, ServeOptionsError  # noqa: E402

GiB = 1 << 30
DISK = DiskTier(8.0, "/data/kv")
#: one 16-token block of Llama-3.1-8B's KV (32 layers x 8 KV heads x 128 x 2 x bf16)
BLOCK_BYTES = 16 * 32 * 8 * 128 * 2 * 2


def _config(extra: dict) -> SimpleNamespace:
    return SimpleNamespace(kv_connector="OffloadingConnector", kv_connector_extra_config=extra)


# -- the connector config -------------------------------------------------------------------
def test_without_a_disk_tier_the_config_is_the_host_tiers_key_for_key():
    assert offload_options() == {"offload_prompt_only": False}
    assert offloading_config(4.0) == {
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"offload_prompt_only": False, "cpu_bytes_to_use": 4 * GiB}}
    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "engine_id": "e"}
    assert stacked(nixl, 4.0) == {
        "kv_connector": "MultiConnector", "kv_role": "kv_both", "engine_id": "e",
        "kv_connector_extra_config": {"connectors": [
            {"kv_connector": "NixlConnector", "kv_role": "kv_both"}, offloading_config(4.0)]}}
    assert not has_disk_tier(_config(offloading_config(4.0)["kv_connector_extra_config"]))
    assert not has_disk_tier(None)


def test_a_disk_tier_is_vllms_tiering_spec_with_the_fs_tier_behind_the_cpu_tier():
    extra = offloading_config(4.0, DISK)["kv_connector_extra_config"]
    assert extra == {"offload_prompt_only": False, "spec_name": "TieringOffloadingSpec",
                     DISK_BYTES_KEY: 8 * GiB,
                     "secondary_tiers": [{"type": "fs", "root_dir": "/data/kv"}],
                     "cpu_bytes_to_use": 4 * GiB}
    assert has_disk_tier(_config(extra)) and disk_tier_bytes(_config(extra)) == 8 * GiB
    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert stacked(nixl, 4.0, DISK)["kv_connector_extra_config"]["connectors"][1] == \
        offloading_config(4.0, DISK)


def test_the_engine_spec_gives_a_disk_tier_only_behind_a_host_tier():
    swap, vllm = PolicySpec.named("swap"), PolicySpec.named("vllm")
    assert EngineSpec().disk_tier(swap) is None
    assert EngineSpec(disk_gib=100).disk_tier(swap) == DiskTier(100.0, default_disk_path())
    assert EngineSpec(disk_gib=100).disk_tier(vllm) is None  # no host tier, no disk tier
    assert EngineSpec(disk_gib=1, offload_gib=2, disk_path="/d").disk_tier(vllm) == \
        DiskTier(1.0, "/d")
    with pytest.raises(ServeOptionsError, match="--disk-gib 0"):
        EngineSpec(disk_gib=0).disk_tier(swap)
    assert default_disk_path().rsplit("/", 1)[-1].startswith("harness-kv-disk-")


def test_serve_carries_the_disk_tier_in_vllms_connector_options():
    swap = PolicySpec.named("swap")
    argv = build_command(swap, EngineSpec(profile="h100-llama-3.1-8b", disk_gib=50,
                                          disk_path="/data/kv")).argv
    assert argv[argv.index("--kv-offloading-size") + 1] == f"{DEFAULT_OFFLOAD_GIB:g}"
    options = argv[argv.index("--kv-transfer-config") + 1]
    assert '"secondary_tiers": [{"type": "fs", "root_dir": "/data/kv"}]' in options
    plain = build_command(swap, EngineSpec(profile="h100-llama-3.1-8b")).argv
    assert plain[plain.index("--kv-transfer-config") + 1] == \
        '{"kv_connector_extra_config": {"offload_prompt_only": false}}'


def test_serve_refuses_a_disk_tier_it_would_not_get(capsys):
    from cli.main import main

    for args, message in ((["--disk-gib", "10"], "runs without one"),
                          (["--disk-gib", "-1", "--policy", "swap"], "--disk-gib -1"),
                          (["--disk-path", "/tmp/x", "--policy", "swap"], "give --disk-gib")):
        assert main(["serve", *args]) == 2
        assert message in capsys.readouterr().err


# -- pricing --------------------------------------------------------------------------------
def test_a_disk_job_is_one_io_per_block_back_to_back_at_the_drives_rates():
    assert NVME_GEN4.read_bandwidth == 6.8e9 and NVME_GEN4.write_bandwidth == 5.6e9
    read = disk_seconds(10, BLOCK_BYTES, NVME_GEN4, read=True)
    assert read == pytest.approx(10 * (70e-6 + BLOCK_BYTES / 6.8e9))
    write = disk_seconds(10, BLOCK_BYTES, NVME_GEN4, read=False)
    assert write == pytest.approx(10 * (100e-6 + BLOCK_BYTES / 5.6e9))
    assert disk_seconds(0, BLOCK_BYTES, NVME_GEN4, read=True) == 0.0
    # a 100k-token context of Llama-3.1-8B (12.2 GiB) comes back from disk in about 2 s
    blocks = 100_000 // 16
    assert 1.8 < disk_seconds(blocks, BLOCK_BYTES, NVME_GEN4, read=True) < 2.5


def test_the_report_gets_tier_columns_only_with_a_disk_tier():
    assert tier_columns({}) == {}
    columns = tier_columns({"host": {"stored_blocks": 3}, "disk": {"loaded_bytes": 5}})
    assert columns == {"host_stored_blocks": 3, "disk_loaded_bytes": 5}


# -- the emulated file-system tier ----------------------------------------------------------
class _Job(SimpleNamespace):
    pass


@pytest.fixture()
def tier():
    """An emulated disk tier on a virtual clock, 4 blocks of Llama-3.1-8B's KV at most."""
    from server.clock import VirtualClock, use_clock
    from server.emulated.disk import EmulatedDisk, EmulatedDiskTier, _ShapeOnly

    clock = VirtualClock()
    previous = use_clock(clock)
    disk = EmulatedDisk(NVME_GEN4)
    made = EmulatedDiskTier(SimpleNamespace(), _ShapeOnly(64, BLOCK_BYTES), "fs", disk=disk,
                            capacity_blocks=4)
    yield SimpleNamespace(tier=made, disk=disk, clock=clock)
    use_clock(previous)


def _store(tier, job_id: int, keys: list[bytes]) -> None:
    tier.submit_store(_Job(job_id=job_id, keys=keys))


def _finished(tier) -> list[int]:
    return [r.job_id for r in tier.get_finished_jobs()]


@pytest.mark.engine
def test_a_load_of_n_blocks_ends_after_the_modelled_time_on_the_virtual_clock(tier):
    from vllm.v1.kv_offload.base import LookupResult

    t, clock = tier.tier, tier.clock
    _store(t, 0, [b"a", b"b", b"c"])
    assert t.lookup(b"a", None) is LookupResult.MISS  # not on disk until the write ends
    write = disk_seconds(3, BLOCK_BYTES, NVME_GEN4, read=False)
    clock.advance_to(write * 0.99)
    assert _finished(t) == [] and t.has_pending_work()
    clock.advance_to(write)
    assert _finished(t) == [0] and not t.has_pending_work()
    assert t.lookup(b"a", None) is LookupResult.HIT
    start = clock.now()
    t.submit_load(_Job(job_id=1, keys=[b"a", b"b", b"c"]))
    t.submit_load(_Job(job_id=2, keys=[b"a"]))  # queued behind the first on the drive
    read3 = disk_seconds(3, BLOCK_BYTES, NVME_GEN4, read=True)
    read1 = disk_seconds(1, BLOCK_BYTES, NVME_GEN4, read=True)
    assert tier.disk.idle_seconds() == pytest.approx(read3)
    clock.advance_to(start + read3)
    [result] = t.get_finished_jobs()
    assert (result.job_id, result.success, result.transfer_bytes) == (1, True, 3 * BLOCK_BYTES)
    assert result.transfer_time == pytest.approx(read3)
    t.drain_jobs()  # the clock runs to the end of what is in flight
    assert clock.now() == pytest.approx(start + read3 + read1) and _finished(t) == [2]
    traffic = tier.disk.traffic
    assert (traffic.stored_blocks, traffic.loaded_blocks, traffic.loaded_bytes) == \
        (3, 4, 4 * BLOCK_BYTES)


@pytest.mark.engine
def test_stores_do_not_hold_up_loads_and_past_its_size_the_tier_drops_the_oldest(tier):
    from vllm.v1.kv_offload.base import LookupResult

    t, clock = tier.tier, tier.clock
    _store(t, 0, [b"a", b"b"])
    clock.advance_to(1.0)
    assert _finished(t) == [0]
    _store(t, 1, [b"c", b"d", b"e"])  # a long write ...
    t.submit_load(_Job(job_id=2, keys=[b"a"]))  # ... and a read beside it
    clock.advance_to(1.0 + disk_seconds(1, BLOCK_BYTES, NVME_GEN4, read=True))
    assert _finished(t) == [2]
    t.touch([b"a"], None)  # a was read: b is the least recently used now
    clock.advance_to(2.0)
    assert _finished(t) == [1]
    assert t.lookup(b"b", None) is LookupResult.MISS and t.lookup(b"a", None) is LookupResult.HIT
    assert tier.disk.traffic.dropped_blocks == 1  # 5 blocks on a 4-block disk
    stored = tier.disk.traffic.stored_blocks
    _store(t, 3, [b"a", b"e"])  # already on disk: nothing written, done at once
    assert _finished(t) == [3] and tier.disk.traffic.stored_blocks == stored


@pytest.mark.engine
def test_the_emulated_gpu_points_a_tiering_config_at_its_own_spec():
    from server.emulated.disk import EMULATED_SPEC, emulate_disk_tier, forget_disk

    host_only = _config(offloading_config(4.0)["kv_connector_extra_config"])
    host_only.engine_id = "e0"
    assert emulate_disk_tier(host_only) is None
    assert "spec_name" not in host_only.kv_connector_extra_config
    extra = offloading_config(4.0, DISK)["kv_connector_extra_config"]
    multi = SimpleNamespace(kv_connector="MultiConnector", engine_id="e1",
                            kv_connector_extra_config={"connectors": [
                                {"kv_connector": "NixlConnector"},
                                {"kv_connector": "OffloadingConnector",
                                 "kv_connector_extra_config": extra}]})
    assert emulate_disk_tier(multi) is not None
    assert extra["spec_name"] == EMULATED_SPEC
    assert extra["spec_module_path"] == "server.emulated.disk"
    assert has_disk_tier(_config(extra))  # still a disk tier to whoever asks
    forget_disk(multi)


# -- a replay that spills to disk -----------------------------------------------------------
def _spilling_trace() -> Trace:
    """Six programs of 1,500-token contexts whose tool calls outlast the GPU cache's memory of
    them (3,200 tokens: two contexts), then one more turn each."""
    return Trace(name="spill", programs=[Program(id=f"p{i}", arrival_s=0.2 * i, turns=[
        Turn(input_tokens=1500, output_tokens=20, tool="bash", tool_seconds=3.0,
             tool_return_tokens=30),
        Turn(input_tokens=10, output_tokens=5)]) for i in range(6)])


@pytest.mark.engine
@pytest.mark.slow
def test_blocks_spill_to_disk_and_come_back_as_prefix_hits(autoclose):
    from server.engine import VirtualEngine
    from sim.replay import replay

    def run(disk_gib: float | None):
        spec = EngineSpec(profile="h100-llama-3.1-8b", num_gpu_blocks=200, max_model_len=2048,
                          offload_gib=0.25, disk_gib=disk_gib)  # host: 128 blocks, < 1 context
        engine = autoclose(VirtualEngine(PolicySpec.parse("vllm+offload"), spec))
        result = replay(_spilling_trace(), engine)
        turns = [t for p in result.programs.values() for t in p.turns if t.turn == 1]
        return result, turns

    host_only, host_turns = run(None)
    with_disk, disk_turns = run(4.0)
    assert host_only.tier_traffic == {}  # no disk tier: the report is as before
    recomputed = [sum(t.recomputed_tokens for t in turns) for turns in (host_turns, disk_turns)]
    reloaded = [sum(t.reloaded_tokens for t in turns) for turns in (host_turns, disk_turns)]
    assert recomputed[1] < recomputed[0] and reloaded[1] > reloaded[0]
    disk = with_disk.tier_traffic["disk"]
    assert disk["stored_blocks"] > 0 and disk["loaded_blocks"] > 0
    # what came back from disk went on to the GPU through the host tier
    assert with_disk.tier_traffic["host"]["loaded_blocks"] >= disk["loaded_blocks"]
    assert math.isclose(disk["loaded_bytes"], disk["loaded_blocks"] * BLOCK_BYTES)


# -- the CPU engine's worker side -----------------------------------------------------------
@pytest.mark.engine
def test_the_cpu_engines_worker_side_copies_blocks_to_the_host_tier_and_back():
    import torch
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
        GPULoadStoreSpec,
    )
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    from server.cpu.offload import HostCopyWorker, HostTieringSpec
    from server.kv_connectors import CPU_ENGINE_SPEC

    assert CPU_ENGINE_SPEC == {"spec_name": HostTieringSpec.__name__,
                               "spec_module_path": HostTieringSpec.__module__}
    layers = [torch.randn(6, 2, 8, dtype=torch.bfloat16) for _ in range(2)]  # 6 blocks each
    page = 2 * 8 * 2
    region = SimpleNamespace(create_next_worker_view=lambda size: torch.zeros(4, size,
                                                                             dtype=torch.int8),
                             mmap_path="/dev/shm/no-such-buffer", cleanup=lambda: None)
    worker = HostCopyWorker(CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(t, page) for t in layers],
        group_data_refs=[[CanonicalKVCacheRef(0, page), CanonicalKVCacheRef(1, page)]]), region)
    kept = [t[[1, 4]].clone() for t in layers]
    assert worker.submit_store(7, GPULoadStoreSpec([1, 4], [2], [0]), CPULoadStoreSpec([3, 0]))
    for t in layers:
        t.zero_()
    assert worker.submit_load(8, CPULoadStoreSpec([3, 0]), GPULoadStoreSpec([5, 2], [2], [0]))
    assert [(r.job_id, r.success, r.transfer_size) for r in worker.get_finished()] == \
        [(7, True, 2 * 2 * page), (8, True, 2 * 2 * page)]
    for t, before in zip(layers, kept, strict=True):
        assert torch.equal(t[[5, 2]], before) and not t[[0, 1, 3, 4]].any()
    assert worker.get_finished() == []


@pytest.mark.engine
@pytest.mark.slow
def test_a_turn_waits_out_a_long_disk_read_and_gets_its_context(autoclose, monkeypatch):
    """A read of 12 s: 12,000 idle engine steps of 1 ms while the only turn waits for its
    blocks, which is no stall (the clock moves); the turn then finds its context loaded."""
    from server import engine as engine_module
    from server.emulated import disk as disk_module
    from server.engine import VirtualEngine

    monkeypatch.setattr(disk_module, "disk_seconds",
                        lambda blocks, size, storage, *, read: 12.0 if read else 1e-3)
    monkeypatch.setattr(engine_module, "NO_PROGRESS_STEPS", 2_000)  # far fewer than 12,000
    spec = EngineSpec(profile="h100-llama-3.1-8b", num_gpu_blocks=64, max_model_len=1000,
                      offload_gib=0.05, disk_gib=1.0)  # host tier: 25 blocks
    engine = autoclose(VirtualEngine(PolicySpec.parse("vllm+offload"), spec))
    prompts = [list(range(1000 + 300 * i, 1200 + 300 * i)) for i in range(6)]  # 13 blocks each

    def answer(request_id: str, prompt: list[int]):
        engine.add_request(request_id, prompt, output_tokens=4)
        done = []
        while engine.has_work():
            done += engine.step()
        return done[0]

    for i, prompt in enumerate(prompts):  # the first one's blocks end up on disk only
        answer(f"a{i}", prompt)
    again = answer("b0", prompts[0])
    assert again.cached_tokens == 192 and again.external_tokens >= 128  # most from disk
    assert again.first_token - again.arrival > 12.0


def test_the_bench_refuses_a_disk_tier_it_cannot_give():
    from eval.bench.specs import BenchError, check_engine

    check_engine(EngineSpec(disk_gib=100))
    with pytest.raises(BenchError, match="--disk-gib -1"):
        check_engine(EngineSpec(disk_gib=-1))
    with pytest.raises(BenchError, match="--url"):
        check_engine(EngineSpec(disk_gib=100), http=True)
    with pytest.raises(BenchError, match="--disk-gib: the cluster file"):
        check_engine(EngineSpec(disk_gib=100), cluster=True)
