"""A lost GPU under the kernel runtime (Failover, which KernelRuntime builds and owns).

`step()` and `synchronize()`/`StepTicket.wait()` first ask the manager which
devices are lost (`MultiDeviceManager.check_devices`: one atomic read of each
device's native lost flag, set by any VK_ERROR_DEVICE_LOST in vkmulti or by
vkmulti.testing.lose_device); a step that meets the loss itself (its submit or
harvest raises DeviceLostError) does the same. For a lost secondary:

* the coordinator unregisters the device (its greedy plans say where each
  kernel goes; a coordinator made by `from_manager` does this itself when the
  manager reports the loss);
* the K2K router forgets its moves to and from the device;
* with a checkpoint policy, the kernels there are restored on the survivors
  from their latest checkpoints and replayed from the replay log
  (kernels/replay.py), listed in `restored_kernels`; the others (no policy,
  no checkpoint, inputs not all logged) are released and listed in
  `lost_kernels` (id -> device);
* the runtime's context on the device is released without touching the
  device (no wait, no submit: only vkDestroy*/vkFree*, which a lost device
  allows);
* the step goes on with the kernels of the other devices; no exception reaches
  the caller, the loss is logged and counted in `failover_stats`.

Losing the primary (GPU 0) is the caller's PrimaryDeviceLostError.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable, ContextManager

from ...errors import DeviceLostError, PrimaryDeviceLostError, VkmError
from ...errors import TimeoutError as VkmTimeout
from ...device.failover import FailoverStats
from ...device.logical import drain_through_driver
from ..engine.device_context import DeviceContext
from ..engine.kernel import Kernel
from .twin import drop_imports
from ..._core.checks import short_str

log = logging.getLogger(__name__)

__all__ = ["Failover"]

#: seconds a failover waits, through the driver, for the work of a lost device whose drain nobody saw finish
DRAIN_TIMEOUT = 2.0

#: seconds the runtime's destroy() lets threads still waiting on a lost device's kernel timeline leave it
#: (their waits fail at once on a device marked lost)
LEAVE_TIMEOUT = 1.0

#: seconds a thread that finds a device lost waits for another thread's failover from it
FAILOVER_WAIT = 120.0

#: restore_lost_kernels bound to the runtime: (device, kernels, (context, stepper) or None, drained, lost devices)
#: -> (restored, not restored, steps replayed, messages handed again)
Restorer = Callable[[int, list, Any, bool, set], tuple[list, list, int, int]]


class Failover:
    """The failover of one KernelRuntime (see the module docstring). It reads the
    runtime's registries under the runtime's `lock`: `kernels` (id -> kernel),
    `contexts` (device -> (context, stepper)); `device_lost(index)` tells the
    K2K router (through the runtime's inbound side) to forget its moves; `forget(kernel)` takes a kernel out of the registries (called with the lock
    held), `release(kernel)` then makes its address reusable and tells the
    coordinator; `restore` brings lost kernels back."""

    def __init__(self, manager: Any, coordinator: Any, lock: threading.RLock, kernels: dict, contexts: dict,
                 device_lost: Callable[[int], None], forget: Callable[[Kernel], None], release: Callable[[Kernel], None],
                 restore: Restorer, turn: Callable[[float | None], ContextManager[Any]] | None = None):
        self.manager, self.coordinator, self._lock = manager, coordinator, lock
        self._kernels, self._contexts, self._device_lost = kernels, contexts, device_lost
        self._forget, self._release, self._restore = forget, release, restore
        self._turn = turn if turn is not None else (lambda timeout: contextlib.nullcontext())
        self._check_devices = getattr(manager, "check_devices", None)   # (every step calls it)
        #: what lost devices cost this runtime (devices, kernels lost, times)
        self.stats = FailoverStats()
        #: kernels that were on a lost device and could not be restored: id -> that device
        self.lost_kernels: dict[str, int] = {}
        #: kernels of a lost device restored from their checkpoints: id -> (lost device, new device)
        self.restored_kernels: dict[str, tuple[int, int]] = {}
        self._lost_handled: set[int] = set()
        self._failing = threading.RLock()   # held by the thread failing over
        self._lost_pairs: list[tuple[DeviceContext, Any]] = []   # lost devices' contexts, freed by release()

    def device_lost(self, index: int) -> bool:
        """Whether device `index` is lost (the manager's view)."""
        check = getattr(self.manager, "device_lost", None)
        return bool(check is not None and check(index))

    def primary_lost(self, reason: str) -> PrimaryDeviceLostError:
        return PrimaryDeviceLostError(-4, "KernelRuntime.step", (
            f"the primary GPU 0 was lost ({short_str(reason)}): the kernels there and the host's view of the runtime "
            f"cannot go on; destroy the runtime and the manager (their objects are released without touching "
            f"the lost device) and make new ones"))

    def sync_lost_devices(self, *, teardown: bool = False) -> set[int]:
        """Fail over from every device found lost; the lost devices. PrimaryDeviceLostError
        for GPU 0 (unless `teardown`: then its kernels are released like the others')."""
        check = self._check_devices
        if check is None:
            return set()
        if getattr(self.manager, "destroyed", False):   # the manager's destroy() runs: read the flags
            lost = {s.index: "the device returned VK_ERROR_DEVICE_LOST" for s in self.manager._slots
                    if s.native is not None and s.native.lost}
        else:
            lost = check()
        if not lost:   # (every step asks: the common case)
            return set()
        if 0 in lost and not teardown:
            raise self.primary_lost(lost[0])
        if any(d not in self._lost_handled for d in lost):
            # between two steps (a wait's failover waits for a step of another thread to end), by one
            # thread (the others wait for it); teardown runs without steps
            with contextlib.nullcontext() if teardown else self._turn(FAILOVER_WAIT):
                self._enter()
                try:
                    for d in sorted(lost):
                        if d not in self._lost_handled:
                            self._fail_over(d, lost[d], teardown)
                finally:
                    self._failing.release()
        return set(lost)

    def _enter(self) -> None:
        """Take the failover's lock (re-entrant: a restore's own waits come back here),
        in slices, bounded by FAILOVER_WAIT."""
        deadline = time.monotonic() + FAILOVER_WAIT
        while not self._failing.acquire(timeout=0.25):
            if time.monotonic() >= deadline:
                raise VkmTimeout(f"KernelRuntime: the failover of another thread did not end within "
                                 f"{FAILOVER_WAIT:.0f} s")

    def step_failed(self, device: int, exc: DeviceLostError) -> bool:
        """A step on `device` raised DeviceLostError: True when the device is now known
        lost and failed over (the step goes on without it), False otherwise."""
        if not self.device_lost(device):
            return False
        self.sync_lost_devices()
        return True

    def _fail_over(self, d: int, why: str, teardown: bool = False) -> None:
        t0 = time.perf_counter()
        self._lost_handled.add(d)
        self.stats.lost(d)
        online = getattr(self.coordinator, "is_device_online", None)
        if online is not None and online(d):
            self.coordinator.unregister_device(d)
        with self._lock:
            pair = self._contexts.get(d)
        # listed under the device's lock: a move onto it swaps under that lock once it found the device
        # not lost, so no kernel lands there after this list
        with pair[0].lock if pair is not None else contextlib.nullcontext():
            with self._lock:
                kernels = [k for k in self._kernels.values() if k is not None and k.device_index == d]
                pair = self._contexts.pop(d, None)
        drained = False
        if kernels and not teardown:
            slot = self.manager.slot(d) if hasattr(self.manager, "slot") else None
            seen = getattr(slot, "lost_drained", None)   # True: drained; False: its memory is not to be trusted
            drained = bool(seen) or (seen is None and self._drain(slot))
        # the K2K router forgets its moves to and from the device, after the drain: survivors' steps waiting
        # on relays of its steps go then (before, a relay lets one go only once the step it waits for ran)
        self._device_lost(d)
        restored: list[Any] = []
        if kernels and not teardown:
            lost_now = {i for i in self._lost_handled}
            try:
                restored, kernels, steps, handed = self._restore(d, kernels, pair, drained, lost_now)
            except VkmError as exc:   # (e.g. the survivors did not finish in time): they are lost
                log.error("KernelRuntime: the kernels of lost GPU %d could not be restored: %s", d, exc)
                restored, steps, handed = [], 0, 0
            with self.stats._lock:
                self.stats.kernels_restored += len(restored)
                self.stats.steps_replayed += steps
                self.stats.messages_replayed += handed
            for k in restored:
                self.restored_kernels[k.id] = (d, k.device_index)
        kernels = [k for k in kernels if k.device_index == d]   # (not those another call's move took off it)
        for k in kernels:
            self._drop_lost_kernel(k, d)
        if pair is not None:
            ctx, stepper = pair
            stepper.inflight.clear()   # never harvested
            if drained:   # (else steps the driver still runs may use them: they go with the pools, in release())
                for _, s in stepper.retired:
                    ctx.free_set(s)
            stepper.retired = []
            stepper.batches.clear()
            ctx.retire()   # its objects outlive the failover: see release()
            self._lost_pairs.append(pair)
        what = f"{len(restored)} kernel(s) restored from checkpoints, {len(kernels)} lost with the device"
        rec = self.stats.recovered(d, what, t0, why)
        log.error("KernelRuntime: GPU %d lost (%s); kernels restored: %s; kernels lost with it: %s; the others go "
                  "on (%.2f ms)", d, why, {k.id: k.device_index for k in restored}, [k.id for k in kernels],
                  rec.seconds * 1e3)

    def release(self) -> None:
        """Free the kernel contexts of the devices failed over (the runtime's destroy()).
        Not at the failover: a router's native workers may still be inside a wait on
        such a context's timeline then (the loss is seen between two of their waits),
        and a semaphore freed under a wait corrupts the driver's heap."""
        pairs, self._lost_pairs = self._lost_pairs, []
        for ctx, _ in pairs:
            ctx.destroy(LEAVE_TIMEOUT)

    def _drain(self, slot: Any) -> bool:
        """Whether the work submitted to a device marked lost, whose drain nobody saw
        finish (the fault hook's own drain timed out, or a loss the driver reported),
        has all run: waited for through the driver (the fences such a drain gave up on
        first: drain_through_driver), bounded by DRAIN_TIMEOUT. A driver
        that reports the device lost says no (its memory contents are undefined)."""
        if getattr(slot, "native", None) is None or not hasattr(slot, "queues"):
            return False
        try:
            return drain_through_driver(slot, DRAIN_TIMEOUT)
        except VkmError:
            return False

    def _drop_lost_kernel(self, k: Kernel, d: int) -> None:
        """Forget a kernel of a lost device and free its objects without waiting on the device."""
        ctx = k.ctx
        with ctx.lock:
            if k.destroyed or k.ctx is not ctx or ctx.index != d:   # (moved off it meanwhile: it lives on)
                return
            k.destroyed = True
            with self._lock:
                self.lost_kernels[k.id] = d
                self._forget(k)
            ctx.cond.notify_all()
            buffers, k.buffers = k.buffers, []   # (a destroy_kernel meanwhile finds nothing left to free)
        drop_imports(k, buffers=buffers)   # (the survivors' locks, not under the lost device's)
        with ctx.lock:
            k.buffers = buffers
            k.free()
        self._release(k)

    def free_stopped(self, k: Kernel, stopped: list[Kernel]) -> None:
        """Free `k`, which a destroy_kernel stopped (and left in `stopped`) before its device
        was lost: nothing runs there any more, so nothing is waited for."""
        drop_imports(k)   # (other devices' locks, before k's)
        with k.ctx.lock:
            if not k.buffers:   # (freed already, or by another call meanwhile)
                return
            k.destroyed = True
            self._forget(k)
            k.free()
        with self._lock:
            if k in stopped:
                stopped.remove(k)
        self._release(k)
