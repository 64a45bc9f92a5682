"""InterconnectType, GpuConnection and GpuTopology: how devices are linked,
estimated from the interconnect table or measured by probe.py;
and TopologyView, the coordinator's topology that follows its registry."""
from __future__ import annotations

import copy
import dataclasses
import enum
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..._core.checks import check_count, check_index, check_number, short_repr, int_in, U64_MAX
from ..._core.reprs import compact_repr
from ...errors import InvalidConfigError
from .config import Backend
from .records import RegistrySnapshot

__all__ = ["MAX_TOPOLOGY_DEVICES", "InterconnectType", "GpuConnection", "GpuTopology", "TopologyView",
           "estimated_link", "estimate", "route"]

#: The most devices a GpuTopology may have: it is a dense n x n matrix (and an estimate
#: makes a link per pair), so n is bounded to keep its memory and time bounded
#: (1024 devices: a million links).
MAX_TOPOLOGY_DEVICES = 1024


class InterconnectType(enum.Enum):
    """The kind of link between two devices, with ringkernel's estimated figures."""
    NONE = "none"                     # no direct link: through host memory
    PCIE = "pcie"                     # PCIe peer-to-peer
    NVLINK = "nvlink"
    NVSWITCH = "nvswitch"
    INFINITY_FABRIC = "infinity_fabric"
    XE_LINK = "xe_link"
    SAME_DEVICE = "same_device"       # the device itself (or one device seen twice)

    def estimated_bandwidth_gbps(self) -> float:
        """Assumed bandwidth (GB/s): NONE 16 (PCIe 3 x16 through the host), PCIE 32,
        NVLINK 300, NVSWITCH 600, INFINITY_FABRIC 200, XE_LINK 100, SAME_DEVICE 2000."""
        return _BANDWIDTH[self]

    def estimated_latency_us(self) -> float:
        """Assumed latency (us): NONE 10, PCIE 5, NVLINK 1, NVSWITCH 2,
        INFINITY_FABRIC 1.5, XE_LINK 2, SAME_DEVICE 0."""
        return _LATENCY[self]

    def supports_p2p(self) -> bool:
        """Whether the link moves data device to device (everything but NONE)."""
        return self is not InterconnectType.NONE


_BANDWIDTH = {InterconnectType.NONE: 16.0, InterconnectType.PCIE: 32.0, InterconnectType.NVLINK: 300.0,
              InterconnectType.NVSWITCH: 600.0, InterconnectType.INFINITY_FABRIC: 200.0,
              InterconnectType.XE_LINK: 100.0, InterconnectType.SAME_DEVICE: 2000.0}
_LATENCY = {InterconnectType.NONE: 10.0, InterconnectType.PCIE: 5.0, InterconnectType.NVLINK: 1.0,
            InterconnectType.NVSWITCH: 2.0, InterconnectType.INFINITY_FABRIC: 1.5, InterconnectType.XE_LINK: 2.0,
            InterconnectType.SAME_DEVICE: 0.0}


