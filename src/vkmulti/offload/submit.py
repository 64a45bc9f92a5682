"""Submitter: the non-blocking submission that ReferenceRenderer and Compositor share.

A command pool, a timeline semaphore the submitter owns and recycled command
buffers on one queue: each submit signals the next timeline value and returns
it as a TimelinePoint, so work on several devices runs at once.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Sequence

import vulkan as vk

from .._core import vkapi
from .._core.lifetime import Lifetime
from .._core.timeline import TimelinePoint
from ..device.logical import retire_submits
from ..errors import DestroyedError, DeviceLostError
from ..errors import TimeoutError as VkmTimeoutError
from ..memory.image import Image, timeline_submit_info
from ..device.slots import check_slot, slot_lifetime, slot_queue

if TYPE_CHECKING:
    from ..device.logical import Queue
    from ..device.manager import DeviceSlot

log = logging.getLogger(__name__)

__all__ = ["Submitter", "Job", "MAX_IN_FLIGHT", "format_features"]


#: Command buffers a submitter keeps in flight before it waits for the oldest.
MAX_IN_FLIGHT = 64


class Job:
    """One recycled command buffer of a submitter (with its descriptor set and view, if any) and
    the timeline value of its latest submit."""

    __slots__ = ("cmd", "dset", "view", "value")

    def __init__(self, cmd: Any, dset: Any = None):
        self.cmd, self.dset, self.view, self.value = cmd, dset, None, 0


class _SubmitDone:
    """One submit of a renderer or compositor, for the images it touches (their
    destroy() waits for it): done once the submitter's timeline reaches `value`."""
    __slots__ = ("sub", "value")

    def __init__(self, sub: "Submitter", value: int):
        self.sub, self.value = sub, value

    def gpu_done(self, device_index: int | None = None) -> bool:
        life = self.sub._life
        try:
            with life.keep():   # the timeline semaphore stays while this reads it
                return self.sub.slot.native.timeline_value(self.sub._timeline) >= self.value  # type: ignore[union-attr]
        except DestroyedError:
            return life.dead   # its destroy() waited for every submit
        except DeviceLostError as exc:
            log.info("%r: device lost (%s); its submits count as done", self.sub, exc)
            return True

    def gpu_wait(self, device_index: int | None, timeout: float | None) -> bool:
        life = self.sub._life
        try:
            with life.keep():
                self.sub.slot.native.wait_timeline(self.sub._timeline, self.value, timeout)  # type: ignore[union-attr]
                return True
        except VkmTimeoutError:
            return False
        except DestroyedError:
            return life.dead
        except DeviceLostError as exc:
            log.info("%r: device lost (%s); its submits count as done", self.sub, exc)
            return True


class Submitter:
    """A command pool, a timeline semaphore and recycled command buffers on one queue.

    Adopted by the slot's manager; render/composite/wait run inside its
    lifetime, and destroy() waits (bounded) for every submit before freeing.
    """

    _teardown_rank = 30   # after the coordinators that use it, before the images it draws into

    def __init__(self, slot: DeviceSlot, queue: Queue | None = None):
        check_slot(slot)
        self.slot = slot
        self.queue = slot_queue(slot, queue, slot.graphics_queue)
        self._lock = threading.Lock()
        self._free: list[Job] = []
        self._inflight: deque[Job] = deque()
        self._value = 0
        self.pool: Any = None
        self._life = Lifetime(self, type(self).__name__, (slot_lifetime(slot),))
        life = slot_lifetime(slot)
        with life:
            self.pool = vkapi.vkCreateCommandPool(slot.device, vk.VkCommandPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue.family), None)
            try:
                self._timeline = slot.native.create_timeline(0)  # type: ignore[union-attr]
            except BaseException:
                vk.vkDestroyCommandPool(slot.device, self.pool, None)
                self.pool = None
                raise
            try:
                life.adopt(self)
            except BaseException:
                vk.vkDestroyCommandPool(slot.device, self.pool, None)
                slot.native.destroy_timeline(self._timeline)  # type: ignore[union-attr]
                self.pool = None
                raise

    # -- jobs ------------------------------------------------------------

    def _check(self) -> None:
        if self.pool is None:
            raise DestroyedError(f"{type(self).__name__} used after destroy()")

    def _new_job(self) -> Job:
        cmd = vkapi.vkAllocateCommandBuffers(self.slot.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        return Job(cmd)

    def _retire(self, job: Job) -> None:
        if job.view is not None:
            vk.vkDestroyImageView(self.slot.device, job.view, None)
            job.view = None

    def _take_job(self) -> Job:
        """A command buffer no submit still uses (waits for the oldest when too many are in flight)."""
        done = self.slot.native.timeline_value(self._timeline)  # type: ignore[union-attr]
        while self._inflight and (self._inflight[0].value <= done or len(self._inflight) >= MAX_IN_FLIGHT):
            job = self._inflight[0]
            if job.value > done:
                self.slot.native.wait_timeline(self._timeline, job.value, 60.0)  # type: ignore[union-attr]
            self._inflight.popleft()
            self._retire(job)
            self._free.append(job)
        return self._free.pop() if self._free else self._new_job()

    def _submit(self, job: Job, waits: Sequence[TimelinePoint], images: Sequence[Image] = ()) -> TimelinePoint:
        value = self._value + 1
        info = timeline_submit_info(job.cmd, [(p.semaphore, p.value) for p in waits],
                                    signal=(self._timeline, value))
        vkapi.queue_submit(self.slot.native, self.queue, [info])
        self._value = job.value = value
        self._inflight.append(job)
        done = _SubmitDone(self, value)
        for img in images:
            img._track(done)   # its destroy() waits for this submit
        return TimelinePoint.of(self.slot, self._timeline, value)

    # -- public ------------------------------------------------------------

    @property
    def last(self) -> TimelinePoint | None:
        """The point the latest submit signals (None before the first)."""
        return TimelinePoint.of(self.slot, self._timeline, self._value) if self._value else None

    def wait(self, point: TimelinePoint | None = None, timeout: float | None = 60.0) -> None:
        """Block (no GIL) until `point` (default: the latest submit) is reached."""
        with self._life:
            point = point or self.last
            if point is None:
                return
            if not isinstance(point, TimelinePoint) or point.semaphore != self._timeline:
                raise ValueError(f"that point was not signalled by this {type(self).__name__}")
            self.slot.native.wait_timeline(self._timeline, point.value, timeout)  # type: ignore[union-attr]

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
                        self.slot.native.wait_timeline(self._timeline, self._value, dl.left())  # type: ignore[union-attr]
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
                self.slot.native.destroy_timeline(self._timeline)  # type: ignore[union-attr]
                self.pool = None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(GPU {getattr(self.slot, 'index', '?')}, submits={self._value})"


def format_features(slot: Any, fmt: int) -> int:
    """The optimal-tiling format features of `fmt` on the slot's physical device."""
    return vk.vkGetPhysicalDeviceFormatProperties(slot.physical_device, fmt).optimalTilingFeatures
