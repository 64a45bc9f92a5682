"""Native links and the tickets of their jobs: ring shapes, link sharing, TransferTicket.

A link is one source, destination, method and ring shape, shared by every
transfer that matches (kept in the source slot's children, counted by
reference): a worker thread per link pipelines chunks through a ring of slots
and orders the two devices with timeline semaphores. A TransferTicket is one
queued job of a link.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Generator

import vulkan as vk

from .._core import _native
from .._core.checks import is_int, seconds_text, short_repr
from .._core.lifetime import Deadline, Lifetime
from .._core.timeline import TimelinePoint
from ..device.capabilities import EXT_DMA_BUF
from ..device.logical import retire_submits
from ..device.slots import slot_lifetime
from ..errors import DestroyedError, DeviceLostError, VkmError
from ..errors import TimeoutError as VkmTimeoutError
from .methods import TransferMethod

if TYPE_CHECKING:
    from .._core._native import Link as NativeLink

log = logging.getLogger(__name__)

__all__ = ["TransferTicket", "LinkRef", "acquire_link", "link_queue", "check_ring_shape", "ring_shape", "DEFAULT_SLOT_SIZE",
           "DEFAULT_SLOT_COUNT", "SPIN_SECONDS", "TRACE_ENV"]

#: Ring shape per device pair and method: 8 slots of 8 MiB (64 MiB). Jobs
#: under 128 MiB are cut into about sixteen chunks of at least 2 MiB instead.
DEFAULT_SLOT_SIZE = 8 << 20
DEFAULT_SLOT_COUNT = 8
#: CUDA_PEER's default ring: 8 slots of 16 MiB (128 MiB a side). Each chunk
#: costs its worker ~25 us of host work, so chunks are large: a 4K frame goes
#: in eight, 256 MiB in sixteen (bench/HISTORY.md has the shapes measured).
CUDA_PEER_SLOT_SIZE = 16 << 20
CUDA_PEER_SLOT_COUNT = 8
#: The default ring where a device of the pair is a CPU (lavapipe): 8 slots of
#: 1 MiB. The copies there are CPU work, and chunks that stay in the caches run
#: 1.2-1.7x faster than 8 MiB ones (bench/HISTORY.md, 2026-11-30 session 4).
CPU_SLOT_SIZE = 1 << 20
CPU_SLOT_COUNT = 8
#: Ring shapes vkmulti accepts: a slot of at most 4 GiB, at most 1024 slots, at
#: most 64 GiB a ring (each side). Anything larger is refused at construction:
#: slot_size x slot_count, and its rounding up to the devices' alignment, must
#: never wrap 64 bits or overflow the native ring's 32-bit slot count.
MAX_SLOT_SIZE = 1 << 32
MAX_SLOT_COUNT = 1024
MAX_RING_BYTES = 1 << 36


def check_ring_shape(slot_size: Any, slot_count: Any) -> tuple[int, int]:
    """(slot_size, slot_count) if within MAX_SLOT_SIZE, MAX_SLOT_COUNT and
    MAX_RING_BYTES, else ValueError naming the value."""
    for label, v, hi in (("slot_size", slot_size, MAX_SLOT_SIZE), ("slot_count", slot_count, MAX_SLOT_COUNT)):
        if not is_int(v):
            raise ValueError(f"{label} must be a positive int, got {type(v).__name__} {short_repr(v)}")
        if not 0 < v <= hi:
            raise ValueError(f"{label} must be in [1, {hi}], got {short_repr(v)}")
    if slot_size * slot_count > MAX_RING_BYTES:
        raise ValueError(f"a ring of {slot_count} x {slot_size} B exceeds {MAX_RING_BYTES} B; "
                         f"lower slot_size or slot_count")
    return slot_size, slot_count


def _on_gpus(src: Any, dst: Any) -> bool:
    """Whether both devices of a pair are known to be GPUs (not CPU devices)."""
    return src.capabilities is not None and dst.capabilities is not None and \
        "cpu" not in (src.capabilities.device_type, dst.capabilities.device_type)


def ring_shape(method: str, src: Any, dst: Any, slot_size: int, slot_count: int) -> tuple[int, int]:
    """The ring a transfer's link uses: the one asked for, or where that is the
    default, the default of the method (CUDA_PEER) or of CPU devices."""
    if (slot_size, slot_count) != (DEFAULT_SLOT_SIZE, DEFAULT_SLOT_COUNT):
        return slot_size, slot_count
    if method == TransferMethod.CUDA_PEER:
        return CUDA_PEER_SLOT_SIZE, CUDA_PEER_SLOT_COUNT
    if not _on_gpus(src, dst):
        return CPU_SLOT_SIZE, CPU_SLOT_COUNT
    return slot_size, slot_count


#: On GPUs, semaphores are polled this long before a blocking wait (a wake-up
#: costs tens of microseconds); never on CPU devices, where it steals their cores.
SPIN_SECONDS = 200e-6
_OPAQUE_FD = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT
_DMA_BUF = 0x200  # VK_EXTERNAL_MEMORY_HANDLE_TYPE_DMA_BUF_BIT_EXT
_RING = {TransferMethod.STAGING_COPY: _native.RING_STAGING, TransferMethod.HOST_SHARED: _native.RING_SHARED_HOST,
         TransferMethod.DMABUF: _native.RING_EXPORTED, TransferMethod.CUDA_PEER: _native.RING_CUDA_PEER}
#: Set to a file name, links made from then on append a timeline of their work
#: to it (a diagnostic: a poller thread spins a core per link; bench/trace_report.py).
TRACE_ENV = _native.TRACE_ENV


class LinkRef:
    """A shared native link with a reference count (destroyed at zero, or with its slot).

    destroy() waits (bounded, interruptible) until the GPUs reached the last
    timeline values the link handed out, so they are done with every job
    before the native link frees its ring; and it answers for the tickets of
    jobs that completed (or failed) once the link is gone.
    """

    def __init__(self, link: Any, key: tuple, links: "_Links", slots: tuple[Any, Any]):
        self.link, self.key, self.links, self.refs = link, key, links, 0
        self.slots = slots   # (source, destination): their queues are retired before the link's timelines go
        self.src_sem, self.dst_sem = link.src_timeline, link.dst_timeline   # fixed for the link's life
        links.alive[id(self)] = self   # made under links.lock (acquire_link)
        # no parent: tickets stay answerable while the manager's destroy() runs, which
        # destroys the links last
        self.life = Lifetime(self, "transfer link")
        # the highest value read from each timeline so far: a lower bound of it from
        # then on (it only grows), so most gpu_done() answers need no native call
        self.seen_src = self.seen_dst = 0
        self._lock = threading.Lock()
        # the tickets handed out, to settle at destroy() (weak: the caller's to keep;
        # plain references without callbacks, pruned now and then: cheaper per job
        # than a WeakSet)
        self._tickets: list[weakref.ref[TransferTicket]] = []
        self._prune_at = 64

    def submitted(self, ticket: "TransferTicket") -> None:
        """Note a job just queued: its ticket is answered for if the link goes first."""
        with self._lock:
            tickets = self._tickets
            if len(tickets) >= self._prune_at:
                tickets[:] = [r for r in tickets if (t := r()) is not None and not t._complete and t._error is None]
                self._prune_at = max(64, 2 * len(tickets))
            tickets.append(weakref.ref(ticket))

    def release(self, timeout: float | None = None) -> None:
        """Give back one reference; the last one destroys the link (waiting for its jobs).

        A transfer made meanwhile gets a new link: this one leaves the table first."""
        with self.links.lock:
            self.refs -= 1
            if self.refs > 0:
                return
            if self.links.by_key.get(self.key) is self:
                del self.links.by_key[self.key]
        try:
            self.destroy(timeout)
        except BaseException:
            with self.links.lock:
                self.refs += 1   # still held: a later release() or the slot's destroy retries
            raise

    def destroy(self, timeout: float | None = None) -> None:
        """Wait until both GPUs reached the last values handed out (every job done or
        failed, a failed link's timelines raised), settle the tickets still
        unanswered, then free the native link. vkmulti.TimeoutError keeps it."""
        with self.life.ending(timeout) as dl:
            if dl is None:
                return
            link = self.link
            if link.alive:
                last_src, last_dst = link.last_values
                for side, sem, value in ((link.src, self.src_sem, last_src), (link.dst, self.dst_sem, last_dst)):
                    if value:
                        _wait_gpu(side, sem, value, dl, "a transfer link's jobs")
                with self._lock:
                    tickets = [t for r in self._tickets if (t := r()) is not None]
                for t in tickets:
                    t._settle_outcome()
                # submits that waited on the link's timelines (a compositor on dst_ready, a
                # render on src_done, the link's own) may still hold them in the driver
                for slot in self.slots:
                    retire_submits(slot, dl)
                link.destroy()
            with self.links.lock:
                if self.links.by_key.get(self.key) is self:
                    del self.links.by_key[self.key]
                self.links.alive.pop(id(self), None)


def _wait_gpu(device: Any, semaphore: int, value: int, dl: Deadline, what: str) -> None:
    """Wait (sliced, Ctrl-C honoured) for a timeline value; vkmulti.TimeoutError
    naming `what` after the deadline; a lost device counts as done."""
    try:
        device.wait_timeline(semaphore, value, dl.left())
    except VkmTimeoutError:
        raise VkmTimeoutError(f"{what} still queued on the GPU after {seconds_text(dl.timeout)} s; nothing was freed "
                              f"(call destroy() again once the work can finish)") from None
    except DeviceLostError as exc:
        log.info("device lost while waiting for %s (%s); freeing them", what, exc)


class _Links:
    """The links whose source is one slot (kept in slot.children["links"])."""

    def __init__(self, slot: Any = None) -> None:
        self.slot = slot
        self.by_key: dict[tuple, LinkRef] = {}     # the link new transfers of a key share
        self.alive: dict[int, LinkRef] = {}        # every link not yet destroyed (some left by_key)
        self.lock = threading.Lock()

    def destroy(self, timeout: float | None = None) -> None:
        """Destroy every link (each waits for its jobs); vkmulti.TimeoutError keeps the rest."""
        dl = Deadline(timeout)
        with self.lock:
            refs = list(self.alive.values()) + [r for r in self.by_key.values() if id(r) not in self.alive]
        for ref in refs:
            ref.destroy(dl.left())


def _links_of(src: Any) -> _Links:
    """The slot's link table, made once even when first transfers race."""
    with src.children_lock:
        slot_lifetime(src).check()   # no new link on a destroyed manager's device
        links = src.children.get("links")
        if links is None:
            links = src.children["links"] = _Links(src)
        return links


def _export_type(src: Any, dst: Any) -> int:
    both_dmabuf = EXT_DMA_BUF in src.enabled_extensions and EXT_DMA_BUF in dst.enabled_extensions
    return _DMA_BUF if both_dmabuf else _OPAQUE_FD


def link_queue(slot: Any, method: str | None) -> Any:
    """The queue of `slot` a link of `method` submits its side of a job on: the copy
    queue, or the universal one for CUDA_PEER (its device-local copies into the
    exported rings run several times faster on the universal family)."""
    return slot.universal_copy_queue if method == TransferMethod.CUDA_PEER else slot.copy_queue


def _gates(slot: Any, queue: Any) -> bool:
    """Whether a link's side on `queue` waits for its jobs' wait points on the host: where
    the queue is vkmulti's own copy queue, the links of both directions (and of other pairs)
    submit there, and a copy waiting on the GPU for a step of this device would hold up the
    copies queued behind it, among them the one that step waits for. On the device's
    graphics queue (a device with one queue), the callers order their submits after the
    link's (TransferTicket.wait_submitted), and the GPU wait costs nothing."""
    return int(queue) != int(slot.graphics_queue)


def acquire_link(src: Any, dst: Any, method: str, slot_size: int, slot_count: int) -> LinkRef:
    links = _links_of(src)
    key = (dst.index, id(dst.native), method, slot_size, slot_count)
    with links.lock:
        ref = links.by_key.get(key)
        if ref is None or not ref.link.alive:
            export = _export_type(src, dst) if method == TransferMethod.DMABUF else 0
            spin = SPIN_SECONDS if _on_gpus(src, dst) else 0.0
            sq, dq = link_queue(src, method), link_queue(dst, method)
            link = _native.Link(src.native, sq.lock, dst.native, dq.lock, _RING[method], slot_size, slot_count, export,
                                spin=spin, trace=os.environ.get(TRACE_ENV) or None,
                                host_gates=_gates(src, sq) * _native.GATE_SRC | _gates(dst, dq) * _native.GATE_DST)
            ref = LinkRef(link, key, links, (src, dst))
            links.by_key[key] = ref
        ref.refs += 1
        return ref


_AWAIT_SLICE = 0.05   # s: each executor wait of `await ticket`, so that a cancelled await ends within one


async def _done() -> None:
    return None


class TransferTicket:
    """An in-flight transfer: wait(timeout) blocks without the GIL; done() polls.

    A ticket stays answerable after its transfer (and link) are destroyed:
    the link settles every ticket still alive before it is freed, so wait()
    then returns (or raises the job's error) instead of DestroyedError.
    """

    def __init__(self, link: NativeLink, ticket: int, src_done: TimelinePoint, dst_ready: TimelinePoint,
                 ref: LinkRef | None = None):
        self._link, self.ticket, self.src_done, self.dst_ready = link, ticket, src_done, dst_ready
        self._ref = ref
        self._complete = False
        self._error: BaseException | None = None
        self._gpu_done: set[int] = set()   # ids of the points (src_done, dst_ready) seen reached

    def _answered(self) -> bool:
        """True when the job completed; raises its error when it failed; False when not known."""
        if self._complete:
            return True
        if self._error is not None:
            raise self._error.with_traceback(None)
        return False

    def _call(self, fn: Any, *args: Any) -> Any:
        """A call into the link, recording the job's outcome; DestroyedError only
        when the link went without settling this ticket."""
        try:
            return fn(*args)
        except (VkmTimeoutError, KeyboardInterrupt):
            raise
        except DestroyedError:
            if self._answered():
                return True
            raise DestroyedError(f"transfer {self.ticket}: its link was destroyed before the outcome was "
                                 f"known") from None
        except VkmError as exc:   # the job failed (a stalled link, a lost device): answer that from now on
            self._error = exc
            raise

    def wait(self, timeout: float | None = None) -> None:
        """Block until the destination holds the data; vkmulti.TimeoutError after `timeout` s."""
        if self._complete:
            return
        if self._error is not None:
            raise self._error.with_traceback(None)
        self._call(self._link.wait, self.ticket, self.dst_ready.value, timeout)
        self._complete = True

    def __await__(self) -> Generator[Any, None, None]:
        """`await ticket`: waits of one slice each on the event loop's default executor
        (native, without the GIL; the loop never blocks). Cancelling the awaiting task
        (`asyncio.wait_for(...)` for a timeout, Ctrl-C in asyncio.run) leaves no
        executor thread waiting for the transfer; it does not stop the transfer."""
        if self.done():
            return _done().__await__()
        return self._awaited().__await__()

    async def _awaited(self) -> None:
        loop = asyncio.get_running_loop()
        while not await loop.run_in_executor(None, self._poll, _AWAIT_SLICE):
            pass

    def wait_submitted(self, timeout: float | None = None) -> None:
        """Block until all of this transfer's GPU work is submitted (not finished).

        A submit of your own that waits on `dst_ready` on a queue the transfer
        also uses (a device with a single queue) must come after this: an
        in-order queue cannot run a wait placed before its signal.
        """
        if not self._answered():
            self._call(self._link.wait, self.ticket, self.dst_ready.value, timeout, True)

    def wait_source(self, timeout: float | None = None) -> None:
        """Block until the source side's work is done too (`src_done`: the source
        read, and an exclusive image handed back to its owner). Returns at once
        when the link is gone: its destroy() waited for everything."""
        if not self._gpu_wait(self.src_done, timeout):
            raise VkmTimeoutError(f"transfer {self.ticket}: the source side was not done within {seconds_text(timeout)} s")

    def done(self) -> bool:
        """True once the destination holds the data (never blocks); raises the job's error if it failed."""
        return self._poll(0.0)

    def _poll(self, seconds: float) -> bool:
        """done(), waiting up to `seconds` (one slice) for it."""
        if not self._answered():
            self._complete = bool(self._call(self._link.poll, self.ticket, self.dst_ready.value, seconds))
        return self._complete

    def _settle_outcome(self) -> None:
        """Record the outcome now (the link is drained and about to be freed)."""
        if self._complete or self._error is not None:
            return
        try:
            self._complete = bool(self._link.poll(self.ticket, self.dst_ready.value, 0.0))
        except VkmError as exc:   # recorded: the ticket's waiter gets it
            self._error = exc

    # -- for resources: is the GPU done with this job on one device? ----------

    def _point(self, device_index: int | None) -> TimelinePoint:
        return self.src_done if device_index == self.src_done.device_index else self.dst_ready

    def gpu_done(self, device_index: int | None) -> bool:
        """Whether the GPU work of this job on device `device_index` is finished (never blocks)."""
        point = self._point(device_index)
        if id(point) in self._gpu_done or (self._complete and point is self.dst_ready):
            return True
        ref = self._ref
        if ref is None or ref.life.dead:
            return ref is not None or not self._link.alive
        src = point is self.src_done
        if point.value <= (ref.seen_src if src else ref.seen_dst):
            self._gpu_done.add(id(point))
            return True
        try:
            with ref.life.keep():
                value = (self._link.src if src else self._link.dst).timeline_value(point.semaphore)
            if src:   # unlocked: a racing reader may store a lower value, still one that was read
                ref.seen_src = max(ref.seen_src, value)
            else:
                ref.seen_dst = max(ref.seen_dst, value)
            if value < point.value:
                return False
            self._gpu_done.add(id(point))
            return True
        except DestroyedError:
            return ref.life.dead
        except DeviceLostError as exc:
            log.info("transfer %d: device lost (%s); its GPU work counts as done", self.ticket, exc)
            return True

    def gpu_wait(self, device_index: int | None, timeout: float | None) -> bool:
        """Wait up to `timeout` s for this job's GPU work on device `device_index`; False on timeout."""
        return self._gpu_wait(self._point(device_index), timeout)

    def _gpu_wait(self, point: TimelinePoint, timeout: float | None) -> bool:
        ref = self._ref
        if ref is None:
            if not self._link.alive:
                return True
            dev = self._link.src if point is self.src_done else self._link.dst
            try:
                dev.wait_timeline(point.semaphore, point.value, timeout)
            except VkmTimeoutError:
                return False
            return True
        try:
            with ref.life.keep():   # the link (and its semaphores) stay while this waits
                dev = self._link.src if point is self.src_done else self._link.dst
                try:
                    dev.wait_timeline(point.semaphore, point.value, timeout)
                except VkmTimeoutError:
                    return False
                except DeviceLostError as exc:
                    log.info("transfer %d: device lost (%s); its GPU work counts as done", self.ticket, exc)
                return True
        except DestroyedError:
            return ref.life.dead   # destroyed: it waited for everything; being destroyed: not known yet

    def __repr__(self) -> str:
        state = "done" if self._complete else "failed" if self._error is not None else "pending"
        return f"TransferTicket({self.ticket}, {state})"
