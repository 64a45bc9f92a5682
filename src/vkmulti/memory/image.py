"""Device buffers and 2D images owned by vkmulti, with host upload/download.

Not a hot path: uploads and downloads go through a temporary host-visible
buffer and a one-shot command buffer on the slot's universal queue. The
objects exist so tests, benches, the demo and engine-less users have real
device resources to move between GPUs.

Both are adopted by their MultiDeviceManager (freed by its destroy(), before
any device) and safe to destroy() from one thread while another uploads,
downloads or transfers them: destroy() waits for that work (bounded by its
timeout) and frees nothing the GPU may still touch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import vulkan as vk

from .._core.checks import is_int, timeout_seconds, short_repr
from .._core import vkapi
from .._core.handles import handle_int
from .buffer import BUFFER_USAGE, Buffer, check_usage, run_one_shot
from ..device.commands import CommandRunner, timeline_submit_info
from ..errors import DestroyedError, UnsupportedError, VulkanError
from .._core.formats import bytes_per_pixel, format_name
from .._core.lifetime import Deadline
from ..device.slots import check_slot, slot_lifetime
from .resource import GpuResource, allocate_memory, as_host_bytes, find_memory_type, require_transfer_usage
from .._core.timeline import wait_points

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from .._core.protocols import HostData
    from .._core.timeline import Waits
    from .._core.vktypes import VkCommandBuffer
    from ..device.manager import DeviceSlot

__all__ = ["Buffer", "Image", "CommandRunner", "as_host_bytes", "find_memory_type", "timeline_submit_info",
           "check_layout", "IMAGE_USAGE", "BUFFER_USAGE", "DEFAULT_FORMAT"]

_ffi = vk.ffi

DEFAULT_FORMAT = vk.VK_FORMAT_R16G16B16A16_SFLOAT
SHADER_READ = vk.VK_IMAGE_LAYOUT_SHADER_READ_ONLY_OPTIMAL
IMAGE_USAGE = (vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT
               | vk.VK_IMAGE_USAGE_SAMPLED_BIT)
#: The UINT view format, by texel size, through which the transfer engine's
#: compute kernels read and write an image bit for bit (native/vkm_kcopy.h).
_EXTENDED_USAGE = 0x100   # VK_IMAGE_CREATE_EXTENDED_USAGE_BIT (core 1.1; the vulkan package lacks the value)
KERNEL_VIEW_FORMATS = {4: vk.VK_FORMAT_R32_UINT, 8: vk.VK_FORMAT_R32G32_UINT, 16: vk.VK_FORMAT_R32G32B32A32_UINT}

#: Layouts a colour image may rest in between operations, with the usage each
#: needs (any of the bits; 0: none).
RESTING_LAYOUTS = {
    vk.VK_IMAGE_LAYOUT_GENERAL: 0,
    vk.VK_IMAGE_LAYOUT_COLOR_ATTACHMENT_OPTIMAL: vk.VK_IMAGE_USAGE_COLOR_ATTACHMENT_BIT,
    vk.VK_IMAGE_LAYOUT_SHADER_READ_ONLY_OPTIMAL: vk.VK_IMAGE_USAGE_SAMPLED_BIT | vk.VK_IMAGE_USAGE_INPUT_ATTACHMENT_BIT,
    vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL: vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT,
    vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL: vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT,
}
_LAYOUT_NAMES = {v: k[len("VK_IMAGE_LAYOUT_"):] for k, v in vars(vk).items()
                 if k.startswith("VK_IMAGE_LAYOUT_") and isinstance(v, int) and v in RESTING_LAYOUTS}
_U32 = 1 << 32


def check_layout(layout: int, usage: int | None, label: str, *, undefined_ok: bool = False) -> int:
    """`layout` if a colour image with `usage` (None: unknown) may rest in it, else
    ValueError/TypeError naming it. `undefined_ok`: UNDEFINED is accepted too
    (a starting layout whose contents may be discarded)."""
    if not is_int(layout):
        raise TypeError(f"{label} must be a VkImageLayout int, got {type(layout).__name__}")
    if undefined_ok and layout == vk.VK_IMAGE_LAYOUT_UNDEFINED:
        return layout
    need = RESTING_LAYOUTS.get(layout)
    if need is None:
        names = ", ".join(sorted(_LAYOUT_NAMES.values()))
        raise ValueError(f"{label} {short_repr(layout)} is not a layout vkmulti keeps colour images in (one of {names})")
    if usage is not None and need and not usage & need:
        raise ValueError(f"{label} {_LAYOUT_NAMES[layout]} needs image usage 0x{need:x}, which the image "
                         f"(usage 0x{usage:x}) lacks")
    return layout


#: Usage bits an Image may be made with (no depth/stencil, no transient attachment).
IMAGE_USAGE_ALLOWED = (vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT
                       | vk.VK_IMAGE_USAGE_SAMPLED_BIT | vk.VK_IMAGE_USAGE_STORAGE_BIT
                       | vk.VK_IMAGE_USAGE_COLOR_ATTACHMENT_BIT | vk.VK_IMAGE_USAGE_INPUT_ATTACHMENT_BIT)


class Image(GpuResource):
    """A 2D optimal-tiling colour image with its own memory on one slot.

    `layout` is the layout the image is in between operations (vkmulti keeps it
    there; one of RESTING_LAYOUTS that `usage` allows). By default the image is
    shared (CONCURRENT) by the slot's universal and copy queue families, so
    transfers need no ownership hand-over; `exclusive=True` makes it owned by
    the universal family (`owner_family`), as engine images usually are, and
    transfers then release and re-acquire it. With `kernel_copies` (the
    default) an image of 4-, 8- or 16-byte texels also gets STORAGE usage and a
    UINT view format (MUTABLE_FORMAT with a format list), so the transfer
    engine can copy it with compute kernels, which on NVIDIA run several times
    faster than image copy commands. `timeout`: how long to wait for the
    transition into `layout` (queued behind the slot's other work).
    """

    def __init__(self, slot: DeviceSlot, width: int, height: int, format: int = DEFAULT_FORMAT, *,
                 usage: int = IMAGE_USAGE, layout: int = SHADER_READ, exclusive: bool = False,
                 kernel_copies: bool = True, timeout: float | None = 60.0):
        check_slot(slot)
        timeout = timeout_seconds(timeout)
        for label, v in (("width", width), ("height", height)):
            if not is_int(v) or v <= 0:
                raise ValueError(f"image {label} must be a positive int, got {short_repr(v)}")
        self.bytes_per_pixel = bytes_per_pixel(format)
        usage = check_usage(usage, "usage")
        if usage & ~IMAGE_USAGE_ALLOWED:
            raise ValueError(f"usage 0x{usage:x} has bits a colour image cannot have (allowed: "
                             f"0x{IMAGE_USAGE_ALLOWED:x})")
        check_layout(layout, usage | (vk.VK_IMAGE_USAGE_STORAGE_BIT if kernel_copies else 0), "layout")
        self.handle: Any = None
        self.memory: Any = None
        self.kernel_view: Any = None   # the UINT view the transfer kernels copy through (lives with the image)
        self.slot, self.width, self.height, self.format = slot, width, height, format
        self._handle_ints: tuple[int, int | None] | None = None
        super().__init__(slot)
        life = slot_lifetime(slot)
        with life:   # the manager's destroy() waits for a constructor that is running
            try:
                props = vkapi.vkGetPhysicalDeviceImageFormatProperties(
                    slot.physical_device, format, vk.VK_IMAGE_TYPE_2D, vk.VK_IMAGE_TILING_OPTIMAL, usage, 0)
            except UnsupportedError:
                raise
            except VulkanError as exc:
                if exc.result != vk.VK_ERROR_FORMAT_NOT_SUPPORTED:
                    raise
                raise UnsupportedError(f"{format_name(format)} images with usage 0x{usage:x} are not supported "
                                       f"on {slot.name!r}", device=slot.name) from None
            if width > props.maxExtent.width or height > props.maxExtent.height:
                raise ValueError(f"{short_repr(width)}x{short_repr(height)} exceeds the device's maximum image extent "
                                 f"{props.maxExtent.width}x{props.maxExtent.height}")
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
            self.usage = usage
            check_layout(layout, usage, "layout")
            families = sorted({slot.graphics_queue.family, slot.copy_queue.family})  # type: ignore[union-attr]
            concurrent = len(families) > 1 and not exclusive
            self.handle = vkapi.vkCreateImage(slot.device, vk.VkImageCreateInfo(
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
                self.memory = allocate_memory(slot, req, 0, vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
                vkapi.vkBindImageMemory(slot.device, self.handle, self.memory, 0)
                if self.kernel_view_format:
                    only_storage = vk.VkImageViewUsageCreateInfo(   # the UINT format needs no other feature
                        sType=vk.VK_STRUCTURE_TYPE_IMAGE_VIEW_USAGE_CREATE_INFO, usage=vk.VK_IMAGE_USAGE_STORAGE_BIT)
                    self.kernel_view = vkapi.vkCreateImageView(slot.device, vk.VkImageViewCreateInfo(
                        sType=vk.VK_STRUCTURE_TYPE_IMAGE_VIEW_CREATE_INFO, pNext=only_storage, image=self.handle,
                        viewType=vk.VK_IMAGE_VIEW_TYPE_2D, format=self.kernel_view_format,
                        subresourceRange=vk.VkImageSubresourceRange(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT,
                                                                    baseMipLevel=0, levelCount=1, baseArrayLayer=0,
                                                                    layerCount=1)), None)
                life.adopt(self)
            except BaseException:
                self._free()
                raise
            #: the family that owns the image (None: shared by every family vkmulti uses)
            self.owner_family = None if concurrent else slot.graphics_queue.family  # type: ignore[union-attr]
            self.layout = layout
            # a failure here leaves the image adopted: the manager frees it once the GPU is done
            CommandRunner.for_slot(slot).run(lambda cmd: self.barrier(cmd, vk.VK_IMAGE_LAYOUT_UNDEFINED, layout),
                                             users=[self], timeout=timeout)

    def _free(self) -> None:
        dev = self.slot.device
        if self.kernel_view is not None:
            vk.vkDestroyImageView(dev, self.kernel_view, None)
            self.kernel_view = None
        if self.handle is not None:
            vk.vkDestroyImage(dev, self.handle, None)
            self.handle = None
        if self.memory is not None:
            vk.vkFreeMemory(dev, self.memory, None)
            self.memory = None

    @staticmethod
    def _kernel_view(slot: DeviceSlot, format: int, usage: int) -> int:
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
            vkapi.vkGetPhysicalDeviceImageFormatProperties(slot.physical_device, format, vk.VK_IMAGE_TYPE_2D,
                                                           vk.VK_IMAGE_TILING_OPTIMAL,
                                                           usage | vk.VK_IMAGE_USAGE_STORAGE_BIT, flags)
        except VulkanError as exc:
            if exc.result != vk.VK_ERROR_FORMAT_NOT_SUPPORTED:
                raise
            return 0
        except UnsupportedError:
            return 0
        return view

    @property
    def nbytes(self) -> int:
        """Bytes of the image's pixels (width x height x bytes per pixel)."""
        return self.width * self.height * self.bytes_per_pixel

    @property
    def handle_int(self) -> int:
        """The VkImage handle as an int; DestroyedError after destroy()."""
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
        return self._handle_ints[1]   # type: ignore[index]

    def barrier(self, cmd: VkCommandBuffer, old: int, new: int) -> None:
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

    def _staging(self, usage: int) -> Buffer:
        return Buffer(self.slot, self.nbytes, usage=usage, host_visible=True)

    def upload(self, pixels: HostData, *, timeout: float | None = 60.0) -> None:
        """Fill the image from host pixels (rows tightly packed, nbytes must match; the image
        needs VK_IMAGE_USAGE_TRANSFER_DST_BIT: ValueError otherwise).

        vkmulti.TimeoutError after `timeout` s (the copy stays queued, and
        this image's destroy() waits for it)."""
        src = as_host_bytes(pixels, "pixels")
        Deadline(timeout)
        with self._life:
            require_transfer_usage(self.usage, "dst", "image", "upload(): the image")
            if src.nbytes != self.nbytes:
                raise ValueError(f"pixels hold {src.nbytes} bytes; a {self.width}x{self.height} "
                                 f"{format_name(self.format)} image needs {self.nbytes}")
            staging = self._staging(vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT)
            layout = self.layout

            def record(cmd: Any) -> None:
                self.barrier(cmd, layout, vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL)
                vk.vkCmdCopyBufferToImage(cmd, staging.handle, self.handle,
                                          vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, 1, [self._region()])
                self.barrier(cmd, vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, layout)
            run_one_shot(self.slot, record, staging, [self], timeout, before=lambda: staging._write(src))
            staging.destroy()

    def download(self, *, waits: Waits = (), timeout: float | None = 60.0) -> NDArray[np.uint8]:
        """The pixels as a (height, width, bytes_per_pixel) uint8 array (the image needs
        VK_IMAGE_USAGE_TRANSFER_SRC_BIT: ValueError otherwise).

        `waits`: timeline points on this device (TimelinePoints or (semaphore,
        value) pairs) to wait for first, e.g. a transfer's dst_ready.
        vkmulti.TimeoutError after `timeout` s; the copy then stays queued
        (its staging memory is freed once it completes, and this image's
        destroy() waits for it), as after Ctrl-C.
        """
        Deadline(timeout)
        with self._life:
            require_transfer_usage(self.usage, "src", "image", "download(): the image")
            points = wait_points(waits, self.slot, "waits")
            staging = self._staging(vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
            layout = self.layout

            def record(cmd: Any) -> None:
                self.barrier(cmd, layout, vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL)
                vk.vkCmdCopyImageToBuffer(cmd, self.handle, vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL,
                                          staging.handle, 1, [self._region()])
                self.barrier(cmd, vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL, layout)
            run_one_shot(self.slot, record, staging, [self], timeout, waits=points)
            try:
                return staging._read(self.nbytes).reshape(self.height, self.width, self.bytes_per_pixel)
            finally:
                staging.destroy()

    def __repr__(self) -> str:
        state = "destroyed" if self.handle is None else f"{self.width}x{self.height} {format_name(self.format)}"
        return f"Image(GPU {getattr(self.slot, 'index', '?')}, {state})"
