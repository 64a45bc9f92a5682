"""Facts about real devices for the coordinator and the topology probe: memory
(VK_EXT_memory_budget or heap sizes), CUDA compute capability, PCI bus and
NUMA node (sysfs), NVLink (NVML through nvidia-ml-py, optional), and the
transfer method of every device pair. Nothing here guesses: a fact that
cannot be read is None, with a note saying why."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import vulkan as vk

from ..._core.files import read_named_file
from ...device.capabilities import EXT_MEMORY_BUDGET, DeviceCapabilities
from ...device.cuda import cuda_device_for
from ...transfer.methods import select_transfer_method
from .config import Backend
from .records import DeviceInfo

log = logging.getLogger(__name__)
_ffi = vk.ffi

__all__ = ["memory_figures", "device_info_for_slot", "pair_transfer_methods", "numa_node", "nvlink_links",
           "NvLinkFacts", "NVLINK_GBPS_PER_LINK"]

NVIDIA_VENDOR_ID = 0x10DE
#: GB/s per NVLink link and direction by NVML's nvmlNvlinkVersion_t (1: NVLink 1.0,
#: 2: 2.0, 3: 2.2, 4: 3.0, 5: 3.1, 6: 4.0, 7: 5.0, 8: 6.0): 20 for 1.0, 25 for 2.x-4.0,
#: 50 from 5.0 (ringkernel-cuda's per-generation figures). A nominal figure only:
#: the probe measures the bandwidth it reports.
NVLINK_GBPS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 25.0, 7: 50.0, 8: 50.0}


# ---- memory ---------------------------------------------------------------------

def _memory_budget(physical_device: Any) -> tuple[list[int], list[int]]:
    """(heap budget, heap usage) per heap from VK_EXT_memory_budget."""
    budget = _ffi.new("VkPhysicalDeviceMemoryBudgetPropertiesEXT*")
    budget.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT
    props = _ffi.new("VkPhysicalDeviceMemoryProperties2*")
    props.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2
    props.pNext = budget
    vk.vkGetPhysicalDeviceMemoryProperties2(physical_device, props)
    n = props.memoryProperties.memoryHeapCount
    return [int(budget.heapBudget[i]) for i in range(n)], [int(budget.heapUsage[i]) for i in range(n)]


def memory_figures(slot: Any) -> tuple[int, int, str]:
    """(total, available, source) of a slot's largest device-local heap.

    With VK_EXT_memory_budget enabled on the slot's device, available is the
    heap's budget minus its usage as the driver reports them (refreshed on
    every call); without it, available is the heap size (no usage is known)
    and `source` says so.
    """
    caps: DeviceCapabilities = slot.capabilities
    heaps = [h for h in caps.memory_heaps if h.device_local] or list(caps.memory_heaps)
    if not heaps:
        return 0, 0, "no memory heaps reported"
    heap = max(heaps, key=lambda h: h.size)
    if EXT_MEMORY_BUDGET in slot.enabled_extensions:
        budgets, usage = _memory_budget(slot.physical_device)
        if heap.index < len(budgets) and budgets[heap.index] > 0:
            available = max(0, min(budgets[heap.index], heap.size) - usage[heap.index])
            return heap.size, available, EXT_MEMORY_BUDGET
    why = "not enabled" if caps.has(EXT_MEMORY_BUDGET) else "not available"
    return heap.size, heap.size, f"heap size ({EXT_MEMORY_BUDGET} {why} on {caps.name!r}: usage unknown)"


# ---- one device -------------------------------------------------------------------

def _max_threads_per_block(slot: Any) -> int:
    try:
        props = vk.vkGetPhysicalDeviceProperties(slot.physical_device)   # (kept: owns `limits`)
        return int(props.limits.maxComputeWorkGroupInvocations)
    except Exception:   # noqa: BLE001 - a missing limit keeps the seed's default
        return 1024


def device_info_for_slot(slot: Any) -> DeviceInfo:
    """A DeviceInfo with the slot's real figures (p2p_capable is left to the caller,
    who knows the pairs)."""
    caps: DeviceCapabilities = slot.capabilities
    total, available, _ = memory_figures(slot)
    backend = Backend.CPU if caps.device_type == "cpu" else Backend.VULKAN
    info = DeviceInfo(slot.index, slot.name or caps.name, backend, total_memory=total, available_memory=available,
                      max_threads_per_block=_max_threads_per_block(slot), device_uuid=caps.device_uuid,
                      pci_bus=caps.pci_bus)
    if caps.vendor_id == NVIDIA_VENDOR_ID:
        cu = cuda_device_for(caps.device_uuid)
        if cu is not None:
            info.compute_capability = cu.compute_capability
            if cu.multiprocessor_count:
                info.multiprocessor_count = cu.multiprocessor_count
    return info


class _Source:
    __slots__ = ("device_index",)

    def __init__(self, index: int):
        self.device_index = index


def pair_transfer_methods(manager: Any) -> dict[tuple[int, int], str]:
    """{(src, dst): the method select_transfer_method picks} for every ordered pair."""
    caps = manager.capabilities
    n = manager.device_count
    return {(a, b): select_transfer_method(_Source(a), caps, dst_index=b)
            for a in range(n) for b in range(n) if a != b}


# ---- PCI and NUMA -------------------------------------------------------------------

def numa_node(pci_bus: str | None, sysfs_root: str = "/sys") -> int | None:
    """The NUMA node of a PCI device ("0000:06:00.0") from sysfs; None when
    unknown (no bus id, no sysfs entry, or -1: a machine without NUMA)."""
    if not pci_bus:
        return None
    path = os.path.join(sysfs_root, "bus", "pci", "devices", pci_bus.lower(), "numa_node")
    try:   # (sysfs entries are links: followed; a FIFO or a huge file is refused, never waited on)
        node = int(read_named_file(path, 64, "numa_node").strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _bus_key(bus_id: str | bytes | None) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of "0000:06:00.0" or NVML's "00000000:06:00.0"."""
    if bus_id is None:
        return None
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode(errors="replace")
    try:
        dom, bus, rest = bus_id.strip().split(":")
        dev, fn = rest.split(".")
        return int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return None


