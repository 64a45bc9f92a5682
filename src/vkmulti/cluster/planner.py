"""Two-level placement over a Ray cluster, with the cost model of assign_srus.

Level 1 (driver): SRUs go to nodes with `assign_srus`, each node weighted by
its measured render throughput (cost units per second: an SRU of cost c
takes c / throughput seconds there) and the network link to the driver as
the transfer cost (seconds to move the SRU's image: bytes / that node's
bandwidth, assign_srus' `link_costs`; the per-object latency is paid once per
node, as all its images travel as one object). Node 0 of that problem is the
driver's own node when it runs an agent (its images reach the compositor
through shared memory, no transfer); otherwise the best-connected node, and
the transfer cost is what the slower links add. Level 2 (each agent): its share goes to its GPUs with
`assign_srus` again, weighted by each GPU's throughput.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from .._core.reprs import compact_repr
from ..offload.partition import assign_srus
from ..offload.render import ReferenceSRU
from .._core.checks import short_repr

if TYPE_CHECKING:
    from ..offload.types import SruId

__all__ = ["NodeInfo", "LinkInfo", "NodePlan", "plan_nodes", "sru_image_bytes", "composite_frame",
           "check_srus", "node_order", "IMAGE_BYTES_PER_PIXEL"]

#: SRU images are RGBA16F: 8 bytes per pixel.
IMAGE_BYTES_PER_PIXEL = 8


@dataclass(frozen=True)
class LinkInfo:
    """A measured one-way link through Ray's object store: time(n bytes) = latency + n / bandwidth."""

    __repr__ = compact_repr

    source: str                    # node id
    destination: str               # node id, or "driver"
    bandwidth: float               # bytes per second (math.inf: same node, shared memory)
    latency: float                 # seconds per object

    def seconds(self, nbytes: float) -> float:
        """Predicted time to move one object of `nbytes` over this link."""
        return self.latency + (0.0 if math.isinf(self.bandwidth) else nbytes / self.bandwidth)

    def to_dict(self) -> dict[str, Any]:
        """The link as plain JSON-ready data (GB/s and ms)."""
        return {"source": self.source, "destination": self.destination,
                "bandwidth_gbps": None if math.isinf(self.bandwidth) else self.bandwidth / 1e9,
                "latency_ms": self.latency * 1e3}


@dataclass(frozen=True)
class NodeInfo:
    """What the driver knows of one node's agent."""

    __repr__ = compact_repr

    node_id: str
    address: str
    hostname: str
    devices: tuple[str, ...]                 # GPU names, agent slot order
    gpu_throughput: tuple[float, ...]        # cost units per second per GPU (measured; 1.0 each if not)
    local: bool = False                      # runs on the driver's node
    topology: dict[str, Any] | None = None             # vkmulti.kernels' measured topology, when available

    @property
    def throughput(self) -> float:
        """The node's render throughput: the sum over its GPUs."""
        return float(sum(self.gpu_throughput))

    @property
    def label(self) -> str:
        """'node ID8 (address)', for messages."""
        return f"node {self.node_id[:8]} ({self.address})"

    def gpu_links(self) -> list[dict[str, Any]]:
        """The measured links between this node's GPUs (from its topology; [] without one)."""
        if not self.topology:
            return []
        return [{k: c.get(k) for k in ("source", "destination", "method", "bandwidth_gbps", "latency_us")}
                for c in self.topology.get("connections", ()) if c.get("source") != c.get("destination")]

    def to_dict(self) -> dict[str, Any]:
        """The node as plain JSON-ready data."""
        return {"node_id": self.node_id, "address": self.address, "hostname": self.hostname,
                "devices": list(self.devices), "gpu_throughput": list(self.gpu_throughput),
                "throughput": self.throughput, "local": self.local,
                "topology": self.topology is not None, "gpu_links": self.gpu_links()}


@dataclass
class NodePlan:
    """Which SRUs each node renders this round, and the model's predicted finish time per node."""

    __repr__ = compact_repr

    srus: dict[str, list[ReferenceSRU]] = field(default_factory=dict)      # node id -> SRUs, input order
    predicted: dict[str, float] = field(default_factory=dict)     # node id -> seconds

    def sru_ids(self) -> dict[str, list[SruId]]:
        """The SRU ids planned on each node."""
        return {n: [s.sru_id for s in v] for n, v in self.srus.items()}


def sru_image_bytes(sru: ReferenceSRU) -> int:
    """Bytes of the SRU's RGBA16F image (what travels back to the driver)."""
    return int(sru.width) * int(sru.height) * IMAGE_BYTES_PER_PIXEL


