"""What an engine that creates its own VkDevice should enable for vkmulti's fast paths.

Vulkan cannot be asked which extensions or features a VkDevice was created
with, so an engine that owns its device (1) asks `device_requirements()` what
to enable, (2) creates its device with that, and (3) tells
`MultiDeviceManager(..., primary_extensions=req.extensions,
primary_features=req.features)` what it enabled. vkmulti trusts that answer;
a transfer method whose extension the engine left out is not chosen (one log
line says which extension and points here).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

import vulkan as vk

from ..device.capabilities import (EXT_DMA_BUF, EXT_MEMORY_BUDGET, EXT_MEMORY_FD, EXT_MEMORY_HOST, EXT_TIMELINE,
                                   DeviceCapabilities, QueueFamilies, probe_device)
from ..device.logical import default_queue_families
from ..errors import UnsupportedError
from .methods import TransferMethod, method_problem

if TYPE_CHECKING:
    from .._core.vktypes import VkPhysicalDevice, VkStruct

__all__ = ["DeviceRequirements", "device_requirements", "FEATURE_STRUCTS", "REQUIRED_FEATURES"]

#: The device features vkmulti needs, with the Vulkan struct each is a member of
#: (chain it into VkDeviceCreateInfo.pNext with the member set to VK_TRUE;
#: DeviceRequirements.feature_chain() builds that chain).
FEATURE_STRUCTS = {"timelineSemaphore": "VkPhysicalDeviceTimelineSemaphoreFeatures"}
_STYPES = {"VkPhysicalDeviceTimelineSemaphoreFeatures":
           "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES"}
REQUIRED_FEATURES = ("timelineSemaphore",)

#: What each extension vkmulti asks for gives it.
EXTENSION_USES = {
    EXT_TIMELINE: "timeline semaphores on a Vulkan 1.1 device (core from 1.2)",
    EXT_MEMORY_HOST: "host_shared transfers (one host allocation imported into both GPUs) and zero-copy "
                     "host uploads/downloads",
    EXT_MEMORY_FD: "dmabuf (exported memory) and cuda_peer (NVLink through CUDA) transfers",
    EXT_DMA_BUF: "dmabuf transfers between devices of different drivers or UUIDs",
    EXT_MEMORY_BUDGET: "live free-memory figures for kernel placement",
}


@dataclass(frozen=True)
class DeviceRequirements:
    """What vkmulti wants enabled on one device (device_requirements' answer).

    `extensions`: device extensions to enable (each one the driver offers);
    `features`: feature names (members of the structs in `feature_structs`) to
    set to VK_TRUE; `queue_families`: the families to create queues in (the
    seed's QueueFamilies: pass it as `primary_queue_families`, and a queue of
    `transfer` (and `compute`) as primary_transfer_queue (primary_compute_queue)
    where it is not None); `uses`: what each extension gives.
    """
    device: str
    extensions: tuple[str, ...]
    features: tuple[str, ...]
    queue_families: QueueFamilies
    feature_structs: dict[str, str] = field(default_factory=dict)
    uses: dict[str, str] = field(default_factory=dict)

    @property
    def family_indices(self) -> tuple[int, ...]:
        """The distinct queue families to create one queue each in, graphics first."""
        qf = self.queue_families
        return tuple(dict.fromkeys(f for f in (qf.graphics, qf.present, qf.compute, qf.transfer) if f is not None))

    def feature_chain(self, pnext: VkStruct | None = None) -> VkStruct | None:
        """The feature structs (`vulkan` package objects) with every feature in
        `features` set to VK_TRUE, chained in front of `pnext`: pass the result as
        VkDeviceCreateInfo.pNext (or `pnext` your own chain to append it)."""
        by_struct: dict[str, list[str]] = {}
        for name in self.features:
            by_struct.setdefault(self.feature_structs.get(name, FEATURE_STRUCTS[name]), []).append(name)
        head = pnext
        for struct, names in by_struct.items():
            head = getattr(vk, struct)(sType=getattr(vk, _STYPES[struct]), pNext=head,
                                       **{n: vk.VK_TRUE for n in names})
        return head

    def __repr__(self) -> str:
        return (f"DeviceRequirements({self.device!r}, extensions={list(self.extensions)}, "
                f"features={list(self.features)}, families={list(self.family_indices)})")[:199]


def device_requirements(physical_device: VkPhysicalDevice | int,
                        peers: Iterable[VkPhysicalDevice | int] = ()) -> DeviceRequirements:
    """The device extensions, features and queue families vkmulti wants enabled on
    `physical_device` (a `vulkan` package handle or an int).

    `peers`: the physical devices it will be paired with. Without them every
    extension that any transfer method could use is listed (where the driver
    offers it); with them, the fd and dma-buf extensions only when some peer
    can use them too. Raises UnsupportedError for a device without timeline
    semaphores (vkmulti cannot order work on it).
    """
    caps = probe_device(physical_device)
    if isinstance(peers, (str, bytes)):
        raise TypeError("peers must be a list of physical devices, not a string")
    peer_caps = [probe_device(p) for p in peers]
    if not caps.timeline_semaphore:
        raise UnsupportedError(f"device {caps.name!r} lacks timeline semaphores (Vulkan 1.2 or {EXT_TIMELINE}); "
                               f"vkmulti cannot order transfers on it", extension=EXT_TIMELINE, device=caps.name)
    qf = default_queue_families(physical_device, caps)
    if qf is None:
        raise UnsupportedError(f"device {caps.name!r} has no graphics or compute queue family", device=caps.name)
    wanted = [EXT_TIMELINE] if caps.api_version_tuple < (1, 2, 0) else []
    wanted += [e for e in (EXT_MEMORY_HOST, EXT_MEMORY_BUDGET) if caps.has(e)]
    wanted += [e for e in _exported_memory_extensions(caps, peer_caps) if caps.has(e)]
    return DeviceRequirements(
        device=caps.name, extensions=tuple(wanted), features=REQUIRED_FEATURES, queue_families=qf,
        feature_structs=dict(FEATURE_STRUCTS), uses={e: EXTENSION_USES[e] for e in wanted})


def _exported_memory_extensions(caps: DeviceCapabilities, peers: list[DeviceCapabilities]) -> list[str]:
    """The fd / dma-buf extensions worth enabling: all the device has without peers;
    with peers, those a method that works with some peer needs."""
    if not caps.has(EXT_MEMORY_FD):
        return []
    both = [EXT_MEMORY_FD] + ([EXT_DMA_BUF] if caps.has(EXT_DMA_BUF) else [])
    if not peers:
        return both
    out: set[str] = set()
    for peer in peers:
        for method in (TransferMethod.DMABUF, TransferMethod.CUDA_PEER):
            for a, b in ((caps, peer), (peer, caps)):
                if method_problem(method, a, b) is None:
                    out.add(EXT_MEMORY_FD)
                    if method == TransferMethod.DMABUF and caps.has(EXT_DMA_BUF) and peer.has(EXT_DMA_BUF):
                        out.add(EXT_DMA_BUF)
    return [e for e in both if e in out]
