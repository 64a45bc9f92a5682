"""One-shot command buffers on a slot's queue (CommandRunner) and the submit info they use.

Not a hot path: image and buffer uploads/downloads, layout transitions. A run
records, submits and waits with a fence (no GIL, sliced, Ctrl-C honoured). A
submit whose wait times out or is interrupted is never freed under the GPU:
its fence, its command buffer and the objects handed in `keep` (a staging
buffer) are set aside and reclaimed once the fence signals (at a later run, or
at destroy()), and the resources it touches are told to wait for it before
they are freed.
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence

import vulkan as vk

from .._core import vkapi
from .._core.handles import handle_int
from ..errors import DeviceLostError
from ..errors import TimeoutError as VkmTimeout
from .._core.lifetime import Deadline, Lifetime
from .._core.protocols import Destroyable
from .._core.vktypes import VkCommandBuffer, VkStruct
from .logical import Queue
from .slots import check_slot, slot_queue

if TYPE_CHECKING:
    from .manager import DeviceSlot

log = logging.getLogger(__name__)
_ffi = vk.ffi

__all__ = ["CommandRunner", "timeline_submit_info"]


def timeline_submit_info(cmd: VkCommandBuffer, waits: Sequence[tuple[int, int]] = (), *,
                         stage: int = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                         signal: tuple[int, int] | None = None) -> VkStruct:
    """A VkSubmitInfo for one command buffer that waits, at `stage`, for timeline
    points `waits` (checked (semaphore, value) pairs) and optionally signals `signal`."""
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


def command_with_fence(dev: Any, pool: Any) -> tuple[Any, Any]:
    """A primary command buffer of `pool` and a new fence for its submits (neither leaks on failure)."""
    fence = vkapi.vkCreateFence(dev, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
    try:
        cmd = vkapi.vkAllocateCommandBuffers(dev, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
    except BaseException:
        vk.vkDestroyFence(dev, fence, None)
        raise
    return cmd, fence


def wait_fence_or_lost(slot: Any, fence_int: int, timeout: float | None, owner: str) -> bool:
    """Wait for one fence of `slot`; False on timeout. On a device marked lost the
    driver is asked (driver_done): a real loss counts as done (logged for `owner`)."""
    try:
        slot.native.wait_fence(fence_int, timeout)
    except VkmTimeout:
        return False
    except DeviceLostError as exc:
        log.info("%s on %s: device lost (%s); its submits count as finished once the driver says so",
                 owner, slot.name, exc)
        return driver_done(slot, fence_int, timeout)
    return True


def driver_done(slot: Any, fence_int: int, timeout: float | None) -> bool:
    """Whether the driver is done with the submit of a fence of a device marked lost,
    waiting up to `timeout` s. A loss injected by vkmulti.testing.lose_device leaves the
    driver running what it was given, so what the submit uses must not be freed before
    its fence signals; a device really lost answers VK_ERROR_DEVICE_LOST at once (done:
    nothing of it runs again)."""
    device = getattr(slot, "device", None)
    if device is None:
        return True
    deadline = Deadline(timeout)
    fences = vk.ffi.new("VkFence[1]", [vk.ffi.cast("VkFence", fence_int)])
    while True:   # in the deadline's slices: Ctrl-C is seen between them
        if vk.lib.vkWaitForFences(device, 1, fences, vk.VK_TRUE, int(deadline.slice() * 1e9)) != vk.VK_TIMEOUT:
            return True
        if deadline.expired():
            return False


class SubmitUser(Protocol):
    """A resource a run's commands touch (an Image, a Buffer): told of a submit left queued."""

    def _track(self, submit: "AbandonedSubmit") -> None: ...


def _destroy_all(objs: Iterable[Destroyable]) -> None:
    for obj in objs:
        obj.destroy()


class _Pair:
    """A command buffer and the fence its submit signals."""
    __slots__ = ("cmd", "fence", "fence_int")

    def __init__(self, cmd: Any, fence: Any):
        self.cmd, self.fence, self.fence_int = cmd, fence, handle_int(fence, "VkFence")


