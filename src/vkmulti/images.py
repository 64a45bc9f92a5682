"""Device buffers and 2D images owned by vkmulti, with host upload/download.

Not a hot path: uploads and downloads go through a temporary host-visible
buffer and a one-shot command buffer on the slot's universal queue. The
objects exist so tests, benches, the demo and engine-less users have real
device resources to move between GPUs.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
import vulkan as vk

from ._handles import handle_int
from .errors import DestroyedError, UnsupportedError, from_vulkan_exception
from .formats import bytes_per_pixel, format_name

_ffi = vk.ffi

DEFAULT_FORMAT = vk.VK_FORMAT_R16G16B16A16_SFLOAT
SHADER_READ = vk.VK_IMAGE_LAYOUT_SHADER_READ_ONLY_OPTIMAL
BUFFER_USAGE = (vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
                | vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)
IMAGE_USAGE = (vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT
               | vk.VK_IMAGE_USAGE_SAMPLED_BIT)
#: The UINT view format, by texel size, through which the transfer engine's
#: compute kernels read and write an image bit for bit (native/vkm_kcopy.h).
_EXTENDED_USAGE = 0x100   # VK_IMAGE_CREATE_EXTENDED_USAGE_BIT (core 1.1; the vulkan package lacks the value)
KERNEL_VIEW_FORMATS = {4: vk.VK_FORMAT_R32_UINT, 8: vk.VK_FORMAT_R32G32_UINT, 16: vk.VK_FORMAT_R32G32B32A32_UINT}


def _vk(call: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except vk.VkError as exc:
        from_vulkan_exception(exc, call)
        raise


def find_memory_type(slot: Any, bits: int, required: int, preferred: int = 0) -> int:
    props = vk.vkGetPhysicalDeviceMemoryProperties(slot.physical_device)
    fallback = -1
    for i in range(props.memoryTypeCount):
        flags = props.memoryTypes[i].propertyFlags
        if bits & (1 << i) and flags & required == required:
            if flags & preferred == preferred:
                return i
            if fallback < 0:
                fallback = i
    if fallback < 0:
        raise UnsupportedError(f"no memory type with flags 0x{required:x} on {slot.name!r}", device=slot.name)
    return fallback


def _allocate(slot: Any, req: Any, required: int, preferred: int) -> Any:
    info = vk.VkMemoryAllocateInfo(sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=req.size,
                                   memoryTypeIndex=find_memory_type(slot, req.memoryTypeBits, required, preferred))
    return _vk("vkAllocateMemory", vk.vkAllocateMemory, slot.device, info, None)


def timeline_submit_info(cmd: Any, waits: Sequence[tuple[int, int]] = (), *,
                         stage: int = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                         signal: tuple[int, int] | None = None) -> Any:
    """A VkSubmitInfo for one command buffer that waits, at `stage`, for timeline
    points `waits` ((semaphore, value) pairs) and optionally signals `signal`."""
    sems = [_ffi.cast("VkSemaphore", s) for s, _ in waits]
    chain = None
    if waits or signal:
        chain = vk.VkTimelineSemaphoreSubmitInfo(
            sType=vk.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
            waitSemaphoreValueCount=len(waits), pWaitSemaphoreValues=[v for _, v in waits] or None,
            signalSemaphoreValueCount=1 if signal else 0, pSignalSemaphoreValues=[signal[1]] if signal else None)
    return vk.VkSubmitInfo(
        sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, pNext=chain, waitSemaphoreCount=len(sems),
        pWaitSemaphores=sems or None, pWaitDstStageMask=[stage] * len(sems) or None,
        commandBufferCount=1, pCommandBuffers=[cmd], signalSemaphoreCount=1 if signal else 0,
        pSignalSemaphores=[_ffi.cast("VkSemaphore", signal[0])] if signal else None)


class CommandRunner:
    """One-shot command buffers on a queue of a slot, waited with a fence (no GIL, timeout)."""

    def __init__(self, slot: Any, queue: Any = None):
        self.slot = slot
        self.queue = queue or slot.graphics_queue
        self._lock = threading.Lock()
        self.pool = _vk("vkCreateCommandPool", vk.vkCreateCommandPool, slot.device, vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            flags=vk.VK_COMMAND_POOL_CREATE_TRANSIENT_BIT | vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            queueFamilyIndex=self.queue.family), None)
        self._abandoned: list[Any] = []   # fences of submits that timed out, still pending
        self._new_buffer()

    def _new_buffer(self) -> None:
        self.fence = _vk("vkCreateFence", vk.vkCreateFence, self.slot.device,
                         vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
        self.cmd = vk.vkAllocateCommandBuffers(self.slot.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]

    @classmethod
    def for_slot(cls, slot: Any) -> "CommandRunner":
        """The slot's shared runner (created once, destroyed with the slot's children)."""
        runner = slot.children.get("runner")
        if runner is None:
            runner = slot.children["runner"] = cls(slot)
        return runner

    def run(self, record: Callable[[Any], None], *, waits: list[tuple[int, int]] = (),
            timeout: float | None = 60.0) -> None:
        """Record with `record(cmd)`, submit (optionally waiting on timeline points), wait."""
        with self._lock:
            dev = self.slot.device
            vk.vkResetCommandBuffer(self.cmd, 0)
            vk.vkBeginCommandBuffer(self.cmd, vk.VkCommandBufferBeginInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            record(self.cmd)
            vk.vkEndCommandBuffer(self.cmd)
            info = timeline_submit_info(self.cmd, waits)
            with self.queue.lock:
                _vk("vkQueueSubmit", vk.vkQueueSubmit, self.queue.handle, 1, [info], self.fence)
            try:
                self.slot.native.wait_fence(handle_int(self.fence, "VkFence"), timeout)
            except BaseException:
                # Still pending: set the buffer aside (freed at destroy) and use a new one.
                self._abandoned.append(self.fence)
                self._new_buffer()
                raise
            vk.vkResetFences(dev, 1, [self.fence])

    def destroy(self) -> None:
        if self.pool is None:
            return
        for fence in self._abandoned:
            self.slot.native.wait_fence(handle_int(fence, "VkFence"), 30.0)
            vk.vkDestroyFence(self.slot.device, fence, None)
        vk.vkDestroyFence(self.slot.device, self.fence, None)
        vk.vkDestroyCommandPool(self.slot.device, self.pool, None)
        self.pool = None


def _check_slot(slot: Any) -> None:
    if getattr(slot, "device", None) is None or getattr(slot, "native", None) is None:
        raise ValueError("slot has no live device (destroyed, or a passthrough primary without a native table); "
                         "use a slot of an active MultiDeviceManager")


class _InFlight:
    """Transfers that still use a resource: destroy() waits for them (bounded),
    so neither a transfer's worker nor a GPU touches freed objects."""

    _pending: list[Any]

    def _track(self, ticket: Any) -> None:
        pending = self.__dict__.setdefault("_pending", [])
        if len(pending) >= 16:   # keep it short without a native call per submit
            pending[:] = [t for t in pending if not _finished(t)]
        pending.append(ticket)

    def _settle(self, timeout: float) -> None:
        """Wait until every tracked transfer is done with this resource: its
        destination is written and, where this is the source, the source side's
        work (an ownership hand-back included) has finished. Raises
        vkmulti.TimeoutError, keeping the resource alive, when `timeout` s pass."""
        from .errors import TimeoutError as VkmTimeout

        pending = self.__dict__.pop("_pending", [])
        deadline = time.monotonic() + timeout
        for i, t in enumerate(pending):
            try:
                t.wait(max(0.0, deadline - time.monotonic()))
                if t.src_done.device_index == self.slot.index:
                    t.wait_source(max(0.0, deadline - time.monotonic()))
            except VkmTimeout:
                self._pending = pending[i:]
                raise VkmTimeout(f"a transfer still uses this {type(self).__name__} after {timeout:.1f} s; "
                                 f"it was not destroyed") from None
            except Exception:   # noqa: BLE001 - a failed transfer: its error went to its own waiter
                pass


