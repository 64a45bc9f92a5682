"""Inbound: the K2K router's side of KernelRuntime, a collaborator the runtime
builds and owns. It keeps the step listeners and the outbox feed (the router,
an OutboxFeed), takes the batches handed in from other devices (accept,
withdraw, the descriptor sets kept for reused buffers) and is the runtime's
RuntimePort: everything the router's delivery engine asks of the runtime goes
through it. docs/reference/k2k-router.md, "The hooks a router uses", describes the contract.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any, Callable

from ...errors import DestroyedError, DeviceLostError, VkmError, TimeoutError as VkmTimeout
from ...memory.image import Buffer
from ..._core.lifetime import Deadline
from ..._core.timeline import TimelinePoint
from ...transfer.peer import ExportedBuffer, ImportedBuffer
from ..._core.checks import int_in, is_int, timeout_seconds, short_repr
from ..._core.timeline import as_wait_points
from ..engine.kernel import InboundBatch, Kernel, OutboxBatch
from ..messages import RING_HEADER_BYTES
from .ports import OutboxFeed

log = logging.getLogger(__name__)

__all__ = ["Inbound"]

#: What set_outbox_feed asks of a feed (the methods of OutboxFeed).
_FEED_METHODS = ("take", "settle", "flush", "device_lost", "detach")


class Inbound:
    """The step listeners, the outbox feed and the inbound batches of `runtime`;
    KernelRuntime's add/remove_step_listener, set_outbox_feed, accept_batch,
    withdraw_batch and forget_buffer are its methods. Implements RuntimePort for
    the K2K router.

    Besides the runtime's public members it is handed the runtime's registry:
    `check()` (DestroyedError once the runtime is destroyed), `device(index)`
    (a device's (DeviceContext, DeviceStepper), made on first use), `contexts`
    (the pairs made so far, read under `lock`), `by_index` (address %
    max_kernels -> kernel) and `wait_points(points, timeout)`."""

    def __init__(self, runtime: Any, check: Callable[[], None], device: Callable[[int], tuple[Any, Any]],
                 lock: Any, contexts: dict[int, tuple[Any, Any]], by_index: dict[int, Kernel],
                 wait_points: Callable[[list[TimelinePoint], float | None], None]):
        self._rt = runtime
        self.manager = runtime.manager
        self._check, self._device, self._wait_points = check, device, wait_points
        self._registry_lock, self._contexts, self._by_index = lock, contexts, by_index
        self._lock = threading.Lock()   # listeners and feed (taken with nothing else called)
        self._listeners: list[Callable[[list[OutboxBatch]], Any]] = []
        self._retaining: set[int] = set()   # ids of listeners each new batch starts retained for
        self._preparers: dict[int, Callable[[list[Kernel], float | None], Any]] = {}   # listener id -> before-step hook
        self._quiet: dict[int, Callable[[list[Kernel]], bool]] = {}   # listener id -> its quiet(kernels)
        self._hooks: tuple[list, int, list] = ([], 0, [])   # what step_hooks() gives, made on each change
        self._watched: weakref.WeakSet[ImportedBuffer] = weakref.WeakSet()   # imports read in place
        #: import -> the step of its device that must be done before its memory goes, where a
        #: drop_readers() that took its batches out gave up waiting (a timeout, Ctrl-C)
        self._unread: weakref.WeakKeyDictionary[ImportedBuffer, int] = weakref.WeakKeyDictionary()
        #: the source of messages the host routes on kernels' behalf (the K2K router), or None
        self.feed: OutboxFeed | None = None

    # -- listeners and the feed ------------------------------------------------------------

    def add_step_listener(self, listener: Callable[[list[OutboxBatch]], Any], *, retain: bool = False,
                          prepare: Callable[[list[Kernel], float | None], Any] | None = None,
                          quiet: Callable[[list[Kernel]], bool] | None = None) -> None:
        """Call `listener(batches)` after each step with the new outbox batches (the
        router's hook: it copies them to other devices and hold()s them). With
        `retain=True` every batch handed to it starts retained once for it (it
        cannot count as done, so its region is not reused) until the listener
        calls `batch.release()`; it must do so exactly once per batch.
        `prepare(kernels, timeout)`, if given, runs at the start of each step call (no
        device lock held) with the kernels it is asked to step and what is left of
        the call's timeout (None: no limit), which its waits keep to: a router
        releases there the batches other devices have finished reading, so
        their kernels need not be deferred. `quiet(kernels)`, if given, tells whether
        the listener has nothing to do for steps of `kernels` that send nothing: while
        every listener says so, run() may submit such steps natively and hand the
        listeners only the batches of the last ones (see Stepping)."""
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {type(listener).__name__}")
        if not isinstance(retain, bool):
            raise TypeError(f"retain must be a bool, got {short_repr(retain)}")
        if prepare is not None and not callable(prepare):
            raise TypeError(f"prepare must be callable or None, got {type(prepare).__name__}")
        if quiet is not None and not callable(quiet):
            raise TypeError(f"quiet must be callable or None, got {type(quiet).__name__}")
        with self._lock:
            self._listeners.append(listener)
            if retain:
                self._retaining.add(id(listener))
            if prepare is not None:
                self._preparers[id(listener)] = prepare
            if quiet is not None:
                self._quiet[id(listener)] = quiet
            self._snapshot_hooks()

    def remove_step_listener(self, listener: Callable[[list[OutboxBatch]], Any]) -> None:
        """Stop calling `listener` (a step already running still hands it its batches)."""
        with self._lock:
            if listener in self._listeners:
                stored = self._listeners.pop(self._listeners.index(listener))   # (a bound method: an equal object)
                if listener not in self._listeners:
                    self._retaining.discard(id(stored))
                    self._preparers.pop(id(stored), None)
                    self._quiet.pop(id(stored), None)
                self._snapshot_hooks()

    def step_hooks(self) -> tuple[list[Callable[[list[OutboxBatch]], Any]], int,
                                  list[Callable[[list[Kernel], float | None], Any]]]:
        """For one step: the listeners that see its batches, how many of them retain
        each batch, and the before-step hooks (taken together, so they agree; the
        caller must not change the lists)."""
        return self._hooks

    def listeners_quiet(self, kernels: list[Kernel]) -> bool:
        """Whether every step listener has a quiet hook and says it has nothing to do
        for steps of `kernels` that send nothing, and the outbox feed has nothing on
        its way for them (True without either). Asked with no device lock held: the
        hooks may take their own locks, and wait."""
        listeners, quiet = self._hooks[0], self._quiet
        for fn in listeners:
            hook = quiet.get(id(fn))
            if hook is None or not hook(kernels):
                return False
        feed = self.feed
        return feed is None or feed.quiet(kernels)

    def _snapshot_hooks(self) -> None:
        """Make what step_hooks() gives anew (with the lock held, after a change): a step
        reads one consistent snapshot without taking the lock."""
        listeners = list(self._listeners)
        self._hooks = (listeners, sum(1 for fn in listeners if id(fn) in self._retaining),
                       list(self._preparers.values()))

    def has_listeners(self) -> bool:
        """Whether something moves messages to kernels on other devices (a step listener)."""
        return bool(self._listeners)

    def set_outbox_feed(self, feed: OutboxFeed | None) -> None:
        """Install (or remove, with None) the source of messages the host routes on a
        kernel's behalf (an OutboxFeed): `feed.take(kernel, limit)` -> list of
        (packed slot, token) is asked at each step of a kernel with no such
        messages in flight; they join that step's outbox after the kernel's own
        (same sequence numbers and clock) as far as it has room;
        `feed.settle(kernel, batch, taken, returned)` hands back the tokens once
        the step is harvested (`returned`: did not fit, or nothing ran; they go
        first next time). Only one feed: the K2K router."""
        if feed is not None and not all(callable(getattr(feed, name, None)) for name in _FEED_METHODS):
            raise TypeError(f"feed must have take(), settle(), flush(), device_lost() and detach() (an OutboxFeed), "
                            f"got {type(feed).__name__}")
        with self._lock:
            if feed is not None and self.feed is not None and self.feed is not feed:
                raise ValueError("this runtime already has an outbox feed (a K2K router is attached)")
            self.feed = feed

    def close(self, timeout: float | None) -> None:
        """The runtime is being destroyed: the feed (the K2K router) detaches first, so that
        nothing of it (a move, a relay of a timeline, an import) still uses the devices'
        objects the runtime frees next."""
        feed = self.feed
        if feed is not None:
            feed.detach(timeout)

    def settle_injected(self, kernel: Kernel, batch: OutboxBatch | None, taken: list, returned: list) -> None:
        """The stepper's report on host-routed messages of one step (see set_outbox_feed)."""
        feed = self.feed
        if feed is not None:
            feed.settle(kernel, batch, [t for _, t in taken], [(slot, t) for slot, t in returned])

    def device_lost(self, index: int) -> None:
        """Tell the feed (the K2K router) that GPU `index` was lost: it forgets its moves
        to and from the device."""
        feed = self.feed
        if feed is None:
            return
        try:
            feed.device_lost(index)
        except VkmError as exc:
            log.warning("KernelRuntime: the K2K router failed to forget GPU %d: %s", index, exc)

    # -- batches handed in -------------------------------------------------------------------

    def accept_batch(self, device: int, buffer: Any, offset: int = 0, size: int | None = None, *,
                     wait: Any = None, source: Kernel | None = None, hops: int = 0, report_unknown: bool = True,
                     submitted: Callable[[float], Any] | None = None, reuse_sets: bool = False,
                     direct: Kernel | None = None, direct_slots: int | None = None,
                     lazy: bool = False) -> InboundBatch:
        """Hand the kernels of `device` a batch in `buffer` (a vkmulti Buffer on that
        device, laid out as an outbox region: 16-word header with the count, then
        slots of this runtime's size) from `offset`. The next steps there deliver
        its messages (waiting on the GPU for `wait` first); the buffer must stay
        untouched until the returned batch is done (then the GPU no longer reads
        it). `source`: the kernel that sent the batch, told of messages that
        cannot be delivered (otherwise they count as dead letters; the batch's
        `unknown` and `rejected` counts say how many). `hops` is added to the hop
        count of each message delivered from it; `report_unknown=False` leaves
        unknown addresses to the sender's own survey; `submitted(timeout)` runs
        before a step first queues a wait on `wait` (a transfer's
        TransferTicket.wait_submitted when it shares that step's queue).
        `reuse_sets=True`: the buffer is reused for later batches (a router's
        pool), so the descriptor sets made for it are kept for them; call
        forget_buffer() before destroying it. `direct`: a kernel of `device` the
        batch is expected to be all for (its sender's recent batches were):
        that kernel's next step copies the batch's first `direct_slots` slots
        (default all) into its inbox with a copy command and takes them in
        place, checking on the GPU that they are all its own; any that are not
        (or past `direct_slots`) are delivered as usual, so a wrong guess costs
        speed, never a message. `lazy=True`: no step waits on the GPU for `wait`;
        the first step recorded once it is reached reads the batch (with the
        batches after it from the same source), so a batch that is probably
        empty does not tie this device's steps to the other device's."""
        rt = self._rt
        self._check()
        if not is_int(device):
            raise TypeError(f"device must be an int, got {type(device).__name__}")
        if not isinstance(buffer, Buffer):
            raise TypeError(f"buffer must be a vkmulti Buffer, got {type(buffer).__name__}")
        if buffer.handle is None:
            raise DestroyedError("buffer was destroyed")
        if buffer.slot.index != device:
            raise ValueError(f"buffer is on GPU {buffer.slot.index}, not GPU {short_repr(device)}")
        size = buffer.size - offset if size is None else size
        int_in(offset, "offset", 0, buffer.size)
        ctx, stepper = self._device(device)
        if offset % ctx.min_offset_alignment:
            raise ValueError(f"offset {offset} is not a multiple of the device's storage offset alignment "
                             f"{ctx.min_offset_alignment}")
        int_in(size, "size", RING_HEADER_BYTES + rt.slot_size, buffer.size - offset)
        points = as_wait_points(wait, device, native=ctx.slot.native)
        if source is not None and not isinstance(source, Kernel):
            raise TypeError(f"source must be a Kernel or None, got {type(source).__name__}")
        int_in(hops, "hops", 0, 255)
        if not isinstance(report_unknown, bool):
            raise TypeError(f"report_unknown must be a bool, got {short_repr(report_unknown)}")
        if submitted is not None and not callable(submitted):
            raise TypeError(f"submitted must be callable or None, got {type(submitted).__name__}")
        if not isinstance(reuse_sets, bool):
            raise TypeError(f"reuse_sets must be a bool, got {short_repr(reuse_sets)}")
        if not isinstance(lazy, bool):
            raise TypeError(f"lazy must be a bool, got {short_repr(lazy)}")
        slots = (size - RING_HEADER_BYTES) // rt.slot_size
        if direct is not None:
            if not isinstance(direct, Kernel):
                raise TypeError(f"direct must be a Kernel or None, got {type(direct).__name__}")
            if direct.runtime is not rt or direct.device_index != device:
                raise ValueError(f"direct kernel {short_repr(direct.id)} is not a kernel of this runtime on GPU {short_repr(device)}")
        direct_slots = slots if direct_slots is None else int_in(direct_slots, "direct_slots", 0, slots)
        return self._accept(ctx, stepper, buffer, offset, size, points, source, hops, report_unknown, submitted,
                            reuse_sets, direct, direct_slots, lazy)

    def accept_in_place(self, device: int, view: ImportedBuffer, batch: OutboxBatch, wait: list[TimelinePoint],
                        hops: int, direct: Kernel | None, direct_slots: int | None, lazy: bool) -> InboundBatch:
        """Hand the kernels of `device` the outbox batch `batch` of another device, read
        in place through `view` (that outbox's import on `device`) once `wait` (points
        of `device`) is reached. Unlike accept_batch, the batch's offset need not meet
        this device's alignment: only a step that reads it as an inbox needs that,
        and checks. Its sets are kept for `view` (forget_buffer)."""
        ctx, stepper = self._device(device)
        k = batch.kernel
        return self._accept(ctx, stepper, view, batch.offset, batch.size, wait, k, hops, False, None, True, direct,
                            k.spec.outbox_capacity if direct_slots is None else direct_slots, lazy)

    def _accept(self, ctx: Any, stepper: Any, buffer: Any, offset: int, size: int, points: list, source: Any,
                hops: int, report_unknown: bool, submitted: Any, reuse_sets: bool, direct: Any,
                direct_slots: int, lazy: bool) -> InboundBatch:
        b = InboundBatch(ctx, buffer, offset, size, points, hops=hops, report_unknown=report_unknown,
                         submitted=submitted, reuse_sets=reuse_sets, direct=direct, direct_slots=direct_slots,
                         lazy=lazy)
        b.source = source
        imported = isinstance(buffer, ImportedBuffer)
        with ctx.lock:
            ctx.check()
            if imported:
                if (source is not None and source.destroyed) or buffer.destroyed:
                    raise DestroyedError("the outbox it lies in was freed: it is no longer read in place")
                if buffer not in self._watched:   # its memory may go: stop reading it first
                    self._watched.add(buffer)
                    buffer.on_destroy(lambda timeout, view=buffer: self.drop_readers(view, timeout))
            stepper.batches.append(b)
        return b

    def withdraw_batch(self, batch: InboundBatch, *, timeout: float | None = 30.0) -> int:
        """Take an accepted batch back before it is fully delivered (a router that
        detaches): no later step reads it, and once the steps already submitted
        are done its buffer may be reused. Returns how many of its messages for
        kernels of that device were not delivered (dropped; the caller reports them)."""
        if not isinstance(batch, InboundBatch):
            raise TypeError(f"batch must be an InboundBatch, got {type(batch).__name__}")
        timeout = timeout_seconds(timeout)
        try:
            ctx, stepper = self._device(batch.device_index)
        except DeviceLostError:   # failed over: the device and what it held are gone
            batch.done = True
            batch.event.set()
            return 0
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        with ctx.lock:
            if batch.done:
                return 0
            queued = batch in stepper.batches
            if queued:
                stepper.batches.remove(batch)
            lost = False
            try:
                self._wait_read(ctx, stepper, batch, deadline, timeout)
            except DeviceLostError:
                if not self._rt.device_lost(batch.device_index):
                    if queued:
                        stepper.batches.append(batch)
                    raise
                lost = True   # it runs nothing more: nothing to wait for; the failover hands its messages again
            except BaseException:   # (a timeout, Ctrl-C): not withdrawn, later steps go on delivering it
                if queued:
                    stepper.batches.append(batch)
                raise
            stepper.retire_sets(batch)
            left = 0 if lost else max(0, batch.local - batch.delivered - batch.rejected)
            batch.done = True
            batch.event.set()
            ctx.cond.notify_all()
            return left

    def let_go_batch(self, batch: InboundBatch) -> None:
        """An accepted batch that holds nothing more for the kernels of its device (the
        router learnt so from the sending step's survey, or every message of it was
        taken): no later step reads it, and it is done, its buffer free to reuse, once
        the steps already submitted that read it are -- which the device's harvests
        find. Never waits (withdraw_batch waits for those steps)."""
        if not isinstance(batch, InboundBatch):
            raise TypeError(f"batch must be an InboundBatch, got {type(batch).__name__}")
        try:
            ctx, stepper = self._device(batch.device_index)
        except DeviceLostError:   # failed over: the device and what it held are gone
            batch.done = True
            batch.event.set()
            return
        with ctx.lock:
            if batch.done:
                return
            batch.pending = set()   # no delivery pass takes anything from it, no survey reads it
            batch.surveyed = True
            batch.submitted = None  # (no later step waits for its transfer's submit either)
            if not ctx.alive:
                return
            try:
                done = ctx.completed()
            except DeviceLostError:
                return   # its failover lets the device's batches go
            if batch.finish_if_done(done):   # (else a later harvest of the device finishes it)
                if batch in stepper.batches:
                    stepper.batches.remove(batch)
                stepper.retire_sets(batch)
                ctx.cond.notify_all()

    def _wait_read(self, ctx: Any, stepper: Any, batch: InboundBatch, deadline: float, timeout: float | None) -> None:
        """Wait (ctx.lock held, released while waiting) until the steps that read `batch` are done."""
        while ctx.completed() < batch.last_value:
            left = deadline - time.monotonic()
            if left <= 0:
                raise VkmTimeout(f"GPU {batch.device_index}: steps reading the batch did not finish within "
                                 f"{timeout} s; it was not withdrawn")
            try:
                ctx.wait_unlocked(batch.last_value, min(left, 0.25))
            except VkmTimeout:
                pass
        stepper.harvest()

    def wait_reads(self, batches: list[InboundBatch], timeout: float | None) -> None:
        """Wait until the steps already submitted that read `batches` are done
        (vkmulti.TimeoutError after `timeout` s)."""
        points = [b.ctx.point(b.last_value) for b in batches if b.last_value]
        if points:
            self._wait_points(points, timeout)

    def forget_buffer(self, buffer: Any) -> None:
        """Drop the descriptor sets cached for `buffer` (batches accepted with
        reuse_sets=True), before or after it is destroyed; they are freed once
        the steps already submitted on its device are done."""
        if not isinstance(buffer, Buffer):
            raise TypeError(f"buffer must be a vkmulti Buffer, got {type(buffer).__name__}")
        with self._registry_lock:
            pair = self._contexts.get(buffer.slot.index)
        if pair is None:
            return
        kernels = self._rt.kernels
        ctx, stepper = pair
        with ctx.lock:   # (the sets are kept by the buffer object: this works after its destroy() too)
            for key in [key for key in ctx.buffer_sets if key[0] is buffer]:
                stepper.retired.append((ctx.value, ctx.buffer_sets.pop(key)))
            for k in kernels:
                if k.ctx is ctx and not k.destroyed:
                    for key in [key for key in k.deliver_sets if key[0] == "in" and key[1] is buffer]:
                        stepper.retired.append((ctx.value, k.deliver_sets.pop(key)))

    def drop_readers(self, view: ImportedBuffer, timeout: float | None = 30.0) -> None:
        """Batches read in place through `view` (an import of another device's outbox)
        are dropped, undelivered, before its memory goes: the steps already
        submitted that read them are waited for, and the descriptor sets made
        for it are let go. Takes only the lock of the view's device, and only
        when there is something to drop."""
        pair = self._contexts.get(view.slot.index)
        if pair is None:
            return
        ctx, stepper = pair
        held = any(key[0] is view for key in list(ctx.buffer_sets)) or \
            any(b.buffer is view for b in list(stepper.batches)) or view in self._unread
        if held:
            with ctx.lock:
                if not ctx.alive:
                    return
                last = self._unread.get(view, 0)
                for b in list(stepper.batches):
                    if b.buffer is view:
                        stepper.batches.remove(b)
                        last = max(last, b.last_value)
                        stepper.retire_sets(b)
                        b.done = True
                        b.event.set()
                ctx.cond.notify_all()
                self._unread[view] = last   # (until seen done: a later call waits for it too)
                deadline = Deadline(timeout)
                try:
                    while ctx.completed() < last:
                        ctx.wait_unlocked(last, deadline.left())
                except DeviceLostError:
                    if not self._rt.device_lost(view.slot.index):
                        raise   # (a lost device runs nothing more: nothing reads the view)
                del self._unread[view]
        self.forget_buffer(view)

    # -- the rest of the RuntimePort -----------------------------------------------------------

    @property
    def kernels(self) -> list[Kernel]:
        """The runtime's live kernels, in launch order."""
        return self._rt.kernels

    def kernel_by_address(self, address: int) -> Kernel | None:
        """The live kernel with this address (None: no such kernel, or one destroyed)."""
        k = self._by_index.get(address % self._rt.max_kernels)
        return None if k is None or k.address != address or k.destroyed else k

    def poll(self) -> None:
        """Harvest every completed step without waiting (KernelRuntime.poll)."""
        self._rt.poll()

    def fail_delivery(self, kernel: Kernel, step: int, text: str) -> None:
        """A message of `kernel`'s step `step` could not be delivered: counted as
        undeliverable, and its next step raises KernelMessageError naming `text`;
        a destroyed kernel's count as dead letters."""
        if kernel.destroyed:
            self._rt.record_dead_letters(text, 1)
            return
        with kernel.ctx.lock:
            kernel.stats.undeliverable += 1
            kernel.errors.append(f"step {step}: {text}")
        log.warning("kernel %r: %s", kernel.id, text)

    def record_dead_letters(self, text: str, n: int) -> None:
        """Count undeliverable messages whose sender cannot be told (KernelRuntime.record_dead_letters)."""
        self._rt.record_dead_letters(text, n)

    def __repr__(self) -> str:
        return f"Inbound(listeners={len(self._listeners)}, feed={type(self.feed).__name__ if self.feed else None})"