class AbandonedSubmit:
    """A submit whose wait gave up (timeout, Ctrl-C): still queued on the GPU.

    Resources it touches track it (their destroy() waits for it); the runner
    frees its fence and `keep` objects once it signalled and nobody waits on it.
    """

    def __init__(self, runner: "CommandRunner", pair: _Pair, keep: list[Destroyable]):
        self._runner, self._pair, self._keep = runner, pair, keep
        self._lock = threading.Lock()
        self._waiters = 0
        self._done = False

    def gpu_done(self, device_index: int | None = None) -> bool:
        """True once the GPU finished this submit (never raises for a lost device)."""
        with self._lock:
            if not self._done and self._pair is not None:
                self._done = self._runner._signalled(self._pair)
            return self._done

    def gpu_wait(self, device_index: int | None, timeout: float | None) -> bool:
        """Wait up to `timeout` s until the GPU finished this submit; False on timeout."""
        with self._lock:
            if self._done or self._pair is None:
                return True
            self._waiters += 1
        try:
            done = self._runner._wait_pair(self._pair, timeout)
        finally:
            with self._lock:
                self._waiters -= 1
        if done:
            with self._lock:
                self._done = True
        return done

    def _reap(self) -> bool:
        """Free the fence and the kept objects once done; True when freed (runner lock held)."""
        with self._lock:
            if self._pair is None:
                return True
            if self._waiters or not (self._done or self._runner._signalled(self._pair)):
                return False
            self._done = True
            pair, keep, self._pair, self._keep = self._pair, self._keep, None, []  # type: ignore[assignment]
        vk.vkDestroyFence(self._runner.slot.device, pair.fence, None)
        for obj in keep:
            obj.destroy()
        return True


