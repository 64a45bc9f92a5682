"""Test helpers: a host-opened gate for GPU work, and a signal that interrupts a wait like Ctrl-C."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

import vulkan as vk


class Gate:
    """A timeline semaphore on one slot that the host opens: GPU work waiting on
    `gate.point` ((semaphore, 1)) stays queued until open()."""

    def __init__(self, slot):
        self.slot = slot
        self.sem = slot.native.create_timeline(0)
        self.point = (self.sem, 1)

    def open(self) -> None:
        vk.vkSignalSemaphore(self.slot.device, vk.VkSemaphoreSignalInfo(
            sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", self.sem),
            value=1))

    def hold(self, queue) -> None:
        """Queue on `queue` (a slot's Queue) a submit that waits for the gate: work
        submitted after it stays queued behind it until open()."""
        from vkmulti._core import vkapi
        chain = vk.VkTimelineSemaphoreSubmitInfo(
            sType=vk.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO, waitSemaphoreValueCount=1,
            pWaitSemaphoreValues=[1])
        info = vk.VkSubmitInfo(sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, pNext=chain, waitSemaphoreCount=1,
                               pWaitSemaphores=[vk.ffi.cast("VkSemaphore", self.sem)],
                               pWaitDstStageMask=[vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT])
        vkapi.queue_submit(self.slot.native, queue, [info])

    def destroy(self) -> None:
        """Open (if not yet), wait until every queue of the slot retired what was
        submitted to it so far, and free the semaphore.

        The wait is an empty submit with a fence on each queue, under the queue's
        lock (retire_submits), not vkDeviceWaitIdle: that uses every queue of the
        device at once, without their locks, while a runtime's background threads
        (ready twins, prebuilds) may be submitting to one of them (a validation
        error UNASSIGNED-Threading-MultipleThreads)."""
        if self.slot.device is None:
            return
        if self.slot.native.timeline_value(self.sem) < 1:
            self.open()
        settle(self.slot)
        self.slot.native.destroy_timeline(self.sem)


def settle(*slots) -> None:
    """Wait until every queue of each slot retired what was submitted to it so far:
    an empty fenced submit per queue under the queue's lock (retire_submits), where
    vkDeviceWaitIdle would use the queues without their locks while a link's worker
    or a runtime's background thread submits (UNASSIGNED-Threading-MultipleThreads).
    Unbounded, as a device wait is."""
    from vkmulti._core.lifetime import Deadline
    from vkmulti.device.logical import retire_submits
    for slot in slots:
        retire_submits(slot, Deadline(None))


class Interrupted(Exception):
    """What `interrupt_after` makes a wait raise (as Ctrl-C would raise KeyboardInterrupt)."""


@contextlib.contextmanager
def interrupt_after(seconds: float) -> Iterator[None]:
    """SIGINT to this process after `seconds`, raised in the main thread as Interrupted
    (a KeyboardInterrupt would end pytest itself); the handler is restored after."""
    def handler(signum, frame):
        raise Interrupted(f"SIGINT after {seconds} s")
    old = signal.signal(signal.SIGINT, handler)
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGINT, old)