def _finished(ticket: Any) -> bool:
    """done(), counting a failed transfer or one whose link is gone as finished."""
    try:
        return ticket.done()
    except Exception:   # noqa: BLE001 - its error is its waiter's
        return True


class Buffer(_InFlight):
    """A VkBuffer with its own memory on one slot (device-local unless `host_visible`)."""

    def __init__(self, slot: Any, size: int, *, usage: int = BUFFER_USAGE, host_visible: bool = False):
        _check_slot(slot)
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"buffer size must be a positive int, got {size!r}")
        self.slot, self.size, self.usage = slot, size, usage
        self._handle_int: int | None = None
        # Shared by the universal and copy families, so transfers need no ownership hand-over.
        families = sorted({slot.graphics_queue.family, slot.copy_queue.family})
        concurrent = len(families) > 1
        self.handle = _vk("vkCreateBuffer", vk.vkCreateBuffer, slot.device, vk.VkBufferCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=size, usage=usage,
            sharingMode=vk.VK_SHARING_MODE_CONCURRENT if concurrent else vk.VK_SHARING_MODE_EXCLUSIVE,
            queueFamilyIndexCount=len(families) if concurrent else 0,
            pQueueFamilyIndices=families if concurrent else None), None)
        try:
            req = vk.vkGetBufferMemoryRequirements(slot.device, self.handle)
            host = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
            self.memory = _allocate(slot, req, host if host_visible else 0,
                                    0 if host_visible else vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
        except BaseException:
            vk.vkDestroyBuffer(slot.device, self.handle, None)
            raise
        vk.vkBindBufferMemory(slot.device, self.handle, self.memory, 0)
        self.host_visible = host_visible

    @property
    def handle_int(self) -> int:
        if self.handle is None:
            raise DestroyedError("Buffer used after destroy()")
        if self._handle_int is None:   # cached: transfers read it on every submit
            self._handle_int = handle_int(self.handle, "VkBuffer")
        return self._handle_int

    def upload(self, data: Any, offset: int = 0) -> None:
        """Copy host bytes (any buffer-protocol object) into the buffer at `offset`."""
        src = as_host_bytes(data)
        self._check_range(offset, src.nbytes)
        staging = Buffer(self.slot, max(1, src.nbytes), usage=vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT, host_visible=True)
        try:
            staging._write(src)
            CommandRunner.for_slot(self.slot).run(lambda cmd: vk.vkCmdCopyBuffer(
                cmd, staging.handle, self.handle, 1, [vk.VkBufferCopy(srcOffset=0, dstOffset=offset,
                                                                      size=src.nbytes)]))
        finally:
            staging.destroy()

    def download(self, size: int | None = None, offset: int = 0) -> np.ndarray:
        """The bytes at [offset, offset+size) as a new uint8 array."""
        size = self.size - offset if size is None else size
        self._check_range(offset, size)
        staging = Buffer(self.slot, max(1, size), usage=vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT, host_visible=True)
        try:
            CommandRunner.for_slot(self.slot).run(lambda cmd: vk.vkCmdCopyBuffer(
                cmd, self.handle, staging.handle, 1, [vk.VkBufferCopy(srcOffset=offset, dstOffset=0, size=size)]))
            return staging._read(size)
        finally:
            staging.destroy()

    def _check_range(self, offset: int, size: int) -> None:
        if self.handle is None:
            raise DestroyedError("Buffer used after destroy()")
        if offset < 0 or size <= 0 or offset + size > self.size:
            raise ValueError(f"range [{offset}, {offset + size}) is outside the buffer of {self.size} bytes")

    def _write(self, src: np.ndarray) -> None:
        mapped = vk.vkMapMemory(self.slot.device, self.memory, 0, src.nbytes, 0)
        _ffi.memmove(mapped, src, src.nbytes)
        vk.vkUnmapMemory(self.slot.device, self.memory)

    def _read(self, size: int) -> np.ndarray:
        mapped = vk.vkMapMemory(self.slot.device, self.memory, 0, size, 0)
        out = np.frombuffer(bytes(mapped[:size]), dtype=np.uint8).copy()
        vk.vkUnmapMemory(self.slot.device, self.memory)
        return out

    def destroy(self, timeout: float = 30.0) -> None:
        """Free the buffer once transfers using it are done (vkmulti.TimeoutError after `timeout` s)."""
        if self.handle is None:
            return
        self._settle(timeout)
        vk.vkDestroyBuffer(self.slot.device, self.handle, None)
        vk.vkFreeMemory(self.slot.device, self.memory, None)
        self.handle = None

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def as_host_bytes(data: Any, what: str = "data", *, writable: bool = False) -> np.ndarray:
    """The bytes of a C-contiguous buffer-protocol object as a 1-D uint8 view (no copy)."""
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"{what} must be bytes, a numpy array or another buffer-protocol object, "
                        f"got {type(data).__name__}") from None
    if not mv.c_contiguous:
        raise ValueError(f"{what} is not C-contiguous (shape {mv.shape}, strides {mv.strides}); "
                         f"pass numpy.ascontiguousarray({what})")
    if writable and mv.readonly:
        raise ValueError(f"{what} is read-only; results need a writable array")
    if mv.nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    return np.frombuffer(mv, dtype=np.uint8)


