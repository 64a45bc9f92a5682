"""Copies between host memory and device buffers on one device: HostPort.

Fast path: the caller's host memory itself is imported into the device
(`VK_EXT_external_memory_host`) for the duration of one copy, so the GPU reads
or writes the numpy array directly: one DMA, no staging buffer, no CPU copy.
Where a device lacks the extension, or the driver refuses an import (e.g. a
read-only file mapping), a ring of persistently mapped host-visible slots is
used instead, and the CPU copy of one chunk (numpy, without the GIL) overlaps
the GPU copy of the next. Every wait is a fence wait in the native layer
without the GIL.

Each port is adopted by its manager; destroy() (or the manager's) waits,
bounded, for copies still queued and frees nothing the GPU may still touch.
Copies report themselves to the resources they touch (`users=`), whose
destroy() waits for them.
"""
from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import vulkan as vk

from .._core.checks import is_int, seconds_text, short_repr
from .._core import vkapi
from .._core.handles import handle_int
from ..device.capabilities import EXT_MEMORY_HOST
from ..device.commands import command_with_fence, timeline_submit_info, wait_fence_or_lost
from ..errors import DestroyedError, UnsupportedError, VulkanError
from ..errors import TimeoutError as VkmTimeoutError
from .._core.lifetime import Deadline, Lifetime
from ..device.slots import check_slot, slot_lifetime, slot_queue
from .resource import as_host_bytes, find_memory_type
from .._core.timeline import wait_points

log = logging.getLogger(__name__)
_ffi = vk.ffi

__all__ = ["HostPort", "Arena", "Pending", "Deadline", "as_host_bytes"]