# ---- NVLink through NVML --------------------------------------------------------------

@dataclass(frozen=True)
class NvLinkFacts:
    """NVLink between two GPUs as NVML reports it: active links and their summed
    per-direction bandwidth; `switch` when the links go to an NVSwitch."""
    links: int
    gbps: float
    switch: bool = False


def nvlink_links(uuids: list[str | None], pci_buses: list[str | None]) -> \
        tuple[dict[tuple[int, int], NvLinkFacts], str | None]:
    """NVLink per ordered device pair from NVML, and a note when NVML was not
    used (nvidia-ml-py missing, NVML failing). Devices are matched by UUID
    (Vulkan's deviceUUID is the NVML GPU UUID), link ends by PCI bus id."""
    try:
        import pynvml
    except ImportError:
        return {}, "nvidia-ml-py is not installed (pip install 'vkmulti[gpu]'): NVLink was not probed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:   # noqa: BLE001 - NVMLError or a missing libnvidia-ml
        return {}, f"NVML did not initialise ({exc}): NVLink was not probed"
    try:
        return _nvlink_links(pynvml, uuids, pci_buses), None
    except Exception as exc:   # noqa: BLE001
        return {}, f"NVML failed while reading NVLink ({type(exc).__name__}: {exc}): NVLink was not probed"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as exc:   # noqa: BLE001 - the answer above stands
            log.warning("NVML shutdown failed after the NVLink probe (%r)", exc)


def _nvlink_links(nvml: Any, uuids: list[str | None], pci_buses: list[str | None]) -> \
        dict[tuple[int, int], NvLinkFacts]:
    handles: dict[int, Any] = {}
    bus_of: dict[tuple[int, int, int, int], int] = {}
    for i, uuid in enumerate(uuids):
        if not uuid:
            continue
        try:
            h = nvml.nvmlDeviceGetHandleByUUID("GPU-" + uuid)
        except nvml.NVMLError:
            continue
        handles[i] = h
        key = _bus_key(nvml.nvmlDeviceGetPciInfo(h).busId) or _bus_key(pci_buses[i])
        if key is not None:
            bus_of[key] = i
    direct: dict[tuple[int, int], list[float]] = {}
    to_switch: dict[int, float] = {}
    switch_type = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
    for i, h in handles.items():
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nvml.nvmlDeviceGetNvLinkState(h, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                version = nvml.nvmlDeviceGetNvLinkVersion(h, link)
            except nvml.NVMLError:
                continue   # no such link on this GPU
            gbps = NVLINK_GBPS_PER_LINK.get(int(version), 25.0)
            remote_type = None
            if hasattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType"):
                try:
                    remote_type = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
                except nvml.NVMLError:
                    remote_type = None
            if remote_type == switch_type:
                to_switch[i] = to_switch.get(i, 0.0) + gbps
                continue
            get_remote = getattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2", None) or \
                nvml.nvmlDeviceGetNvLinkRemotePciInfo
            j = bus_of.get(_bus_key(get_remote(h, link).busId))   # type: ignore[arg-type]
            if j is not None and j != i:
                direct.setdefault((i, j), []).append(gbps)
    out = {pair: NvLinkFacts(len(v), sum(v)) for pair, v in direct.items()}
    for i, gi in to_switch.items():
        for j, gj in to_switch.items():
            if i != j and (i, j) not in out:
                out[(i, j)] = NvLinkFacts(0, min(gi, gj), switch=True)
    return out
