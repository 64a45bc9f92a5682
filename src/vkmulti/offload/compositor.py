"""Compositor: places SRU images into one frame image on the primary (vkCmdBlitImage)."""
from __future__ import annotations

import math
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import vulkan as vk

from .._core import vkapi
from .._core.checks import is_int, short_repr
from .._core.formats import format_name
from .._core.timeline import TimelinePoint, as_wait_points
from ..errors import DestroyedError
from ..memory.image import Image
from .submit import Submitter, format_features

if TYPE_CHECKING:
    from .._core.timeline import Points
    from ..device.logical import Queue
    from ..device.manager import DeviceSlot

__all__ = ["Compositor", "scale_pair"]


def _int_kind(fmt: int) -> str:
    """"UINT", "SINT" or "" (not an integer format): a blit copies only within one kind."""
    name = format_name(fmt)
    return "UINT" if "_UINT" in name else "SINT" if "_SINT" in name else ""


def scale_pair(content_scale: Any) -> tuple[float, float]:
    try:
        sx, sy = (float(v) for v in content_scale)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"content_scale must be a pair of numbers, got {short_repr(content_scale)}") from None
    if not (math.isfinite(sx) and math.isfinite(sy) and sx > 0 and sy > 0):
        raise ValueError(f"content_scale must be two finite numbers > 0, got {short_repr(content_scale)}")
    return sx, sy


