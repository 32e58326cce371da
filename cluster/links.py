"""How long moving KV between two replicas takes: an alpha-beta (latency + size/bandwidth) link.

Why a model and not a measurement: the emulated cluster has no wires. AMPD (section 7.1) states
its fabric as NVLink within a server and InfiniBand across servers; the alpha-beta form is the
standard cost model of one point-to-point transfer (Hockney), and it is what AMPD's Eq. 2 uses
for T_kv. Replicas on the same `node` talk over the intra-node link, others over the inter-node
one. Pure Python: the virtual cluster, the emulated KV-transfer worker and the router's cost
estimates all price a transfer here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Link:
    """One direction of a point-to-point link: `latency_s` per transfer, `bandwidth` bytes/s."""

    latency_s: float
    bandwidth: float

    def seconds(self, nbytes: int | float) -> float:
        """Time to move `nbytes` (0 bytes costs nothing: no transfer is made)."""
        if nbytes <= 0:
            return 0.0
        return self.latency_s + float(nbytes) / self.bandwidth


#: AMPD section 7.1: 900 GB/s NVLink within a server, 200 GB/s InfiniBand across servers.
#: Latencies are typical one-way figures for a GPU-direct RDMA read (a few microseconds).
NVLINK = Link(latency_s=5e-6, bandwidth=900e9)
INFINIBAND = Link(latency_s=10e-6, bandwidth=200e9)
