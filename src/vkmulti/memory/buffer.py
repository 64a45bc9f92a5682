"""Buffer: a VkBuffer with its own memory on one GPU, with host upload/download.

Not a hot path: uploads and downloads go through a temporary host-visible
buffer and a one-shot command buffer on the slot's universal queue. Buffers
exist so tests, benches, the demo and engine-less users have real device
memory to move between GPUs (`CrossDeviceTransfer`, `InterGpuTransfer`).

A Buffer is adopted by its MultiDeviceManager (freed by its destroy(), before
any device) and safe to destroy() from one thread while another uploads,
downloads or transfers it: destroy() waits for that work (bounded by its
timeout) and frees nothing the GPU may still touch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import vulkan as vk

from .._core import vkapi
from .._core.checks import U32_MAX, is_int, short_repr
from .._core.handles import handle_int
from ..device.commands import CommandRunner
from ..errors import DestroyedError, OutOfDeviceMemoryError, OutOfHostMemoryError
from .._core.lifetime import Deadline
from ..device.slots import check_slot, slot_lifetime
from .resource import MAX_BYTES, GpuResource, allocate_memory, as_host_bytes, require_transfer_usage

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from .._core.protocols import HostData
    from .._core.vktypes import VkCommandBuffer
    from ..device.commands import SubmitUser
    from ..device.manager import DeviceSlot

__all__ = ["Buffer", "BUFFER_USAGE", "BUFFER_USAGE_ALLOWED", "run_one_shot", "check_usage"]

_ffi = vk.ffi
BUFFER_USAGE = (vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
                | vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)


def _too_big(exc: Any, slot: Any, size: int) -> Any:
    """The driver's out-of-memory error (same class and code) saying what did not fit where."""
    return type(exc)(exc.result, exc.call, f"{exc.call}: a buffer of {size} bytes ({size / 2**30:.1f} GiB) does not "
                                           f"fit on GPU {slot.index} ({slot.name!r}): {exc.result_name}")


def check_usage(usage: Any, label: str) -> int:
    """Usage flags of a Buffer or Image: a nonzero 32-bit int; ValueError otherwise."""
    if not is_int(usage) or not 0 < usage <= U32_MAX:
        raise ValueError(f"{label} must be a nonzero 32-bit flags int, got {short_repr(usage, 100)}")
    return usage


def _check_offset_size(offset: Any, size: Any, total: int) -> None:
    for label, v in (("offset", offset), ("size", size)):
        if not is_int(v):
            raise TypeError(f"{label} must be an int, got {type(v).__name__}")
    if offset < 0 or size <= 0 or offset + size > total:
        raise ValueError(f"range [{short_repr(offset)}, {short_repr(offset + size)}) is outside the buffer of "
                         f"{total} bytes")


def run_one_shot(slot: DeviceSlot, record: Callable[[VkCommandBuffer], None], staging: "Buffer",
                 users: list[SubmitUser], timeout: float | None, *,
                 waits: Sequence[tuple[int, int]] = (), before: Callable[[], None] | None = None) -> None:
    """Run `record` on the slot's CommandRunner with a staging buffer: on success the
    caller still owns `staging`; on failure the runner frees it (at once, or once
    an abandoned submit completes), and `users` wait for such a submit."""
    try:
        if before is not None:
            before()
        runner = CommandRunner.for_slot(slot)
    except BaseException:
        staging.destroy()
        raise
    runner.run(record, waits=waits, timeout=timeout, keep=[staging], users=[*users, staging])


#: Usage bits a Buffer may be made with: the core ones (transfer, uniform, storage,
#: texel, index, vertex, indirect, device address); extension bits need their extension.
BUFFER_USAGE_ALLOWED = 0x1FF | 0x20000