class Compositor(Submitter):
    """Places SRU images into one frame image with vkCmdBlitImage on one device (the primary).

    An SRU at logical (x, y) with a w x h image covers frame pixels
    round(x*sx) .. round((x+w)*sx) (and likewise in y), `content_scale`
    = (sx, sy); parts outside the frame are clipped. Unscaled blits are exact
    copies (nearest filter); scaled ones filter linearly where the format allows.
    """

    def __init__(self, slot: DeviceSlot, *, content_scale: tuple[float, float] = (1.0, 1.0),
                 queue: Queue | None = None):
        self.content_scale = scale_pair(content_scale)
        super().__init__(slot, queue)
        self._linear: dict[int, bool] = {}
        self._features: dict[int, int] = {}

    def _check_image(self, image: Any, what: str, usage: int) -> None:
        if not isinstance(image, Image):
            raise TypeError(f"{what} must be a vkmulti Image, got {type(image).__name__}")
        if image.handle is None:
            raise DestroyedError(f"{what} was destroyed")
        if image.slot is not self.slot:
            raise ValueError(f"{what} belongs to GPU {image.slot.index}, the compositor to GPU {self.slot.index}")
        if not image.usage & usage:
            name = "TRANSFER_DST" if usage == vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT else "TRANSFER_SRC"
            raise ValueError(f"{what} lacks the {name} usage a blit needs")

    def check_frame(self, frame: Image, src_format: int, what: str) -> None:
        """TypeError / ValueError / DestroyedError unless images of `src_format` (`what`) can be
        composited into `frame`."""
        self._check_image(frame, "frame", vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT)
        self.check_blit(src_format, frame.format, what)

    def check_blit(self, src_format: int, dst_format: int, what: str) -> None:
        """ValueError where vkCmdBlitImage cannot copy `src_format` (of `what`) into the frame's
        `dst_format` on this device: the format lacks BLIT_SRC / BLIT_DST, or one is an integer
        format and the other is not of the same kind (the blit would be invalid Vulkan)."""
        for fmt, bit, side in ((src_format, vk.VK_FORMAT_FEATURE_BLIT_SRC_BIT, f"{what}'s"),
                               (dst_format, vk.VK_FORMAT_FEATURE_BLIT_DST_BIT, "the frame's")):
            feats = self._features.get(fmt)
            if feats is None:
                feats = self._features[fmt] = format_features(self.slot, fmt)
            if not feats & bit:
                raise ValueError(f"{side} format {format_name(fmt)} cannot be "
                                 f"{'blitted from' if bit == vk.VK_FORMAT_FEATURE_BLIT_SRC_BIT else 'blitted into'}"
                                 f" on {self.slot.name!r}")
        if _int_kind(src_format) != _int_kind(dst_format):
            raise ValueError(f"{what} is {format_name(src_format)} and the frame {format_name(dst_format)}: a blit "
                             f"copies integer formats only into the same kind (UINT, SINT) and others only into "
                             f"non-integer formats")

    def regions(self, frame: Image, placements: Iterable[tuple[Image, int, int]]) \
            -> list[tuple[Image, tuple[int, int, int, int], tuple[int, int, int, int]]]:
        """(image, src rect, dst rect) per visible placement; rects are (x0, y0, x1, y1)."""
        sx, sy = self.content_scale
        out = []
        for k, item in enumerate(placements):
            try:
                image, x, y = item
            except (TypeError, ValueError):
                raise TypeError(f"placement {k} must be (image, x, y), got {short_repr(item)}") from None
            for label, v in (("x", x), ("y", y)):
                if not is_int(v):
                    raise TypeError(f"placement {k}: {label} must be an int, got {short_repr(v)}")
            self._check_image(image, f"placement {k} image", vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT)
            if image is frame:
                raise ValueError(f"placement {k} image is the frame itself")
            self.check_blit(image.format, frame.format, f"placement {k} image")
            w, h = image.width, image.height
            try:
                d = (round(x * sx), round(y * sy), round((x + w) * sx), round((y + h) * sy))
            except OverflowError:
                raise ValueError(f"placement {k} lies beyond any frame: x {short_repr(x)}, y {short_repr(y)}") from None
            c = (max(d[0], 0), max(d[1], 0), min(d[2], frame.width), min(d[3], frame.height))
            if c[0] >= c[2] or c[1] >= c[3] or d[0] >= d[2] or d[1] >= d[3]:
                continue
            # the source part that lands on the visible destination part
            fx, fy = w / (d[2] - d[0]), h / (d[3] - d[1])
            s = (round((c[0] - d[0]) * fx), round((c[1] - d[1]) * fy),
                 round((c[2] - d[0]) * fx), round((c[3] - d[1]) * fy))
            s = (min(s[0], w - 1), min(s[1], h - 1), max(s[2], min(s[0], w - 1) + 1), max(s[3], min(s[1], h - 1) + 1))
            out.append((image, s, c))
        return out

    def _filter(self, image: Image, src: tuple, dst: tuple) -> int:
        if (src[2] - src[0], src[3] - src[1]) == (dst[2] - dst[0], dst[3] - dst[1]):
            return vk.VK_FILTER_NEAREST
        ok = self._linear.get(image.format)
        if ok is None:
            ok = self._linear[image.format] = bool(
                format_features(self.slot, image.format) & vk.VK_FORMAT_FEATURE_SAMPLED_IMAGE_FILTER_LINEAR_BIT)
        return vk.VK_FILTER_LINEAR if ok else vk.VK_FILTER_NEAREST

    def composite(self, frame: Image, placements: Iterable[tuple[Image, int, int]], *, wait: Points = None,
                  clear: Sequence[float] | None = (0.0, 0.0, 0.0, 1.0)) -> TimelinePoint:
        """Submit the blits of every (image, x, y) into `frame`; returns the point that marks it done.

        `wait`: TimelinePoint(s) on this device to reach first (each SRU
        render, each transfer's dst_ready). `clear`: RGBA the frame is
        cleared to first, or None to draw over its contents.
        """
        waits = as_wait_points(wait, self.slot.index, native=self.slot.native)
        if clear is not None:
            try:
                clear = [float(v) for v in clear]
            except (TypeError, ValueError):
                raise TypeError(f"clear must be 4 numbers (RGBA) or None, got {type(clear).__name__}") from None
            if len(clear) != 4 or not all(math.isfinite(v) for v in clear):
                raise ValueError(f"clear must be 4 finite numbers (RGBA) or None, got {len(clear)} values")
        with self._life, ExitStack() as using:
            if not isinstance(frame, Image):
                raise TypeError(f"frame must be a vkmulti Image, got {type(frame).__name__}")
            using.enter_context(frame._life)   # no image is destroyed under the submit
            self._check_image(frame, "frame", vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT)
            regions = self.regions(frame, placements)
            sources = list({id(img): img for img, _, _ in regions}.values())
            for img in sources:
                using.enter_context(img._life)
                self._check_image(img, "placement image", vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT)
            return self._composite(frame, regions, sources, waits, clear)

    def _composite(self, frame: Image, regions: list, sources: list[Image], waits: list[TimelinePoint],
                   clear: list[float] | None) -> TimelinePoint:
        with self._lock:
            self._check()
            job = self._take_job()
            try:
                self._record(job.cmd, frame, regions, clear)
                return self._submit(job, waits, [frame, *sources])
            except BaseException:
                self._free.append(job)
                raise

    def _record(self, cmd: Any, frame: Image, regions: list, clear: list[float] | None) -> None:
        src_l, dst_l = vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL, vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL
        vkapi.vkResetCommandBuffer(cmd, 0)
        vkapi.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        sources = {img.handle_int: img for img, _, _ in regions}
        frame.barrier(cmd, vk.VK_IMAGE_LAYOUT_UNDEFINED if clear is not None else frame.layout, dst_l)
        for img in sources.values():
            img.barrier(cmd, img.layout, src_l)
        rng = vk.VkImageSubresourceRange(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0, levelCount=1,
                                         baseArrayLayer=0, layerCount=1)
        if clear is not None:
            vk.vkCmdClearColorImage(cmd, frame.handle, dst_l, vk.VkClearColorValue(float32=clear), 1, [rng])
            frame.barrier(cmd, dst_l, dst_l)   # the clear before the blits
        layers = vk.VkImageSubresourceLayers(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, mipLevel=0,
                                             baseArrayLayer=0, layerCount=1)
        for img, s, d in regions:
            blit = vk.VkImageBlit(srcSubresource=layers, srcOffsets=[vk.VkOffset3D(s[0], s[1], 0),
                                                                     vk.VkOffset3D(s[2], s[3], 1)],
                                  dstSubresource=layers, dstOffsets=[vk.VkOffset3D(d[0], d[1], 0),
                                                                     vk.VkOffset3D(d[2], d[3], 1)])
            vk.vkCmdBlitImage(cmd, img.handle, src_l, frame.handle, dst_l, 1, [blit], self._filter(img, s, d))
        for img in sources.values():
            img.barrier(cmd, src_l, img.layout)
        frame.barrier(cmd, dst_l, frame.layout)
        vkapi.vkEndCommandBuffer(cmd)