class CommandRunner:
    """One-shot command buffers on a queue of a slot, waited with a fence (no GIL, timeout).

    Thread-safe: each run takes a command buffer and fence of its own
    (recycled), recording under the pool's lock and waiting without it.
    """

    _teardown_rank = 90   # a slot child: after every resource that uses it

    def __init__(self, slot: DeviceSlot, queue: Queue | None = None):
        check_slot(slot)
        self.slot = slot
        self.queue = slot_queue(slot, queue, slot.graphics_queue)
        self._life = Lifetime(self, "CommandRunner", (getattr(slot, "lifetime", None),))
        self._lock = threading.Lock()            # the command pool (external synchronisation), lists
        self._free: list[_Pair] = []
        self._made: list[_Pair] = []
        self._abandoned: list[AbandonedSubmit] = []
        self.pool = vkapi.vkCreateCommandPool(slot.device, vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            flags=vk.VK_COMMAND_POOL_CREATE_TRANSIENT_BIT | vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            queueFamilyIndex=self.queue.family), None)

    @classmethod
    def for_slot(cls, slot: DeviceSlot) -> "CommandRunner":
        """The slot's shared runner (created once, destroyed with the slot's children)."""
        lock = getattr(slot, "children_lock", None)
        if lock is None:
            raise ValueError("slot has no live device; use a slot of an active MultiDeviceManager")
        with lock:   # one runner per slot even when first uses race
            life = getattr(slot, "lifetime", None)
            if life is not None:
                life.check()
            runner = slot.children.get("runner")
            if runner is None or runner.pool is None:  # type: ignore[attr-defined]
                runner = slot.children["runner"] = cls(slot)
            return runner  # type: ignore[return-value]

    # -- running -----------------------------------------------------------------

    def run(self, record: Callable[[VkCommandBuffer], None], *, waits: Sequence[tuple[int, int]] = (),
            timeout: float | None = 60.0, keep: Iterable[Destroyable] = (), users: Iterable[SubmitUser] = ()) -> None:
        """Record with `record(cmd)`, submit (waiting on checked timeline points
        `waits`), and wait up to `timeout` s.

        `keep`: objects (staging buffers) the caller frees after a run that
        returns. If the run fails before its submit they are destroyed at
        once; if the wait gives up (vkmulti.TimeoutError, Ctrl-C) the submit
        stays queued, and they and the fence are set aside and destroyed
        once it completes. Each of `users` (resources the commands touch) is
        then told to wait for that submit before it is freed. On a device
        marked lost, DeviceLostError comes once the driver is done with the
        submit (or after `timeout` s, the submit then set aside as above).
        """
        keep = list(keep)
        try:
            Deadline(timeout)   # checks the value
            self._life.__enter__()
        except BaseException:
            _destroy_all(keep)
            raise
        try:
            self._run(record, waits, timeout, keep, users)
        finally:
            self._life.__exit__()

    def _run(self, record: Callable[[VkCommandBuffer], None], waits: Sequence[tuple[int, int]],
             timeout: float | None, keep: list[Destroyable], users: Iterable[SubmitUser]) -> None:
        try:
            pair = self._record(record)
        except BaseException:
            _destroy_all(keep)
            raise
        try:
            info = timeline_submit_info(pair.cmd, waits)
            vkapi.queue_submit(self.slot.native, self.queue, [info], pair.fence)
        except BaseException:
            with self._lock:
                self._free.append(pair)   # never submitted: reusable
            _destroy_all(keep)
            raise
        deadline = Deadline(timeout)
        try:
            try:
                self.slot.native.wait_fence(pair.fence_int, timeout)  # type: ignore[union-attr]
            except DeviceLostError:
                # a loss injected by lose_device leaves the driver running the submit: the caller
                # frees what the commands use once this raises, so the driver must be done first
                driver_done(self.slot, pair.fence_int, deadline.left())
                raise
        except BaseException:
            ab = AbandonedSubmit(self, pair, keep)
            with self._lock:
                self._abandoned.append(ab)
            for u in users:
                u._track(ab)
            raise
        with self._lock:
            vkapi.vkResetFences(self.slot.device, 1, [pair.fence])
            self._free.append(pair)

    def _record(self, record: Callable[[VkCommandBuffer], None]) -> _Pair:
        with self._lock:
            self._reap()
            pair = self._free.pop() if self._free else self._new_pair()
            try:
                vkapi.vkResetCommandBuffer(pair.cmd, 0)
                vkapi.vkBeginCommandBuffer(pair.cmd, vk.VkCommandBufferBeginInfo(
                    sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                    flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
                record(pair.cmd)
                vkapi.vkEndCommandBuffer(pair.cmd)
            except BaseException:
                self._free.append(pair)
                raise
            return pair

    def _new_pair(self) -> _Pair:
        pair = _Pair(*command_with_fence(self.slot.device, self.pool))
        self._made.append(pair)
        return pair

    def _signalled(self, pair: _Pair) -> bool:
        try:
            return self.slot.native.fence_signalled(pair.fence_int)  # type: ignore[union-attr]
        except DeviceLostError as exc:
            log.info("CommandRunner on %s: device lost (%s); a submit counts as finished once the driver says so",
                     self.slot.name, exc)
            return driver_done(self.slot, pair.fence_int, 0.0)

    def _wait_pair(self, pair: _Pair, timeout: float | None) -> bool:
        return wait_fence_or_lost(self.slot, pair.fence_int, timeout, "CommandRunner")

    def _reap(self) -> None:
        """Free the abandoned submits that have completed (lock held)."""
        for ab in list(self._abandoned):
            pair = ab._pair
            if ab._reap():
                self._abandoned.remove(ab)
                self._made = [p for p in self._made if p is not pair]

    # -- the end -------------------------------------------------------------------

    def destroy(self, timeout: float | None = 60.0) -> None:
        """Wait (up to `timeout` s) for abandoned submits, then free everything
        (idempotent; vkmulti.TimeoutError keeps it all for a later call)."""
        with self._life.ending(timeout) as dl:
            if dl is None:
                return
            for ab in list(self._abandoned):
                if not ab.gpu_wait(None, dl.left()):
                    raise VkmTimeout(f"CommandRunner on {self.slot.name!r}: a submit is still queued after "
                                     f"{timeout} s; nothing was freed")
            with self._lock:
                self._reap()
                if self._abandoned:
                    raise VkmTimeout(f"CommandRunner on {self.slot.name!r}: a submit is still waited on; "
                                     f"nothing more was freed")
                dev = self.slot.device
                for pair in self._made:
                    vk.vkDestroyFence(dev, pair.fence, None)
                self._made, self._free = [], []
                vk.vkDestroyCommandPool(dev, self.pool, None)
                self.pool = None

    def __repr__(self) -> str:
        return f"CommandRunner(GPU {getattr(self.slot, 'index', '?')}, abandoned={len(self._abandoned)})"
