"""The topology side of MultiGpuCoordinator (mixed into it): the estimate from
device records, the view of a set or probed topology that follows register
and unregister, and topology-aware selection for kernel-to-kernel traffic."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .config import Backend
from ..ids import KernelId, as_kernel_id
from .topology import GpuConnection, GpuTopology, InterconnectType

if TYPE_CHECKING:
    from .coordinator import MultiGpuCoordinator as _Base
else:
    _Base = object

__all__ = ["TopologyMixin"]


class TopologyMixin(_Base):
    """discover_topology / topology / set_topology / select_device_for_k2k."""

    def select_device_for_k2k(self, source_kernel: KernelId | str) -> int:
        """The device for a kernel that will talk to `source_kernel`: among the
        source device's P2P neighbours that can take a kernel, the highest
        bandwidth / (load + 0.1) (ties to the lowest index); select_device()
        when the source is unplaced or no neighbour qualifies."""
        kid = as_kernel_id(source_kernel, "source_kernel")
        with self._lock:
            src = self._map.get(kid)
            if src is not None:
                topo = self._view_locked()
                best, best_score = -1, -1.0
                for n in topo.neighbors(src):
                    if n < len(self._infos) and self._registered[n] and self._online[n] \
                            and self._counts[n] < self._max:
                        conn = topo.get_connection(src, n)
                        bw = conn.bandwidth_gbps if conn is not None else 1.0
                        score = bw / (self._counts[n] / self._max + 0.1)
                        if score > best_score:
                            best, best_score = n, score
                if best >= 0:
                    return best
        return self.select_device()

    # -- kernels -------------------------------------------------------------------


    def discover_topology(self) -> GpuTopology:
        """Estimate the topology from the device records (no measurement): for two
        online P2P-capable devices of one backend, SAME_DEVICE when they share a
        UUID, NVLINK when both report compute capability >= 8 (CUDA or Vulkan on
        NVIDIA), else PCIE; NONE for the other online pairs; no link to
        placeholders or offline devices. It becomes the coordinator's topology,
        replacing one given to set_topology."""
        with self._lock:
            topo = self._estimate_locked()
            self._topology_base = None
            self._topology_view = topo
            self._topology_generation += 1
            return topo.copy()

    @property
    def topology_generation(self) -> int:
        """A counter that changes whenever topology() may answer differently (set,
        probed, estimated anew, devices registered or unregistered): a cheap check
        for callers that cache routes."""
        return self._topology_generation

    def topology(self) -> GpuTopology:
        """A copy of the current topology: the one set (or probed) with offline
        devices' links removed and new devices estimated, else the estimate.
        Register and unregister invalidate it."""
        with self._lock:
            return self._view_locked().copy()

    def set_topology(self, topology: GpuTopology) -> None:
        """Use `topology` (manual or probed) from now on; a copy is kept."""
        if not isinstance(topology, GpuTopology):
            raise TypeError(f"set_topology takes a GpuTopology, got {type(topology).__name__}")
        with self._lock:
            self._topology_base = topology.copy()
            self._topology_view = None
            self._topology_generation += 1

    def _estimated_link(self, i: int, j: int) -> GpuConnection | None:
        if not (self._is_live(i) and self._is_live(j)):
            return None
        a, b = self._infos[i], self._infos[j]
        kind = InterconnectType.NONE
        if a.p2p_capable and b.p2p_capable and a.backend == b.backend:
            if a.device_uuid is not None and a.device_uuid == b.device_uuid:
                kind = InterconnectType.SAME_DEVICE
            elif a.backend in (Backend.CUDA, Backend.VULKAN) and (a.compute_capability or (0, 0))[0] >= 8 \
                    and (b.compute_capability or (0, 0))[0] >= 8:
                kind = InterconnectType.NVLINK
            else:
                kind = InterconnectType.PCIE
        return GpuConnection(i, j, kind, bidirectional=False)

    def _estimate_locked(self) -> GpuTopology:
        n = len(self._infos)
        topo = GpuTopology(n)
        for i in range(n):
            for j in range(n):
                if i != j:
                    c = self._estimated_link(i, j)
                    if c is not None:
                        topo.set_connection(c)
        return topo

    def _view_locked(self) -> GpuTopology:
        if self._topology_view is not None:
            return self._topology_view
        base = self._topology_base
        if base is None:
            view = self._estimate_locked()
        else:
            n = len(self._infos)
            view = base.copy()
            if base.device_count < n:   # devices registered after it was made: estimated links
                grown = GpuTopology(n)
                for s in range(n):
                    for d in range(n):
                        if s < base.device_count and d < base.device_count:
                            grown._connections[s][d] = view._connections[s][d]
                        elif s != d:
                            grown._connections[s][d] = self._estimated_link(s, d)
                grown.numa_nodes[:base.device_count] = view.numa_nodes
                grown.details, grown.last_updated = view.details, view.last_updated
                view = grown
            for s in range(n):
                if not self._is_live(s):   # offline devices and placeholders have no links
                    for d in range(view.device_count):
                        if d != s:
                            view._connections[s][d] = view._connections[d][s] = None
            view.probed = base.probed and base.device_count >= n
        self._topology_view = view
        return view
