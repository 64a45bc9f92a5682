"""GpuTopology and GpuConnection beyond the seed's tests: figures, validation,
the seed's quiet handling of out-of-range indices, costs for placement, JSON."""
from __future__ import annotations

import math

import pytest

from vkmulti import Backend, DeviceInfo, GpuConnection, GpuTopology, InterconnectType, InvalidConfigError, \
    MultiGpuCoordinator
from vkmulti.kernels.coordinator.topology import MAX_TOPOLOGY_DEVICES

I = InterconnectType


def test_interconnect_table():
    assert [(t.estimated_bandwidth_gbps(), t.estimated_latency_us(), t.supports_p2p()) for t in I] == [
        (16.0, 10.0, False), (32.0, 5.0, True), (300.0, 1.0, True), (600.0, 2.0, True), (200.0, 1.5, True),
        (100.0, 2.0, True), (2000.0, 0.0, True)]
    assert [t.name for t in I] == ["NONE", "PCIE", "NVLINK", "NVSWITCH", "INFINITY_FABRIC", "XE_LINK",
                                   "SAME_DEVICE"]


def test_connection_defaults_and_measured_values():
    c = GpuConnection(0, 1, I.PCIE)
    assert (c.bandwidth_gbps, c.latency_us, c.bidirectional, c.hops, c.method) == (32.0, 5.0, True, 1, None)
    assert GpuConnection(2, 2, I.SAME_DEVICE).hops == 0
    m = c.with_bandwidth(25.5).with_latency(3.0).with_hops(2)
    assert (m.bandwidth_gbps, m.latency_us, m.hops) == (25.5, 3.0, 2) and c.bandwidth_gbps == 32.0
    by_name = GpuConnection(source=1, destination=0, interconnect=I.NVLINK, bandwidth_gbps=400.0, latency_us=1.5,
                            bidirectional=False, hops=1)
    assert by_name.bandwidth_gbps == 400.0 and not by_name.bidirectional
    for bad in (dict(bandwidth_gbps=-1.0), dict(latency_us=math.nan), dict(hops=-1), dict(bandwidth_gbps="x")):
        with pytest.raises((ValueError, TypeError)):
            GpuConnection(0, 1, I.PCIE, **bad)
    with pytest.raises(TypeError):
        GpuConnection(0, 1, "nvlink")
    with pytest.raises(ValueError):
        GpuConnection(-1, 1, I.PCIE)


def test_out_of_range_is_ignored_as_in_the_seed_but_types_are_checked():
    topo = GpuTopology(2)
    topo.set_connection(GpuConnection(0, 5, I.NVLINK))
    assert topo.get_connection(0, 5) is None and topo.get_connection(5, 0) is None
    assert topo.neighbors(7) == [] and topo.numa_neighbors(7) == []
    topo.set_numa_node(7, 0)
    assert topo.numa_nodes == [None, None] and topo.numa_neighbors(0) == []
    for call in (lambda: topo.get_connection("0", 1), lambda: topo.neighbors(None),
                 lambda: topo.set_connection((0, 1)), lambda: topo.set_numa_node(0, -1),
                 lambda: GpuTopology(-1), lambda: topo.best_path(0.5, 1)):
        with pytest.raises((TypeError, ValueError)):
            call()


def test_one_way_connections_and_bisection():
    topo = GpuTopology(4)
    topo.set_connection(GpuConnection(0, 2, I.NVLINK, bidirectional=False))
    assert topo.get_connection(2, 0) is None
    topo.set_connection(GpuConnection(1, 3, I.NONE))
    assert topo.bisection_bandwidth_gbps() == 316.0   # first half -> second half, NONE counts
    assert GpuTopology(1).bisection_bandwidth_gbps() == 0.0
    assert not topo.is_fully_connected() and GpuTopology(1).is_fully_connected()


def test_costs_for_placement():
    topo = GpuTopology(3)
    topo.set_connection(GpuConnection(0, 1, I.NVLINK).with_bandwidth(400.0))
    topo.set_connection(GpuConnection(1, 2, I.PCIE).with_bandwidth(25.0).with_latency(4.0))
    assert topo.transfer_seconds(0, 0, 1 << 30) == 0.0
    assert topo.transfer_seconds(0, 1, 4 * 10**9) == pytest.approx(0.01 + 1e-6)
    assert topo.transfer_seconds(0, 2, 10**9) == pytest.approx(0.04 + 5e-6)   # via 1: narrowest 25 GB/s
    cost = topo.transfer_cost_matrix()
    assert cost[0][0] == 0.0 and cost[0][1] == pytest.approx(1 / 400e9) and cost[2][0] == pytest.approx(1 / 25e9)
    lone = GpuTopology(2)   # no link at all: host-mediated estimate
    assert lone.transfer_cost_matrix()[0][1] == pytest.approx(1 / 16e9)
    with pytest.raises(ValueError):
        topo.transfer_seconds(0, 1, -1)


