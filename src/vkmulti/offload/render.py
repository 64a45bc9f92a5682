"""The reference SRU renderer: ReferenceSRU and ReferenceRenderer (a compute shader drawing a procedural tile).

`ReferenceRenderer` renders a `ReferenceSRU` into an RGBA16F storage image on
one device; it submits without blocking and signals a timeline semaphore it
owns (submit.py), so several devices render at once, and owns its command
pool (never an engine's frame pool), pipeline and descriptor pool. Engine
authors can copy it as the pattern for their own per-device SRU renderers.
"""
from __future__ import annotations

import logging
import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import vulkan as vk

from .._core import vkapi
from .._core.checks import U32_MAX, int_in, is_int, positive_int, short_repr
from .._core.reprs import compact_repr
from .._core.shaders import shader_bytes
from .._core.timeline import TimelinePoint, as_wait_points
from ..errors import DestroyedError, UnsupportedError
from ..memory.image import IMAGE_USAGE, Image
from .submit import MAX_IN_FLIGHT, Job, Submitter, format_features

if TYPE_CHECKING:
    from .._core.timeline import Points
    from ..device.logical import Queue
    from ..device.manager import DeviceSlot

log = logging.getLogger(__name__)

__all__ = ["ReferenceSRU", "ReferenceRenderer", "SRU_IMAGE_USAGE", "SRU_FORMAT", "MAX_ITERATIONS", "MAX_SLOWDOWN"]

_ffi = vk.ffi

SRU_FORMAT = vk.VK_FORMAT_R16G16B16A16_SFLOAT
#: Usage of SRU render targets: storage (the shader), copies (transfers, blits), sampling (engines).
SRU_IMAGE_USAGE = IMAGE_USAGE | vk.VK_IMAGE_USAGE_STORAGE_BIT
MAX_ITERATIONS = 1 << 24       # a sane bound on steps per pixel
MAX_SLOWDOWN = 1024            # bound of ReferenceRenderer.slowdown (dispatches per SRU)
_GROUP = 8                     # local_size_x/y of sru.comp
_PUSH = struct.Struct("<4f4fIIfI")




def _colour(v: Any, what: str) -> tuple[float, float, float]:
    try:
        c = tuple(float(x) for x in v)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"{what} must be 3 numbers (linear RGB), got {short_repr(v)}") from None
    if len(c) != 3 or not all(math.isfinite(x) for x in c):
        raise ValueError(f"{what} must be 3 finite numbers (linear RGB), got {short_repr(v)}")
    return c


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
            raise TypeError(f"sru_id must be an int or a str, got {short_repr(self.sru_id)}")
        positive_int(self.width, "width")
        positive_int(self.height, "height")
        for label in ("x", "y"):
            v = getattr(self, label)
            if not is_int(v):
                raise TypeError(f"{label} must be an int, got {short_repr(v)}")
        int_in(self.seed, "seed", 0, U32_MAX)
        positive_int(self.iterations, "iterations", MAX_ITERATIONS)
        int_in(self.border, "border", 0, U32_MAX)   # a uint in the push constants
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


class ReferenceRenderer(Submitter):
    """Renders ReferenceSRUs with the sru.comp compute shader on one device.

    `render()` records and submits at once and returns the TimelinePoint that
    marks the image ready, so renderers on several devices run concurrently.
    Implements the seed's recorder protocol (`render_sru_offscreen`).

    `slowdown` (an int >= 1, settable) is a test and bench hook that makes
    this device look slower than it is: every SRU is dispatched `slowdown`
    times in a row into the same image (real GPU work, same pixels), so one
    device of an equal pair takes `slowdown` x as long per SRU.
    """

    def __init__(self, slot: DeviceSlot, *, queue: Queue | None = None, slowdown: int = 1):
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
        self._slowdown = int_in(value, "slowdown", 1, MAX_SLOWDOWN)

    def _create_pipeline(self) -> None:
        slot, dev = self.slot, self.slot.device
        self.layout = self.dsl = self.pipeline = self.dpool = None
        if not format_features(slot, SRU_FORMAT) & vk.VK_FORMAT_FEATURE_STORAGE_IMAGE_BIT:
            raise UnsupportedError(f"R16G16B16A16_SFLOAT storage images are not supported on {slot.name!r}",
                                   device=slot.name)
        code = shader_bytes("sru.comp.spv")
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
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, maxSets=MAX_IN_FLIGHT,
            pPoolSizes=[vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE,
                                                descriptorCount=MAX_IN_FLIGHT)]), None)

    def _new_job(self) -> Job:
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
        if not isinstance(sru, ReferenceSRU):
            raise TypeError(f"sru must be a ReferenceSRU, got {type(sru).__name__}")
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
            raise ValueError(f"target is {target.width}x{target.height}, SRU {short_repr(sru.sru_id)} is "
                             f"{short_repr(sru.width)}x{short_repr(sru.height)}")

    def render(self, sru: ReferenceSRU, target: Image, *, wait: Points = None) -> TimelinePoint:
        """Submit the render of `sru` into `target`; returns the point that marks it done.

        `wait`: TimelinePoint(s) on this device to reach first (e.g. the
        previous transfer's src_done, before the target is overwritten).
        """
        if not isinstance(sru, ReferenceSRU):
            raise TypeError(f"sru must be a ReferenceSRU, got {type(sru).__name__}")
        if not isinstance(target, Image):
            raise TypeError(f"target must be a vkmulti Image, got {type(target).__name__}")
        waits = as_wait_points(wait, self.slot.index, native=self.slot.native)
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
