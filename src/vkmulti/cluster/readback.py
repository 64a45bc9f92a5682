"""Reading many images of one GPU back to host memory in one submit.

An agent returns every SRU image of a frame as numpy arrays. Image.download()
makes a staging buffer, submits and waits once per image; for the dozens of
small images of a frame that per-image cost is most of the read-back time. A
`BatchReadback` keeps one host-visible staging buffer per GPU (grown as
needed), records every image's copy into it in one command buffer, waits once
and copies each image out once.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import vulkan as vk

from .._core import vkapi
from .._core.checks import seconds_text
from ..errors import TimeoutError as VkmTimeout
from ..memory.buffer import Buffer
from ..device.commands import CommandRunner
from ..memory.image import Image

__all__ = ["BatchReadback"]

_SRC = vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL


class BatchReadback:
    """One GPU's staging buffer for reading images back in one submit (destroy() frees it)."""

    def __init__(self, slot: Any):
        self.slot = slot
        self._buffer: Buffer | None = None

    def _staging(self, nbytes: int, timeout: float | None) -> Buffer:
        if self._buffer is None or self._buffer.size < nbytes:
            if self._buffer is not None:
                self._buffer.destroy(timeout)   # (waits for a copy a read that gave up left queued)
                self._buffer = None
            size = max(nbytes, 1 << 20)
            size = 1 << (size - 1).bit_length()            # power of two: few regrowths
            self._buffer = Buffer(self.slot, size, usage=vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT, host_visible=True)
        return self._buffer

    def read(self, images: Sequence[Image], *, waits: Sequence[tuple[int, int]] = (),
             timeout: float = 60.0) -> list[np.ndarray]:
        """Each image's pixels as a new (height, width, bytes_per_pixel) uint8 array, in order.

        `waits`: (timeline semaphore, value) points on this GPU to reach first.
        """
        for img in images:
            if not isinstance(img, Image) or img.handle is None or img.slot is not self.slot:
                raise ValueError(f"images must be live vkmulti Images of GPU {self.slot.index}")
        if not images:
            return []
        offsets, total = [], 0
        for img in images:
            offsets.append(total)
            total += (img.nbytes + 15) & ~15                # copies start 16-byte aligned
        buf = self._staging(total, timeout)

        def record(cmd: Any) -> None:
            layers = vk.VkImageSubresourceLayers(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, mipLevel=0,
                                                 baseArrayLayer=0, layerCount=1)
            for img, off in zip(images, offsets):
                img.barrier(cmd, img.layout, _SRC)
                vk.vkCmdCopyImageToBuffer(cmd, img.handle, _SRC, buf.handle, 1, [vk.VkBufferImageCopy(
                    bufferOffset=off, bufferRowLength=0, bufferImageHeight=0, imageSubresource=layers,
                    imageOffset=vk.VkOffset3D(0, 0, 0), imageExtent=vk.VkExtent3D(img.width, img.height, 1))])
                img.barrier(cmd, _SRC, img.layout)
        # (a wait that gives up leaves the copy queued: the images and the staging buffer are its
        # users, so that their destroy() waits for it instead of freeing them under it)
        try:
            CommandRunner.for_slot(self.slot).run(record, waits=list(waits), timeout=timeout, users=[*images, buf])
        except VkmTimeout:
            raise VkmTimeout(f"reading back {len(images)} image(s) of GPU {self.slot.index}: the copy did not finish "
                             f"within {seconds_text(timeout)} s (it runs after the work queued on the GPU before "
                             f"it)") from None
        mapped = vkapi.vkMapMemory(self.slot.device, buf.memory, 0, total, 0)
        try:
            host = np.frombuffer(mapped, dtype=np.uint8, count=total)   # vkMapMemory gives a cffi buffer
            return [host[off:off + img.nbytes].reshape(img.height, img.width, img.bytes_per_pixel).copy()
                    for img, off in zip(images, offsets)]
        finally:
            vk.vkUnmapMemory(self.slot.device, buf.memory)

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Free the staging buffer once no copy uses it (idempotent); vkmulti.TimeoutError after
        `timeout` s keeps it for a later call."""
        if self._buffer is not None:
            self._buffer.destroy(timeout)
            self._buffer = None
