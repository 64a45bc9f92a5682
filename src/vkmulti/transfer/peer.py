"""Bytes that cross between devices through memory both of them read: the
DMABUF method in its copy-in-place form.

* `ExportedBuffer`: a device-local buffer whose memory other devices import
  (`import_on(slot)` -> `ImportedBuffer`, a buffer of that device over the
  same bytes) where the pair supports DMABUF (VK_EXT_external_memory_dma_buf
  on both, or an opaque fd between devices with equal deviceUUID/driverUUID).
  The importing device's own commands then read (or write) the exporter's
  memory in place: no copy through a transfer ring.
* `TimelineRelay`: orders such reads. A timeline semaphore cannot be shared
  between two devices here, so a native thread (_native.TimelineMirror)
  follows a timeline of the source device and signals each new value from the
  host on a timeline of the destination. A GPU wait there may be submitted
  before the value exists, on any queue (a host signal never stands behind it
  in a queue): no host waits for submits on devices with a single queue, and
  nothing to push per point.

The K2K router moves kernel batches this way between devices that share
memory (docs/explanation/k2k.md, "How a step's messages cross GPUs").
"""
from __future__ import annotations

import os
import threading
from typing import Any

import vulkan as vk

from .._core import _native, vkapi
from .._core.lifetime import Deadline
from ..device.capabilities import EXT_DMA_BUF
from ..device.logical import retire_submits
from ..errors import UnsupportedError
from ..memory.image import BUFFER_USAGE, Buffer
from .._core.lifetime import Lifetime
from .methods import TransferMethod, method_support
from ..device.slots import check_slot, slot_lifetime
from ..memory.resource import GpuResource, find_memory_type
from .._core.timeline import TimelinePoint
from .._core.checks import is_int, short_repr

__all__ = ["ExportedBuffer", "ImportedBuffer", "TimelineRelay", "RelayTicket", "shares_memory"]

_OPAQUE_FD = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT
_DMA_BUF = 0x200   # VK_EXTERNAL_MEMORY_HANDLE_TYPE_DMA_BUF_BIT_EXT
_DEVICE_LOCAL = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
#: On GPUs a relay polls the source semaphore this long before blocking (as links do).
RELAY_SPIN_SECONDS = 200e-6


def shares_memory(a: Any, b: Any) -> bool:
    """Whether device slots `a` and `b` (distinct) can import each other's memory (DMABUF)."""
    if a is b or a.index == b.index or a.capabilities is None or b.capabilities is None:
        return False
    return method_support(TransferMethod.DMABUF, a.capabilities, b.capabilities, a.enabled_extensions,
                          b.enabled_extensions) is None


def _handle_type(slot: Any) -> int:
    return _DMA_BUF if EXT_DMA_BUF in slot.enabled_extensions else _OPAQUE_FD


def _external_buffer(slot: Any, size: int, usage: int, handle_type: int) -> Any:
    ext = vk.VkExternalMemoryBufferCreateInfo(sType=vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
                                              handleTypes=handle_type)
    families = sorted({slot.graphics_queue.family, slot.copy_queue.family})
    concurrent = len(families) > 1
    return vkapi.vkCreateBuffer(slot.device, vk.VkBufferCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, pNext=ext, size=size, usage=usage,
        sharingMode=vk.VK_SHARING_MODE_CONCURRENT if concurrent else vk.VK_SHARING_MODE_EXCLUSIVE,
        queueFamilyIndexCount=len(families) if concurrent else 0,
        pQueueFamilyIndices=families if concurrent else None), None)


