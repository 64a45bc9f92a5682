"""The coordinator on two real GPUs (VKMULTI_REAL_GPUS=1 on the GPU host)."""
from __future__ import annotations

import pytest

from vkmulti import Backend, InterconnectType, MultiGpuCoordinator, cuda_status
from vkmulti.kernels.coordinator import device_facts, probe
from vkmulti.kernels import format_topology

pytestmark = pytest.mark.gpu


def test_real_devices_registered(manager):
    coord = MultiGpuCoordinator.from_manager(manager)
    infos = coord.devices()
    assert len(infos) >= 2 and all(i.backend == Backend.VULKAN for i in infos)
    for slot, info in zip(manager.slots, infos):
        total, available, source = device_facts.memory_figures(slot)
        assert info.total_memory == total > 0
        if "VK_EXT_memory_budget" in slot.enabled_extensions:
            assert source == "VK_EXT_memory_budget" and 0 < info.available_memory < info.total_memory
        assert info.pci_bus is not None
        if slot.capabilities.vendor_id == 0x10DE and cuda_status() is None:
            assert info.compute_capability is not None and info.compute_capability >= (7, 0)
            assert info.multiprocessor_count > 1
    if coord.transfer_method(0, 1) == "cuda_peer":
        assert infos[0].p2p_capable and infos[1].p2p_capable


def test_real_topology_is_measured(manager, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(probe.CACHE_ENV, str(tmp_path))
    coord = MultiGpuCoordinator.from_manager(manager)
    topo = coord.probe_topology(force=True)
    with capsys.disabled():
        print("\n" + format_topology(topo))
    assert topo.probed
    for a, b in ((0, 1), (1, 0)):
        c = topo.get_connection(a, b)
        assert c.bandwidth_gbps > 5.0 and c.latency_us > 0
        if c.method == "cuda_peer":
            assert c.bandwidth_gbps > 100.0, c
    try:
        import pynvml  # noqa: F401
        have_nvml = True
    except ImportError:
        have_nvml = False
    if have_nvml and topo.details["nvlink"]:
        assert topo.get_connection(0, 1).interconnect in (InterconnectType.NVLINK, InterconnectType.NVSWITCH)
    assert probe.probe_topology(manager).details["source"] == "cache"