class Image(_InFlight):
    """A 2D optimal-tiling colour image with its own memory on one slot.

    `layout` is the layout the image is in between operations (vkmulti keeps it
    there). By default the image is shared (CONCURRENT) by the slot's universal
    and copy queue families, so transfers need no ownership hand-over;
    `exclusive=True` makes it owned by the universal family (`owner_family`),
    as engine images usually are, and transfers then release and re-acquire it.
    With `kernel_copies` (the default) an image of 4-, 8- or 16-byte texels also
    gets STORAGE usage and a UINT view format (MUTABLE_FORMAT with a format
    list), so the transfer engine can copy it with compute kernels, which on
    NVIDIA run several times faster than image copy commands.
    """

    def __init__(self, slot: Any, width: int, height: int, format: int = DEFAULT_FORMAT, *,
                 usage: int = IMAGE_USAGE, layout: int = SHADER_READ, exclusive: bool = False,
                 kernel_copies: bool = True):
        _check_slot(slot)
        for label, v in (("width", width), ("height", height)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"image {label} must be a positive int, got {v!r}")
        self.bytes_per_pixel = bytes_per_pixel(format)
        try:
            props = vk.vkGetPhysicalDeviceImageFormatProperties(
                slot.physical_device, format, vk.VK_IMAGE_TYPE_2D, vk.VK_IMAGE_TILING_OPTIMAL, usage, 0)
        except vk.VkErrorFormatNotSupported:
            raise UnsupportedError(f"{format_name(format)} images with usage 0x{usage:x} are not supported on "
                                   f"{slot.name!r}", device=slot.name) from None
        flags, view_formats = 0, None
        #: the UINT view format the transfer engine's compute kernels copy this image
        #: through (0: copy commands only; see KERNEL_VIEW_FORMATS)
        self.kernel_view_format = self._kernel_view(slot, format, usage) if kernel_copies else 0
        if self.kernel_view_format:
            usage |= vk.VK_IMAGE_USAGE_STORAGE_BIT
            if self.kernel_view_format != format:
                flags = vk.VK_IMAGE_CREATE_MUTABLE_FORMAT_BIT | _EXTENDED_USAGE
                view_formats = vk.VkImageFormatListCreateInfo(   # keeps the driver's compression possible
                    sType=vk.VK_STRUCTURE_TYPE_IMAGE_FORMAT_LIST_CREATE_INFO, viewFormatCount=2,
                    pViewFormats=[format, self.kernel_view_format])
        self.slot, self.width, self.height, self.format, self.usage = slot, width, height, format, usage
        self._handle_ints: tuple[int, int | None] | None = None
        if width > props.maxExtent.width or height > props.maxExtent.height:
            raise ValueError(f"{width}x{height} exceeds the device's maximum image extent "
                             f"{props.maxExtent.width}x{props.maxExtent.height}")
        families = sorted({slot.graphics_queue.family, slot.copy_queue.family})
        concurrent = len(families) > 1 and not exclusive
        self.handle = _vk("vkCreateImage", vk.vkCreateImage, slot.device, vk.VkImageCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_IMAGE_CREATE_INFO, pNext=view_formats, flags=flags,
            imageType=vk.VK_IMAGE_TYPE_2D, format=format,
            extent=vk.VkExtent3D(width, height, 1), mipLevels=1, arrayLayers=1,
            samples=vk.VK_SAMPLE_COUNT_1_BIT, tiling=vk.VK_IMAGE_TILING_OPTIMAL, usage=usage,
            sharingMode=vk.VK_SHARING_MODE_CONCURRENT if concurrent else vk.VK_SHARING_MODE_EXCLUSIVE,
            queueFamilyIndexCount=len(families) if concurrent else 0,
            pQueueFamilyIndices=families if concurrent else None,
            initialLayout=vk.VK_IMAGE_LAYOUT_UNDEFINED), None)
        try:
            req = vk.vkGetImageMemoryRequirements(slot.device, self.handle)
            self.memory = _allocate(slot, req, 0, vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
        except BaseException:
            vk.vkDestroyImage(slot.device, self.handle, None)
            raise
        vk.vkBindImageMemory(slot.device, self.handle, self.memory, 0)
        self.kernel_view = None   # the UINT view the transfer kernels copy through (lives with the image)
        if self.kernel_view_format:
            try:
                only_storage = vk.VkImageViewUsageCreateInfo(   # the UINT format needs no other feature
                    sType=vk.VK_STRUCTURE_TYPE_IMAGE_VIEW_USAGE_CREATE_INFO, usage=vk.VK_IMAGE_USAGE_STORAGE_BIT)
                self.kernel_view = _vk("vkCreateImageView", vk.vkCreateImageView, slot.device, vk.VkImageViewCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_IMAGE_VIEW_CREATE_INFO, pNext=only_storage, image=self.handle,
                    viewType=vk.VK_IMAGE_VIEW_TYPE_2D, format=self.kernel_view_format,
                    subresourceRange=vk.VkImageSubresourceRange(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT,
                                                                baseMipLevel=0, levelCount=1, baseArrayLayer=0,
                                                                layerCount=1)), None)
            except BaseException:
                vk.vkDestroyImage(slot.device, self.handle, None)
                vk.vkFreeMemory(slot.device, self.memory, None)
                raise
        #: the family that owns the image (None: shared by every family vkmulti uses)
        self.owner_family = None if concurrent else slot.graphics_queue.family
        self.layout = layout
        CommandRunner.for_slot(slot).run(
            lambda cmd: self.barrier(cmd, vk.VK_IMAGE_LAYOUT_UNDEFINED, layout))

    @staticmethod
    def _kernel_view(slot: Any, format: int, usage: int) -> int:
        """The UINT view format for kernel copies when the device allows it, else 0."""
        view = KERNEL_VIEW_FORMATS.get(bytes_per_pixel(format), 0)
        caps = getattr(slot, "capabilities", None)
        if not view or (caps is not None and caps.api_version_tuple < (1, 2, 0)):
            return 0
        feats = vk.vkGetPhysicalDeviceFormatProperties(slot.physical_device, view).optimalTilingFeatures
        if not feats & vk.VK_FORMAT_FEATURE_STORAGE_IMAGE_BIT:
            return 0
        flags = 0 if view == format else \
            vk.VK_IMAGE_CREATE_MUTABLE_FORMAT_BIT | _EXTENDED_USAGE
        try:
            vk.vkGetPhysicalDeviceImageFormatProperties(slot.physical_device, format, vk.VK_IMAGE_TYPE_2D,
                                                        vk.VK_IMAGE_TILING_OPTIMAL,
                                                        usage | vk.VK_IMAGE_USAGE_STORAGE_BIT, flags)
        except vk.VkErrorFormatNotSupported:
            return 0
        return view

    @property
    def nbytes(self) -> int:
        return self.width * self.height * self.bytes_per_pixel

    @property
    def handle_int(self) -> int:
        if self.handle is None:
            raise DestroyedError("Image used after destroy()")
        if self._handle_ints is None:   # cached: transfers read them on every submit
            view = self.kernel_view
            self._handle_ints = (handle_int(self.handle, "VkImage"),
                                 handle_int(view, "VkImageView") if view is not None else None)
        return self._handle_ints[0]

    @property
    def kernel_view_int(self) -> int | None:
        """The kernel view's handle as an int (None without one)."""
        self.handle_int
        return self._handle_ints[1]

    def barrier(self, cmd: Any, old: int, new: int) -> None:
        """Record a full layout transition (conservative access masks)."""
        mem = vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT
        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                                0, 0, None, 0, None, 1, [vk.VkImageMemoryBarrier(
                                    sType=vk.VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER, srcAccessMask=mem,
                                    dstAccessMask=mem, oldLayout=old, newLayout=new,
                                    srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                    dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED, image=self.handle,
                                    subresourceRange=vk.VkImageSubresourceRange(
                                        aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0, levelCount=1,
                                        baseArrayLayer=0, layerCount=1))])

    def _region(self) -> Any:
        return vk.VkBufferImageCopy(
            bufferOffset=0, bufferRowLength=0, bufferImageHeight=0,
            imageSubresource=vk.VkImageSubresourceLayers(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, mipLevel=0,
                                                         baseArrayLayer=0, layerCount=1),
            imageOffset=vk.VkOffset3D(0, 0, 0), imageExtent=vk.VkExtent3D(self.width, self.height, 1))

    def upload(self, pixels: Any) -> None:
        """Fill the image from host pixels (rows tightly packed, nbytes must match)."""
        if self.handle is None:
            raise DestroyedError("Image used after destroy()")
        src = as_host_bytes(pixels, "pixels")
        if src.nbytes != self.nbytes:
            raise ValueError(f"pixels hold {src.nbytes} bytes; a {self.width}x{self.height} "
                             f"{format_name(self.format)} image needs {self.nbytes}")
        staging = Buffer(self.slot, self.nbytes, usage=vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT, host_visible=True)
        try:
            staging._write(src)

            def record(cmd: Any) -> None:
                self.barrier(cmd, self.layout, vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL)
                vk.vkCmdCopyBufferToImage(cmd, staging.handle, self.handle,
                                          vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, 1, [self._region()])
                self.barrier(cmd, vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, self.layout)
            CommandRunner.for_slot(self.slot).run(record)
        finally:
            staging.destroy()

    def download(self, *, waits: list[tuple[int, int]] = ()) -> np.ndarray:
        """The pixels as a (height, width, bytes_per_pixel) uint8 array.

        `waits`: timeline (semaphore, value) points on this device to wait for
        first, e.g. a transfer's dst_ready.
        """
        if self.handle is None:
            raise DestroyedError("Image used after destroy()")
        staging = Buffer(self.slot, self.nbytes, usage=vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT, host_visible=True)
        try:
            def record(cmd: Any) -> None:
                self.barrier(cmd, self.layout, vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL)
                vk.vkCmdCopyImageToBuffer(cmd, self.handle, vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL,
                                          staging.handle, 1, [self._region()])
                self.barrier(cmd, vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL, self.layout)
            CommandRunner.for_slot(self.slot).run(record, waits=waits)
            return staging._read(self.nbytes).reshape(self.height, self.width, self.bytes_per_pixel)
        finally:
            staging.destroy()

    def destroy(self, timeout: float = 30.0) -> None:
        """Free the image once transfers using it are done (vkmulti.TimeoutError after `timeout` s)."""
        if self.handle is None:
            return
        self._settle(timeout)
        if self.kernel_view is not None:
            vk.vkDestroyImageView(self.slot.device, self.kernel_view, None)
            self.kernel_view = None
        vk.vkDestroyImage(self.slot.device, self.handle, None)
        vk.vkFreeMemory(self.slot.device, self.memory, None)
        self.handle = None

    def __enter__(self) -> "Image":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