def test_json_round_trip_and_copies():
    topo = GpuTopology(3)
    topo.set_connection(GpuConnection(0, 1, I.NVLINK, bandwidth_gbps=380.5, latency_us=9.5, bidirectional=False,
                                      method="cuda_peer"))
    topo.set_connection(GpuConnection(1, 2, I.NONE))
    topo.set_numa_node(2, 1)
    topo.details = {"notes": ["x"]}
    topo.mark_probed()
    back = GpuTopology.from_dict(topo.to_dict())
    assert back == topo and back.details == {"notes": ["x"]} and back.last_updated == topo.last_updated
    assert back.get_connection(0, 1).method == "cuda_peer" and back.get_connection(1, 0) is None
    dup = topo.copy()
    dup.set_connection(GpuConnection(0, 2, I.PCIE))
    dup.details["notes"].append("y")
    assert topo.get_connection(0, 2) is None and topo.details == {"notes": ["x"]}
    assert len(topo.connections()) == 3 + 3 and "probed=True" in repr(topo)
    bad = topo.to_dict()
    bad["numa_nodes"] = [None]
    with pytest.raises(ValueError):
        GpuTopology.from_dict(bad)


def test_a_set_topology_larger_than_the_registry_routes_only_through_registered_devices():
    """Links of indices past the registry are dropped from the coordinator's view like
    those of placeholders (before: a migration from 0 to 1 went through device 2, which
    the coordinator does not have)."""
    coord = MultiGpuCoordinator()
    for i in range(2):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.VULKAN))
    topo = GpuTopology(3)
    topo.set_connection(GpuConnection(0, 1, I.NONE))
    topo.set_connection(GpuConnection(0, 2, I.NVLINK))
    topo.set_connection(GpuConnection(2, 1, I.NVLINK))
    coord.set_topology(topo)
    coord.assign_kernel("k", 0)
    assert coord.request_migration("k", 1).path == [0, 1]
    view = coord.topology()
    assert view.neighbors(0) == [] and view.get_connection(2, 1) is None
    assert view.get_connection(0, 1).interconnect is I.NONE


def test_topologies_are_bounded_so_a_high_device_index_cannot_exhaust_memory():
    """A topology is a dense matrix; one device registered at a high (allowed) index
    made topology() and request_migration() build and estimate an n x n matrix under
    the coordinator's lock (index 30,000: 900 million links, a MemoryError or the OOM
    killer). Past MAX_TOPOLOGY_DEVICES they refuse, and the registry is unchanged."""
    with pytest.raises(InvalidConfigError, match="at most"):
        GpuTopology(MAX_TOPOLOGY_DEVICES + 1)
    with pytest.raises(ValueError):
        GpuTopology.from_dict({**GpuTopology(1).to_dict(), "device_count": 10**9})
    assert GpuTopology(MAX_TOPOLOGY_DEVICES).device_count == MAX_TOPOLOGY_DEVICES
    coord = MultiGpuCoordinator()
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.VULKAN))
    coord.register_device(DeviceInfo(2 * MAX_TOPOLOGY_DEVICES, "far", Backend.VULKAN))
    coord.assign_kernel("k", 0)
    for call in (coord.topology, coord.discover_topology, lambda: coord.request_migration("k", 2 * MAX_TOPOLOGY_DEVICES)):
        with pytest.raises(InvalidConfigError, match="at most"):
            call()
    assert coord.get_kernel_device("k") == 0 and coord.place_kernel("j") == 2 * MAX_TOPOLOGY_DEVICES


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("field, value", [("latency_us", math.nan), ("bandwidth_gbps", -1.0),
                                          ("bandwidth_gbps", math.inf), ("hops", True)])
def test_set_connection_checks_fields_assigned_after_construction(bidirectional, field, value):
    """GpuConnection's fields are assignable; set_connection checks them again and stores
    nothing on failure (before: a one-way connection was stored as it was, a bidirectional
    one half, and a NaN latency surfaced later in request_migration)."""
    topo = GpuTopology(2)
    conn = GpuConnection(0, 1, I.NVLINK, bidirectional=bidirectional)
    setattr(conn, field, value)
    with pytest.raises((TypeError, ValueError)):
        topo.set_connection(conn)
    assert topo.get_connection(0, 1) is None and topo.get_connection(1, 0) is None