@dataclass
class GpuConnection:
    """A link from `source` to `destination`. `GpuConnection(src, dst, type)`
    takes the type's estimated bandwidth and latency, bidirectional=True and
    hops 0 (src == dst) or 1; `with_bandwidth/with_latency/with_hops` return a
    copy carrying measured values. `method` (vkmulti's) names the transfer
    method a measurement used, None for estimates."""

    __repr__ = compact_repr

    source: int
    destination: int
    interconnect: InterconnectType
    bandwidth_gbps: float | None = None
    latency_us: float | None = None
    bidirectional: bool = True
    hops: int | None = None
    method: str | None = None

    def __post_init__(self) -> None:
        self.source = check_index(self.source, "source")
        self.destination = check_index(self.destination, "destination")
        if not isinstance(self.interconnect, InterconnectType):
            raise TypeError(f"interconnect must be an InterconnectType, got {short_repr(self.interconnect)}")
        self.bandwidth_gbps = (self.interconnect.estimated_bandwidth_gbps() if self.bandwidth_gbps is None
                               else check_number(self.bandwidth_gbps, "bandwidth_gbps"))
        self.latency_us = (self.interconnect.estimated_latency_us() if self.latency_us is None
                           else check_number(self.latency_us, "latency_us"))
        if not isinstance(self.bidirectional, bool):
            raise TypeError(f"bidirectional must be a bool, got {short_repr(self.bidirectional)}")
        self.hops = (0 if self.source == self.destination else 1) if self.hops is None \
            else check_count(self.hops, "hops")
        if self.method is not None and not isinstance(self.method, str):
            raise TypeError(f"method must be a str or None, got {short_repr(self.method)}")

    def with_bandwidth(self, gbps: float) -> "GpuConnection":
        """A copy with `bandwidth_gbps` set."""
        return dataclasses.replace(self, bandwidth_gbps=gbps)

    def with_latency(self, us: float) -> "GpuConnection":
        """A copy with `latency_us` set."""
        return dataclasses.replace(self, latency_us=us)

    def with_hops(self, hops: int) -> "GpuConnection":
        """A copy with `hops` set."""
        return dataclasses.replace(self, hops=hops)

    def to_dict(self) -> dict[str, Any]:
        """The connection as plain JSON-ready data (interconnect by name)."""
        d = dataclasses.asdict(self)
        d["interconnect"] = self.interconnect.name
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GpuConnection":
        """The connection to_dict() wrote."""
        return cls(source=d["source"], destination=d["destination"],
                   interconnect=InterconnectType[d["interconnect"]], bandwidth_gbps=d["bandwidth_gbps"],
                   latency_us=d["latency_us"], bidirectional=d["bidirectional"], hops=d["hops"],
                   method=d.get("method"))


