"""Probed facts about physical devices: no policy, only what the driver reports."""
from __future__ import annotations

import dataclasses
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import vulkan as vk
from vulkan._vulkan import lib

from .._core import vkapi
from .._core.checks import is_int, short_repr, short_text
from .._core.handles import cstr, to_cffi
from ..errors import raise_for_result
from .._core.vktypes import VkInstance, VkPhysicalDevice
from .instance import Instance
from .._core.reprs import compact_repr

_ffi = vk.ffi

#: The device extensions vkmulti looks for (and enables where present).
EXT_MEMORY_FD = "VK_KHR_external_memory_fd"
EXT_MEMORY_HOST = "VK_EXT_external_memory_host"
EXT_DMA_BUF = "VK_EXT_external_memory_dma_buf"
EXT_SEMAPHORE_FD = "VK_KHR_external_semaphore_fd"
EXT_FENCE_FD = "VK_KHR_external_fence_fd"
EXT_PCI_BUS_INFO = "VK_EXT_pci_bus_info"
EXT_MEMORY_BUDGET = "VK_EXT_memory_budget"
EXT_TIMELINE = "VK_KHR_timeline_semaphore"
EXT_SYNC2 = "VK_KHR_synchronization2"
EXT_DRM = "VK_EXT_physical_device_drm"
EXT_HOST_IMAGE_COPY = "VK_EXT_host_image_copy"
TRACKED_EXTENSIONS = (EXT_MEMORY_FD, EXT_MEMORY_HOST, EXT_DMA_BUF, EXT_SEMAPHORE_FD, EXT_FENCE_FD,
                      EXT_PCI_BUS_INFO, EXT_MEMORY_BUDGET, EXT_TIMELINE, EXT_SYNC2, EXT_DRM,
                      EXT_HOST_IMAGE_COPY)

#: VkPhysicalDeviceType -> the name DeviceCapabilities.device_type gives it.
DEVICE_TYPES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}
_VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel", 0x13B5: "ARM", 0x5143: "Qualcomm",
            0x106B: "Apple", 0x10005: "Mesa"}
_MEMORY_FLAGS = {1: "DEVICE_LOCAL", 2: "HOST_VISIBLE", 4: "HOST_COHERENT", 8: "HOST_CACHED",
                 16: "LAZILY_ALLOCATED", 32: "PROTECTED"}
_QUEUE_FLAGS = {1: "graphics", 2: "compute", 4: "transfer", 8: "sparse", 16: "protected",
                32: "video-decode", 64: "video-encode", 256: "optical-flow"}


def _version(v: int) -> str:
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


def _uuid(raw: Any) -> str:
    b = bytes(_ffi.buffer(raw, 16)) if not isinstance(raw, (bytes, list)) else bytes(raw)
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _flag_names(bits: int, table: dict[int, str]) -> tuple[str, ...]:
    return tuple(name for bit, name in table.items() if bits & bit)


#: Vulkan 1.0 shader features a kernel's SPIR-V may need (the Int64, Float64 and Int16
#: capabilities): the devices vkmulti makes enable those their GPU offers.
SHADER_FEATURES = ("shaderInt64", "shaderFloat64", "shaderInt16")


@dataclass(frozen=True)
class QueueFamilies:
    """Which queue families a device's queues come from.

    `graphics` and `present` as in the seed; `compute` and `transfer` name
    dedicated families (None when the device has none or they are not used).
    """

    __repr__ = compact_repr
    graphics: int
    present: int
    compute: int | None = None
    transfer: int | None = None


@dataclass(frozen=True)
class QueueFamilyInfo:
    index: int
    flags: tuple[str, ...]
    queue_count: int
    timestamp_valid_bits: int

    @property
    def graphics(self) -> bool:
        return "graphics" in self.flags

    @property
    def compute(self) -> bool:
        return "compute" in self.flags

    @property
    def transfer(self) -> bool:
        # Graphics and compute families implicitly support transfer.
        return "transfer" in self.flags or self.graphics or self.compute


@dataclass(frozen=True)
class MemoryHeap:
    index: int
    size: int
    device_local: bool


@dataclass(frozen=True)
class MemoryType:
    index: int
    heap: int
    flags: tuple[str, ...]


