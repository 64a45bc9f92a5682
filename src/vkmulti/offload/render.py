"""The reference SRU renderer (a compute shader drawing a procedural tile) and the compositor.

`ReferenceRenderer` renders a `ReferenceSRU` into an RGBA16F storage image on
one device; `Compositor` blits SRU images into a frame image on the primary.
Both submit without blocking and signal a timeline semaphore they own, so
several devices render at once; each owns its command pool (never an
engine's frame pool), pipeline and descriptor pool. Engine authors can copy
them as the pattern for their own per-device SRU renderers.
"""
from __future__ import annotations

import logging
import math
import struct
import threading
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import vulkan as vk

from .._core.reprs import compact_repr
from .._core import vkapi
from ..errors import DestroyedError, DeviceLostError, UnsupportedError
from ..errors import TimeoutError as VkmTimeoutError
from ..device.logical import retire_submits
from ..memory.image import IMAGE_USAGE, Image, timeline_submit_info
from .._core.lifetime import Lifetime
from ..device.slots import check_slot, slot_lifetime, slot_queue
from .._core.shaders import shader_path
from .._core.timeline import TimelinePoint, as_wait_points

log = logging.getLogger(__name__)

__all__ = ["ReferenceSRU", "ReferenceRenderer", "Compositor", "SRU_IMAGE_USAGE", "SRU_FORMAT",
           "shader_path", "as_wait_points"]

_ffi = vk.ffi

SRU_FORMAT = vk.VK_FORMAT_R16G16B16A16_SFLOAT
#: Usage of SRU render targets: storage (the shader), copies (transfers, blits), sampling (engines).
SRU_IMAGE_USAGE = IMAGE_USAGE | vk.VK_IMAGE_USAGE_STORAGE_BIT
MAX_ITERATIONS = 1 << 24       # a sane bound on steps per pixel
MAX_SLOWDOWN = 1024            # bound of ReferenceRenderer.slowdown (dispatches per SRU)
_GROUP = 8                     # local_size_x/y of sru.comp
_PUSH = struct.Struct("<4f4fIIfI")
_MAX_IN_FLIGHT = 64




def _positive_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{what} must be a positive int, got {v!r}")
    return v


def _colour(v: Any, what: str) -> tuple[float, float, float]:
    try:
        c = tuple(float(x) for x in v)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be 3 numbers (linear RGB), got {v!r}") from None
    if len(c) != 3 or not all(math.isfinite(x) for x in c):
        raise ValueError(f"{what} must be 3 finite numbers (linear RGB), got {v!r}")
    return c  # type: ignore[return-value]


