"""Prefill/decode disaggregation glue: the KV-transfer config of a replica and the request
parameters a router passes between the prefill replica P and the decode replica D.

Why here and this small: P/D in vLLM 0.32 is its `NixlConnector` (pull mode). Its scheduler side
runs unchanged inside each replica's engine; its worker side (which would read blocks over
RDMA) is played on the emulated GPU by `server.emulated.nixl`, pricing each read with the link
between the two replicas (`server.perf.hardware.Link`). The served cluster (one `vllm serve` per
replica) and the virtual-time cluster (`sim.loop`, in-process `VirtualEngine`s)
build their replicas' connector config here, and their routers turn one replica's returned
`kv_transfer_params` into the next request's here, so both speak the protocol the same way.

The protocol (vLLM's pull mode; `docs/pd.md` has the full flow):

1. P gets the prompt with `prefill_params()` and `max_tokens=1`. When it finishes, P keeps the
   blocks (a lease of `lease_s`) and returns `kv_transfer_params` naming them.
2. D gets the same prompt with `decode_params(returned)`. It pulls the blocks its own prefix
   cache lacks over the link P -> D, then decodes; when the read is done P is told and frees
   its blocks (or the lease expires).
3. With `bidirectional=True`, D's finished turn is exported in turn (its blocks held for
   `export_ttl_s`) and D returns `kv_transfer_params` too; the program's next prefill on P
   goes out with `prefill_params(exported=those)` and P reads the history it lacks from D.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from server.emulated.nixl_fabric import FABRIC_KEY, LINKS_KEY, send_release
from server.kv_connectors import transfer_args
from server.perf.hardware import Link

#: The vLLM connector (pull mode; `NixlConnector` is vLLM's alias of `NixlPullConnector`).
CONNECTOR = "NixlConnector"
#: Replica role (cluster file) -> vLLM `kv_role`. A colocated replica carries a connector only
#: when its router moves programs with their KV (`carry_kv`): it then sends a program's KV
#: (the old home) or reads it (the new home), as the turn's route says.
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer", "colocated": "kv_both"}
#: vLLM's defaults (`nixl/base_scheduler.py`), restated so a cluster file can show them.
DEFAULT_LEASE_S = 30
DEFAULT_EXPORT_TTL_S = 480
DEFAULT_RECOMPUTE_THRESHOLD = 64
#: How replicas find each other: `zmq` (served: one process per replica, notifications over
#: ZMQ to the side-channel host/port each replica advertises) or `inproc[:NAMESPACE]` (engines
#: of one process, found by engine id within the namespace).
FABRICS = ("zmq", "inproc")


class PDError(ValueError):
    """A P/D hand-off that cannot go ahead; the message says what is wrong."""


def link_spec(link: Link) -> dict[str, float]:
    """A link as JSON (the form `harness_links` holds)."""
    return {"latency_s": float(link.latency_s), "bandwidth": float(link.bandwidth)}


def kv_transfer_config(replica_name: str, role: str, links: Mapping[str, Link], *,
                       bidirectional: bool = False, lease_s: int = DEFAULT_LEASE_S,
                       export_ttl_s: int = DEFAULT_EXPORT_TTL_S,
                       recompute_threshold: int = DEFAULT_RECOMPUTE_THRESHOLD,
                       fabric: str = "zmq") -> dict[str, Any]:
    """The KV-transfer config of one P/D replica, as JSON-able data: give it to `vllm serve
    --kv-transfer-config` (see `serve_args`) or to `VirtualEngine(kv_transfer=...)`.

    `links[peer]` is the link that carries KV *from* replica `peer` *to* `replica_name` (the
    direction `replica_name` reads in: D reads from P; with `bidirectional`, P also reads from
    D). A key `"*"` stands for every peer not named. `lease_s`: how long P holds a finished
    prefill's blocks for D (vLLM's `kv_lease_duration`; D's heartbeats extend it while D
    queues the request). `export_ttl_s`: with `bidirectional`, how long D holds a finished
    turn's blocks for the next prefill (`decoder_kv_blocks_ttl`). `recompute_threshold`: a
    prefill replica reads history from D only if at least this many tokens are missing
    (`kv_recompute_threshold`). The engine id is the replica name.
    """
    if role not in KV_ROLES:
        raise PDError(f"replica {replica_name!r}: role {role!r} has no KV transfer; the "
                      f"roles are {', '.join(KV_ROLES)}")
    kind = fabric.split(":", 1)[0]
    if kind not in FABRICS:
        raise PDError(f"unknown fabric {fabric!r}; use 'zmq' (served) or 'inproc[:NAME]' "
                      "(engines in one process)")
    if lease_s <= 0 or export_ttl_s <= 0:
        raise PDError("lease_s and export_ttl_s must be positive seconds")
    extra: dict[str, Any] = {
        LINKS_KEY: {peer: link_spec(link) for peer, link in links.items()},
        FABRIC_KEY: fabric,
        "kv_lease_duration": int(lease_s),
        "kv_recompute_threshold": int(recompute_threshold),
    }
    if bidirectional:
        extra["bidirectional_kv_xfer"] = True
        extra["decoder_kv_blocks_ttl"] = int(export_ttl_s)
    # A read that cannot be served (an export that expired, a peer that is gone) makes the
    # request recompute its prompt instead of failing (vLLM's default is "fail").
    return {"kv_connector": CONNECTOR, "kv_role": KV_ROLES[role], "engine_id": replica_name,
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra}


def links_to(config: Any, replica_name: str) -> dict[str, Link]:
    """`links` for `kv_transfer_config` from a `cluster.config.ClusterConfig`: for every
    other replica, the link KV takes from it to `replica_name`."""
    return {r.name: config.link(r.name, replica_name) for r in config.replicas
            if r.name != replica_name}


def virtual_engine_options(replica: Any, cluster: Any, *,
                           bidirectional: bool = False) -> dict[str, Any]:
    """Keyword arguments for `server.engine.VirtualEngine` that make a cluster file's prefill
    or decode replica an in-process P/D engine (its peers: the same cluster's engines, found
    in-process within a namespace of their own, so several clusters may live in one
    process)."""
    namespace = f"{cluster.name}@{id(cluster):x}"
    return {"kv_transfer": kv_transfer_config(
        replica.name, replica.role, links_to(cluster, replica.name),
        bidirectional=bidirectional, fabric=f"inproc:{namespace}")}


def serve_args(config: Mapping[str, Any]) -> list[str]:
    """`vllm serve` / `harness serve` arguments for a `kv_transfer_config` result."""
    return transfer_args(config)


def side_channel_env(port: int, host: str = "127.0.0.1") -> dict[str, str]:
    """Environment of a served P/D replica: the host and port it advertises to its peers
    (`remote_host` / `remote_port` in its `kv_transfer_params`), where its emulated worker
    listens for their notifications. Each replica on one machine needs its own port."""
    if not 1 <= int(port) <= 65535:
        raise PDError(f"side-channel port {port} is not a TCP port")
    return {"VLLM_NIXL_SIDE_CHANNEL_HOST": host, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(int(port))}


def prefill_params(exported: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`kv_transfer_params` of a request to a prefill replica (send it with `max_tokens=1`).
    `exported`: what the program's decode replica returned for its previous turn under
    `bidirectional` (or None): P then reads the history its prefix cache lacks from D."""
    if exported and exported.get("remote_block_ids") and exported.get("do_remote_decode"):
        params = dict(exported)
        params["do_remote_decode"] = True
        params["do_remote_prefill"] = False
        return params
    # what vLLM's toy proxy sends (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py)
    return {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}


def decode_params(returned: Mapping[str, Any] | None) -> dict[str, Any]:
    """`kv_transfer_params` of the decode request, from what the prefill replica returned."""
    if not returned:
        raise PDError("the prefill replica returned no kv_transfer_params: it has no P/D "
                      "connector, or the request was aborted; prefill on the decode replica")
    if not returned.get("do_remote_prefill"):
        raise PDError("these kv_transfer_params do not come from a prefill request "
                      f"(do_remote_prefill is {returned.get('do_remote_prefill')!r})")
    missing = [k for k in ("remote_engine_id", "remote_request_id", "remote_block_ids")
               if returned.get(k) is None]
    if missing:
        raise PDError(f"the prefill replica's kv_transfer_params lack {', '.join(missing)}")
    return dict(returned)


def release_export(exported: Mapping[str, Any]) -> bool:
    """Served replicas: tell the replica that exported `exported` (a decode replica under
    `bidirectional`, or a prefill replica whose decode request was never sent) that nobody
    will read its blocks, so it frees them now instead of at its lease's end. Sent over the
    same notification channel a reader uses (`server.emulated.nixl_fabric`). In-process engines:
    `VirtualEngine.release_export`. Returns whether the message went out."""
    return send_release(exported)
