"""Copies between host memory and device buffers on one device: HostPort.

Fast path: the caller's host memory itself is imported into the device
(`VK_EXT_external_memory_host`) for the duration of one copy, so the GPU reads
or writes the numpy array directly: one DMA, no staging buffer, no CPU copy.
Where a device lacks the extension, or the driver refuses an import (e.g. a
read-only file mapping), a ring of persistently mapped host-visible slots is
used instead, and the CPU copy of one chunk (numpy, without the GIL) overlaps
the GPU copy of the next. Every wait is a fence wait in the native layer
without the GIL.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import vulkan as vk

from ._handles import handle_int
from .capabilities import EXT_MEMORY_HOST
from .errors import DestroyedError, UnsupportedError
from .images import _vk, as_host_bytes, find_memory_type, timeline_submit_info

log = logging.getLogger(__name__)
_ffi = vk.ffi

__all__ = ["HostPort", "Arena", "Pending", "Deadline", "as_host_bytes"]

_HOST_ALLOCATION = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT
_COPY_USAGE = vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
_HOST_VISIBLE = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
#: Ring shape of the fallback path: 3 slots of 8 MiB per device.
RING_SLOT_SIZE = 8 << 20
RING_SLOT_COUNT = 3


class Deadline:
    """An overall time limit shared by the waits of one operation (None: none)."""

    def __init__(self, timeout: float | None):
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
                raise ValueError(f"timeout must be None or a non-negative number of seconds, got {timeout!r}")
        self.end = None if timeout is None else time.monotonic() + float(timeout)

    def left(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - time.monotonic())


class _Submit:
    """A command buffer and its fence (reused once the fence was waited)."""
    __slots__ = ("cmd", "fence", "fence_int")

    def __init__(self, cmd: Any, fence: Any):
        self.cmd, self.fence, self.fence_int = cmd, fence, handle_int(fence, "VkFence")


class _HostImport:
    """Whole pages around a host array imported as one VkBuffer (held until destroy)."""

    def __init__(self, port: "HostPort", array: np.ndarray):
        dev, align = port.slot.device, port.alignment
        addr = array.ctypes.data
        start = addr - addr % align
        end = -(-(addr + array.nbytes) // align) * align
        self.array, self.offset, self.size, self.device = array, addr - start, end - start, dev
        self.buffer = self.memory = None
        ext = vk.VkExternalMemoryBufferCreateInfo(sType=vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
                                                  handleTypes=_HOST_ALLOCATION)
        self.buffer = _vk("vkCreateBuffer", vk.vkCreateBuffer, dev, vk.VkBufferCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, pNext=ext, size=self.size, usage=_COPY_USAGE,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        try:
            req = vk.vkGetBufferMemoryRequirements(dev, self.buffer)
            ptr = _ffi.cast("void*", start)
            props = _ffi.new("VkMemoryHostPointerPropertiesEXT*")
            props.sType = vk.VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT
            _vk("vkGetMemoryHostPointerPropertiesEXT", port.host_pointer_properties, dev, _HOST_ALLOCATION, ptr,
                props)
            bits = req.memoryTypeBits & props.memoryTypeBits
            if not bits or req.size > self.size:
                raise UnsupportedError(f"host memory at 0x{start:x} cannot back a buffer on {port.slot.name!r}",
                                       extension=EXT_MEMORY_HOST, device=port.slot.name)
            imp = vk.VkImportMemoryHostPointerInfoEXT(
                sType=vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT, handleType=_HOST_ALLOCATION,
                pHostPointer=ptr)
            self.memory = _vk("vkAllocateMemory", vk.vkAllocateMemory, dev, vk.VkMemoryAllocateInfo(
                sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, pNext=imp, allocationSize=self.size,
                memoryTypeIndex=(bits & -bits).bit_length() - 1), None)
            _vk("vkBindBufferMemory", vk.vkBindBufferMemory, dev, self.buffer, self.memory, 0)
        except BaseException:
            self.destroy()
            raise

    def destroy(self) -> None:
        if self.buffer is not None:
            vk.vkDestroyBuffer(self.device, self.buffer, None)
            self.buffer = None
        if self.memory is not None:
            vk.vkFreeMemory(self.device, self.memory, None)
            self.memory = None
        self.array = None


class Arena:
    """Host memory a port keeps imported into its device, for zero-copy readbacks.

    `array` is an ordinary numpy array: views of it stay safe to use after the
    port is destroyed (only the import is released then).
    """

    def __init__(self, port: "HostPort", size: int):
        # 64 bytes past a page boundary: CPU copies (lavapipe's, the ring's) between
        # two page-aligned buffers suffer 4K aliasing and run ~20% slower.
        raw = np.empty(size + 8192, dtype=np.uint8)
        start = (-raw.ctypes.data) % 4096 + 64
        self.array, self.size = raw[start:start + size], size
        self.imported = port._try_import(self.array)

    def destroy(self) -> None:
        if self.imported is not None:
            self.imported.destroy()
            self.imported = None


class Pending:
    """Copies submitted on one device: wait() blocks (no GIL) until they are done.

    After a timeout the copies stay owned by the port (and the host memory
    they touch stays referenced) until they finish or the port is destroyed.
    """

    def __init__(self, port: "HostPort", submits: list[_Submit], imports: list[_HostImport]):
        self._port, self._submits, self._imports = port, submits, imports

    def done(self) -> bool:
        return not self._submits

    def wait(self, timeout: float | None = None) -> None:
        port = self._port
        if self._submits and port.pool is None:
            raise DestroyedError(f"HostPort of {port.slot.name!r} was destroyed")
        while self._submits:
            port.slot.native.wait_fence(self._submits[0].fence_int, timeout)
            port._recycle([self._submits.pop(0)])
        port._finish(self)


class HostPort:
    """Host<->device buffer copies for one slot (thread-safe).

    `queue`: default the slot's copy queue (PCIe hops); pass the universal
    queue for on-device copies, which run several times faster there on
    NVIDIA. `host_import`: None uses memory import where the device has
    VK_EXT_external_memory_host; False always uses the staging ring.
    """

    def __init__(self, slot: Any, *, queue: Any = None, host_import: bool | None = None,
                 ring_slot_size: int = RING_SLOT_SIZE, ring_slot_count: int = RING_SLOT_COUNT):
        if getattr(slot, "device", None) is None or getattr(slot, "native", None) is None:
            raise ValueError("slot has no live device; use a slot of an active MultiDeviceManager")
        self.slot, self.queue = slot, queue or slot.copy_queue
        self.alignment = slot.native.host_pointer_alignment if EXT_MEMORY_HOST in slot.enabled_extensions else 0
        self.host_import = bool(self.alignment) and host_import is not False
        self.ring_slot_size, self.ring_slot_count = ring_slot_size, ring_slot_count
        self.host_pointer_properties: Any = None
        if self.host_import:
            try:
                self.host_pointer_properties = vk.vkGetDeviceProcAddr(slot.device,
                                                                      "vkGetMemoryHostPointerPropertiesEXT")
            except (vk.ProcedureNotFoundError, vk.ExtensionNotSupportedError):
                self.host_import = False
        self._lock = threading.Lock()          # command pool, free list, in-flight set
        self._ring_lock = threading.Lock()     # one ring operation at a time
        self._free: list[_Submit] = []
        self._made: list[_Submit] = []
        self._inflight: dict[int, Pending] = {}
        self._ring: tuple[Any, Any, np.ndarray] | None = None
        self._ring_abandoned: list[Pending] = []
        self._arena: Arena | None = None
        self._arena_lock = threading.Lock()
        self._retired: list[Arena] = []
        self.pool = _vk("vkCreateCommandPool", vk.vkCreateCommandPool, slot.device, vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue.family), None)

    # -- public operations ---------------------------------------------------

    def start_download(self, buffer: int, offset: int, out: np.ndarray, *, waits: Iterable[tuple[int, int]] = (),
                       deadline: Deadline | None = None, arena: Arena | None = None) -> Pending:
        """Copy buffer[offset:offset+out.nbytes] into `out` (1-D writable uint8).

        With `arena` (held through `with port.arena(n)`), `out` must be the
        start of `arena.array`, and the arena's standing import is used.
        """
        imp = arena.imported if arena is not None else self._try_import(out)
        if imp is None:
            self._ring_download(buffer, offset, out, list(waits), deadline or Deadline(None))
            return self._track([], [])
        return self._start([(buffer, offset, imp.buffer, imp.offset, out.nbytes)], waits, host_read=True,
                           imports=[] if arena is not None else [imp])

    @contextmanager
    def arena(self, size: int) -> Iterator[Arena]:
        """Hold this port's readback arena (at least `size` bytes) exclusively."""
        with self._arena_lock:
            self._check()
            if self._arena is None or self._arena.size < size:
                old, self._arena = self._arena, Arena(self, size)
                if old is not None:
                    with self._lock:
                        busy = bool(self._inflight)
                    if busy:   # a timed-out copy may still write into it
                        self._retired.append(old)
                    else:
                        old.destroy()
            yield self._arena

    def start_upload(self, buffer: int, offset: int, data: np.ndarray, *, waits: Iterable[tuple[int, int]] = (),
                     deadline: Deadline | None = None) -> Pending:
        """Copy `data` (1-D uint8) into buffer[offset:offset+data.nbytes]."""
        imp = self._try_import(data)
        if imp is None:
            self._ring_upload(buffer, offset, data, list(waits), deadline or Deadline(None))
            return self._track([], [])
        return self._start([(imp.buffer, imp.offset, buffer, offset, data.nbytes)], waits, imports=[imp])

    def start_copy(self, src: int, src_offset: int, dst: int, dst_offset: int, size: int, *,
                   waits: Iterable[tuple[int, int]] = ()) -> Pending:
        """An on-device copy between two buffers of this device."""
        return self._start([(src, src_offset, dst, dst_offset, size)], waits)

    def download(self, buffer: int, offset: int, out: np.ndarray, *, waits: Iterable[tuple[int, int]] = (),
                 timeout: float | None = None) -> None:
        dl = Deadline(timeout)
        self.start_download(buffer, offset, out, waits=waits, deadline=dl).wait(dl.left())

    def upload(self, buffer: int, offset: int, data: np.ndarray, *, waits: Iterable[tuple[int, int]] = (),
               timeout: float | None = None) -> None:
        dl = Deadline(timeout)
        self.start_upload(buffer, offset, data, waits=waits, deadline=dl).wait(dl.left())

    def destroy(self) -> None:
        """Wait for (up to 30 s each) and free everything the port holds (idempotent)."""
        with self._lock:
            if self.pool is None:
                return
            pending, self._inflight = list(self._inflight.values()), {}
        dev = self.slot.device
        for p in pending:
            for s in p._submits:
                try:
                    self.slot.native.wait_fence(s.fence_int, 30.0)
                except Exception:   # device lost or hung: free anyway, the device goes next
                    log.exception("copy on %s did not finish before destroy", self.slot.name)
            for imp in p._imports:
                imp.destroy()
        for arena in self._retired + ([self._arena] if self._arena is not None else []):
            arena.destroy()
        self._arena, self._retired = None, []
        for s in self._made:
            vk.vkDestroyFence(dev, s.fence, None)
        vk.vkDestroyCommandPool(dev, self.pool, None)
        self.pool = None
        if self._ring is not None:
            buf, mem, _ = self._ring
            vk.vkUnmapMemory(dev, mem)
            vk.vkDestroyBuffer(dev, buf, None)
            vk.vkFreeMemory(dev, mem, None)
            self._ring = None

    # -- submission ------------------------------------------------------------

    def _check(self) -> None:
        if self.pool is None:
            raise DestroyedError(f"HostPort of {self.slot.name!r} used after destroy()")

    def _try_import(self, array: np.ndarray) -> _HostImport | None:
        if not self.host_import or array.nbytes == 0:
            return None
        self._check()
        try:
            return _HostImport(self, array)
        except Exception as exc:   # the driver refused this memory: use the ring
            log.debug("host memory import refused on %s (%s); using the staging ring", self.slot.name, exc)
            return None

    def _start(self, copies: list[tuple[Any, int, Any, int, int]], waits: Iterable[tuple[int, int]], *,
               host_read: bool = False, imports: list[_HostImport] = ()) -> Pending:
        try:
            sub = self._submit(copies, list(waits), host_read)
        except BaseException:
            for imp in imports:
                imp.destroy()
            raise
        return self._track([sub], list(imports))

    def _track(self, submits: list[_Submit], imports: list[_HostImport]) -> Pending:
        p = Pending(self, submits, imports)
        if submits:
            with self._lock:
                self._inflight[id(p)] = p
        return p

    def _finish(self, p: Pending) -> None:
        with self._lock:
            self._inflight.pop(id(p), None)
        for imp in p._imports:
            imp.destroy()
        p._imports = []

    def _recycle(self, subs: list[_Submit]) -> None:
        with self._lock:
            if self.pool is None:
                return
            for s in subs:
                vk.vkResetFences(self.slot.device, 1, [s.fence])
                self._free.append(s)

    def _submit(self, copies: list[tuple[Any, int, Any, int, int]], waits: list[tuple[int, int]],
                host_read: bool) -> _Submit:
        dev = self.slot.device
        with self._lock:
            self._check()
            if self._free:
                s = self._free.pop()
            else:
                cmd = _vk("vkAllocateCommandBuffers", vk.vkAllocateCommandBuffers, dev,
                          vk.VkCommandBufferAllocateInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                                         commandPool=self.pool,
                                                         level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                                         commandBufferCount=1))[0]
                fence = _vk("vkCreateFence", vk.vkCreateFence, dev,
                            vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
                s = _Submit(cmd, fence)
                self._made.append(s)
            try:
                vk.vkBeginCommandBuffer(s.cmd, vk.VkCommandBufferBeginInfo(
                    sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                    flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
                for src, so, dst, do, size in copies:
                    vk.vkCmdCopyBuffer(s.cmd, _ffi.cast("VkBuffer", src) if isinstance(src, int) else src,
                                       _ffi.cast("VkBuffer", dst) if isinstance(dst, int) else dst, 1,
                                       [vk.VkBufferCopy(srcOffset=so, dstOffset=do, size=size)])
                write = vk.VK_ACCESS_TRANSFER_WRITE_BIT
                if host_read:
                    stage, access = vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_ACCESS_HOST_READ_BIT
                else:
                    stage = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
                    access = vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT
                vk.vkCmdPipelineBarrier(s.cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, stage, 0, 1, [vk.VkMemoryBarrier(
                    sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, srcAccessMask=write, dstAccessMask=access)],
                    0, None, 0, None)
                vk.vkEndCommandBuffer(s.cmd)
            except BaseException:
                self._free.append(s)
                raise
        info = timeline_submit_info(s.cmd, waits, stage=vk.VK_PIPELINE_STAGE_TRANSFER_BIT)
        try:
            with self.queue.lock:
                _vk("vkQueueSubmit", vk.vkQueueSubmit, self.queue.handle, 1, [info], s.fence)
        except BaseException:
            with self._lock:
                self._free.append(s)
            raise
        return s

    # -- staging ring (devices without host-memory import) ---------------------

    def _ring_get(self) -> tuple[Any, Any, np.ndarray]:
        if self._ring is None:
            dev, size = self.slot.device, self.ring_slot_size * self.ring_slot_count
            buf = _vk("vkCreateBuffer", vk.vkCreateBuffer, dev, vk.VkBufferCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=size, usage=_COPY_USAGE,
                sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
            mem = None
            try:
                req = vk.vkGetBufferMemoryRequirements(dev, buf)
                mem = _vk("vkAllocateMemory", vk.vkAllocateMemory, dev, vk.VkMemoryAllocateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=req.size,
                    memoryTypeIndex=find_memory_type(self.slot, req.memoryTypeBits, _HOST_VISIBLE,
                                                 vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT)), None)
                _vk("vkBindBufferMemory", vk.vkBindBufferMemory, dev, buf, mem, 0)
                view = np.frombuffer(_vk("vkMapMemory", vk.vkMapMemory, dev, mem, 0, size, 0), dtype=np.uint8)
            except BaseException:
                vk.vkDestroyBuffer(dev, buf, None)
                if mem is not None:
                    vk.vkFreeMemory(dev, mem, None)
                raise
            self._ring = (buf, mem, view)
        return self._ring

    def _ring_settle(self, deadline: Deadline) -> None:
        """Wait for ring copies left running by an earlier timed-out operation."""
        while self._ring_abandoned:
            self._ring_abandoned[0].wait(deadline.left())
            self._ring_abandoned.pop(0)

    def _ring_run(self, nbytes: int, issue: Callable[[int, int, int, int], _Submit],
                  after: Callable[[int, int, int], None] | None, prefill: Callable[[int, int, int], None] | None,
                  deadline: Deadline) -> None:
        """Drive chunks [a, b) through the ring slots; `prefill` runs on the host before
        a chunk's copy (upload), `after` once it completed (download)."""
        with self._ring_lock:
            self._check()
            self._ring_settle(deadline)
            self._ring_get()
            ss, count = self.ring_slot_size, self.ring_slot_count
            chunks = [(a, min(nbytes, a + ss)) for a in range(0, nbytes, ss)]
            slots: list[_Submit | None] = [None] * count
            nxt = 0
            try:
                for i, (a, b) in enumerate(chunks):
                    # keep up to `count` chunks in flight
                    while nxt < len(chunks) and nxt < i + count:
                        k = nxt % count
                        if slots[k] is not None:
                            self.slot.native.wait_fence(slots[k].fence_int, deadline.left())
                            self._recycle([slots[k]])
                            slots[k] = None
                        na, nb = chunks[nxt]
                        if prefill is not None:
                            prefill(k * ss, na, nb)
                        slots[k] = issue(k * ss, na, nb, k)
                        nxt += 1
                    k = i % count
                    if after is not None:
                        self.slot.native.wait_fence(slots[k].fence_int, deadline.left())
                        self._recycle([slots[k]])
                        slots[k] = None
                        after(k * ss, a, b)
                for k, s in enumerate(slots):
                    if s is not None:
                        self.slot.native.wait_fence(s.fence_int, deadline.left())
                        self._recycle([s])
                        slots[k] = None
            except BaseException:
                left = [s for s in slots if s is not None]
                if left:
                    self._ring_abandoned.append(self._track(left, []))
                raise

    def _ring_upload(self, buffer: int, offset: int, data: np.ndarray, waits: list[tuple[int, int]],
                     deadline: Deadline) -> None:
        ring = self._ring_get()

        def prefill(at: int, a: int, b: int) -> None:
            np.copyto(ring[2][at:at + b - a], data[a:b])

        def issue(at: int, a: int, b: int, k: int) -> _Submit:
            return self._submit([(ring[0], at, buffer, offset + a, b - a)], waits, False)
        self._ring_run(data.nbytes, issue, None, prefill, deadline)

    def _ring_download(self, buffer: int, offset: int, out: np.ndarray, waits: list[tuple[int, int]],
                       deadline: Deadline) -> None:
        ring = self._ring_get()

        def issue(at: int, a: int, b: int, k: int) -> _Submit:
            return self._submit([(buffer, offset + a, ring[0], at, b - a)], waits, True)

        def after(at: int, a: int, b: int) -> None:
            np.copyto(out[a:b], ring[2][at:at + b - a])
        self._ring_run(out.nbytes, issue, after, None, deadline)