@dataclass(frozen=True)
class DeviceCapabilities:
    """Everything vkmulti reads off one physical device."""
    name: str
    device_type: str
    vendor_id: int
    vendor: str
    device_id: int
    driver_name: str
    driver_info: str
    driver_version: int
    api_version: str
    device_uuid: str
    driver_uuid: str
    pci_bus: str | None
    memory_heaps: tuple[MemoryHeap, ...]
    memory_types: tuple[MemoryType, ...]
    queue_families: tuple[QueueFamilyInfo, ...]
    graphics_family: int | None
    dedicated_compute_family: int | None
    dedicated_transfer_family: int | None
    extensions: frozenset[str]
    min_imported_host_pointer_alignment: int | None
    timeline_semaphore: bool
    synchronization2: bool
    timestamp_period: float
    #: Of SHADER_FEATURES, those the device offers (the devices vkmulti makes enable them)
    shader_features: frozenset[str] = frozenset()

    def has(self, extension: str) -> bool:
        """Whether the driver offers device extension `extension` (not whether a device enabled it)."""
        return extension in self.extensions

    def __repr__(self) -> str:
        return (f"DeviceCapabilities({short_text(self.name)}, {self.device_type}, {self.vendor}, "
                f"Vulkan {self.api_version}, {sum(self.tracked_extensions.values())} of "
                f"{len(TRACKED_EXTENSIONS)} tracked extensions)")

    @property
    def tracked_extensions(self) -> dict[str, bool]:
        """Each extension vkmulti looks for, and whether the driver offers it."""
        return {e: e in self.extensions for e in TRACKED_EXTENSIONS}

    @property
    def api_version_tuple(self) -> tuple[int, int, int]:
        """The device's Vulkan version as (major, minor, patch)."""
        a, b, c = (int(x) for x in self.api_version.split("."))
        return a, b, c

    def to_dict(self) -> dict[str, Any]:
        """The capabilities as plain JSON-ready data (what `python -m vkmulti info --json` prints)."""
        d = dataclasses.asdict(self)
        d["extensions"] = self.tracked_extensions
        d["shader_features"] = sorted(self.shader_features)
        return d


def device_extensions(physical_device: VkPhysicalDevice | int) -> frozenset[str]:
    pd = to_cffi(physical_device, "VkPhysicalDevice")
    return frozenset(cstr(p.extensionName) for p in vkapi.vkEnumerateDeviceExtensionProperties(pd, None))


def _new(ctype: str, stype: int, pnext: Any = None) -> Any:
    s = _ffi.new(ctype + "*")
    s.sType = stype
    if pnext is not None:
        s.pNext = pnext
    return s