_HOST_ALLOCATION = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT
_COPY_USAGE = vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
_HOST_VISIBLE = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
#: Ring shape of the fallback path: 3 slots of 8 MiB per device.
RING_SLOT_SIZE = 8 << 20
RING_SLOT_COUNT = 3


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
        self.buffer = vkapi.vkCreateBuffer(dev, vk.VkBufferCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, pNext=ext, size=self.size, usage=_COPY_USAGE,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        try:
            req = vk.vkGetBufferMemoryRequirements(dev, self.buffer)
            ptr = _ffi.cast("void*", start)
            props = _ffi.new("VkMemoryHostPointerPropertiesEXT*")
            props.sType = vk.VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT
            port.host_pointer_properties(dev, _HOST_ALLOCATION, ptr, props)
            bits = req.memoryTypeBits & props.memoryTypeBits
            if not bits or req.size > self.size:
                raise UnsupportedError(f"host memory at 0x{start:x} cannot back a buffer on {port.slot.name!r}",
                                       extension=EXT_MEMORY_HOST, device=port.slot.name)
            imp = vk.VkImportMemoryHostPointerInfoEXT(
                sType=vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT, handleType=_HOST_ALLOCATION,
                pHostPointer=ptr)
            self.memory = vkapi.vkAllocateMemory(dev, vk.VkMemoryAllocateInfo(
                sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, pNext=imp, allocationSize=self.size,
                memoryTypeIndex=(bits & -bits).bit_length() - 1), None)
            vkapi.vkBindBufferMemory(dev, self.buffer, self.memory, 0)
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
        self.array = None  # type: ignore[assignment]


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
    they touch stays referenced) until they finish; the port's destroy()
    waits for them. Resources the copies touch track this object
    (gpu_done/gpu_wait), so their destroy() waits too.
    """

    def __init__(self, port: "HostPort", submits: list[_Submit], imports: list[_HostImport]):
        self._port, self._submits, self._imports = port, submits, imports
        self._lock = threading.Lock()

    def done(self) -> bool:
        """True once every copy completed (and was waited for)."""
        with self._lock:
            return not self._submits

    def wait(self, timeout: float | None = None) -> None:
        """Block until the copies are done; vkmulti.TimeoutError after `timeout` s."""
        if not self._wait(Deadline(timeout), enter=True):
            raise VkmTimeoutError(f"copies on {self._port.slot.name!r} not done within {seconds_text(timeout)} s")

    def gpu_done(self, device_index: int | None = None) -> bool:
        with self._lock:
            return not self._submits

    def gpu_wait(self, device_index: int | None, timeout: float | None) -> bool:
        """For resources: True once the copies are done, False if not within `timeout` s."""
        try:
            return self._wait(Deadline(timeout), enter=True)
        except DestroyedError:
            return False   # the port's destroy() timed out on these copies: they may still run

    def _wait(self, dl: Deadline, *, enter: bool) -> bool:
        port = self._port
        if not self._submits:
            return True
        keep = port._life.keep()
        if enter:
            try:
                keep.__enter__()         # the port's destroy() waits for this wait
            except DestroyedError:
                if port._life.dead:      # its destroy() waited for every copy
                    return True
                raise
        try:
            while True:
                with self._lock:
                    if not self._submits:
                        break
                    s = self._submits[0]
                if not port._wait_fence(s, dl.left()):
                    return False
                with self._lock:
                    if self._submits and self._submits[0] is s:
                        self._submits.pop(0)
                        port._recycle([s])
        finally:
            if enter:
                keep.__exit__()
        port._finish(self)
        return True


class HostPort:
    """Host<->device buffer copies for one slot (thread-safe).

    `queue`: default the slot's copy queue (PCIe hops); pass the universal
    queue for on-device copies, which run several times faster there on
    NVIDIA. `host_import`: None uses memory import where the device has
    VK_EXT_external_memory_host; False always uses the staging ring of
    `ring_slot_count` (1..64) slots of `ring_slot_size` bytes.
    """

    _teardown_rank = 40   # before the resources its copies touch

    def __init__(self, slot: Any, *, queue: Any = None, host_import: bool | None = None,
                 ring_slot_size: int = RING_SLOT_SIZE, ring_slot_count: int = RING_SLOT_COUNT):
        check_slot(slot)
        for label, v, hi in (("ring_slot_size", ring_slot_size, 1 << 32), ("ring_slot_count", ring_slot_count, 64)):
            if not is_int(v) or not 0 < v <= hi:
                raise ValueError(f"{label} must be an int in [1, {hi}], got {short_repr(v)}")
        self.slot, self.queue = slot, slot_queue(slot, queue, slot.copy_queue)
        self.alignment = slot.native.host_pointer_alignment if EXT_MEMORY_HOST in slot.enabled_extensions else 0
        self.host_import = bool(self.alignment) and host_import is not False
        self.ring_slot_size, self.ring_slot_count = ring_slot_size, ring_slot_count
        self.host_pointer_properties: Any = None
        if self.host_import:
            try:
                self.host_pointer_properties = vkapi.device_function(slot.device,
                                                                     "vkGetMemoryHostPointerPropertiesEXT")
            except UnsupportedError:
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
        self._refusals = 0
        self._life = Lifetime(self, "HostPort", (slot_lifetime(slot),))
        life = slot_lifetime(slot)
        with life:
            self.pool = vkapi.vkCreateCommandPool(slot.device, vk.VkCommandPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue.family), None)
            try:
                life.adopt(self)
            except BaseException:
                vk.vkDestroyCommandPool(slot.device, self.pool, None)
                self.pool = None
                raise

    # -- public operations ---------------------------------------------------

    def start_download(self, buffer: int, offset: int, out: np.ndarray, *, waits: Iterable[Any] = (),
                       deadline: Deadline | None = None, arena: Arena | None = None,
                       users: Iterable[Any] = ()) -> Pending:
        """Copy buffer[offset:offset+out.nbytes] into `out` (1-D writable uint8).

        With `arena` (held through `with port.arena(n)`), `out` must be the
        start of `arena.array`, and the arena's standing import is used.
        `users`: resources the copy touches (they track it).
        """
        with self._life:
            points = wait_points(waits, self.slot)
            imp = arena.imported if arena is not None else self._try_import(out)
            if imp is None:
                self._ring_download(buffer, offset, out, points, deadline or Deadline(None), users)
                return self._track([], [])
            return self._start([(buffer, offset, imp.buffer, imp.offset, out.nbytes)], points, host_read=True,
                               imports=[] if arena is not None else [imp], users=users)

    @contextmanager
    def arena(self, size: int) -> Iterator[Arena]:
        """Hold this port's readback arena (at least `size` bytes) exclusively."""
        with self._life, self._arena_lock:
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

    def start_upload(self, buffer: int, offset: int, data: np.ndarray, *, waits: Iterable[Any] = (),
                     deadline: Deadline | None = None, users: Iterable[Any] = ()) -> Pending:
        """Copy `data` (1-D uint8) into buffer[offset:offset+data.nbytes]."""
        with self._life:
            points = wait_points(waits, self.slot)
            imp = self._try_import(data)
            if imp is None:
                self._ring_upload(buffer, offset, data, points, deadline or Deadline(None), users)
                return self._track([], [])
            return self._start([(imp.buffer, imp.offset, buffer, offset, data.nbytes)], points, imports=[imp],
                               users=users)

    def start_copy(self, src: int, src_offset: int, dst: int, dst_offset: int, size: int, *,
                   waits: Iterable[Any] = (), users: Iterable[Any] = ()) -> Pending:
        """An on-device copy between two buffers of this device."""
        with self._life:
            return self._start([(src, src_offset, dst, dst_offset, size)], wait_points(waits, self.slot),
                               users=users)

    def download(self, buffer: int, offset: int, out: np.ndarray, *, waits: Iterable[Any] = (),
                 timeout: float | None = None, users: Iterable[Any] = ()) -> None:
        dl = Deadline(timeout)
        self.start_download(buffer, offset, out, waits=waits, deadline=dl, users=users).wait(dl.left())

    def upload(self, buffer: int, offset: int, data: np.ndarray, *, waits: Iterable[Any] = (),
               timeout: float | None = None, users: Iterable[Any] = ()) -> None:
        dl = Deadline(timeout)
        self.start_upload(buffer, offset, data, waits=waits, deadline=dl, users=users).wait(dl.left())

    @property
    def destroyed(self) -> bool:
        return self._life.dead

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Wait (up to `timeout` s) for copies still queued, then free everything the
        port holds (idempotent). vkmulti.TimeoutError keeps it all for a later call."""
        with self._life.ending(timeout) as dl:
            if dl is None:
                return
            with self._lock:
                pending = list(self._inflight.values())
            for p in pending + self._ring_abandoned:
                if not p._wait(dl, enter=False):
                    raise VkmTimeoutError(f"HostPort of {self.slot.name!r}: copies still queued after {seconds_text(timeout)} s; "
                                          f"nothing was freed (call destroy() again)")
            self._ring_abandoned = []
            dev = self.slot.device
            for arena in self._retired + ([self._arena] if self._arena is not None else []):
                arena.destroy()
            self._arena, self._retired = None, []
            with self._lock:
                for s in self._made:
                    vk.vkDestroyFence(dev, s.fence, None)
                self._made, self._free = [], []
                vk.vkDestroyCommandPool(dev, self.pool, None)
                self.pool = None
            if self._ring is not None:
                buf, mem, _ = self._ring
                vk.vkUnmapMemory(dev, mem)
                vk.vkDestroyBuffer(dev, buf, None)
                vk.vkFreeMemory(dev, mem, None)
                self._ring = None

    def __repr__(self) -> str:
        return f"HostPort(GPU {getattr(self.slot, 'index', '?')}, in flight={len(self._inflight)})"

    # -- submission ------------------------------------------------------------

    def _check(self) -> None:
        if self.pool is None:
            raise DestroyedError(f"HostPort of {self.slot.name!r} used after destroy()")

    def _wait_fence(self, s: _Submit, timeout: float | None) -> bool:
        """Wait for one submit; False on timeout. A lost device counts as done."""
        return wait_fence_or_lost(self.slot, s.fence_int, timeout, "HostPort")

    def _try_import(self, array: np.ndarray) -> _HostImport | None:
        if not self.host_import or array.nbytes == 0:
            return None
        self._check()
        try:
            return _HostImport(self, array)
        except (VulkanError, UnsupportedError) as exc:   # the driver refused this memory: use the ring
            self._refusals += 1
            level = logging.WARNING if self._refusals == 1 else logging.DEBUG
            log.log(level, "HostPort of %s: host memory import refused (%s); using the staging ring",
                    self.slot.name, exc)
            return None

    def _start(self, copies: list[tuple[Any, int, Any, int, int]], waits: list[tuple[int, int]], *,
               host_read: bool = False, imports: Sequence[_HostImport] = (), users: Iterable[Any] = ()) -> Pending:
        try:
            sub = self._submit(copies, waits, host_read)
        except BaseException:
            for imp in imports:
                imp.destroy()
            raise
        p = self._track([sub], list(imports))
        for u in users:
            u._track(p)
        return p

    def _track(self, submits: list[_Submit], imports: list[_HostImport]) -> Pending:
        p = Pending(self, submits, imports)
        if submits:
            with self._lock:
                self._inflight[id(p)] = p
        return p

    def _finish(self, p: Pending) -> None:
        with self._lock:
            self._inflight.pop(id(p), None)
            imports, p._imports = p._imports, []
        for imp in imports:
            imp.destroy()

    def _recycle(self, subs: list[_Submit]) -> None:
        with self._lock:
            if self.pool is None:
                return
            for s in subs:
                vkapi.vkResetFences(self.slot.device, 1, [s.fence])
                self._free.append(s)

    def _submit(self, copies: list[tuple[Any, int, Any, int, int]], waits: list[tuple[int, int]],
                host_read: bool) -> _Submit:
        dev = self.slot.device
        with self._lock:
            self._check()
            if self._free:
                s = self._free.pop()
            else:
                s = _Submit(*command_with_fence(dev, self.pool))
                self._made.append(s)
            try:
                vkapi.vkBeginCommandBuffer(s.cmd, vk.VkCommandBufferBeginInfo(
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
                vkapi.vkEndCommandBuffer(s.cmd)
            except BaseException:
                self._free.append(s)
                raise
        info = timeline_submit_info(s.cmd, waits, stage=vk.VK_PIPELINE_STAGE_TRANSFER_BIT)
        try:
            vkapi.queue_submit(self.slot.native, self.queue, [info], s.fence)
        except BaseException:
            with self._lock:
                self._free.append(s)
            raise
        return s

    # -- staging ring (devices without host-memory import) ---------------------

    def _ring_get(self) -> tuple[Any, Any, np.ndarray]:
        if self._ring is None:
            dev, size = self.slot.device, self.ring_slot_size * self.ring_slot_count
            buf = vkapi.vkCreateBuffer(dev, vk.VkBufferCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=size, usage=_COPY_USAGE,
                sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
            mem = None
            try:
                req = vk.vkGetBufferMemoryRequirements(dev, buf)
                mem = vkapi.vkAllocateMemory(dev, vk.VkMemoryAllocateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=req.size,
                    memoryTypeIndex=find_memory_type(self.slot, req.memoryTypeBits, _HOST_VISIBLE,
                                                     vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT)), None)
                vkapi.vkBindBufferMemory(dev, buf, mem, 0)
                view = np.frombuffer(vkapi.vkMapMemory(dev, mem, 0, size, 0), dtype=np.uint8)
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
                  deadline: Deadline, users: Iterable[Any]) -> None:
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
                            self.slot.native.wait_fence(slots[k].fence_int, deadline.left())  # type: ignore[union-attr]
                            self._recycle([slots[k]])  # type: ignore[list-item]
                            slots[k] = None
                        na, nb = chunks[nxt]
                        if prefill is not None:
                            prefill(k * ss, na, nb)
                        slots[k] = issue(k * ss, na, nb, k)
                        nxt += 1
                    k = i % count
                    if after is not None:
                        self.slot.native.wait_fence(slots[k].fence_int, deadline.left())  # type: ignore[union-attr]
                        self._recycle([slots[k]])  # type: ignore[list-item]
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
                    p = self._track(left, [])
                    self._ring_abandoned.append(p)
                    for u in users:
                        u._track(p)
                raise

    def _ring_upload(self, buffer: int, offset: int, data: np.ndarray, waits: list[tuple[int, int]],
                     deadline: Deadline, users: Iterable[Any]) -> None:
        def prefill(at: int, a: int, b: int) -> None:   # the ring exists (made under the ring lock)
            np.copyto(self._ring[2][at:at + b - a], data[a:b])   # type: ignore[index]

        def issue(at: int, a: int, b: int, k: int) -> _Submit:
            return self._submit([(self._ring[0], at, buffer, offset + a, b - a)], waits, False)  # type: ignore[index]
        self._ring_run(data.nbytes, issue, None, prefill, deadline, users)

    def _ring_download(self, buffer: int, offset: int, out: np.ndarray, waits: list[tuple[int, int]],
                       deadline: Deadline, users: Iterable[Any]) -> None:
        def issue(at: int, a: int, b: int, k: int) -> _Submit:   # the ring exists (made under the ring lock)
            return self._submit([(buffer, offset + a, self._ring[0], at, b - a)], waits, True)  # type: ignore[index]

        def after(at: int, a: int, b: int) -> None:
            np.copyto(out[a:b], self._ring[2][at:at + b - a])   # type: ignore[index]
        self._ring_run(out.nbytes, issue, after, None, deadline, users)