class GpuTopology:
    """A dense matrix of optional connections between `device_count` devices,
    NUMA nodes, `probed` (False: estimated) and `last_updated` (time.time()).

    Index arguments out of range are ignored or answer empty, as in the seed;
    arguments that are not ints raise TypeError. `device_count` is at most
    MAX_TOPOLOGY_DEVICES (InvalidConfigError, a ValueError, past it). `details` holds what a probe
    found beyond the matrix (PCI buses, UUIDs, NVLink counts, notes).
    """

    def __init__(self, device_count: int):
        n = check_count(device_count, "device_count")
        if n > MAX_TOPOLOGY_DEVICES:
            raise InvalidConfigError(f"a topology of {short_repr(n)} devices: at most {MAX_TOPOLOGY_DEVICES} (a dense matrix "
                                     f"of links; a coordinator's topology has a row per device slot)")
        self.device_count = n
        self._connections: list[list[GpuConnection | None]] = [[None] * n for _ in range(n)]
        for i in range(n):
            self._connections[i][i] = GpuConnection(i, i, InterconnectType.SAME_DEVICE)
        self.numa_nodes: list[int | None] = [None] * n
        self.probed = False
        self.last_updated = time.time()
        self.details: dict[str, Any] = {}

    # -- the seed's API --------------------------------------------------------

    def set_connection(self, connection: GpuConnection) -> None:
        """Store `connection` (and its mirror when bidirectional); ignored when an
        endpoint is out of range. Its fields are checked again (they are assignable),
        before anything is stored."""
        if not isinstance(connection, GpuConnection):
            raise TypeError(f"connection must be a GpuConnection, got {type(connection).__name__}")
        conn = dataclasses.replace(connection)   # a checked copy
        s, d = conn.source, conn.destination
        if s >= self.device_count or d >= self.device_count:
            return
        mirror = dataclasses.replace(conn, source=d, destination=s) if conn.bidirectional and s != d else None
        self._connections[s][d] = conn
        if mirror is not None:
            self._connections[d][s] = mirror

    def get_connection(self, source: int, destination: int) -> GpuConnection | None:
        """The connection from `source` to `destination`, or None (unknown pair, or out of range)."""
        s, d = check_index(source, "source"), check_index(destination, "destination")
        if s >= self.device_count or d >= self.device_count:
            return None
        return self._connections[s][d]

    def best_path(self, source: int, destination: int) -> list[int]:
        """The devices a transfer from `source` to `destination` goes through.

        [s] for s == d; [s, d] when a direct P2P-capable link exists; otherwise
        the widest path over P2P-capable links (any number of hops: the path
        whose narrowest link is widest; ties to fewer hops, then to the
        lexicographically smallest device sequence); [s, d] (host-mediated)
        when no P2P path exists or an index is out of range.
        """
        s, d = check_index(source, "source"), check_index(destination, "destination")
        if s == d:
            return [s]
        n = self.device_count
        if s >= n or d >= n:
            return [s, d]
        direct = self._connections[s][d]
        if direct is not None and direct.interconnect.supports_p2p():
            return [s, d]
        width = self._widest(s)
        if width[d] <= 0.0:
            return [s, d]
        path = self._fewest_hops(s, d, width[d])
        return path if path is not None else [s, d]

    def neighbors(self, device: int) -> list[int]:
        """Other devices `device` has a P2P-capable link to, ascending."""
        dev = check_index(device, "device")
        if dev >= self.device_count:
            return []
        return [i for i, c in enumerate(self._connections[dev])
                if i != dev and c is not None and c.interconnect.supports_p2p()]

    def bisection_bandwidth_gbps(self) -> float:
        """Sum of the link bandwidths from the first half of the devices to the
        second (one direction; host-mediated links count), 0 below 2 devices."""
        half = self.device_count // 2
        if half == 0:
            return 0.0
        return sum(c.bandwidth_gbps for s in range(half) for c in self._connections[s][half:] if c is not None)  # type: ignore[misc]

    def is_fully_connected(self) -> bool:
        """Every ordered pair of distinct devices has a P2P-capable link."""
        return all(c is not None and c.interconnect.supports_p2p()
                   for s, row in enumerate(self._connections) for d, c in enumerate(row) if s != d)

    def numa_neighbors(self, device: int) -> list[int]:
        """The other devices on `device`'s NUMA node, ascending (empty if it has none)."""
        dev = check_index(device, "device")
        node = self.numa_nodes[dev] if dev < len(self.numa_nodes) else None
        if node is None:
            return []
        return [i for i, n in enumerate(self.numa_nodes) if i != dev and n == node]

    def set_numa_node(self, device: int, numa_node: int) -> None:
        """Record the NUMA node of a device."""
        dev = check_index(device, "device")
        node = check_count(numa_node, "numa_node")
        if dev < len(self.numa_nodes):
            self.numa_nodes[dev] = node

    def mark_probed(self) -> None:
        """Mark the matrix as measured (not estimated) and refresh last_updated."""
        self.probed = True
        self.last_updated = time.time()

    # -- vkmulti's additions ------------------------------------------------------

    def hop_count(self, source: int, destination: int) -> int | None:
        """Fewest P2P-capable links from source to destination (BFS, as ringkernel-cuda
        does); 0 for the same device, None when unreachable or out of range."""
        s, d = check_index(source, "source"), check_index(destination, "destination")
        if s >= self.device_count or d >= self.device_count:
            return None
        if s == d:
            return 0
        path = self._fewest_hops(s, d, 0.0)
        return None if path is None else len(path) - 1

    def path_figures(self, path: list[int]) -> tuple[float, float]:
        """(bandwidth GB/s of the narrowest link, summed latency us) along `path`;
        links that are absent count as host-mediated (NONE's estimate)."""
        if len(path) < 2:
            return InterconnectType.SAME_DEVICE.estimated_bandwidth_gbps(), 0.0
        bw, lat = float("inf"), 0.0
        for a, b in zip(path, path[1:]):
            c = self.get_connection(a, b)
            cb = c.bandwidth_gbps if c is not None else InterconnectType.NONE.estimated_bandwidth_gbps()
            cl = c.latency_us if c is not None else InterconnectType.NONE.estimated_latency_us()
            bw, lat = min(bw, cb), lat + cl  # type: ignore[assignment, operator, type-var]
        return bw, lat

    def transfer_seconds(self, source: int, destination: int, nbytes: int) -> float:
        """Estimated time to move `nbytes` along best_path (0 for the same device)."""
        n = int_in(check_count(nbytes, "nbytes"), "nbytes", 0, U64_MAX)   # (a float can hold the time)
        path = self.best_path(source, destination)
        if len(path) < 2:
            return 0.0
        bw, lat = self.path_figures(path)
        return (n / (bw * 1e9) if bw > 0 else float("inf")) + lat * 1e-6

    def transfer_cost_matrix(self) -> list[list[float]]:
        """Seconds per byte for every ordered pair along best_path (0 on the diagonal):
        a per-pair link cost for placement."""
        n = self.device_count
        out = [[0.0] * n for _ in range(n)]
        for s in range(n):
            for d in range(n):
                if s != d:
                    bw, _ = self.path_figures(self.best_path(s, d))
                    out[s][d] = 1.0 / (bw * 1e9) if bw > 0 else float("inf")
        return out

    def copy(self) -> "GpuTopology":
        """An independent copy (connections and facts copied)."""
        t = GpuTopology.__new__(GpuTopology)
        t.device_count = self.device_count
        t._connections = [[copy.copy(c) for c in row] for row in self._connections]
        t.numa_nodes = list(self.numa_nodes)
        t.probed, t.last_updated = self.probed, self.last_updated
        t.details = copy.deepcopy(self.details)
        return t

    def connections(self) -> list[GpuConnection]:
        """Every stored connection, row by row (self-connections included)."""
        return [copy.copy(c) for row in self._connections for c in row if c is not None]

    def to_dict(self) -> dict[str, Any]:
        """The topology as plain JSON-ready data (what the cache stores)."""
        return {"device_count": self.device_count, "probed": self.probed, "last_updated": self.last_updated,
                "numa_nodes": list(self.numa_nodes), "details": copy.deepcopy(self.details),
                "connections": [c.to_dict() for row in self._connections for c in row if c is not None]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GpuTopology":
        """The topology to_dict() wrote."""
        t = cls(d["device_count"])
        t._connections = [[None] * t.device_count for _ in range(t.device_count)]
        for c in d["connections"]:
            conn = GpuConnection.from_dict(c)
            if conn.source < t.device_count and conn.destination < t.device_count:
                t._connections[conn.source][conn.destination] = conn
        t.numa_nodes = [None if n is None else check_count(n, "numa node") for n in d["numa_nodes"]]
        if len(t.numa_nodes) != t.device_count:
            raise ValueError(f"numa_nodes has {len(t.numa_nodes)} entries for {t.device_count} devices")
        t.probed, t.last_updated = bool(d["probed"]), float(d["last_updated"])
        t.details = dict(d.get("details") or {})
        return t

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GpuTopology):
            return NotImplemented
        return (self.device_count, self._connections, self.numa_nodes, self.probed) == \
            (other.device_count, other._connections, other.numa_nodes, other.probed)

    __hash__ = None   # type: ignore[assignment]  # (mutable)

    def __repr__(self) -> str:
        links = sum(1 for s, row in enumerate(self._connections) for d, c in enumerate(row) if c is not None and s != d)
        return f"GpuTopology(device_count={self.device_count}, links={links}, probed={self.probed})"

    # -- path search -------------------------------------------------------------

    def _p2p(self, a: int, b: int) -> float:
        c = self._connections[a][b]
        return c.bandwidth_gbps if c is not None and c.interconnect.supports_p2p() and a != b else -1.0  # type: ignore[return-value]

    def _widest(self, s: int) -> list[float]:
        """Widest (max-bottleneck) bandwidth from s to every device over P2P links."""
        n = self.device_count
        width = [0.0] * n
        width[s] = float("inf")
        done = [False] * n
        for _ in range(n):
            u = max((i for i in range(n) if not done[i]), key=lambda i: width[i], default=None)
            if u is None or width[u] <= 0.0:
                break
            done[u] = True
            for v in range(n):
                bw = self._p2p(u, v)
                if bw > 0.0 and not done[v]:
                    width[v] = max(width[v], min(width[u], bw))
        return width

    def _fewest_hops(self, s: int, d: int, min_bw: float) -> list[int] | None:
        """BFS over P2P links of at least `min_bw` GB/s (> 0), neighbours ascending:
        the shortest path, lexicographically smallest among the shortest."""
        n = self.device_count
        parent: list[int | None] = [None] * n
        seen = [False] * n
        seen[s] = True
        q = deque([s])
        while q:
            u = q.popleft()
            if u == d:
                break
            for v in range(n):
                bw = self._p2p(u, v)
                if not seen[v] and bw > 0.0 and bw >= min_bw:
                    seen[v] = True
                    parent[v] = u
                    q.append(v)
        if not seen[d]:
            return None
        path = [d]
        while path[-1] != s:
            path.append(parent[path[-1]])   # type: ignore[arg-type]
        return path[::-1]