class ExportedBuffer(Buffer):
    """A device-local buffer of `slot` whose memory devices that share memory
    with it (`shares_memory`) import with `import_on(slot)`. Its destroy()
    destroys the imports first (each waits for the GPU work tracked on it)."""

    def __init__(self, slot: Any, size: int, *, usage: int = BUFFER_USAGE):
        check_slot(slot)
        if not is_int(size) or not 0 < size <= 1 << 62:
            raise ValueError(f"buffer size must be an int in [1, 2**62], got {short_repr(size)}")
        self.slot, self.size, self.usage = slot, size, usage
        self.host_visible = False
        self.handle: Any = None
        self.memory: Any = None
        self._handle_int: int | None = None
        self.handle_type = _handle_type(slot)
        self.allocation_size = 0
        self.memory_type = -1
        self._imports: dict[int, ImportedBuffer] = {}
        self._imports_lock = threading.Lock()
        GpuResource.__init__(self, slot)   # not Buffer.__init__: this memory is made exportable (or imported) here
        life = slot_lifetime(slot)
        with life:
            self.handle = _external_buffer(slot, size, usage, self.handle_type)
            try:
                req = vk.vkGetBufferMemoryRequirements(slot.device, self.handle)
                self.memory_type = find_memory_type(slot, req.memoryTypeBits, 0, _DEVICE_LOCAL)
                self.allocation_size = int(req.size)
                dedicated = vk.VkMemoryDedicatedAllocateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO, buffer=self.handle)
                export = vk.VkExportMemoryAllocateInfo(sType=vk.VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO,
                                                       pNext=dedicated, handleTypes=self.handle_type)
                self.memory = vkapi.vkAllocateMemory(slot.device, vk.VkMemoryAllocateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, pNext=export, allocationSize=req.size,
                    memoryTypeIndex=self.memory_type), None)
                vkapi.vkBindBufferMemory(slot.device, self.handle, self.memory, 0)
                life.adopt(self)
            except BaseException:
                self._free()
                raise

    def import_on(self, slot: Any) -> "ImportedBuffer":
        """This buffer's memory as a buffer of `slot` (made once per device, kept
        until this buffer is destroyed). UnsupportedError when the pair does not
        share memory."""
        check_slot(slot)
        with self._life:
            with self._imports_lock:
                imp = self._imports.get(slot.index)
                if imp is not None and not imp.destroyed:
                    return imp
                if not shares_memory(self.slot, slot):
                    why = method_support(TransferMethod.DMABUF, self.slot.capabilities, slot.capabilities,
                                         self.slot.enabled_extensions, slot.enabled_extensions) \
                        if self.slot.capabilities is not None and slot.capabilities is not None else \
                        "device capabilities unknown"
                    raise UnsupportedError(f"GPU {slot.index} ({slot.name!r}) cannot import memory of GPU "
                                           f"{self.slot.index} ({self.slot.name!r}): {why or 'the same device'}; "
                                           f"move the bytes with a CrossDeviceTransfer instead",
                                           extension=EXT_DMA_BUF, device=slot.name)
                imp = self._imports[slot.index] = ImportedBuffer(slot, self)
                return imp

    def imports(self) -> list["ImportedBuffer"]:
        """The live imports of this buffer."""
        with self._imports_lock:
            return [imp for imp in self._imports.values() if not imp.destroyed]

    def _export_fd(self) -> int:
        get_fd = vkapi.device_function(self.slot.device, "vkGetMemoryFdKHR")
        return int(get_fd(self.slot.device, vk.VkMemoryGetFdInfoKHR(
            sType=vk.VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR, memory=self.memory, handleType=self.handle_type)))

    def destroy_imports(self, timeout: float | None = 30.0) -> None:
        """Destroy the imports (each once the GPU work tracked on it is done); the buffer
        stays. An owner that frees the buffer under a lock of its own calls this first,
        without that lock: an import's users may need their device's lock to let it go."""
        deadline = Deadline(timeout)   # (one for all of them)
        with self._imports_lock:
            imports = list(self._imports.values())
        for imp in imports:
            imp.destroy(deadline.left())
        with self._imports_lock:
            self._imports = {k: v for k, v in self._imports.items() if not v.destroyed}

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Destroy the imports (each once the GPU work tracked on it is done), then the buffer,
        within `timeout` s for all of it."""
        deadline = Deadline(timeout)
        self.destroy_imports(deadline.left())
        super().destroy(deadline.left())

    def __repr__(self) -> str:
        state = "destroyed" if self.handle is None else f"{self.size} B, imported on {sorted(self._imports)}"
        return f"ExportedBuffer(GPU {getattr(self.slot, 'index', '?')}, {state})"


class ImportedBuffer(Buffer):
    """A buffer of `slot` over the memory of `source` (an ExportedBuffer of another
    device): the same bytes. Made by ExportedBuffer.import_on()."""

    def __init__(self, slot: Any, source: ExportedBuffer):
        self.slot, self.size, self.usage = slot, source.size, source.usage
        self.host_visible = False
        self.handle: Any = None
        self.memory: Any = None
        self._handle_int: int | None = None
        self.source = source
        self._finalizers: list[Any] = []
        GpuResource.__init__(self, slot)   # not Buffer.__init__: this memory is made exportable (or imported) here
        life = slot_lifetime(slot)
        with life:
            fd = source._export_fd()
            try:
                self.handle = _external_buffer(slot, source.size, source.usage, source.handle_type)
                req = vk.vkGetBufferMemoryRequirements(slot.device, self.handle)
                bits = int(req.memoryTypeBits)
                if source.handle_type == _OPAQUE_FD:
                    bits &= 1 << source.memory_type   # same driver and device: the same memory type
                else:
                    props = vkapi.device_function(slot.device, "vkGetMemoryFdPropertiesKHR")(
                        slot.device, source.handle_type, fd)
                    bits &= int(props.memoryTypeBits)
                if not bits:
                    raise UnsupportedError(f"GPU {slot.index} ({slot.name!r}) can import the memory of GPU "
                                           f"{source.slot.index} into no memory type its buffers may use",
                                           extension=EXT_DMA_BUF, device=slot.name)
                dedicated = vk.VkMemoryDedicatedAllocateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO, buffer=self.handle)
                imp = vk.VkImportMemoryFdInfoKHR(sType=vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR,
                                                 pNext=dedicated, handleType=source.handle_type, fd=fd)
                self.memory = vkapi.vkAllocateMemory(slot.device, vk.VkMemoryAllocateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, pNext=imp,
                    allocationSize=source.allocation_size,
                    memoryTypeIndex=(bits & -bits).bit_length() - 1), None)
                fd = -1   # the driver owns it now
                vkapi.vkBindBufferMemory(slot.device, self.handle, self.memory, 0)
                life.adopt(self)
            except BaseException:
                if fd >= 0:
                    os.close(fd)
                self._free()
                raise

    def on_destroy(self, fn: Any) -> None:
        """Call `fn(timeout)` once when destroy() starts (before anything is freed), with
        what is left of destroy()'s timeout: its users stop reading it there (a runtime
        drops the batches it reads in place). One that raises (a timeout) is called
        again by the next destroy()."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self._finalizers.append(fn)

    def destroy(self, timeout: float | None = 30.0) -> None:
        deadline = Deadline(timeout)   # (one for the users and the memory)
        while self._finalizers:
            fn = self._finalizers[0]
            fn(deadline.left())
            if self._finalizers and self._finalizers[0] is fn:
                self._finalizers.pop(0)
        super().destroy(deadline.left())

    def __repr__(self) -> str:
        state = "destroyed" if self.handle is None else f"{self.size} B of GPU {self.source.slot.index}'s memory"
        return f"ImportedBuffer(GPU {getattr(self.slot, 'index', '?')}, {state})"