class Buffer(GpuResource):
    """A VkBuffer with its own memory on one slot (device-local unless `host_visible`)."""

    def __init__(self, slot: DeviceSlot, size: int, *, usage: int = BUFFER_USAGE, host_visible: bool = False):
        check_slot(slot)
        if not is_int(size) or not 0 < size <= MAX_BYTES:
            raise ValueError(f"buffer size must be an int in [1, 2**62], got {short_repr(size, 100)}")
        usage = check_usage(usage, "usage")
        if usage & ~BUFFER_USAGE_ALLOWED:
            raise ValueError(f"usage 0x{usage:x} has bits vkmulti does not enable (allowed: "
                             f"0x{BUFFER_USAGE_ALLOWED:x})")
        self.slot, self.size, self.usage = slot, size, usage
        self.host_visible = bool(host_visible)
        self.handle: Any = None
        self.memory: Any = None
        self._handle_int: int | None = None
        super().__init__(slot)
        life = slot_lifetime(slot)
        with life:   # the manager's destroy() waits for a constructor that is running
            # Shared by the universal and copy families, so transfers need no ownership hand-over.
            families = sorted({slot.graphics_queue.family, slot.copy_queue.family})  # type: ignore[union-attr]
            concurrent = len(families) > 1
            try:
                self.handle = vkapi.vkCreateBuffer(slot.device, vk.VkBufferCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=size, usage=usage,
                    sharingMode=vk.VK_SHARING_MODE_CONCURRENT if concurrent else vk.VK_SHARING_MODE_EXCLUSIVE,
                    queueFamilyIndexCount=len(families) if concurrent else 0,
                    pQueueFamilyIndices=families if concurrent else None), None)
            except (OutOfDeviceMemoryError, OutOfHostMemoryError) as exc:
                raise _too_big(exc, slot, size) from exc
            try:
                req = vk.vkGetBufferMemoryRequirements(slot.device, self.handle)
                host = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                try:
                    self.memory = allocate_memory(slot, req, host if host_visible else 0,
                                                  0 if host_visible else vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
                except (OutOfDeviceMemoryError, OutOfHostMemoryError) as exc:
                    raise _too_big(exc, slot, size) from exc
                vkapi.vkBindBufferMemory(slot.device, self.handle, self.memory, 0)
                life.adopt(self)
            except BaseException:
                self._free()
                raise

    def _free(self) -> None:
        if self.handle is not None:
            vk.vkDestroyBuffer(self.slot.device, self.handle, None)
            self.handle = None
        if self.memory is not None:
            vk.vkFreeMemory(self.slot.device, self.memory, None)
            self.memory = None

    @property
    def handle_int(self) -> int:
        """The VkBuffer handle as an int; DestroyedError after destroy()."""
        if self.handle is None:
            raise DestroyedError("Buffer used after destroy()")
        if self._handle_int is None:   # cached: transfers read it on every submit
            self._handle_int = handle_int(self.handle, "VkBuffer")
        return self._handle_int

    def _staging(self, size: int, usage: int) -> "Buffer":
        return Buffer(self.slot, max(1, size), usage=usage, host_visible=True)

    def upload(self, data: HostData, offset: int = 0, *, timeout: float | None = 60.0) -> None:
        """Copy host bytes (a buffer-protocol object of plain data) into the buffer at `offset`
        (the buffer needs VK_BUFFER_USAGE_TRANSFER_DST_BIT: ValueError otherwise).

        vkmulti.TimeoutError after `timeout` s (the copy stays queued, and
        this buffer's destroy() waits for it)."""
        src = as_host_bytes(data)
        Deadline(timeout)
        with self._life:
            require_transfer_usage(self.usage, "dst", "buffer", "upload(): the buffer")
            _check_offset_size(offset, src.nbytes, self.size)
            staging = self._staging(src.nbytes, vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT)
            run_one_shot(self.slot, lambda cmd: vk.vkCmdCopyBuffer(
                cmd, staging.handle, self.handle, 1, [vk.VkBufferCopy(srcOffset=0, dstOffset=offset,
                                                                      size=src.nbytes)]),
                staging, [self], timeout, before=lambda: staging._write(src))
            staging.destroy()

    def download(self, size: int | None = None, offset: int = 0, *,
                 timeout: float | None = 60.0) -> NDArray[np.uint8]:
        """The bytes at [offset, offset+size) as a new uint8 array (vkmulti.TimeoutError after `timeout` s;
        the buffer needs VK_BUFFER_USAGE_TRANSFER_SRC_BIT: ValueError otherwise)."""
        Deadline(timeout)
        with self._life:
            require_transfer_usage(self.usage, "src", "buffer", "download(): the buffer")
            if size is None:
                size = self.size - offset if is_int(offset) else 0
            _check_offset_size(offset, size, self.size)
            staging = self._staging(size, vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
            run_one_shot(self.slot, lambda cmd: vk.vkCmdCopyBuffer(
                cmd, self.handle, staging.handle, 1, [vk.VkBufferCopy(srcOffset=offset, dstOffset=0, size=size)]),
                staging, [self], timeout)
            try:
                return staging._read(size)
            finally:
                staging.destroy()

    def _write(self, src: np.ndarray) -> None:
        mapped = vkapi.vkMapMemory(self.slot.device, self.memory, 0, src.nbytes, 0)
        try:
            _ffi.memmove(mapped, src, src.nbytes)
        finally:
            vk.vkUnmapMemory(self.slot.device, self.memory)

    def _read(self, size: int) -> NDArray[np.uint8]:
        mapped = vkapi.vkMapMemory(self.slot.device, self.memory, 0, size, 0)
        try:
            return np.frombuffer(mapped, dtype=np.uint8, count=size).copy()
        finally:
            vk.vkUnmapMemory(self.slot.device, self.memory)

    def __repr__(self) -> str:
        state = "destroyed" if self.handle is None else f"{self.size} B"
        return f"Buffer(GPU {getattr(self.slot, 'index', '?')}, {state})"


class MappedBuffer(Buffer):
    """A host-visible, host-coherent buffer mapped for its whole life: `bytes` and
    `words` (uint32: its whole 4-byte words) are views of it (the host reads what the
    GPU wrote once the submit that wrote it has signalled); zeroed when made unless
    `zero` is False."""

    _mapped: Any = None

    def __init__(self, slot: DeviceSlot, size: int, usage: int = BUFFER_USAGE, zero: bool = True):
        super().__init__(slot, size, usage=usage, host_visible=True)
        try:
            self._mapped = vkapi.vkMapMemory(slot.device, self.memory, 0, size, 0)
            self.bytes = np.frombuffer(self._mapped, dtype=np.uint8, count=size)
            self.words = self.bytes[:size - size % 4].view(np.uint32)
        except BaseException:
            super().destroy()
            raise
        if zero:
            self.bytes[:] = 0

    def _free(self) -> None:
        """Unmap, then free: only once destroy() found the GPU done with the buffer (a
        destroy() that times out keeps it mapped and usable)."""
        if self._mapped is not None:
            self.bytes = self.words = None   # type: ignore[assignment]
            self._mapped = None
            vk.vkUnmapMemory(self.slot.device, self.memory)
        super()._free()
