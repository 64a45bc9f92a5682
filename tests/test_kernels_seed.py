"""The inline tests of ringkernel-core's multi_gpu.rs that concern the coordinator,
strategies, topology, migration requests and unregister, ported with the
Python spelling (struct -> class, X::new(a) -> X(a), enum -> UPPER_SNAKE,
Option -> None, Result error -> exception, Duration -> float seconds)."""
from __future__ import annotations

import pytest

from vkmulti import (Backend, DeviceInfo, GpuConnection, GpuTopology, InterconnectType, KernelId, LaunchOptions,
                     LoadBalancingStrategy, MigrationPriority, MigrationRequest, MigrationState, MultiGpuBuilder,
                     VkmError)


def test_device_info():
    info = DeviceInfo(0, "Test GPU", Backend.CUDA)
    assert info.index == 0
    assert info.name == "Test GPU"
    assert info.memory_utilization() == 0.0


def test_coordinator_registration():
    coord = MultiGpuBuilder().build()
    device = DeviceInfo(0, "GPU 0", Backend.CUDA)
    coord.register_device(device)
    assert coord.device_count() == 1
    assert coord.device(0) is not None


def test_kernel_assignment():
    coord = MultiGpuBuilder().build()
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.CUDA))
    kernel_id = KernelId("test_kernel")
    coord.assign_kernel(kernel_id, 0)
    assert coord.get_kernel_device(kernel_id) == 0
    assert len(coord.kernels_on_device(0)) == 1


def test_load_balancing_least_loaded():
    coord = MultiGpuBuilder().load_balancing(LoadBalancingStrategy.LEAST_LOADED).build()
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.CUDA))
    coord.register_device(DeviceInfo(1, "GPU 1", Backend.CUDA))
    coord.assign_kernel(KernelId("k1"), 0)
    selected = coord.select_device(LaunchOptions())
    assert selected == 1


def test_round_robin():
    coord = MultiGpuBuilder().load_balancing(LoadBalancingStrategy.ROUND_ROBIN).build()
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.CUDA))
    coord.register_device(DeviceInfo(1, "GPU 1", Backend.CUDA))
    d1 = coord.select_device(LaunchOptions())
    d2 = coord.select_device(LaunchOptions())
    d3 = coord.select_device(LaunchOptions())
    assert d1 != d2
    assert d1 == d3


# ---- topology ----

def test_interconnect_bandwidth():
    assert InterconnectType.NVLINK.estimated_bandwidth_gbps() > InterconnectType.PCIE.estimated_bandwidth_gbps()
    assert InterconnectType.PCIE.estimated_bandwidth_gbps() > InterconnectType.NONE.estimated_bandwidth_gbps()
    assert InterconnectType.SAME_DEVICE.estimated_bandwidth_gbps() > \
        InterconnectType.NVLINK.estimated_bandwidth_gbps()


def test_interconnect_p2p_support():
    assert not InterconnectType.NONE.supports_p2p()
    assert InterconnectType.PCIE.supports_p2p()
    assert InterconnectType.NVLINK.supports_p2p()
    assert InterconnectType.NVSWITCH.supports_p2p()


def test_gpu_topology_creation():
    topo = GpuTopology(4)
    assert topo.device_count == 4
    for i in range(4):
        conn = topo.get_connection(i, i)
        assert conn is not None
        assert conn.interconnect == InterconnectType.SAME_DEVICE


def test_gpu_topology_set_connection():
    topo = GpuTopology(4)
    topo.set_connection(GpuConnection(0, 1, InterconnectType.NVLINK))
    conn_01 = topo.get_connection(0, 1)
    assert conn_01 is not None
    assert conn_01.interconnect == InterconnectType.NVLINK
    conn_10 = topo.get_connection(1, 0)
    assert conn_10 is not None
    assert conn_10.interconnect == InterconnectType.NVLINK


def test_gpu_topology_neighbors():
    topo = GpuTopology(4)
    topo.set_connection(GpuConnection(0, 1, InterconnectType.NVLINK))
    topo.set_connection(GpuConnection(1, 2, InterconnectType.NVLINK))
    topo.set_connection(GpuConnection(2, 3, InterconnectType.NVLINK))
    topo.set_connection(GpuConnection(3, 0, InterconnectType.NVLINK))
    neighbors_0 = topo.neighbors(0)
    assert len(neighbors_0) == 2
    assert 1 in neighbors_0
    assert 3 in neighbors_0


def test_gpu_topology_best_path():
    topo = GpuTopology(4)
    topo.set_connection(GpuConnection(0, 1, InterconnectType.NVLINK))
    topo.set_connection(GpuConnection(1, 2, InterconnectType.NVLINK))
    topo.set_connection(GpuConnection(2, 3, InterconnectType.NVLINK))
    topo.set_connection(GpuConnection(0, 3, InterconnectType.NONE))
    assert topo.best_path(0, 1) == [0, 1]
    assert topo.best_path(0, 0) == [0]


def test_gpu_topology_fully_connected():
    topo = GpuTopology(3)
    assert not topo.is_fully_connected()
    topo.set_connection(GpuConnection(0, 1, InterconnectType.NVLINK))
    topo.set_connection(GpuConnection(0, 2, InterconnectType.NVLINK))
    topo.set_connection(GpuConnection(1, 2, InterconnectType.NVLINK))
    assert topo.is_fully_connected()


