"""The capability probe and `python -m vkmulti info` on the virtual pair."""
from __future__ import annotations

import json

import pytest
import subprocess
import sys

from vkmulti import Instance, TransferMethod, probe_device, supported_methods
from vkmulti.device.capabilities import EXT_MEMORY_HOST
from vkmulti.transfer import method_support


@pytest.mark.virtual
def test_probe_device_facts():
    with Instance() as inst:
        caps = [probe_device(p) for p in inst.physical_devices()]
    a = caps[0]
    assert a.device_type == "cpu" and "llvmpipe" in a.name
    assert len(a.device_uuid) == 36 and a.device_uuid == caps[1].device_uuid
    assert a.min_imported_host_pointer_alignment and a.min_imported_host_pointer_alignment >= 4096
    assert a.has(EXT_MEMORY_HOST) and a.timeline_semaphore
    assert a.graphics_family == 0 and a.queue_families[0].graphics and a.queue_families[0].transfer
    assert any(h.device_local for h in a.memory_heaps)
    assert a.pci_bus is None   # lavapipe has no VK_EXT_pci_bus_info


@pytest.mark.virtual
def test_pair_methods_on_virtual_pair():
    with Instance() as inst:
        a, b = (probe_device(p) for p in inst.physical_devices())
    # same UUIDs: opaque-fd memory may cross, so DMABUF is possible
    assert supported_methods(a, b) == [TransferMethod.DMABUF, TransferMethod.HOST_SHARED,
                                       TransferMethod.STAGING_COPY]
    # with the extension not enabled, the reason says so
    why = method_support(TransferMethod.HOST_SHARED, a, b, frozenset(), frozenset())
    assert why and EXT_MEMORY_HOST in why and "created without it" in why and "device_requirements" in why


def test_cli_info_json():
    out = subprocess.run([sys.executable, "-m", "vkmulti", "info", "--json"], check=True,
                         capture_output=True, text=True).stdout
    info = json.loads(out)
    assert len(info["devices"]) == 2
    d = info["devices"][0]
    for key in ("name", "api_version", "device_uuid", "driver_uuid", "memory_heaps", "queue_families",
                "extensions", "min_imported_host_pointer_alignment"):
        assert key in d
    assert {(p["src"], p["dst"]) for p in info["pairs"]} == {(0, 1), (1, 0)}
    assert "host_shared" in info["pairs"][0]["methods"]


def test_cli_info_table():
    out = subprocess.run([sys.executable, "-m", "vkmulti", "info"], check=True, capture_output=True,
                         text=True).stdout
    assert "GPU 0:" in out and "GPU 1:" in out and "Transfer methods per pair" in out


def test_cli_bad_argument():
    r = subprocess.run([sys.executable, "-m", "vkmulti", "info", "--virtual", "-1"], capture_output=True, text=True)
    assert r.returncode == 2 and "--virtual" in r.stderr
