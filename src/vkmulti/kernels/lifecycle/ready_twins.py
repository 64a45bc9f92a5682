"""Ready twins: the twin of each kernel (twin.py: its buffers, descriptor sets and
rings on another device, the pipeline prebuilt there) made ahead, so that a
migration or a restore onto that device only copies and switches.

One background thread (`vkmulti-twins`, at a lower CPU priority) builds, after
a kernel's pipelines were built ahead (engine/prebuild.py) and after each of
its moves, its twin on each device the prebuild policy would move it to
(`Prebuilder.targets`) other than its own. The half a migration leaves on the
old device is itself re-initialised into the twin for a move back (nothing
allocated, no descriptor set made), unless batches the kernel sent still read
its outbox there.

At most one ready twin per kernel and device, and at most `limit_bytes` of
their buffers per device (the rest are not made: the move builds its own);
`enabled = False` turns it off (and frees those made). `take()` gives a move
the twin of its kernel on its target (waiting for that twin's build when it
runs), or None: then the move builds one itself, as without ready twins. A
twin is *stale* when its kernel's code was reloaded (its spec differs), the
kernel was destroyed or moved onto that device, or the device was lost: it is
never used. One made stale by a reload alone is given the new code when the
reload asks for the kernel's twins (the pipeline the reload built there ahead
and a descriptor set of it: no buffer is freed or made while the steps go
on); any other is freed. A ready twin holds no local slot of its device (take()
gives it one), so it never counts against the kernels a device can run.
The thread also destroys what a restore left on a lost device (`free_later`),
off the restore's path, once that device's driver ran the work given it.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from ..._core.checks import check_count, is_int
from ..._core.lifetime import Deadline
from ...errors import DestroyedError, DeviceLostError, VkmError
from ...transfer.peer import ExportedBuffer
from ..engine.kernel import Kernel
from ..engine.gpu_jobs import driver_ran
from ..engine.prebuild import join_worker, lower_priority
from ..reload.swap import BUILD_WAIT, kernel_set, put_pass
from .twin import (LifecycleView, Retired, build_twin, free_retired, free_twin, twin_buffer_sizes,
                   twin_mapped_sizes)

log = logging.getLogger(__name__)

__all__ = ["ReadyTwins", "DEFAULT_TWIN_BYTES", "TAKE_WAIT"]

#: ReadyTwins.limit_bytes by default: per device, the most bytes of ready twins' buffers
DEFAULT_TWIN_BYTES = 256 << 20
#: s: the longest the thread waits for a lost device's driver before freeing what a kernel left there
LOST_FREE_WAIT = 30.0
_IDLE_WAIT = 1.0   # s: how often the idle thread looks for twins gone stale
#: s: the longest a move waits for the build of its twin that runs (then it builds its own)
TAKE_WAIT = 5.0


def free_lost(rt: Any, item: Retired, timeout: float | None = LOST_FREE_WAIT) -> None:
    """Free what a kernel left on a lost device once its driver ran the work given it
    (a reported loss leaves it running: steps may still use the sets and buffers),
    waited for up to `timeout` s; else they stay for the device's teardown. The sets
    stay with their pools (freed with the context) once the failover retired it."""
    ctx = item.ctx
    if not driver_ran(ctx.slot, Deadline(timeout)):
        log.warning("GPU %d still runs work given it before its loss: what a moved kernel left there stays until "
                    "the device goes", ctx.index)
        return
    with ctx.lock:
        for s in item.sets if ctx.alive else ():
            ctx.free_set(s)
    item.sets = []
    free_retired(rt, item)


def _twin_bytes(life: LifecycleView, k: Kernel, ctx: Any) -> int:
    return sum(twin_buffer_sizes(life.rt, k, ctx)) + sum(twin_mapped_sizes(k, ctx))


class ReadyTwins:
    """The ready twins of one runtime's kernels (see the module docstring).
    `targets(kernel)`: the devices its pipelines are built ahead on."""

    def __init__(self, life: LifecycleView, targets: Callable[[Kernel], list[int]]):
        self._life, self._targets = life, targets
        self._enabled = True
        self._limit = DEFAULT_TWIN_BYTES
        self._cond = threading.Condition(threading.Lock())
        self._ready: dict[tuple[Kernel, int], tuple[Kernel, int]] = {}   # (kernel, device) -> (twin, bytes)
        self._bytes: dict[int, int] = {}
        self._queue: deque[tuple[Kernel, Kernel | None]] = deque()      # (kernel, a half to re-initialise)
        self._frees: deque[Retired] = deque()   # what kernels left on lost devices, freed by the thread
        self._building: tuple[Kernel, int] | None = None
        self._busy = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: twins built, old halves re-initialised, twins a move took, stale twins freed, twins given
        #: a reloaded kernel's new code (their buffers kept)
        self.built = self.recycled = self.used = self.discarded = self.refreshed = 0

    # -- policy ------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether twins are made ahead (True by default; False frees those made)."""
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"enabled must be a bool, got {type(value).__name__}")
        self._enabled = value
        if not value:
            with self._cond:
                self._queue.clear()
            self._free(self._pop_all())

    @property
    def limit_bytes(self) -> int:
        """Per device, the most bytes of ready twins' buffers (0: none are made)."""
        return self._limit

    @limit_bytes.setter
    def limit_bytes(self, value: int) -> None:
        self._limit = check_count(value, "limit_bytes")

    def bytes_on(self, device: int) -> int:
        """The bytes the ready twins hold on `device`."""
        if not is_int(device):
            raise TypeError(f"device must be an int, got {type(device).__name__}")
        with self._cond:
            return self._bytes.get(device, 0)

    def ready(self, kernel: Kernel) -> list[int]:
        """The devices where `kernel` has a ready twin."""
        if not isinstance(kernel, Kernel):
            raise TypeError(f"kernel must be a Kernel, got {type(kernel).__name__}")
        with self._cond:
            return sorted(d for k, d in self._ready if k is kernel)

    # -- work ----------------------------------------------------------------------------

    def request(self, kernel: Kernel) -> None:
        """Have the twins of `kernel` made in the background (returns at once)."""
        self._enqueue(kernel, None)

    def recycle(self, kernel: Kernel, half: Kernel) -> bool:
        """Keep `half` (what a migration of `kernel` left on its old device: nothing
        uses it any more) as the twin for a move back, re-initialised in the
        background; False (the caller frees it) when it cannot be."""
        life = self._life
        ctx = half.ctx
        if not self._enabled or self._stopping or life.rt.device_lost(ctx.index) or not ctx.alive:
            return False
        stepper = life.rt._contexts.get(ctx.index, (None, None))[1]
        if stepper is None or any(b.buffer is half.outbox and not b.done for b in stepper.batches):
            return False   # batches it sent there still read its outbox
        size = _twin_bytes(life, kernel, ctx)
        with self._cond:
            if (kernel, ctx.index) in self._ready or self._bytes.get(ctx.index, 0) + size > self._limit:
                return False
            self._bytes[ctx.index] = self._bytes.get(ctx.index, 0) + size   # (counted from here)
        try:
            with ctx.lock:
                for s in half.sets:
                    if s[1] is not half.kernel_set and s[1] is not half.finish_set:
                        ctx.free_set(s)
                half.sets = [s for s in half.sets if s[1] in (half.kernel_set, half.finish_set)]
                for s in half.deliver_sets.values():
                    ctx.free_set(s)
                half.deliver_sets = {}
                if half.local_slot >= 0:
                    if ctx.local[half.local_slot] is half:
                        ctx.release_local_slot(half.local_slot)
                    half.local_slot = -1
        except BaseException:
            with self._cond:
                self._bytes[ctx.index] -= size
            raise
        self._enqueue(kernel, half, size)
        return True

    def free_later(self, item: Retired) -> None:
        """Free `item` (what a kernel left on a lost device: nothing runs there) on the
        thread, so that a failover's restore does not wait for the driver to free
        that memory; at once when twins are off or the thread stops."""
        with self._cond:
            if not self._stopping and self._enabled:
                self._frees.append(item)
                self._start()
                return
        free_lost(self._life.rt, item)

    def _enqueue(self, kernel: Kernel, half: Kernel | None, size: int = 0) -> None:
        with self._cond:
            if not self._stopping and self._enabled:
                self._queue.append((kernel, half))
                self._start()
                return
            if half is not None:
                self._bytes[half.ctx.index] -= size
        if half is not None:
            self._discard(half)

    def _start(self) -> None:
        """Wake the thread for queued work (started on first use; the lock held)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="vkmulti-twins", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def take(self, kernel: Kernel, device: int, deadline: float) -> Kernel | None:
        """The ready twin of `kernel` on `device` with a local slot there (its build
        waited for while it runs, until `deadline` and at most TAKE_WAIT s), or None."""
        deadline = min(deadline, time.monotonic() + TAKE_WAIT)
        with self._cond:
            while self._building == (kernel, device) and time.monotonic() < deadline:
                self._cond.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            entry = self._ready.pop((kernel, device), None)
            if entry is not None:
                self._bytes[device] -= entry[1]
        if entry is None:
            return None
        twin = entry[0]
        if not self._fresh(kernel, device, twin):
            self.discarded += 1
            self._discard(twin)
            return None
        ctx = twin.ctx
        try:
            with ctx.lock:
                ctx.check()
                twin.local_slot = ctx.take_local_slot(twin)
        except VkmError:   # (no slot free there: the move's own build says so)
            self._discard(twin)
            return None
        self.used += 1
        return twin

    def _fresh(self, kernel: Kernel, device: int, twin: Kernel) -> bool:
        rt = self._life.rt
        pair = rt._contexts.get(device)
        return (not kernel.destroyed and not twin.destroyed and pair is not None and pair[0] is twin.ctx
                and twin.ctx.alive and not rt.device_lost(device) and kernel.device_index != device
                and twin.spec == kernel.spec and twin.address == kernel.address and twin.tenant == kernel.tenant
                and isinstance(twin.outbox, ExportedBuffer) == bool(rt.exports_outboxes(device)))

    def wait_idle(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) until no twin is queued or being made; whether so."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._frees or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.25))
        return True

    def _run(self) -> None:
        lower_priority()   # (the steps keep the cores)
        while True:
            with self._cond:
                while not self._queue and not self._frees and not self._stopping:
                    if not self._cond.wait(_IDLE_WAIT) and self._ready:
                        self._cond.release()
                        try:
                            self.prune()
                        finally:
                            self._cond.acquire()
                if self._stopping:
                    return
                frees, self._frees = list(self._frees), deque()
                job = None if frees else self._queue.popleft()
                self._busy = True
            try:
                if job is None:
                    for item in frees:
                        free_lost(self._life.rt, item)
                else:
                    self._work(*job)
            finally:
                with self._cond:
                    self._building = None
                    self._busy = False
                    self._cond.notify_all()

    def _work(self, kernel: Kernel, half: Kernel | None) -> None:
        """Re-initialise `half` as kernel's twin, or build kernel's twins."""
        try:
            if half is not None:
                self._reinit(kernel, half)
            else:
                self._build_for(kernel)
        except DestroyedError:   # (the runtime or a device context went away)
            pass
        except DeviceLostError as exc:   # (the failover takes it from here; no twin there)
            log.info("building a ready twin of %r stopped: %s", kernel.id, exc)
        except Exception:   # a twin is an optimisation: the move builds its own
            log.exception("building a ready twin of %r failed", kernel.id)

    def _build_for(self, kernel: Kernel) -> None:
        life = self._life
        for d in self._targets(kernel):
            if self._stopping or kernel.destroyed:
                return
            if d == kernel.device_index or life.rt.device_lost(d):
                continue
            ctx = life.rt._context(d)
            size = _twin_bytes(life, kernel, ctx)
            with self._cond:
                entry = self._ready.get((kernel, d))
            if entry is not None and self._fresh(kernel, d, entry[0]):
                continue
            with self._cond:
                if entry is not None and self._ready.get((kernel, d)) is entry:
                    del self._ready[(kernel, d)]
                    self._bytes[d] -= entry[1]
                else:
                    entry = None
                go = self._bytes.get(d, 0) + size <= self._limit
                if go or entry is not None:
                    self._building = (kernel, d)
            if entry is not None and self._keep(kernel, d, entry[0], entry[1]):
                continue   # (made stale by a reload alone: given the new code, its buffers kept)
            if not go:
                continue
            twin = build_twin(life.rt, life.pool, kernel, d, ahead=True)
            self.built += 1
            self._keep(kernel, d, twin, size)

    def _new_code(self, kernel: Kernel, device: int, twin: Kernel) -> bool:
        """Give `twin` the code `kernel` runs now, when a hot reload is all that made it
        stale (the spec differs in the code alone): the new pipeline (built on `device`
        ahead by the reload, else here) and a descriptor set of it; its buffers stay.
        Whether it did; on False the caller discards the twin."""
        spec = kernel.spec
        if twin.spec == spec or dataclasses.replace(twin.spec, spirv=spec.spirv,
                                                    entry_point=spec.entry_point) != spec:
            return False
        ctx = twin.ctx
        if not ctx.alive or twin.destroyed or kernel.destroyed:
            return False
        p = ctx.hold_pass(spec.spirv, spec.entry_point, len(twin.states), locked=False, timeout=BUILD_WAIT)
        stepper = self._life.rt._contexts.get(device, (None, None))[1]
        with ctx.lock:
            new_set = kernel_set(twin, p)
            old = put_pass(twin, p, new_set, spec)
            if stepper is not None and twin.last_value > ctx.completed():   # (a recycled half's last steps)
                stepper.retired.append((twin.last_value, old))
            else:
                ctx.free_set(old)
        self.refreshed += 1
        return self._fresh(kernel, device, twin)

    def _reinit(self, kernel: Kernel, half: Kernel) -> None:
        """Make the half a migration left behind a twin again: its rings zeroed, headers
        written, bookkeeping reset (its state buffers the next move overwrites)."""
        ctx, d = half.ctx, half.ctx.index
        size = _twin_bytes(self._life, kernel, ctx)
        with self._cond:
            self._bytes[d] -= size   # (counted again by _keep)
            self._building = (kernel, d)
        try:
            res = half.residency
            n = ctx.in_flight
            res.last_value, res.region_users = 0, [0] * n
            res.region_harvested, res.outbox_batches = [True] * n, [None] * n
            half.h2k_buffer.bytes[:] = 0
            half.k2h.bytes[:] = 0
            for r in range(n):
                h = half.h2k_buffer.words[r * half.h2k_region // 4:]
                h[2], h[3] = half.spec.inbox_capacity, half.slot_words
            ctx.run_once(half.init_commands([np.zeros(0, np.uint8)] * len(half.states)), users=list(half.buffers))
        except BaseException:
            self._discard(half)
            raise
        self.recycled += 1
        self._keep(kernel, d, half, size)

    def _keep(self, kernel: Kernel, device: int, twin: Kernel, size: int) -> bool:
        """Keep `twin` (of `size` bytes, not counted) as kernel's ready twin on `device`, given
        the kernel's new code first where a reload made it stale; else free it. Whether kept."""
        try:
            fresh = self._fresh(kernel, device, twin) or self._new_code(kernel, device, twin)
        except BaseException:
            self.discarded += 1
            self._discard(twin)
            raise
        with self._cond:
            keep = fresh and not self._stopping and self._enabled and (kernel, device) not in self._ready
            if keep:
                self._ready[(kernel, device)] = (twin, size)
                self._bytes[device] = self._bytes.get(device, 0) + size
        if not keep:
            self.discarded += 1
            self._discard(twin)
        return keep

    # -- freeing -------------------------------------------------------------------------

    def _pop_stale(self) -> list[Kernel]:
        """Take out the twins gone stale (the lock not held)."""
        with self._cond:
            entries = list(self._ready.items())
        stale = [(key, entry) for key, entry in entries if not self._fresh(key[0], key[1], entry[0])]
        out = []
        with self._cond:
            for key, entry in stale:
                if self._ready.get(key) is entry:
                    del self._ready[key]
                    self._bytes[key[1]] -= entry[1]
                    out.append(entry[0])
        self.discarded += len(out)
        return out

    def _pop_all(self) -> list[Kernel]:
        with self._cond:
            entries, self._ready = list(self._ready.values()), {}
            self._bytes = {}
        return [t for t, _ in entries]

    def prune(self) -> None:
        """Free the twins gone stale now (their kernels destroyed, devices lost, code reloaded)."""
        self._free(self._pop_stale())

    def _free(self, twins: list[Kernel]) -> None:
        for t in twins:
            self._discard(t)

    def _discard(self, twin: Kernel) -> None:
        """Free a twin; its outbox as a retired one (receivers on its device may hold
        descriptor sets for it: a recycled half's)."""
        outbox = twin.outbox
        if not twin.ctx.alive:   # (a lost device's context: its sets and memory go with it)
            twin.sets, twin.deliver_sets = [], {}
        if outbox is None or twin.ctx.index not in self._life.rt._contexts or not twin.ctx.alive:
            free_twin(twin)
            return
        twin.buffers = [b for b in twin.buffers if b is not outbox]
        free_twin(twin)
        self._life.retire(Retired(twin.ctx, [outbox], [], outbox.handle_int))

    def destroy(self, timeout: float) -> None:
        """Stop the thread (joined within `timeout` s; a twin it is making then is
        freed by it) and free every ready twin. Idempotent."""
        with self._cond:
            self._stopping = True
            queued = [h for _, h in self._queue if h is not None]
            frees = list(self._frees)
            self._queue.clear()
            self._frees.clear()
            self._cond.notify_all()
            thread = self._thread
        deadline = Deadline(timeout)
        join_worker(thread, timeout, "the ready-twin thread")
        for item in frees:
            free_lost(self._life.rt, item, deadline.left())
        self._free(queued + self._pop_all())