class TopologyView:
    """The coordinator's topology: one set (or probed) or, without one, the estimate
    from the device records; the view of it that follows register and unregister
    (offline devices, placeholders and indices past the registry lose their links,
    devices added later get estimated ones) is
    made on demand and kept until the devices or the topology change. Owned by
    MultiGpuCoordinator and used under its lock."""

    def __init__(self) -> None:
        self._base: GpuTopology | None = None
        self._view: GpuTopology | None = None
        self.generation = 0   # bumped whenever the topology may have changed

    def devices_changed(self) -> None:
        """A device was registered or unregistered: the view is made anew."""
        self._view = None
        self.generation += 1

    def set(self, topology: GpuTopology) -> None:
        """Use `topology` (a copy is kept) from now on."""
        self._base = topology.copy()
        self._view = None
        self.generation += 1

    def discover(self, snap: RegistrySnapshot) -> GpuTopology:
        """The estimate from the records becomes the topology (replacing one set); returns it."""
        topo = estimate(snap)
        self._base = None
        self._view = topo
        self.generation += 1
        return topo

    def view(self, snap: RegistrySnapshot) -> GpuTopology:
        """The current view (the coordinator's own: copy it before handing it out)."""
        if self._view is not None:
            return self._view
        base = self._base
        if base is None:
            view = estimate(snap)
        else:
            n = len(snap.infos)
            view = base.copy()
            if base.device_count < n:   # devices registered after it was made: estimated links
                grown = GpuTopology(n)
                for s in range(n):
                    for d in range(n):
                        if s < base.device_count and d < base.device_count:
                            grown._connections[s][d] = view._connections[s][d]
                        elif s != d:
                            grown._connections[s][d] = estimated_link(snap, s, d)
                grown.numa_nodes[:base.device_count] = view.numa_nodes
                grown.details, grown.last_updated = view.details, view.last_updated
                view = grown
            for s in range(view.device_count):
                if not snap.is_live(s):   # offline devices, placeholders and indices past the registry have no links
                    for d in range(view.device_count):
                        if d != s:
                            view._connections[s][d] = view._connections[d][s] = None
            view.probed = base.probed and base.device_count >= n
        self._view = view
        return view