def probe_device(physical_device: VkPhysicalDevice | int) -> DeviceCapabilities:
    """Read the capabilities of `physical_device` (a handle or int)."""
    pd = to_cffi(physical_device, "VkPhysicalDevice")
    exts = device_extensions(pd)
    id_props = _new("VkPhysicalDeviceIDProperties", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES)
    drv = _new("VkPhysicalDeviceDriverProperties", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, id_props)
    chain = drv
    host = pci = None
    if EXT_MEMORY_HOST in exts:
        host = _new("VkPhysicalDeviceExternalMemoryHostPropertiesEXT",
                    vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT, chain)
        chain = host
    if EXT_PCI_BUS_INFO in exts:
        pci = _new("VkPhysicalDevicePCIBusInfoPropertiesEXT",
                   vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PCI_BUS_INFO_PROPERTIES_EXT, chain)
        chain = pci
    props2 = _new("VkPhysicalDeviceProperties2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, chain)
    vk.vkGetPhysicalDeviceProperties2(pd, props2)
    p = props2.properties

    timeline = _new("VkPhysicalDeviceTimelineSemaphoreFeatures",
                    vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES)
    sync2 = _new("VkPhysicalDeviceSynchronization2Features",
                 vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SYNCHRONIZATION_2_FEATURES, timeline)
    api = p.apiVersion
    has_sync2_struct = api >= vk.VK_MAKE_VERSION(1, 3, 0) or EXT_SYNC2 in exts
    feats = _new("VkPhysicalDeviceFeatures2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                 sync2 if has_sync2_struct else timeline)
    vk.vkGetPhysicalDeviceFeatures2(pd, feats)

    mem = vk.vkGetPhysicalDeviceMemoryProperties(pd)
    heaps = tuple(MemoryHeap(i, int(mem.memoryHeaps[i].size), bool(mem.memoryHeaps[i].flags & 1))
                  for i in range(mem.memoryHeapCount))
    types = tuple(MemoryType(i, int(mem.memoryTypes[i].heapIndex),
                             _flag_names(mem.memoryTypes[i].propertyFlags, _MEMORY_FLAGS))
                  for i in range(mem.memoryTypeCount))
    fams = tuple(QueueFamilyInfo(i, _flag_names(q.queueFlags, _QUEUE_FLAGS), int(q.queueCount),
                                 int(q.timestampValidBits))
                 for i, q in enumerate(vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)))
    graphics = next((f.index for f in fams if f.graphics), None)
    if graphics is None:
        graphics = next((f.index for f in fams if f.compute), None)
    compute = next((f.index for f in fams if f.compute and not f.graphics), None)
    transfer = next((f.index for f in fams if "transfer" in f.flags and not f.graphics and not f.compute),
                    None)
    return DeviceCapabilities(
        name=cstr(p.deviceName),
        device_type=DEVICE_TYPES.get(p.deviceType, str(p.deviceType)),
        vendor_id=int(p.vendorID),
        vendor=_VENDORS.get(p.vendorID, f"0x{p.vendorID:04x}"),
        device_id=int(p.deviceID),
        driver_name=cstr(drv.driverName),
        driver_info=cstr(drv.driverInfo),
        driver_version=int(p.driverVersion),
        api_version=_version(api),
        device_uuid=_uuid(id_props.deviceUUID),
        driver_uuid=_uuid(id_props.driverUUID),
        pci_bus=(f"{pci.pciDomain:04x}:{pci.pciBus:02x}:{pci.pciDevice:02x}.{pci.pciFunction:x}"
                 if pci is not None else None),
        memory_heaps=heaps,
        memory_types=types,
        queue_families=fams,
        graphics_family=graphics,
        dedicated_compute_family=compute,
        dedicated_transfer_family=transfer,
        extensions=exts,
        min_imported_host_pointer_alignment=(int(host.minImportedHostPointerAlignment)
                                             if host is not None else None),
        timeline_semaphore=bool(timeline.timelineSemaphore),
        synchronization2=bool(sync2.synchronization2) if has_sync2_struct else False,
        timestamp_period=float(p.limits.timestampPeriod),
        shader_features=frozenset(f for f in SHADER_FEATURES if getattr(feats.features, f)),
    )


def _device_group_sizes(instance: Any) -> list[int]:
    """Devices per device group. (The `vulkan` package's wrapper leaves the
    output structs' sType unset, which the validation layer rejects.)"""
    count = _ffi.new("uint32_t*")
    raise_for_result(lib.vkEnumeratePhysicalDeviceGroups(instance, count, _ffi.NULL),
                     "vkEnumeratePhysicalDeviceGroups")
    if count[0] == 0:
        return []
    groups = _ffi.new("VkPhysicalDeviceGroupProperties[]", count[0])
    for i in range(count[0]):
        groups[i].sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_GROUP_PROPERTIES
    r = lib.vkEnumeratePhysicalDeviceGroups(instance, count, groups)
    if r != 5:   # VK_INCOMPLETE: a group appeared meanwhile; the ones read are enough
        raise_for_result(r, "vkEnumeratePhysicalDeviceGroups")
    return [int(groups[i].physicalDeviceCount) for i in range(count[0])]


@dataclass(frozen=True)
class RenderCapabilities:
    """Probed facts for the engine (the seed's fields), plus per-device detail.

    `devices[i]` and `enabled_extensions[i]` describe slot i of a
    MultiDeviceManager (filled by the manager); `probe()` fills one device.
    """
    free_threaded: bool = False
    gil_disabled_build: bool = False
    physical_device_count: int = 1
    device_group: bool = False
    external_memory_fd: bool = False
    external_memory_fd_enabled: bool = False
    dedicated_compute_qf: int | None = None
    dedicated_transfer_qf: int | None = None
    gpu_timing: bool = False
    multi_draw_indirect: bool = False
    image_cube_array: bool = False
    fill_mode_non_solid: bool = False
    independent_blend: bool = False
    texture_compression_bc: bool = False
    texture_compression_etc2: bool = False
    texture_compression_astc_ldr: bool = False
    limits: dict[str, float] = field(default_factory=dict)
    devices: tuple[DeviceCapabilities, ...] = ()
    enabled_extensions: tuple[frozenset[str], ...] = ()

    def __repr__(self) -> str:
        names = ", ".join(short_text(d.name, 20) for d in self.devices[:4]) + (", ..." if len(self.devices) > 4 else "")
        return (f"RenderCapabilities(physical_device_count={self.physical_device_count}, "
                f"external_memory_fd_enabled={self.external_memory_fd_enabled}, devices=[{names}])")

    def meets(self, *, features: list[str] | tuple[str, ...] | None = None,
              limits: dict[str, float] | None = None) -> bool:
        """True when every named feature is true and every limit is at least the value given."""
        names = {f.name for f in dataclasses.fields(self)}
        for feat in features or ():
            if feat not in names or not getattr(self, feat):
                return False
        for key, want in (limits or {}).items():
            have = self.limits.get(key)
            if have is None or have < want:
                return False
        return True

    @classmethod
    def probe(cls, instance: Instance | VkInstance | int,
              physical_device: VkPhysicalDevice | int) -> "RenderCapabilities":
        """Probe one physical device (and the instance's device count/groups)."""
        inst = instance.handle if isinstance(instance, Instance) else to_cffi(instance, "VkInstance")
        pd = to_cffi(physical_device, "VkPhysicalDevice")
        dev = probe_device(pd)
        count = len(vkapi.vkEnumeratePhysicalDevices(inst))
        group = any(n > 1 for n in _device_group_sizes(inst))
        f = vk.vkGetPhysicalDeviceFeatures(pd)
        props = vk.vkGetPhysicalDeviceProperties(pd)   # (kept while `lim`, which points into it, is read)
        lim = props.limits
        limits = {name: getattr(lim, name) for name in (
            "maxImageDimension2D", "maxComputeWorkGroupInvocations", "maxStorageBufferRange",
            "maxMemoryAllocationCount", "optimalBufferCopyOffsetAlignment",
            "optimalBufferCopyRowPitchAlignment", "nonCoherentAtomSize")}
        gil_disabled = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
        is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
        return cls(
            free_threaded=gil_disabled and is_gil_enabled is not None and not is_gil_enabled(),
            gil_disabled_build=gil_disabled,
            physical_device_count=count,
            device_group=group,
            external_memory_fd=dev.has(EXT_MEMORY_FD),
            dedicated_compute_qf=dev.dedicated_compute_family,
            dedicated_transfer_qf=dev.dedicated_transfer_family,
            gpu_timing=dev.timestamp_period > 0,
            multi_draw_indirect=bool(f.multiDrawIndirect),
            image_cube_array=bool(f.imageCubeArray),
            fill_mode_non_solid=bool(f.fillModeNonSolid),
            independent_blend=bool(f.independentBlend),
            texture_compression_bc=bool(f.textureCompressionBC),
            texture_compression_etc2=bool(f.textureCompressionETC2),
            texture_compression_astc_ldr=bool(f.textureCompressionASTC_LDR),
            limits=limits,
            devices=(dev,),
        )


@runtime_checkable
class QueueFamiliesLike(Protocol):
    """What a queue-families object needs (SimVX's own QueueFamilies has only these
    two fields); vkmulti's QueueFamilies adds compute and transfer."""
    graphics: int
    present: int


def as_queue_families(value: Any, label: str = "queue families") -> QueueFamilies:
    """A QueueFamilies from any object with int `graphics` and `present` fields (and
    optional `compute` / `transfer`); TypeError naming what is missing."""
    if isinstance(value, QueueFamilies):
        return value
    if not isinstance(value, QueueFamiliesLike):
        raise TypeError(f"{label} must have int fields graphics and present (QueueFamilies or the seed's), "
                        f"got {type(value).__name__}")
    fields = {name: getattr(value, name, None) for name in ("graphics", "present", "compute", "transfer")}
    for name, v in fields.items():
        if (v is not None or name in ("graphics", "present")) and not (is_int(v) and v >= 0):  # type: ignore[operator]
            raise TypeError(f"{label}.{name} must be a non-negative int, got {short_repr(v)}")
    return QueueFamilies(**fields)  # type: ignore[arg-type]


#: The fields of the seed's RenderCapabilities (SimVX's, vkmulti's share them).
SEED_CAPABILITY_FIELDS = (
    "free_threaded", "gil_disabled_build", "physical_device_count", "device_group", "external_memory_fd",
    "external_memory_fd_enabled", "dedicated_compute_qf", "dedicated_transfer_qf", "gpu_timing",
    "multi_draw_indirect", "image_cube_array", "fill_mode_non_solid", "independent_blend", "texture_compression_bc",
    "texture_compression_etc2", "texture_compression_astc_ldr", "limits")


@runtime_checkable
class RenderCapabilitiesLike(Protocol):
    """What a capabilities object needs to be taken for RenderCapabilities: the
    seed's DMABUF gate, all that select_transfer_method reads (SimVX's own
    RenderCapabilities has it); its other seed fields are copied where present."""
    external_memory_fd_enabled: bool


def as_render_capabilities(value: Any, label: str = "capabilities") -> "RenderCapabilities | None":
    """RenderCapabilities from any object with the seed's fields (those it has are
    copied; per-device detail only from vkmulti's own); None stays None."""
    if value is None or isinstance(value, RenderCapabilities):
        return value
    if not isinstance(value, RenderCapabilitiesLike):
        raise TypeError(f"{label} must be RenderCapabilities (vkmulti's or the seed's: at least the field "
                        f"external_memory_fd_enabled), got {type(value).__name__}")
    kw = {name: getattr(value, name) for name in SEED_CAPABILITY_FIELDS if hasattr(value, name)}
    count = kw.get("physical_device_count", 1)
    if not is_int(count) or count < 0:
        raise TypeError(f"{label}.physical_device_count must be a non-negative int, got {short_repr(count)}")
    if not isinstance(kw.get("limits", {}), dict):
        kw["limits"] = dict(kw["limits"])
    return RenderCapabilities(**kw)
