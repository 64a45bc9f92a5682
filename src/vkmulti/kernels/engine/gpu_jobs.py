"""Asynchronous one-shot GPU jobs on one queue: record a command buffer,
submit it waiting on timeline points, get a TimelinePoint of this object's
own timeline back (no host wait). Command buffers are recycled once their
job completed. A job is recorded by a function (`submit`), or given as the
packed operations of the native step recorder (`submit_ops`: recorded and
submitted in two native calls, for jobs on a move's path).

Used where the host must not stall: the CRC32 checks of a live migration on
both GPUs at once, and the checkpoint captures a policy queues right behind a
kernel step (on the step's own queue, so a barrier orders them after it).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable

import vulkan as vk

from ..._core import _native, vkapi
from ...device.logical import drain_through_driver, retire_submits
from ...errors import DestroyedError, DeviceLostError, TimeoutError as VkmTimeout
from ..._core.lifetime import Deadline
from ..._core.timeline import TimelinePoint
from . import recording as cmds
from .recording import handle_value

__all__ = ["GpuJobs", "JobDone", "StepTimeline"]

log = logging.getLogger(__name__)

#: A wait for a job, as a resource's destroy() does it, holds the jobs' lock this long at a time.
_WAIT_SLICE = 0.05


class GpuJobs:
    """Jobs on `queue` (a slot queue with .handle, .family, .lock) of `slot`."""

    def __init__(self, slot: Any, queue: Any):
        self.slot, self.queue = slot, queue
        self._lock = threading.Lock()
        self._free: list[Any] = []
        self._busy: list[tuple[int, Any]] = []
        self.value = 0
        self.pool = None
        self._native_cmds: Any = None   # a StepCommands, made by the first submit_ops
        self.timeline = slot.native.create_timeline(0)
        try:
            self.pool = vkapi.vkCreateCommandPool(slot.device, vk.VkCommandPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT | vk.VK_COMMAND_POOL_CREATE_TRANSIENT_BIT,
                queueFamilyIndex=queue.family), None)
        except BaseException:
            slot.native.destroy_timeline(self.timeline)
            raise

    def point(self, value: int) -> TimelinePoint:
        return TimelinePoint.of(self.slot, self.timeline, value)

    def completed(self) -> int:
        return self.slot.native.timeline_value(self.timeline)

    def _reap_locked(self) -> None:
        if not self._busy:
            return
        done = self.completed()
        keep = []
        for value, cmd in self._busy:
            if value <= done:
                self._free.append(cmd)
            else:
                keep.append((value, cmd))
        self._busy = keep

    def _check_pool(self) -> None:
        if self.pool is None:
            raise DestroyedError(f"GPU jobs of GPU {self.slot.index} were destroyed")

    def _allocate(self, count: int) -> list[Any]:
        """`count` new command buffers of this object's pool (its lock held)."""
        made = vkapi.vkAllocateCommandBuffers(self.slot.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=count))
        return [made[i] for i in range(count)]

    def _recorder(self) -> Any:
        """The native recorder of submit_ops, made once (this object's lock held)."""
        if self._native_cmds is None:
            self._native_cmds = _native.StepCommands(self.slot.native)
        return self._native_cmds

    def _command_buffer(self) -> Any:
        """A free command buffer for the next job (this object's lock held)."""
        self._check_pool()
        self._reap_locked()
        return self._free.pop() if self._free else self._allocate(1)[0]

    def prepare(self, count: int) -> None:
        """Make ahead what the first `count` jobs in flight use (command buffers, the
        native recorder), so that they allocate nothing (a move's first CRC32 jobs)."""
        with self._lock:
            self._check_pool()
            self._recorder()
            self._reap_locked()
            if count > len(self._free):
                self._free += self._allocate(count - len(self._free))

    def _queued(self, value: int, cmd: Any) -> None:
        """Job `value` in `cmd` reached the GPU (this object's lock held)."""
        self.value = value
        self._busy.append((value, cmd))

    def submit(self, record: Callable[[Any], None], waits: Iterable[tuple[int, int]] = (),
               users: Iterable[Any] = ()) -> TimelinePoint:
        """Record with `record(cmd)` and submit after the timeline points `waits`
        ((semaphore, value) on this device); returns the point that marks it done.
        Each of `users` (the Buffers the job reads or writes) is told of the job:
        its destroy() waits until the job ran (a kernel destroyed while a capture
        of its buffers is still queued must not free them under the GPU)."""
        with self._lock:
            cmd = self._command_buffer()
            value = self.value + 1
            try:
                vkapi.vkResetCommandBuffer(cmd, 0)
                vkapi.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
                    sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                    flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
                record(cmd)
                vkapi.vkEndCommandBuffer(cmd)
                cmds.submit(self.slot.native, self.queue, cmd, list(waits), (self.timeline, value))
            except BaseException:
                self._free.append(cmd)
                raise
            self._queued(value, cmd)
        self._track(users, value)
        return self.point(value)

    def submit_ops(self, ops: bytes, waits: Iterable[tuple[int, int]] = (), users: Iterable[Any] = ()) \
            -> TimelinePoint:
        """submit() of a job given as the native step recorder's packed operations
        (step_ops: passes, barriers, updates, copies; checked before anything is
        recorded), recorded and submitted without the GIL and without a cffi call
        per command."""
        waits = list(waits)
        with self._lock:
            self._check_pool()
            recorder = self._recorder()
            cmd = self._command_buffer()
            value = self.value + 1
            try:
                handle = handle_value(cmd)
                recorder.record(handle, ops)
                recorder.submit(self.queue.lock, handle, waits, self.timeline, value)
            except BaseException:
                if recorder.submitted != value:   # nothing reached the GPU: the buffer is free
                    self._free.append(cmd)
                    raise
                self._queued(value, cmd)   # an interrupt that came after the submit: the job runs
                self._track(users, value)
                raise
            self._queued(value, cmd)
        self._track(users, value)
        return self.point(value)

    def _track(self, users: Iterable[Any], value: int) -> None:
        if users:
            done = JobDone(self, value)
            for u in users:
                u._track(done)

    def wait(self, point: TimelinePoint, timeout: float | None) -> None:
        """Block (no GIL, interruptible) until `point` of this object's timeline is reached."""
        self.slot.native.wait_timeline(self.timeline, point.value, timeout)

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Wait for the submitted jobs (skipped on a lost device), then free everything."""
        with self._lock:
            if self.pool is None:
                return
            dev = self.slot.device
            if self.value and dev is not None:
                try:
                    self.slot.native.wait_timeline(self.timeline, self.value, timeout)
                except DeviceLostError:
                    pass   # a lost device's objects may be destroyed at once
                except VkmTimeout:
                    log.warning("GPU %d: jobs still running after %s s; their command pool is left to the "
                                "device's destruction", self.slot.index, timeout)
                    return
            if dev is not None:
                try:   # the driver lets go of the submits that waited on the timeline first
                    retire_submits(self.slot, Deadline(timeout))
                except VkmTimeout:
                    log.warning("GPU %d: queued work still holds the jobs' timeline after %s s; it is left to "
                                "the device's destruction", self.slot.index, timeout)
                    return
                vk.vkDestroyCommandPool(dev, self.pool, None)
                self.slot.native.destroy_timeline(self.timeline)
            self.pool = None
            self._free, self._busy = [], []


class JobDone:
    """One job of a GpuJobs, as the GPU work the resources it touches wait for before
    they are freed: done once the jobs' timeline reaches `value`, or once the jobs
    were destroyed (their destroy() waited for every job), or on a lost device once
    the driver ran what it was given (a real loss: at once; the fault hook leaves the
    driver running it, and its own drain may still be under way)."""

    __slots__ = ("jobs", "value")

    def __init__(self, jobs: GpuJobs, value: int):
        self.jobs, self.value = jobs, value

    def gpu_done(self, device_index: int | None = None) -> bool:
        jobs = self.jobs
        with jobs._lock:   # the timeline stays while it is read
            if jobs.pool is None:
                return True
            try:
                return jobs.completed() >= self.value
            except DeviceLostError:
                return bool(getattr(jobs.slot, "lost_drained", False))

    def gpu_wait(self, device_index: int | None, timeout: float | None) -> bool:
        """Wait up to `timeout` s (None: no bound) in slices, so that the jobs'
        lock is let go between them; False when the job still runs then."""
        deadline = Deadline(timeout)
        jobs = self.jobs
        while True:
            with jobs._lock:
                if jobs.pool is None:
                    return True
                try:
                    jobs.slot.native.wait_timeline(jobs.timeline, self.value, min(_WAIT_SLICE, deadline.slice()))
                    return True
                except DeviceLostError:
                    break
                except VkmTimeout:
                    pass
            if deadline.expired():
                return False
        return driver_ran(jobs.slot, deadline)


def driver_ran(slot: Any, deadline: Deadline) -> bool:
    """On a device marked lost: whether the driver ran everything submitted to it so far,
    waited for through the driver until `deadline`; at once where the fault hook's drain
    saw it all run, or the driver itself reports the device lost."""
    if getattr(slot, "lost_drained", False):
        return True
    try:
        return drain_through_driver(slot, deadline.left())
    except DeviceLostError:
        return True


class StepTimeline:
    """A device context's step timeline where a GpuJobs' is expected (`slot`, completed(),
    wait(point, timeout)): copies recorded in a step itself are done with the step."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: Any):
        self.ctx = ctx

    @property
    def slot(self) -> Any:
        return self.ctx.slot

    def completed(self) -> int:
        return self.ctx.completed()

    def wait(self, point: TimelinePoint, timeout: float | None) -> None:
        """Block (no GIL, interruptible) until `point` of the step timeline is reached."""
        self.ctx.slot.native.wait_timeline(point.semaphore, point.value, timeout)