def estimated_link(snap: RegistrySnapshot, i: int, j: int) -> GpuConnection | None:
    """The link from device i to device j as their records suggest (see
    MultiGpuCoordinator.discover_topology); None unless both are online."""
    if not (snap.is_live(i) and snap.is_live(j)):
        return None
    a, b = snap.infos[i], snap.infos[j]
    kind = InterconnectType.NONE
    if a.p2p_capable and b.p2p_capable and a.backend == b.backend:
        if a.device_uuid is not None and a.device_uuid == b.device_uuid:
            kind = InterconnectType.SAME_DEVICE
        elif a.backend in (Backend.CUDA, Backend.VULKAN) and (a.compute_capability or (0, 0))[0] >= 8 \
                and (b.compute_capability or (0, 0))[0] >= 8:
            kind = InterconnectType.NVLINK
        else:
            kind = InterconnectType.PCIE
    return GpuConnection(i, j, kind)   # (the seed's: bidirectional, as the estimate is symmetric)


def estimate(snap: RegistrySnapshot) -> GpuTopology:
    """The topology of every slot estimated from the device records (no measurement)."""
    n = len(snap.infos)
    topo = GpuTopology(n)
    for i in range(n):
        for j in range(n):
            if i != j:
                c = estimated_link(snap, i, j)
                if c is not None:
                    topo.set_connection(c)
    return topo


#: the seed's fallbacks when a route has no direct connection to read figures from
_FALLBACK_BANDWIDTH_GBPS = InterconnectType.NONE.estimated_bandwidth_gbps()
_FALLBACK_LATENCY_US = InterconnectType.NONE.estimated_latency_us()


def route(topo: GpuTopology, source: int, destination: int) -> tuple[list[int], float, float]:
    """(best path, its bandwidth in GB/s, its latency in us) from source to
    destination: a direct link's figures, else the path's (its narrowest link);
    16 GB/s and 10 us where no link is known."""
    path = topo.best_path(source, destination)
    if len(path) == 2:
        conn = topo.get_connection(source, destination)
        bw, lat = (conn.bandwidth_gbps, conn.latency_us) if conn is not None else \
            (_FALLBACK_BANDWIDTH_GBPS, _FALLBACK_LATENCY_US)
    else:
        bw, lat = topo.path_figures(path)
    if not bw > 0:  # type: ignore[operator]
        bw = _FALLBACK_BANDWIDTH_GBPS
    return path, bw, lat  # type: ignore[return-value]
