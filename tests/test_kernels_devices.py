"""The coordinator on real devices: from_manager, the measured topology probe and
its per-machine cache, `python -m vkmulti topology`, and the facts it reads
(NVML through a stand-in pynvml, sysfs NUMA nodes, CUDA compute capability
through the stand-in CUDA driver)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from vkmulti import (Backend, InterconnectType, LoadBalancingStrategy, MultiGpuConfig, MultiGpuCoordinator,
                     InvalidConfigError, probe_topology)
from vkmulti import Buffer
from vkmulti.kernels import CrossDeviceTransfer, format_topology
from vkmulti.kernels.coordinator import device_facts, probe
from vkmulti.kernels.coordinator import NvLinkFacts, numa_node, nvlink_links
from vkmulti.transfer import select_transfer_method

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv(probe.CACHE_ENV, str(d))
    return d


class _Src:
    def __init__(self, i):
        self.device_index = i


# ---- from_manager ----

def test_from_manager_registers_real_devices(manager):
    coord = MultiGpuCoordinator.from_manager(manager)
    assert coord.device_count() == manager.device_count == 2
    assert coord.online_devices() == [0, 1]
    for slot, info in zip(manager.slots, coord.devices()):
        caps = slot.capabilities
        assert info.index == slot.index and info.name == slot.name
        assert info.backend == (Backend.CPU if caps.device_type == "cpu" else Backend.VULKAN)
        assert info.total_memory > 0 and 0 < info.available_memory <= info.total_memory
        assert info.total_memory == max(h.size for h in caps.memory_heaps if h.device_local)
        assert info.device_uuid == caps.device_uuid and info.pci_bus == caps.pci_bus
        assert info.max_threads_per_block >= 64
        peer = {select_transfer_method(_Src(slot.index), manager.capabilities, dst_index=o)
                for o in range(manager.device_count) if o != slot.index}
        assert info.p2p_capable == bool(peer & {"cuda_peer", "dmabuf"})
    assert coord.transfer_method(0, 1) == select_transfer_method(_Src(0), manager.capabilities, dst_index=1)
    assert coord.transfer_method(1, 1) == "none" and coord.transfer_method(0, 5) is None
    mem = coord.refresh_device_memory()
    assert set(mem) == {0, 1} and all(v > 0 for v in mem.values())
    assert coord.stats().total_memory == sum(i.total_memory for i in coord.devices())
    assert coord.manager is manager
    assert coord.place_kernel("k") in (0, 1)


@pytest.mark.virtual
def test_virtual_pair_facts(manager):
    coord = MultiGpuCoordinator.from_manager(manager, MultiGpuConfig(load_balancing=LoadBalancingStrategy.MEMORY_BASED))
    infos = coord.devices()
    assert all(i.backend == Backend.CPU for i in infos)          # lavapipe is a CPU Vulkan device
    assert all(i.compute_capability is None for i in infos)      # not a CUDA device
    total, available, source = device_facts.memory_figures(manager.slot(0))
    assert "VK_EXT_memory_budget" in source and "usage unknown" in source and available == total
    # the pair shares one UUID (one CPU seen twice): the estimate says so
    assert coord.discover_topology().get_connection(0, 1).interconnect == InterconnectType.SAME_DEVICE
    coord.unregister_device(0)
    assert coord.refresh_device_memory() == {1: infos[1].available_memory}
    assert coord.select_device() == 1


def test_record_only_coordinators_cannot_read_devices():
    coord = MultiGpuCoordinator()
    with pytest.raises(InvalidConfigError, match="from_manager"):
        coord.refresh_device_memory()
    with pytest.raises(InvalidConfigError, match="from_manager"):
        coord.probe_topology()
    with pytest.raises(TypeError):
        MultiGpuCoordinator.from_manager(object())
    with pytest.raises(TypeError):
        probe_topology("manager")


# ---- the probe and its cache ----

def test_probe_measures_both_directions_and_caches(manager, cache_dir):
    coord = MultiGpuCoordinator.from_manager(manager)
    topo = coord.probe_topology(force=True, nbytes=1 << 20, reps=2)
    assert topo.probed and topo.device_count == 2
    assert topo.details["source"] == "measured"
    for a, b in ((0, 1), (1, 0)):
        c = topo.get_connection(a, b)
        assert c.bandwidth_gbps > 0 and c.latency_us > 0 and not c.bidirectional
        assert c.method == coord.transfer_method(a, b)
        assert topo.details["pairs"][f"{a}->{b}"]["bytes"] == 1 << 20
    assert coord.topology().probed and coord.topology().get_connection(0, 1) == topo.get_connection(0, 1)
    path = Path(topo.details["cache_file"])
    assert path.parent == cache_dir and path.exists()
    again = probe_topology(manager, nbytes=1 << 20, reps=2)
    assert again.details["source"] == "cache"
    assert again.get_connection(0, 1) == topo.get_connection(0, 1) and again.probed
    fresh = probe_topology(manager, force=True, nbytes=1 << 20, reps=2)
    assert fresh.details["source"] == "measured" and fresh.last_updated >= topo.last_updated
    # a different device set (or driver) is another key; a damaged file is measured again
    assert probe.cache_path(manager) == str(path)
    path.write_text("{ not json")
    assert probe_topology(manager, nbytes=1 << 20, reps=2).details["source"] == "measured"
    doc = json.loads(path.read_text())
    doc["key"][1]["driver_version"] += 1
    path.write_text(json.dumps(doc))
    assert probe_topology(manager, nbytes=1 << 20, reps=2).details["source"] == "measured"
    off = probe_topology(manager, cache=False, nbytes=1 << 20, reps=2)
    assert "cache_file" not in off.details


def test_probe_notes_what_it_could_not_read(manager, cache_dir):
    topo = probe_topology(manager, force=True, nbytes=4096, reps=1)
    notes = " ".join(topo.details["notes"])
    caps = [s.capabilities for s in manager.slots]
    if any(c.pci_bus is None for c in caps):
        assert "VK_EXT_pci_bus_info" in notes
    if not any(c.vendor_id == 0x10DE for c in caps):
        assert "NVLink" in notes
    text = format_topology(topo)
    assert "bandwidth GB/s" in text and "-> GPU 1" in text and "latency us" in text


def test_probe_rejects_bad_arguments(manager, cache_dir):
    with pytest.raises(ValueError):
        probe_topology(manager, nbytes=6)
    with pytest.raises(ValueError):
        probe_topology(manager, reps=0)
    with pytest.raises(TypeError):
        probe_topology(manager, nbytes="big")


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv(probe.CACHE_ENV, str(tmp_path / "x"))
    assert probe.cache_dir() == str(tmp_path / "x")
    monkeypatch.delenv(probe.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert probe.cache_dir() == str(tmp_path / "xdg" / "vkmulti")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert probe.cache_dir() == str(tmp_path / "home" / ".cache" / "vkmulti")


@pytest.mark.virtual
def test_topology_cli(tmp_path):
    env = {**os.environ, probe.CACHE_ENV: str(tmp_path)}
    cmd = [sys.executable, "-m", "vkmulti", "topology", "--virtual", "2", "--bytes", "65536", "--reps", "2"]
    r = subprocess.run(cmd + ["--json"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["probed"] and doc["device_count"] == 2 and doc["details"]["source"] == "measured"
    pairs = {(c["source"], c["destination"]): c for c in doc["connections"]}
    assert pairs[(0, 1)]["bandwidth_gbps"] > 0 and pairs[(1, 0)]["bandwidth_gbps"] > 0
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "source: cache" in r.stdout and "-> GPU 1" in r.stdout and "GPU 1:" in r.stdout
    r = subprocess.run(cmd + ["--measure"], capture_output=True, text=True, env=env, timeout=300)
    assert "source: measured" in r.stdout
    r = subprocess.run([sys.executable, "-m", "vkmulti", "topology", "--reps", "0"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 2 and "--reps" in r.stderr


# ---- facts: sysfs, NVML, CUDA ----

def test_numa_node_from_sysfs(tmp_path):
    for bus, node in (("0000:06:00.0", "1\n"), ("0000:07:00.0", "-1\n"), ("0000:08:00.0", "x")):
        d = tmp_path / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(node)
    assert numa_node("0000:06:00.0", str(tmp_path)) == 1
    assert numa_node("0000:07:00.0", str(tmp_path)) is None   # no NUMA on this machine
    assert numa_node("0000:08:00.0", str(tmp_path)) is None
    assert numa_node("0000:09:00.0", str(tmp_path)) is None
    assert numa_node(None, str(tmp_path)) is None


def _fake_nvml(links_per_gpu, *, fail_init=False, switch=False):
    """A stand-in pynvml: GPU i has UUID GPU-<uuid i>, bus 0000000i:0i:00.0, and
    `links_per_gpu` active NVLink 4.0 links to the other GPU (or to a switch)."""
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass
    m.NVMLError = NVMLError
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_NVLINK_MAX_LINKS = 36
    m.NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    calls = []

    def init():
        calls.append("init")
        if fail_init:
            raise NVMLError("Driver Not Loaded")
    m.nvmlInit = init
    m.nvmlShutdown = lambda: calls.append("shutdown")
    uuids = {"GPU-aa": 0, "GPU-bb": 1}

    def handle(uuid):
        if uuid not in uuids:
            raise NVMLError("Not Found")
        return uuids[uuid]
    m.nvmlDeviceGetHandleByUUID = handle
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"0000000{h}:0{h + 6}:00.0".encode())

    def state(h, link):
        if link >= links_per_gpu:
            raise NVMLError("Not Supported")
        return 1
    m.nvmlDeviceGetNvLinkState = state
    m.nvmlDeviceGetNvLinkVersion = lambda h, link: 6   # NVML_NVLINK_VERSION_4_0
    m.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, link: 2 if switch else 0
    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(
        busId=f"0000000{1 - h}:0{7 - h}:00.0".encode())
    return m, calls


def test_nvlink_from_nvml(monkeypatch):
    fake, calls = _fake_nvml(18)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    links, note = nvlink_links(["aa", "bb", None], ["0000:06:00.0", "0000:07:00.0", None])
    assert note is None and calls == ["init", "shutdown"]
    assert links == {(0, 1): NvLinkFacts(18, 450.0), (1, 0): NvLinkFacts(18, 450.0)}
    fake, _ = _fake_nvml(12, switch=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    links, _ = nvlink_links(["aa", "bb"], [None, None])
    assert links[(0, 1)] == NvLinkFacts(0, 300.0, switch=True)


def test_nvml_absent_or_failing_is_said(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import fails: not installed
    links, note = nvlink_links(["aa"], [None])
    assert links == {} and "nvidia-ml-py is not installed" in note and "vkmulti[gpu]" in note
    fake, calls = _fake_nvml(4, fail_init=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    links, note = nvlink_links(["aa"], [None])
    assert links == {} and "Driver Not Loaded" in note


def test_probe_asks_nvml_on_nvidia_devices(manager, cache_dir, monkeypatch):
    """On NVIDIA devices the probe hands NVML the devices' UUIDs and PCI buses and
    records the links it reports (the pair's label follows _interconnect's rules)."""
    import dataclasses

    asked = []

    def fake_links(uuids, buses):
        asked.append((uuids, buses))
        return {(0, 1): NvLinkFacts(18, 450.0), (1, 0): NvLinkFacts(18, 450.0)}, None
    monkeypatch.setattr(probe, "nvlink_links", fake_links)
    for slot in manager.slots:
        monkeypatch.setattr(slot, "capabilities", dataclasses.replace(slot.capabilities, vendor_id=0x10DE))
    topo = probe.measure_topology(manager, nbytes=4096, reps=1)
    caps = [s.capabilities for s in manager.slots]
    assert asked == [([c.device_uuid for c in caps], [c.pci_bus for c in caps])]
    assert topo.details["nvlink"]["0->1"] == {"links": 18, "nominal_gbps": 450.0, "switch": False}
    want = probe._interconnect(caps[0], caps[1], topo.get_connection(0, 1).method, NvLinkFacts(18, 450.0))
    assert topo.get_connection(0, 1).interconnect == want
    assert not any("NVLink" in n for n in topo.details["notes"])


def test_interconnect_rules():
    def caps(uuid, driver="d"):
        return types.SimpleNamespace(device_uuid=uuid, driver_uuid=driver)
    rule = probe._interconnect
    assert rule(caps("a"), caps("a"), "dmabuf", None) == InterconnectType.SAME_DEVICE
    assert rule(caps("a"), caps("b"), "host_shared", NvLinkFacts(18, 450.0)) == InterconnectType.NVLINK
    assert rule(caps("a"), caps("b"), "cuda_peer", NvLinkFacts(0, 450.0, True)) == InterconnectType.NVSWITCH
    assert rule(caps("a"), caps("b"), "cuda_peer", None) == InterconnectType.PCIE
    assert rule(caps("a"), caps("b"), "host_shared", None) == InterconnectType.NONE


@pytest.mark.virtual
def test_compute_capability_through_the_cuda_driver(tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler for the stand-in CUDA driver")
    lib = tmp_path / "libcuda_mock.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(HERE / "mock_libcuda.c"), "-lpthread"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    code = ("from vkmulti.device.cuda import cuda_devices, cuda_device_for\n"
            "d = cuda_devices()\n"
            "print([(x.compute_capability, x.multiprocessor_count) for x in d])\n"
            "print(cuda_device_for('c1c1c1c1-c1c1-c1c1-c1c1-c1c1c1c1c1c1').ordinal)\n"
            "print(cuda_device_for('00000000-0000-0000-0000-000000000000'))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "VKMULTI_LIBCUDA": str(lib)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["[((9, 0), 132), ((9, 0), 132)]", "1", "None"]


# ---- ringkernel's CrossDeviceTransfer descriptor ----

def test_kernels_cross_device_transfer_runs_through_the_engine(manager):
    n = 256 << 10
    data = np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8)
    with Buffer(manager.slot(0), n) as a, Buffer(manager.slot(1), n) as b:
        a.upload(data)
        t = CrossDeviceTransfer(0, 1, n)
        assert t.use_p2p and not t.without_p2p().use_p2p and t.use_p2p
        method = t.run(manager, a, b, timeout=60)
        assert method == select_transfer_method(_Src(0), manager.capabilities, dst_index=1)
        assert np.array_equal(b.download(), data)
        b.upload(np.zeros(n, np.uint8))
        slow = t.without_p2p()
        assert slow.method(manager) in ("host_shared", "staging_copy")
        slow.run(manager, a, b, timeout=60)
        assert np.array_equal(b.download(), data)
    assert CrossDeviceTransfer(1, 1, 4).method(manager) == "none"
    with pytest.raises(IndexError):
        CrossDeviceTransfer(0, 7, 4).method(manager)
    with pytest.raises(ValueError):
        CrossDeviceTransfer(0, 1, -4)


def test_probe_falls_back_to_staging_when_the_best_method_fails(manager, monkeypatch):
    from vkmulti import TransferError

    real = probe._measure_pair
    failed = []

    def flaky(src, dst, method, *rest):
        if method != "staging_copy":
            failed.append(method)
            raise TransferError("link broke")
        return real(src, dst, method, *rest)
    monkeypatch.setattr(probe, "_measure_pair", flaky)
    topo = probe.measure_topology(manager, nbytes=4096, reps=1)
    for a, b in ((0, 1), (1, 0)):
        assert topo.get_connection(a, b).method == "staging_copy" and topo.get_connection(a, b).bandwidth_gbps > 0
    if failed:
        assert any("link broke" in n and "staging_copy instead" in n for n in topo.details["notes"])