def check_srus(srus: Iterable[ReferenceSRU]) -> list[ReferenceSRU]:
    """A list of ReferenceSRUs with distinct ids, or TypeError/ValueError naming the offender."""
    out = list(srus)
    seen: set = set()
    for s in out:
        if not isinstance(s, ReferenceSRU):
            raise TypeError(f"cluster SRUs must be vkmulti.ReferenceSRU (the agents render them with "
                            f"ReferenceRenderer), got {type(s).__name__}")
        if s.sru_id in seen:
            raise ValueError(f"duplicate sru_id {short_repr(s.sru_id)}")
        seen.add(s.sru_id)
    kinds = {type(s.sru_id) for s in out}
    if len(kinds) > 1:
        raise TypeError("sru_ids must be all ints or all strs")
    return out


def node_order(nodes: Sequence[NodeInfo], links: dict[str, LinkInfo]) -> list[NodeInfo]:
    """Node 0 first: the driver's node if it has an agent, else the best-connected one."""
    def link_time(n: NodeInfo) -> float:
        ln = links.get(n.node_id)
        return 0.0 if n.local else (ln.seconds(2**20) if ln is not None else math.inf)
    return sorted(nodes, key=lambda n: (not n.local, link_time(n), -n.throughput, n.node_id))


def plan_nodes(srus: Sequence[ReferenceSRU], nodes: Sequence[NodeInfo], links: dict[str, LinkInfo]) -> NodePlan:
    """Assign every SRU a node (level 1 of the placement); see the module docstring for the model."""
    if not nodes:
        raise ValueError("no node to plan on")
    srus = list(srus)
    order = node_order(nodes, links)
    weights = []
    for n in order:
        if not (math.isfinite(n.throughput) and n.throughput > 0):
            raise ValueError(f"{n.label}: throughput must be a finite number > 0, got {short_repr(n.throughput)}")
        weights.append(n.throughput)

    def link(n: NodeInfo) -> LinkInfo:
        if n.local:
            return LinkInfo(n.node_id, "driver", math.inf, 0.0)
        ln = links.get(n.node_id)
        if ln is None:
            raise ValueError(f"{n.label}: no measured link to the driver")
        return ln
    # transfer cost of SRU i on node d = its image bytes x node d's seconds per byte (less node 0's,
    # which every plan pays alike). A node's images travel as one object, so the per-object
    # latency is paid once per node and round, not per SRU: it is in `predicted`, not in the balance.
    per_byte = [0.0 if math.isinf(link(n).bandwidth) else 1.0 / link(n).bandwidth for n in order]
    link_costs = [max(p - per_byte[0], 0.0) for p in per_byte]
    assigned = assign_srus(srus, len(order), cost=lambda s: s.render_cost, weights=weights,
                           transfer_cost=lambda s: float(sru_image_bytes(s)), link_costs=link_costs)
    plan = NodePlan({n.node_id: [] for n in order}, {n.node_id: 0.0 for n in order})
    for s, a in zip(srus, assigned):
        k = a.device_index
        n = order[k]
        if not plan.srus[n.node_id]:
            plan.predicted[n.node_id] += link(n).latency
        plan.srus[n.node_id].append(s)
        plan.predicted[n.node_id] += s.render_cost / weights[k] + sru_image_bytes(s) * per_byte[k]
    return plan


def composite_frame(width: int, height: int, pieces: Iterable[tuple[np.ndarray, int, int]],
                    clear: Sequence[float] | None = (0.0, 0.0, 0.0, 1.0),
                    out: np.ndarray | None = None) -> np.ndarray:
    """Place RGBA16F images ((h, w, 8) uint8, as Image.download gives) into a frame, in order.

    The same result as vkmulti.Compositor at content scale 1 (unscaled blits
    are exact copies; parts outside the frame are clipped): a (height, width, 8)
    uint8 array, cleared to `clear` first (None: `out` is drawn over as is).
    """
    if out is None:
        out = np.empty((height, width, IMAGE_BYTES_PER_PIXEL), dtype=np.uint8)
        if clear is None:
            out[...] = 0
    elif out.shape != (height, width, IMAGE_BYTES_PER_PIXEL) or out.dtype != np.uint8:
        raise ValueError(f"out must be a ({height}, {width}, 8) uint8 array, got {out.shape} {out.dtype}")
    if clear is not None:
        c = [float(v) for v in clear]
        if len(c) != 4:
            raise ValueError(f"clear must be 4 numbers (RGBA) or None, got {short_repr(clear)}")
        out.view(np.float16).reshape(height, width, 4)[...] = np.asarray(c, dtype=np.float16)
    for k, (img, x, y) in enumerate(pieces):
        if img.ndim != 3 or img.shape[2] != IMAGE_BYTES_PER_PIXEL or img.dtype != np.uint8:
            raise ValueError(f"piece {k} must be an (h, w, 8) uint8 array, got {img.shape} {img.dtype}")
        h, w = img.shape[:2]
        x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, width), min(y + h, height)
        if x0 < x1 and y0 < y1:
            out[y0:y1, x0:x1] = img[y0 - y:y1 - y, x0 - x:x1 - x]
    return out