def test_gpu_topology_numa():
    topo = GpuTopology(4)
    topo.set_numa_node(0, 0)
    topo.set_numa_node(1, 0)
    topo.set_numa_node(2, 1)
    topo.set_numa_node(3, 1)
    assert topo.numa_neighbors(0) == [1]
    assert topo.numa_neighbors(2) == [3]


def test_coordinator_topology_discovery():
    coord = MultiGpuBuilder().enable_p2p(True).build()
    dev0 = DeviceInfo(0, "GPU 0", Backend.CUDA)
    dev0.p2p_capable = True
    dev0.compute_capability = (8, 0)
    dev1 = DeviceInfo(1, "GPU 1", Backend.CUDA)
    dev1.p2p_capable = True
    dev1.compute_capability = (8, 6)
    coord.register_device(dev0)
    coord.register_device(dev1)
    topo = coord.discover_topology()
    assert topo.device_count == 2
    conn = topo.get_connection(0, 1)
    assert conn is not None
    assert conn.interconnect == InterconnectType.NVLINK


# ---- migration requests ----

def _two_devices():
    coord = MultiGpuBuilder().build()
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.CUDA))
    coord.register_device(DeviceInfo(1, "GPU 1", Backend.CUDA))
    return coord


def test_migration_request():
    coord = _two_devices()
    kernel_id = KernelId("migrating_kernel")
    coord.assign_kernel(kernel_id, 0)
    request = coord.request_migration(kernel_id, 1)
    assert request.source_device == 0
    assert request.target_device == 1
    assert request.state == MigrationState.PENDING


def test_migration_same_device_error():
    coord = MultiGpuBuilder().build()
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.CUDA))
    kernel_id = KernelId("kernel")
    coord.assign_kernel(kernel_id, 0)
    with pytest.raises(VkmError):
        coord.request_migration(kernel_id, 0)


def test_migration_complete():
    coord = _two_devices()
    kernel_id = KernelId("migrating_kernel")
    coord.assign_kernel(kernel_id, 0)
    assert coord.get_kernel_device(kernel_id) == 0
    request = coord.request_migration(kernel_id, 1)
    coord.complete_migration(request)
    assert coord.get_kernel_device(kernel_id) == 1


def test_migration_transfer_time_estimate():
    request = MigrationRequest(kernel_id=KernelId("test"), source_device=0, target_device=1, path=[0, 1],
                               estimated_bandwidth_gbps=300.0, estimated_latency_us=1.0,
                               state=MigrationState.PENDING, started_at=None)
    time = request.estimate_transfer_time(1_000_000_000)
    assert time * 1e6 > 3000
    assert time * 1e6 < 4000


# ---- unregister ----

def test_unregister_device_no_kernels():
    coord = _two_devices()
    result = coord.unregister_device(0)
    assert result.success
    assert result.device_index == 0
    assert not result.kernels_to_migrate
    assert not result.orphaned_kernels


def test_unregister_device_with_kernels():
    coord = _two_devices()
    k1, k2 = KernelId("k1"), KernelId("k2")
    coord.assign_kernel(k1, 0)
    coord.assign_kernel(k2, 0)
    result = coord.unregister_device(0)
    assert result.success
    assert len(result.kernels_to_migrate) == 2
    assert not result.orphaned_kernels
    for plan in result.kernels_to_migrate:
        assert plan.source_device == 0
        assert plan.target_device == 1
    assert coord.get_kernel_device(k1) == 1
    assert coord.get_kernel_device(k2) == 1


def test_unregister_single_device_orphans_kernels():
    coord = MultiGpuBuilder().build()
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.CUDA))
    k1 = KernelId("k1")
    coord.assign_kernel(k1, 0)
    result = coord.unregister_device(0)
    assert result.success
    assert not result.kernels_to_migrate
    assert len(result.orphaned_kernels) == 1
    assert result.orphaned_kernels[0] == k1
    assert coord.get_kernel_device(k1) is None


def test_unregister_nonexistent_device():
    coord = MultiGpuBuilder().build()
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.CUDA))
    result = coord.unregister_device(99)
    assert not result.success
    assert result.device_index == 99


def test_unregister_distributes_to_least_loaded():
    coord = MultiGpuBuilder().build()
    for i in range(3):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.CUDA))
    coord.assign_kernel(KernelId("pre1"), 1)
    coord.assign_kernel(KernelId("pre2"), 1)
    coord.assign_kernel(KernelId("pre3"), 1)
    k1 = KernelId("migrate_me")
    coord.assign_kernel(k1, 0)
    result = coord.unregister_device(0)
    assert result.success
    assert len(result.kernels_to_migrate) == 1
    assert result.kernels_to_migrate[0].target_device == 2


def test_migration_priority_enum():
    low, normal, high, critical = (MigrationPriority.LOW, MigrationPriority.NORMAL, MigrationPriority.HIGH,
                                   MigrationPriority.CRITICAL)
    assert low != normal
    assert normal != high
    assert high != critical
    assert low == MigrationPriority.LOW