class RelayTicket:
    """A point of the source device as seen on the destination device: `dst_ready`
    (on the destination) is reached once `source` is."""

    __slots__ = ("relay", "source", "dst_ready")

    def __init__(self, relay: "TimelineRelay", source: TimelinePoint, dst_ready: TimelinePoint):
        self.relay, self.source, self.dst_ready = relay, source, dst_ready

    def done(self) -> bool:
        """Whether dst_ready is reached (a stopped relay raises its failure)."""
        return self.relay._reached(self.dst_ready.value)

    def wait(self, timeout: float | None = None) -> None:
        """Block (no GIL, Ctrl-C honoured) until dst_ready; vkmulti.TimeoutError after `timeout` s."""
        self.relay._wait(self.dst_ready.value, timeout)

    def wait_submitted(self, timeout: float | None = None) -> None:
        """Nothing to wait for: a GPU wait on dst_ready may be queued at once (the
        signal comes from the host, never from a later submit on a queue)."""

    def __repr__(self) -> str:
        return f"RelayTicket({self.source} -> {self.dst_ready})"


class TimelineRelay:
    """Hands the points of one timeline semaphore of device `src` (`semaphore`) to
    device `dst`: `relay(point)` returns the point of `dst` its GPU work waits
    for (see the module docstring). A native thread mirrors the source
    timeline by itself; nothing is pushed per point. destroy() (idempotent)
    once no GPU work of `dst` waits on it."""

    _teardown_rank = 20   # with the transfers: before the devices

    def __init__(self, src: Any, semaphore: int, dst: Any):
        check_slot(src)
        check_slot(dst)
        if src.index == dst.index:
            raise ValueError(f"a relay joins two devices, got GPU {src.index} twice")
        if src.native is None or dst.native is None:
            raise ValueError("both slots need live devices with native tables (an active MultiDeviceManager)")
        if not is_int(semaphore) or semaphore <= 0:
            raise TypeError(f"semaphore must be a VkSemaphore handle (a positive int), got {short_repr(semaphore)}")
        self.src, self.dst, self.source_semaphore = src, dst, semaphore
        on_gpus = all(s.capabilities is not None and s.capabilities.device_type != "cpu" for s in (src, dst))
        self._mirror = _native.TimelineMirror(src.native, semaphore, dst.native,
                                              spin=RELAY_SPIN_SECONDS if on_gpus else 0.0)
        self.timeline = self._mirror.semaphore
        self._life = Lifetime(self, "TimelineRelay", [slot_lifetime(src), slot_lifetime(dst)])
        for life in self._life.parents:
            life.adopt(self)

    def relay(self, point: TimelinePoint) -> RelayTicket:
        """The point of the destination reached once `point` (of the source semaphore) is."""
        if not isinstance(point, TimelinePoint):
            raise TypeError(f"point must be a TimelinePoint, got {type(point).__name__}")
        if point.device_index != self.src.index or point.semaphore != self.source_semaphore:
            raise ValueError(f"{short_repr(point)} is not a point of the timeline this relay follows (GPU {self.src.index})")
        self._life.check()
        return RelayTicket(self, point, TimelinePoint.of(self.dst, self.timeline, point.value))

    def _reached(self, value: int) -> bool:
        with self._life:
            self._mirror.check()
            return self.dst.native.timeline_value(self.timeline) >= value

    def _wait(self, value: int, timeout: float | None) -> None:
        with self._life:
            self._mirror.check()
            self.dst.native.wait_timeline(self.timeline, value, timeout)
            self._mirror.check()

    def release(self, why: str = "its source is lost") -> None:
        """Let every GPU wait on the destination timeline go now and stop following the
        source (idempotent; the tickets' done() and wait() then raise DeviceLostError).
        A source marked lost is still followed through the driver until this is
        called: a loss injected by vkmulti.testing.lose_device leaves the driver
        running what it was given, and the work that waits here reads what that
        work writes (a failover calls this once the lost device is drained, or given
        up on). A device the driver reports lost lets its waiters go by itself."""
        with self._life:
            self._mirror.release(why)

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Stop following the source (the caller made sure no GPU work waits on the
        destination timeline any more) and free it (idempotent)."""
        with self._life.ending(timeout) as dl:
            if dl is None:
                return
            retire_submits(self.dst, dl)   # the driver may still hold the timeline for submits that waited on it
            self._mirror.destroy()

    def __enter__(self) -> "TimelineRelay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"TimelineRelay(GPU {self.src.index} -> GPU {self.dst.index})"
