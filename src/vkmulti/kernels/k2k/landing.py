"""Device buffers the K2K router moves batches through: pools of landing and
egress regions per device (power-of-two sizes, reused), and the device copies
that gather several outbox batches of one step into one egress region.
"""
from __future__ import annotations

import contextlib

from collections import defaultdict
from typing import Any

import vulkan as vk

from ..._core import vkapi
from ...device.logical import retire_submits
from ..._core.lifetime import Deadline
from ...errors import TimeoutError as VkmTimeout
from ...memory.image import Buffer
from ..._core.timeline import TimelinePoint
from ..engine import recording as cmds
from ..engine.device_context import step_queue

__all__ = ["LandingPool", "Gather", "align", "reached", "nothing_left", "PART_ALIGN"]

#: Landing and egress regions start at multiples of this (the largest
#: minStorageBufferOffsetAlignment Vulkan allows), so a part lands aligned on any device.
PART_ALIGN = 256
_MIN_CLASS = 4096


def align(n: int, a: int = PART_ALIGN) -> int:
    return (n + a - 1) // a * a


def _size_class(n: int) -> int:
    c = _MIN_CLASS
    while c < n:
        c <<= 1
    return c


def nothing_left(i: Any, device: int) -> bool:
    """Whether landed batch `i` (an InboundBatch on `device`) holds nothing more for a
    kernel there, by its sending step's survey: no message addressed to that device,
    or every message of the batch taken from this landing already (by the kernels'
    steps, or by a migration's staging that took a kernel's messages along: then no
    step on the device may ever survey it). The router then takes it back at once."""
    origin = i.k2k_origin
    return not i.done and origin is not None and origin.pending is not None and \
        (not origin.remote_devices >> device & 1 or i.delivered + i.rejected >= origin.count)


def reached(slot: Any, point: TimelinePoint) -> bool:
    return slot.native.timeline_value(point.semaphore) >= point.value


class LandingPool:
    """The landing and egress buffers of one device: device-local, by power-of-two
    size class, reused (`get(size)` a buffer of at least `size` bytes, `put` it back)."""

    def __init__(self, slot: Any):
        self.slot = slot
        self.free: dict[int, list[Buffer]] = defaultdict(list)
        self.all: list[Buffer] = []

    def get(self, size: int) -> Buffer:
        c = _size_class(size)
        if self.free[c]:
            return self.free[c].pop()
        b = Buffer(self.slot, c)
        self.all.append(b)
        return b

    def put(self, buf: Buffer) -> None:
        self.free[buf.size].append(buf)

    def destroy(self, timeout: float) -> None:
        for b in self.all:
            b.destroy(timeout)
        self.all, self.free = [], defaultdict(list)


class GatherTicket:
    """A gather copy as the GPU jobs a Buffer tracks (its destroy() waits for it):
    done once the gather's timeline value is reached. A gather whose timeline is
    gone (destroyed: it waited for every copy first) is done."""

    def __init__(self, gather: "Gather", point: TimelinePoint):
        self.gather, self.point = gather, point

    def gpu_done(self, device_index: int | None = None) -> bool:
        g = self.gather
        return g.timeline is None or g.slot.native.timeline_value(g.timeline) >= self.point.value

    def gpu_wait(self, device_index: int | None, timeout: float | None) -> bool:
        """Wait (no GIL) until the copy is done; False when `timeout` s passed first."""
        g = self.gather
        if g.timeline is None:
            return True
        try:
            g.slot.native.wait_timeline(g.timeline, self.point.value, timeout)
        except VkmTimeout:
            return False
        return True


class Gather:
    """Device copies that gather several outbox batches of one step into one
    egress region on their device (own command buffers and timeline, submitted
    on the runtime's queue after the step that wrote them)."""

    def __init__(self, slot: Any):
        self.slot = slot
        self.queue = step_queue(slot)   # after the steps that wrote the batches, in order
        self.value = 0
        self.timeline = slot.native.create_timeline(0)
        self.pool = vkapi.vkCreateCommandPool(slot.device, vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue.family), None)
        self.buffers: list[tuple[Any, int]] = []   # (command buffer, value it signals)

    def _command_buffer(self) -> Any:
        done = self.slot.native.timeline_value(self.timeline)
        for i, (cmd, value) in enumerate(self.buffers):
            if value <= done:
                del self.buffers[i]
                return cmd
        return vkapi.vkAllocateCommandBuffers(self.slot.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]

    def copy(self, copies: list[tuple[Buffer, int, int]], dst: Buffer, waits: list[TimelinePoint]) -> TimelinePoint:
        """(src buffer, src offset, size) at consecutive aligned offsets of `dst`, after `waits`;
        each source's destroy() waits for the copy (an operation on it until the copy is
        tracked: DestroyedError, nothing submitted, where one was destroyed first)."""
        with contextlib.ExitStack() as using:
            for src, _, _ in copies:
                using.enter_context(src.operation())
            cmd = self._command_buffer()
            vkapi.vkResetCommandBuffer(cmd, 0)
            vkapi.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            cmds.barrier(cmd)
            at = 0
            for src, off, size in copies:
                vk.vkCmdCopyBuffer(cmd, src.handle, dst.handle, 1,
                                   [vk.VkBufferCopy(srcOffset=off, dstOffset=at, size=size)])
                at += align(size)
            cmds.barrier(cmd)
            vkapi.vkEndCommandBuffer(cmd)
            value = self.value + 1
            cmds.submit(self.slot.native, self.queue, cmd, [(p.semaphore, p.value) for p in waits],
                        (self.timeline, value))
            self.value = value
            self.buffers.append((cmd, value))
            point = TimelinePoint.of(self.slot, self.timeline, value)
            self.track([src for src, _, _ in copies], point)
        return point

    def track(self, buffers: list[Buffer], point: TimelinePoint) -> None:
        """Make each buffer's destroy() wait for this gather (a kernel destroyed meanwhile)."""
        t = GatherTicket(self, point)
        for b in buffers:
            b._track(t)

    def destroy(self, timeout: float) -> None:
        if self.value:
            self.slot.native.wait_timeline(self.timeline, self.value, timeout)
        retire_submits(self.slot, Deadline(timeout))   # (see devices.retire_submits)
        vk.vkDestroyCommandPool(self.slot.device, self.pool, None)
        timeline, self.timeline = self.timeline, None
        self.slot.native.destroy_timeline(timeline)