@dataclass(frozen=True)
class ReferenceSRU:
    """One scene-render-unit of the reference renderer.

    `width` x `height` pixels, placed at (`x`, `y`) in the frame (logical units:
    the compositor multiplies by its content_scale). `seed` and the colours
    change the picture; `iterations` (steps per pixel) sets the cost.
    """

    __repr__ = compact_repr

    sru_id: int | str
    width: int
    height: int
    x: int = 0
    y: int = 0
    seed: int = 0
    iterations: int = 64
    color_a: tuple[float, float, float] = (1.0, 0.55, 0.15)
    color_b: tuple[float, float, float] = (0.08, 0.16, 0.45)
    border: int = 2
    offloadable: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.sru_id, bool) or not isinstance(self.sru_id, (int, str)):
            raise TypeError(f"sru_id must be an int or a str, got {self.sru_id!r}")
        _positive_int(self.width, "width")
        _positive_int(self.height, "height")
        for label in ("x", "y"):
            v = getattr(self, label)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{label} must be an int, got {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be an int in [0, 2**32), got {self.seed!r}")
        if _positive_int(self.iterations, "iterations") > MAX_ITERATIONS:
            raise ValueError(f"iterations must be <= {MAX_ITERATIONS}, got {self.iterations}")
        if isinstance(self.border, bool) or not isinstance(self.border, int) or self.border < 0:
            raise ValueError(f"border must be an int >= 0, got {self.border!r}")
        object.__setattr__(self, "color_a", _colour(self.color_a, "color_a"))
        object.__setattr__(self, "color_b", _colour(self.color_b, "color_b"))

    @property
    def render_cost(self) -> float:
        """The renderer's cost model: pixels x steps per pixel (the shader has no early exit)."""
        return float(self.width * self.height * self.iterations)

    def push_constants(self) -> bytes:
        """The shader's parameters, packed as its push-constant block."""
        scale = 3.0 / min(self.width, self.height)
        return _PUSH.pack(*self.color_a, 1.0, *self.color_b, 1.0, self.seed, self.iterations, scale, self.border)




class _Job:
    __slots__ = ("cmd", "dset", "view", "value")

    def __init__(self, cmd: Any, dset: Any = None):
        self.cmd, self.dset, self.view, self.value = cmd, dset, None, 0


class _SubmitDone:
    """One submit of a renderer or compositor, for the images it touches (their
    destroy() waits for it): done once the submitter's timeline reaches `value`."""
    __slots__ = ("sub", "value")

    def __init__(self, sub: "_Submitter", value: int):
        self.sub, self.value = sub, value

    def gpu_done(self, device_index: int | None = None) -> bool:
        life = self.sub._life
        try:
            with life.keep():   # the timeline semaphore stays while this reads it
                return self.sub.slot.native.timeline_value(self.sub._timeline) >= self.value
        except DestroyedError:
            return life.dead   # its destroy() waited for every submit
        except DeviceLostError as exc:
            log.info("%r: device lost (%s); its submits count as done", self.sub, exc)
            return True

    def gpu_wait(self, device_index: int | None, timeout: float | None) -> bool:
        life = self.sub._life
        try:
            with life.keep():
                self.sub.slot.native.wait_timeline(self.sub._timeline, self.value, timeout)
                return True
        except VkmTimeoutError:
            return False
        except DestroyedError:
            return life.dead
        except DeviceLostError as exc:
            log.info("%r: device lost (%s); its submits count as done", self.sub, exc)
            return True


class _Submitter:
    """A command pool, a timeline semaphore and recycled command buffers on one queue.

    Adopted by the slot's manager; render/composite/wait run inside its
    lifetime, and destroy() waits (bounded) for every submit before freeing.
    """

    _teardown_rank = 30   # after the coordinators that use it, before the images it draws into

    def __init__(self, slot: Any, queue: Any = None):
        check_slot(slot)
        self.slot = slot
        self.queue = slot_queue(slot, queue, slot.graphics_queue)
        self._lock = threading.Lock()
        self._free: list[_Job] = []
        self._inflight: deque[_Job] = deque()
        self._value = 0
        self.pool: Any = None
        self._life = Lifetime(self, type(self).__name__, (slot_lifetime(slot),))
        life = slot_lifetime(slot)
        with life:
            self.pool = vkapi.vkCreateCommandPool(slot.device, vk.VkCommandPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue.family), None)
            try:
                self._timeline = slot.native.create_timeline(0)
            except BaseException:
                vk.vkDestroyCommandPool(slot.device, self.pool, None)
                self.pool = None
                raise
            try:
                life.adopt(self)
            except BaseException:
                vk.vkDestroyCommandPool(slot.device, self.pool, None)
                vk.vkDestroySemaphore(slot.device, _ffi.cast("VkSemaphore", self._timeline), None)
                self.pool = None
                raise

    # -- jobs ------------------------------------------------------------

    def _check(self) -> None:
        if self.pool is None:
            raise DestroyedError(f"{type(self).__name__} used after destroy()")

    def _new_job(self) -> _Job:
        cmd = vkapi.vkAllocateCommandBuffers(self.slot.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        return _Job(cmd)

    def _retire(self, job: _Job) -> None:
        if job.view is not None:
            vk.vkDestroyImageView(self.slot.device, job.view, None)
            job.view = None

    def _take_job(self) -> _Job:
        """A command buffer no submit still uses (waits for the oldest when too many are in flight)."""
        done = self.slot.native.timeline_value(self._timeline)
        while self._inflight and (self._inflight[0].value <= done or len(self._inflight) >= _MAX_IN_FLIGHT):
            job = self._inflight[0]
            if job.value > done:
                self.slot.native.wait_timeline(self._timeline, job.value, 60.0)
            self._inflight.popleft()
            self._retire(job)
            self._free.append(job)
        return self._free.pop() if self._free else self._new_job()

    def _submit(self, job: _Job, waits: Sequence[TimelinePoint], images: Sequence[Image] = ()) -> TimelinePoint:
        value = self._value + 1
        info = timeline_submit_info(job.cmd, [(p.semaphore, p.value) for p in waits],
                                    signal=(self._timeline, value))
        vkapi.queue_submit(self.slot.native, self.queue, [info])
        self._value = job.value = value
        self._inflight.append(job)
        done = _SubmitDone(self, value)
        for img in images:
            img._track(done)   # its destroy() waits for this submit
        return TimelinePoint(self._timeline, value, self.slot.index)

    # -- public ------------------------------------------------------------

    @property
    def last(self) -> TimelinePoint | None:
        """The point the latest submit signals (None before the first)."""
        return TimelinePoint(self._timeline, self._value, self.slot.index) if self._value else None

    def wait(self, point: TimelinePoint | None = None, timeout: float | None = 60.0) -> None:
        """Block (no GIL) until `point` (default: the latest submit) is reached."""
        with self._life:
            point = point or self.last
            if point is None:
                return
            if not isinstance(point, TimelinePoint) or point.semaphore != self._timeline:
                raise ValueError(f"that point was not signalled by this {type(self).__name__}")
            self.slot.native.wait_timeline(self._timeline, point.value, timeout)

    def _destroy_extra(self) -> None:
        """Subclasses free their own objects here (the GPU is idle for them)."""

    @property
    def destroyed(self) -> bool:
        return self._life.dead

    def destroy(self, timeout: float | None = 60.0) -> None:
        """Wait for every submit, then free everything (idempotent; vkmulti.TimeoutError keeps it all)."""
        with self._life.ending(timeout) as dl:
            if dl is None or self.pool is None:
                return
            with self._lock:
                dev = self.slot.device
                if self._value:
                    try:
                        self.slot.native.wait_timeline(self._timeline, self._value, dl.left())
                    except DeviceLostError as exc:   # nothing runs on a lost device any more
                        log.info("%s on GPU %d: device lost (%s); freeing its objects",
                                    type(self).__name__, self.slot.index, exc)
                    # later submits waited on this timeline (a compositor on a renderer's, a
                    # transfer on its source's): the driver may hold it until they retire
                    retire_submits(self.slot, dl)
                for job in list(self._inflight) + self._free:
                    self._retire(job)
                self._inflight.clear()
                self._free.clear()
                self._destroy_extra()
                vk.vkDestroyCommandPool(dev, self.pool, None)
                vk.vkDestroySemaphore(dev, _ffi.cast("VkSemaphore", self._timeline), None)
                self.pool = None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(GPU {getattr(self.slot, 'index', '?')}, submits={self._value})"


def _format_features(slot: Any, fmt: int) -> int:
    return vk.vkGetPhysicalDeviceFormatProperties(slot.physical_device, fmt).optimalTilingFeatures


class ReferenceRenderer(_Submitter):
    """Renders ReferenceSRUs with the sru.comp compute shader on one device.

    `render()` records and submits at once and returns the TimelinePoint that
    marks the image ready, so renderers on several devices run concurrently.
    Implements the seed's recorder protocol (`render_sru_offscreen`).

    `slowdown` (an int >= 1, settable) is a test and bench hook that makes
    this device look slower than it is: every SRU is dispatched `slowdown`
    times in a row into the same image (real GPU work, same pixels), so one
    device of an equal pair takes `slowdown` x as long per SRU.
    """

    def __init__(self, slot: Any, *, queue: Any = None, slowdown: int = 1):
        self.slowdown = slowdown
        super().__init__(slot, queue)
        try:
            self._create_pipeline()
        except BaseException:
            self.destroy()
            raise

    @property
    def slowdown(self) -> int:
        """How many times each SRU is dispatched (1: normal speed)."""
        return self._slowdown

    @slowdown.setter
    def slowdown(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SLOWDOWN:
            raise ValueError(f"slowdown must be an int in [1, {MAX_SLOWDOWN}], got {value!r}")
        self._slowdown = value

    def _create_pipeline(self) -> None:
        slot, dev = self.slot, self.slot.device
        self.layout = self.dsl = self.pipeline = self.dpool = None
        if not _format_features(slot, SRU_FORMAT) & vk.VK_FORMAT_FEATURE_STORAGE_IMAGE_BIT:
            raise UnsupportedError(f"R16G16B16A16_SFLOAT storage images are not supported on {slot.name!r}",
                                   device=slot.name)
        code = shader_path("sru.comp.spv").read_bytes()
        module = vkapi.vkCreateShaderModule(dev, vk.VkShaderModuleCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, codeSize=len(code), pCode=code), None)
        try:
            self.dsl = vkapi.vkCreateDescriptorSetLayout(dev,
                           vk.VkDescriptorSetLayoutCreateInfo(
                               sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                               pBindings=[vk.VkDescriptorSetLayoutBinding(
                                   binding=0, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE,
                                   descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)]), None)
            self.layout = vkapi.vkCreatePipelineLayout(dev, vk.VkPipelineLayoutCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, setLayoutCount=1, pSetLayouts=[self.dsl],
                pushConstantRangeCount=1, pPushConstantRanges=[vk.VkPushConstantRange(
                    stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=_PUSH.size)]), None)
            # keep `stage` referenced until the call: its pName lives as long as it does
            stage = vk.VkPipelineShaderStageCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main")
            self.pipeline = vkapi.vkCreateComputePipelines(dev, vk.VK_NULL_HANDLE, 1,
                                [vk.VkComputePipelineCreateInfo(
                                    sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, stage=stage,
                                    layout=self.layout)], None)[0]
            del stage
        finally:
            vk.vkDestroyShaderModule(dev, module, None)
        self.dpool = vkapi.vkCreateDescriptorPool(dev, vk.VkDescriptorPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, maxSets=_MAX_IN_FLIGHT,
            pPoolSizes=[vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE,
                                                descriptorCount=_MAX_IN_FLIGHT)]), None)

    def _new_job(self) -> _Job:
        job = super()._new_job()
        job.dset = vkapi.vkAllocateDescriptorSets(self.slot.device, vk.VkDescriptorSetAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, descriptorPool=self.dpool,
            descriptorSetCount=1, pSetLayouts=[self.dsl]))[0]
        return job

    def _destroy_extra(self) -> None:
        dev = self.slot.device
        if self.dpool is not None:
            vk.vkDestroyDescriptorPool(dev, self.dpool, None)
        if self.pipeline is not None:
            vk.vkDestroyPipeline(dev, self.pipeline, None)
        if self.layout is not None:
            vk.vkDestroyPipelineLayout(dev, self.layout, None)
        if self.dsl is not None:
            vk.vkDestroyDescriptorSetLayout(dev, self.dsl, None)

    def make_target(self, sru: ReferenceSRU) -> Image:
        """A render target for `sru` on this device (the caller destroys it)."""
        return Image(self.slot, sru.width, sru.height, SRU_FORMAT, usage=SRU_IMAGE_USAGE)

    def _check_target(self, sru: ReferenceSRU, target: Any) -> None:
        if not isinstance(target, Image):
            raise TypeError(f"target must be a vkmulti Image, got {type(target).__name__}")
        if target.handle is None:
            raise DestroyedError("target image was destroyed")
        if target.slot is not self.slot:
            raise ValueError(f"target belongs to GPU {target.slot.index}, this renderer to GPU {self.slot.index}")
        if target.format != SRU_FORMAT or not target.usage & vk.VK_IMAGE_USAGE_STORAGE_BIT:
            raise ValueError("target must be an R16G16B16A16_SFLOAT image with STORAGE usage "
                             "(see ReferenceRenderer.make_target)")
        if (target.width, target.height) != (sru.width, sru.height):
            raise ValueError(f"target is {target.width}x{target.height}, SRU {sru.sru_id!r} is "
                             f"{sru.width}x{sru.height}")

    def render(self, sru: ReferenceSRU, target: Image, *, wait: Any = None) -> TimelinePoint:
        """Submit the render of `sru` into `target`; returns the point that marks it done.

        `wait`: TimelinePoint(s) on this device to reach first (e.g. the
        previous transfer's src_done, before the target is overwritten).
        """
        if not isinstance(sru, ReferenceSRU):
            raise TypeError(f"sru must be a ReferenceSRU, got {type(sru).__name__}")
        if not isinstance(target, Image):
            raise TypeError(f"target must be a vkmulti Image, got {type(target).__name__}")
        waits = as_wait_points(wait, self.slot.index)
        with self._life, target._life, self._lock:   # neither is destroyed under the submit
            self._check_target(sru, target)
            self._check()
            job = self._take_job()
            dev = self.slot.device
            try:
                job.view = vkapi.vkCreateImageView(dev, vk.VkImageViewCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_IMAGE_VIEW_CREATE_INFO, image=target.handle,
                    viewType=vk.VK_IMAGE_VIEW_TYPE_2D, format=SRU_FORMAT,
                    subresourceRange=vk.VkImageSubresourceRange(
                        aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0, levelCount=1,
                        baseArrayLayer=0, layerCount=1)), None)
                vk.vkUpdateDescriptorSets(dev, 1, [vk.VkWriteDescriptorSet(
                    sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dstSet=job.dset, dstBinding=0,
                    descriptorCount=1, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE,
                    pImageInfo=[vk.VkDescriptorImageInfo(imageView=job.view,
                                                         imageLayout=vk.VK_IMAGE_LAYOUT_GENERAL)])], 0, None)
                self._record(job.cmd, sru, target, job.dset)
                return self._submit(job, waits, [target])
            except BaseException:
                self._retire(job)
                self._free.append(job)
                raise

    def render_sru_offscreen(self, sru: ReferenceSRU, target: Image) -> TimelinePoint:
        """The seed's recorder protocol: same as render(sru, target)."""
        return self.render(sru, target)

    def _record(self, cmd: Any, sru: ReferenceSRU, target: Image, dset: Any) -> None:
        vkapi.vkResetCommandBuffer(cmd, 0)
        vkapi.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        final = target.layout
        if final in (vk.VK_IMAGE_LAYOUT_UNDEFINED, vk.VK_IMAGE_LAYOUT_PREINITIALIZED):
            final = target.layout = vk.VK_IMAGE_LAYOUT_GENERAL
        # the whole image is overwritten: discard the old contents
        target.barrier(cmd, vk.VK_IMAGE_LAYOUT_UNDEFINED, vk.VK_IMAGE_LAYOUT_GENERAL)
        vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.pipeline)
        vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.layout, 0, 1, [dset], 0, None)
        data = sru.push_constants()
        vk.vkCmdPushConstants(cmd, self.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(data),
                              _ffi.new("char[]", data))
        for k in range(self._slowdown):
            if k:   # the repeat overwrites the same pixels: order it after the previous write
                target.barrier(cmd, vk.VK_IMAGE_LAYOUT_GENERAL, vk.VK_IMAGE_LAYOUT_GENERAL)
            vk.vkCmdDispatch(cmd, (sru.width + _GROUP - 1) // _GROUP, (sru.height + _GROUP - 1) // _GROUP, 1)
        if final != vk.VK_IMAGE_LAYOUT_GENERAL:
            target.barrier(cmd, vk.VK_IMAGE_LAYOUT_GENERAL, final)
        else:
            target.barrier(cmd, final, final)
        vkapi.vkEndCommandBuffer(cmd)


def _scale_pair(content_scale: Any) -> tuple[float, float]:
    try:
        sx, sy = (float(v) for v in content_scale)
    except (TypeError, ValueError):
        raise TypeError(f"content_scale must be a pair of numbers, got {content_scale!r}") from None
    if not (math.isfinite(sx) and math.isfinite(sy) and sx > 0 and sy > 0):
        raise ValueError(f"content_scale must be two finite numbers > 0, got {content_scale!r}")
    return sx, sy


class Compositor(_Submitter):
    """Places SRU images into one frame image with vkCmdBlitImage on one device (the primary).

    An SRU at logical (x, y) with a w x h image covers frame pixels
    round(x*sx) .. round((x+w)*sx) (and likewise in y), `content_scale`
    = (sx, sy); parts outside the frame are clipped. Unscaled blits are exact
    copies (nearest filter); scaled ones filter linearly where the format allows.
    """

    def __init__(self, slot: Any, *, content_scale: Any = (1.0, 1.0), queue: Any = None):
        self.content_scale = _scale_pair(content_scale)
        super().__init__(slot, queue)
        self._linear: dict[int, bool] = {}

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

    def regions(self, frame: Image, placements: Iterable[tuple[Image, int, int]]) -> list[tuple[Image, tuple, tuple]]:
        """(image, src rect, dst rect) per visible placement; rects are (x0, y0, x1, y1)."""
        sx, sy = self.content_scale
        out = []
        for k, item in enumerate(placements):
            try:
                image, x, y = item
            except (TypeError, ValueError):
                raise TypeError(f"placement {k} must be (image, x, y), got {item!r}") from None
            for label, v in (("x", x), ("y", y)):
                if isinstance(v, bool) or not isinstance(v, int):
                    raise TypeError(f"placement {k}: {label} must be an int, got {v!r}")
            self._check_image(image, f"placement {k} image", vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT)
            if image is frame:
                raise ValueError(f"placement {k} image is the frame itself")
            w, h = image.width, image.height
            d = (round(x * sx), round(y * sy), round((x + w) * sx), round((y + h) * sy))
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
                _format_features(self.slot, image.format) & vk.VK_FORMAT_FEATURE_SAMPLED_IMAGE_FILTER_LINEAR_BIT)
        return vk.VK_FILTER_LINEAR if ok else vk.VK_FILTER_NEAREST

    def composite(self, frame: Image, placements: Iterable[tuple[Image, int, int]], *, wait: Any = None,
                  clear: Sequence[float] | None = (0.0, 0.0, 0.0, 1.0)) -> TimelinePoint:
        """Submit the blits of every (image, x, y) into `frame`; returns the point that marks it done.

        `wait`: TimelinePoint(s) on this device to reach first (each SRU
        render, each transfer's dst_ready). `clear`: RGBA the frame is
        cleared to first, or None to draw over its contents.
        """
        waits = as_wait_points(wait, self.slot.index)
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

