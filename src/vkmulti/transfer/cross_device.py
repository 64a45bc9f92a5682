"""Moving images and buffers between devices: select_transfer_method and CrossDeviceTransfer.

The work is done by native links (one per source, destination, method and ring
shape, shared by every transfer that matches): a worker thread per link
pipelines chunks through a ring of slots and orders the two devices with
timeline semaphores. `src_done` and `dst_ready` are those semaphores with the
value the latest transfer signals, so an engine's own submit can wait for them
on the GPU.
"""
from __future__ import annotations

import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import vulkan as vk

from .._core import _native
from .._core.handles import handle_int, short_text
from ..device.capabilities import EXT_DMA_BUF, RenderCapabilities
from ..errors import DestroyedError, DeviceLostError, UnsupportedError, VkmError
from ..errors import TimeoutError as VkmTimeoutError
from ..memory.buffer import Buffer
from ..device.logical import retire_submits
from ..memory.image import Image, check_layout
from .._core.lifetime import Deadline, Lifetime
from .methods import MethodProblem, TransferMethod, method_problem
from ..memory.resource import MAX_BYTES, slot_lifetime
from .._core.timeline import TimelinePoint, wait_point

log = logging.getLogger(__name__)

__all__ = ["TransferMethod", "select_transfer_method", "pair_methods", "pair_problem", "CrossDeviceTransfer", "TransferTicket", "TimelinePoint",
           "DEFAULT_SLOT_SIZE", "DEFAULT_SLOT_COUNT"]

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
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{label} must be a positive int, got {type(v).__name__} {v!r}"[:160])
        if not 0 < v <= hi:
            raise ValueError(f"{label} must be in [1, {hi}], got {v}"[:160])
    if slot_size * slot_count > MAX_RING_BYTES:
        raise ValueError(f"a ring of {slot_count} x {slot_size} B exceeds {MAX_RING_BYTES} B; "
                         f"lower slot_size or slot_count")
    return slot_size, slot_count


def _on_gpus(src: Any, dst: Any) -> bool:
    """Whether both devices of a pair are known to be GPUs (not CPU devices)."""
    return src.capabilities is not None and dst.capabilities is not None and \
        "cpu" not in (src.capabilities.device_type, dst.capabilities.device_type)


def _ring_shape(method: str, src: Any, dst: Any, slot_size: int, slot_count: int) -> tuple[int, int]:
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
SHADER_READ = vk.VK_IMAGE_LAYOUT_SHADER_READ_ONLY_OPTIMAL
_OPAQUE_FD = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT
_DMA_BUF = 0x200  # VK_EXTERNAL_MEMORY_HANDLE_TYPE_DMA_BUF_BIT_EXT
_RING = {TransferMethod.STAGING_COPY: _native.RING_STAGING, TransferMethod.HOST_SHARED: _native.RING_SHARED_HOST,
         TransferMethod.DMABUF: _native.RING_EXPORTED, TransferMethod.CUDA_PEER: _native.RING_CUDA_PEER}
#: Set to a file name, links made from then on append a timeline of their work
#: to it (a diagnostic: a poller thread spins a core per link; bench/trace_report.py).
TRACE_ENV = _native.TRACE_ENV


#: CUDA_PEER comes first wherever CUDA can serve the pair (on two H200s it moves
#: 256 MiB at ~320 GB/s, HOST_SHARED at ~45); this environment variable set to
#: "0" keeps select_transfer_method from choosing it. Forcing the method on a
#: CrossDeviceTransfer works regardless.
CUDA_PEER_ENV = "VKMULTI_CUDA_PEER"


def cuda_peer_auto() -> bool:
    """Whether select_transfer_method may pick CUDA_PEER (yes unless VKMULTI_CUDA_PEER=0)."""
    return os.environ.get(CUDA_PEER_ENV, "") != "0"


def slot_label(slot: Any) -> str:
    """"GPU i ('name')" for messages."""
    return f"GPU {slot.index} ({short_text(slot.name)})"


def pair_problem(method: str, src: Any, dst: Any) -> MethodProblem | None:
    """Why `method` cannot move data from slot `src` to slot `dst` (with the
    extensions their VkDevices enabled), or None when it can."""
    a, b = src.capabilities, dst.capabilities
    if a is None or b is None:
        return None if method in (TransferMethod.STAGING_COPY, TransferMethod.NONE) else \
            MethodProblem("the devices' capabilities are unknown")
    return method_problem(method, a, b, src.enabled_extensions, dst.enabled_extensions,
                          labels=(slot_label(src), slot_label(dst)))


def pair_methods(src: Any, dst: Any) -> list[str]:
    """The cross-device methods that work from slot `src` to slot `dst`, best first
    (what their VkDevices enabled counts; CUDA_PEER as the driver answers)."""
    return [m for m in TransferMethod.CROSS_DEVICE if pair_problem(m, src, dst) is None]


_reported: set[tuple] = set()
_reported_lock = threading.Lock()


def _report_skipped(key: tuple, problem: MethodProblem) -> None:
    """Log once per pair and method why a better method was passed over because a
    VkDevice lacks an extension its driver offers (an engine's own device)."""
    with _reported_lock:
        if key in _reported:
            return
        _reported.add(key)
    log.warning("vkmulti: %s not used: %s", key[-1], problem.reason)


def select_transfer_method(assignment: Any, capabilities: Any, *,
                           prefer_dmabuf: bool = True, dst_index: int = 0) -> str:
    """The best method both devices of the pair support (DMABUF only when preferred,
    CUDA_PEER unless VKMULTI_CUDA_PEER=0).

    The seed's form: `assignment` has a `device_index` (an SRUAssignment) and
    `capabilities` is the manager's RenderCapabilities (`mgr.capabilities`);
    the destination is `dst_index`, the primary by default. NONE for work
    already on the destination; the floor, STAGING_COPY, when the
    capabilities do not describe both devices. The pair form:
    `select_transfer_method(src_slot, dst_slot)` with two DeviceSlots.

    A method passed over because a VkDevice was created without an extension
    its driver offers (an engine's own device) is logged once, in one line
    that names the extension and vkmulti.device_requirements().
    """
    from ..device.manager import DeviceSlot

    if isinstance(assignment, DeviceSlot) or isinstance(capabilities, DeviceSlot):
        if not (isinstance(assignment, DeviceSlot) and isinstance(capabilities, DeviceSlot)):
            raise TypeError(f"select_transfer_method(src_slot, dst_slot) needs two DeviceSlots, got "
                            f"{type(assignment).__name__} and {type(capabilities).__name__}")
        return _select_for_slots(assignment, capabilities, prefer_dmabuf)
    src_index = getattr(assignment, "device_index", None)
    if isinstance(src_index, bool) or not isinstance(src_index, int) or src_index < 0:
        raise TypeError(f"assignment must have a non-negative int device_index (an SRUAssignment), or pass two "
                        f"DeviceSlots; got {type(assignment).__name__} with device_index {src_index!r}"[:200])
    if isinstance(dst_index, bool) or not isinstance(dst_index, int) or dst_index < 0:
        raise TypeError(f"dst_index must be a non-negative int, got {dst_index!r}"[:160])
    if capabilities is not None and not isinstance(capabilities, RenderCapabilities):
        raise TypeError(f"capabilities must be RenderCapabilities or None, got {type(capabilities).__name__}")
    if src_index == dst_index:
        return TransferMethod.NONE
    if capabilities is None or max(src_index, dst_index) >= len(capabilities.devices):
        return TransferMethod.STAGING_COPY
    a, b = capabilities.devices[src_index], capabilities.devices[dst_index]
    en = capabilities.enabled_extensions
    ea = en[src_index] if src_index < len(en) else None
    eb = en[dst_index] if dst_index < len(en) else None
    labels = (f"GPU {src_index} ({short_text(a.name)})", f"GPU {dst_index} ({short_text(b.name)})")
    return _first_working(lambda m: method_problem(m, a, b, ea, eb, labels=labels), prefer_dmabuf,
                          (src_index, dst_index))


def _select_for_slots(src: Any, dst: Any, prefer_dmabuf: bool) -> str:
    if src is dst or src.index == dst.index and src.device is dst.device:
        return TransferMethod.NONE
    return _first_working(lambda m: pair_problem(m, src, dst), prefer_dmabuf, (src.index, dst.index))


def _first_working(problem_of: Any, prefer_dmabuf: bool, pair: tuple[int, int]) -> str:
    for method in TransferMethod.CROSS_DEVICE:
        if method == TransferMethod.DMABUF and not prefer_dmabuf:
            continue
        if method == TransferMethod.CUDA_PEER and not cuda_peer_auto():
            continue
        problem = problem_of(method)
        if problem is None:
            return method
        if problem.not_enabled:
            _report_skipped((*pair, problem.device, method), problem)
    return TransferMethod.STAGING_COPY


def _image_size(w: Any, h: Any, bpp: Any, *, allow_zero: bool = False) -> None:
    """ValueError unless width, height (< 2**20) and bytes per pixel (1..32) are ints in range."""
    lo = 0 if allow_zero else 1
    for label, v, hi in (("width", w, 1 << 20), ("height", h, 1 << 20), ("bytes_per_pixel", bpp, 32)):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"{label} must be an int in [{lo}, {hi}], got {v!r}"[:160])


#: Endpoints a transfer keeps for repeated submits (_remember_endpoint).
_ENDPOINTS_KEPT = 16
#: (layout, final layout, usage) triples check_layout accepted, so that a
#: submit checks each combination once (check_layout is pure; ints only).
_LAYOUTS_OK: set[tuple] = set()


#: One side of a job, in the shape the native layer reads (converted once).
_Endpoint = _native.Endpoint


class _LinkRef:
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
        links.alive[id(self)] = self   # made under links.lock (_acquire_link)
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
        raise VkmTimeoutError(f"{what} still queued on the GPU after {dl.timeout} s; nothing was freed "
                              f"(call destroy() again once the work can finish)") from None
    except DeviceLostError as exc:
        log.info("device lost while waiting for %s (%s); freeing them", what, exc)


class _Links:
    """The links whose source is one slot (kept in slot.children["links"])."""

    def __init__(self, slot: Any = None) -> None:
        self.slot = slot
        self.by_key: dict[tuple, _LinkRef] = {}     # the link new transfers of a key share
        self.alive: dict[int, _LinkRef] = {}        # every link not yet destroyed (some left by_key)
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


def _acquire_link(src: Any, dst: Any, method: str, slot_size: int, slot_count: int) -> _LinkRef:
    links = _links_of(src)
    key = (dst.index, id(dst.native), method, slot_size, slot_count)
    with links.lock:
        ref = links.by_key.get(key)
        if ref is None or not ref.link.alive:
            export = _export_type(src, dst) if method == TransferMethod.DMABUF else 0
            spin = SPIN_SECONDS if _on_gpus(src, dst) else 0.0
            # CUDA_PEER's device-local copies into its exported rings: the universal
            # family is several times faster at those than the transfer-only family
            cuda = method == TransferMethod.CUDA_PEER
            sq, dq = (src.universal_copy_queue, dst.universal_copy_queue) if cuda else (src.copy_queue, dst.copy_queue)
            link = _native.Link(src.native, sq.lock, dst.native, dq.lock, _RING[method], slot_size, slot_count, export,
                                spin=spin, trace=os.environ.get(TRACE_ENV) or None)
            ref = _LinkRef(link, key, links, (src, dst))
            links.by_key[key] = ref
        ref.refs += 1
        return ref


async def _done() -> None:
    return None


class TransferTicket:
    """An in-flight transfer: wait(timeout) blocks without the GIL; done() polls.

    A ticket stays answerable after its transfer (and link) are destroyed:
    the link settles every ticket still alive before it is freed, so wait()
    then returns (or raises the job's error) instead of DestroyedError.
    """

    def __init__(self, link: Any, ticket: int, src_done: TimelinePoint, dst_ready: TimelinePoint,
                 ref: _LinkRef | None = None):
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

    def __await__(self) -> Any:
        """`await ticket`: wait() on the event loop's default executor (a native wait
        without the GIL; the loop never blocks). Cancelling the awaiting task does
        not stop the transfer. Use `asyncio.wait_for(...)` for a timeout."""
        import asyncio

        if self.done():
            return _done().__await__()
        return asyncio.get_running_loop().run_in_executor(None, self.wait).__await__()

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
            raise VkmTimeoutError(f"transfer {self.ticket}: the source side was not done within {timeout} s")

    def done(self) -> bool:
        """True once the destination holds the data (never blocks); raises the job's error if it failed."""
        if not self._answered():
            self._complete = bool(self._call(self._link.poll, self.ticket, self.dst_ready.value, 0.0))
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


@dataclass
class CrossDeviceTransfer:
    """Moves an image (or a buffer range) from `src` to `dst` with `method`.

    The seed's fields and methods; `submit()` is the asynchronous form. The
    ring shape (`slot_size` x `slot_count`) bounds the memory per device pair;
    left at the defaults it is 8 x 8 MiB between GPUs, 8 x 16 MiB for
    CUDA_PEER and 8 x 1 MiB where a device is a CPU (lavapipe).
    """
    src: Any
    dst: Any
    method: str
    src_done: TimelinePoint | None = None
    dst_ready: TimelinePoint | None = None
    width: int = 0
    height: int = 0
    bytes_per_pixel: int = 8
    extra: dict = field(default_factory=dict)
    slot_size: int = DEFAULT_SLOT_SIZE
    slot_count: int = DEFAULT_SLOT_COUNT

    _teardown_rank = 20   # after the owners that use transfers, before images and buffers

    def __post_init__(self) -> None:
        from ..device.manager import DeviceSlot

        for label, slot in (("src", self.src), ("dst", self.dst)):
            if not isinstance(slot, DeviceSlot):
                raise TypeError(f"{label} must be a DeviceSlot (MultiDeviceManager.slot(i)), "
                                f"got {type(slot).__name__}")
        if not isinstance(self.method, str) or self.method not in TransferMethod.ALL:
            raise ValueError(f"unknown cross-device transfer method {self.method!r}; "
                             f"expected one of {TransferMethod.ALL}"[:200])
        check_ring_shape(self.slot_size, self.slot_count)
        _image_size(self.width, self.height, self.bytes_per_pixel, allow_zero=True)
        if not isinstance(self.extra, dict):
            raise TypeError(f"extra must be a dict, got {type(self.extra).__name__}")
        self._refuse_unsupported()
        self._ref: _LinkRef | None = None
        self._last: TransferTicket | None = None
        self._lock = threading.Lock()
        self._endpoints: dict[tuple, Any] = {}   # _remember_endpoint
        lives = [slot_lifetime(self.src), slot_lifetime(self.dst)]
        self._life = Lifetime(self, "CrossDeviceTransfer", lives)
        adopted: list[Lifetime] = []
        try:
            for life in self._life.parents:
                life.adopt(self)   # freed by the manager's destroy() unless destroyed first
                adopted.append(life)
        except BaseException:
            for life in adopted:
                life.forget(self)
            raise

    @property
    def _destroyed(self) -> bool:
        return not self._life.open

    def __repr__(self) -> str:
        size = f", {self.width}x{self.height}x{self.bytes_per_pixel} B" if self.width and self.height else ""
        state = ", destroyed" if self._destroyed else ""
        return (f"CrossDeviceTransfer(GPU {getattr(self.src, 'index', '?')} -> GPU {getattr(self.dst, 'index', '?')}, "
                f"{self.method}{size}{state})")

    def _refuse_unsupported(self) -> None:
        """UnsupportedError (with `extension` and `device`) when this pair cannot use
        `method`, naming exactly the methods it supports."""
        if self.method == TransferMethod.NONE:
            return
        problem = pair_problem(self.method, self.src, self.dst)
        if problem is None:
            return
        raise UnsupportedError(
            f"transfer method {self.method!r} is not possible from {slot_label(self.src)} to "
            f"{slot_label(self.dst)}: {problem.reason}; this pair supports {pair_methods(self.src, self.dst)}",
            extension=problem.extension, device=problem.device,
            device_index=None if problem.side is None else (self.src, self.dst)[problem.side].index)

    # -- the seed's API ----------------------------------------------------

    def run(self, *, src_image: Any = None, dst_image: Any = None, timeout: float | None = None,
            **options: Any) -> None:
        """Transfer and block until the destination holds the data (NONE: nothing to do)."""
        if self.method == TransferMethod.NONE:
            self._check_alive()
            return
        Deadline(timeout)   # checks the value before anything is queued
        self.submit(src_image=src_image, dst_image=dst_image, **options).wait(timeout)

    def run_staging_copy(self, *, src_image: Any = None, dst_image: Any = None, **options: Any) -> None:
        """The seed's per-method entry point: run() for a STAGING_COPY transfer (ValueError for another method)."""
        self._require(TransferMethod.STAGING_COPY, "run_staging_copy")
        self.run(src_image=src_image, dst_image=dst_image, **options)

    def run_host_shared(self, *, src_image: Any = None, dst_image: Any = None, **options: Any) -> None:
        """The seed's per-method entry point: run() for a HOST_SHARED transfer (ValueError for another method)."""
        self._require(TransferMethod.HOST_SHARED, "run_host_shared")
        self.run(src_image=src_image, dst_image=dst_image, **options)

    def run_dmabuf(self, *, src_image: Any = None, dst_image: Any = None, **options: Any) -> None:
        """The seed's per-method entry point: run() for a DMABUF transfer (ValueError for another method)."""
        self._require(TransferMethod.DMABUF, "run_dmabuf")
        self.run(src_image=src_image, dst_image=dst_image, **options)

    def ensure_staging(self, src_command_pool: Any = None, dst_command_pool: Any = None) -> dict:
        """Make the ring this transfer uses ready now (it is otherwise made on first use).

        vkmulti records on command pools of its own (never an engine's frame
        pool); pools passed here are kept in the returned dict for the seed's
        callers and not recorded into. Method NONE has no ring: its dict says
        slot_size 0 and slot_count 0.
        """
        for label, pool in (("src_command_pool", src_command_pool), ("dst_command_pool", dst_command_pool)):
            if pool is not None:
                handle_int(pool, "VkCommandPool")
        with self._life:
            self._check_alive()
            if self.method == TransferMethod.NONE:
                slot_size, slot_count = 0, 0
            else:
                with self._lock:
                    ref = self._link_ref_locked()
                slot_size, slot_count = ref.link.slot_size, self._ring()[1]
            info = {"size": max(1, self.width * self.height * self.bytes_per_pixel), "method": self.method,
                    "slot_size": slot_size, "slot_count": slot_count,
                    "src_pool": src_command_pool, "dst_pool": dst_command_pool}
            self.extra["staging"] = info
            return info

    def destroy(self, timeout: float | None = None) -> None:
        """Wait for this transfer's jobs, then release its share of the ring (idempotent).

        Operations running on other threads are waited for first. On timeout
        (vkmulti.TimeoutError) or Ctrl-C the ring stays held, so nothing the
        GPU may still touch is freed; call destroy() again (the manager's
        destroy() does) once the work can finish.
        """
        with self._life.ending(timeout) as dl:
            if dl is None:
                return
            with self._lock:
                last, ref = self._last, self._ref
            if last is not None:
                for point in (last.dst_ready, last.src_done):
                    if not last._gpu_wait(point, dl.left()):
                        raise VkmTimeoutError(f"CrossDeviceTransfer: transfer {last.ticket} still queued after "
                                              f"{timeout} s; its ring stays held (call destroy() again)")
            if ref is not None:
                ref.release(dl.left())
            with self._lock:
                self._last = self._ref = None
            self._endpoints.clear()
            self.extra.pop("staging", None)

    def __enter__(self) -> "CrossDeviceTransfer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- asynchronous form -------------------------------------------------

    def submit(self, *, src_image: Any = None, dst_image: Any = None, src_buffer: Any = None,
               dst_buffer: Any = None, src_offset: int = 0, dst_offset: int = 0, size: int | None = None,
               src_layout: int | None = None, dst_layout: int | None = None,
               src_final_layout: int | None = None, dst_final_layout: int | None = None,
               src_wait: Any = None, dst_wait: Any = None) -> TransferTicket:
        """Queue the transfer and return a ticket at once.

        Either images (vkmulti `Image`s, or raw VkImage handles sized by this
        transfer's width/height/bytes_per_pixel) or buffers (`Buffer`s, or raw
        VkBuffer handles with `size`). Layouts default to an Image's tracked
        layout, else SHADER_READ_ONLY_OPTIMAL; final layouts default to the
        starting ones. `src_wait`/`dst_wait`: timeline points (semaphore,
        value) on the source/destination device that must be reached before
        the resource is read/overwritten.
        """
        with self._life:   # checks this transfer and its manager
            if self.src.device is None or self.dst.device is None:
                self._check_alive()   # raises, naming the side
            held: list[Any] = []   # the Images and Buffers given, each inside its lifetime
            try:
                for obj in (src_image, dst_image, src_buffer, dst_buffer):
                    if isinstance(obj, (Image, Buffer)):
                        # its destroy() waits until the job is tracked (the manager counts this
                        # call already, through the transfer's lifetime)
                        obj._life._enter_own()
                        held.append(obj)
                return self._submit(src_image, dst_image, src_buffer, dst_buffer, src_offset, dst_offset, size,
                                    src_layout, dst_layout, src_final_layout, dst_final_layout, src_wait, dst_wait,
                                    held)
            finally:
                for obj in held:
                    obj._life._exit_own()

    def _submit(self, src_image: Any, dst_image: Any, src_buffer: Any, dst_buffer: Any, src_offset: Any,
                dst_offset: Any, size: Any, src_layout: Any, dst_layout: Any, src_final_layout: Any,
                dst_final_layout: Any, src_wait: Any, dst_wait: Any, held: list[Any]) -> TransferTicket:
        if self.method == TransferMethod.NONE:
            raise ValueError("method NONE moves nothing: source and destination are the same device")
        images = src_image is not None or dst_image is not None
        buffers = src_buffer is not None or dst_buffer is not None
        if images and buffers:
            raise ValueError("pass images or buffers, not both")
        if not images and not buffers:
            raise ValueError("both src_image (on the source device) and dst_image (on the destination) are needed")
        if images:
            if src_image is None or dst_image is None:
                raise ValueError("both src_image (on the source device) and dst_image (on the destination) "
                                 "are needed")
            slot_size = self._ring()[0]
            es, nbytes = self._image_endpoint(src_image, self.src, "src_image", src_layout, src_final_layout,
                                              src_wait, slot_size)
            ed, nbytes_d = self._image_endpoint(dst_image, self.dst, "dst_image", dst_layout, dst_final_layout,
                                                dst_wait, slot_size)
            if es.image == ed.image:
                raise ValueError("src_image and dst_image are the same image")
            if (es.width, es.height) != (ed.width, ed.height) or nbytes != nbytes_d:
                raise ValueError(f"size mismatch: source {es.width}x{es.height}x{es.bytes_per_pixel} B, "
                                 f"destination {ed.width}x{ed.height}x{ed.bytes_per_pixel} B")
        else:
            if src_buffer is None or dst_buffer is None:
                raise ValueError("both src_buffer and dst_buffer are needed")
            nbytes = self._buffer_size(src_buffer, dst_buffer, src_offset, dst_offset, size)
            es = self._buffer_endpoint(src_buffer, self.src, "src_buffer", src_offset, src_wait)
            ed = self._buffer_endpoint(dst_buffer, self.dst, "dst_buffer", dst_offset, dst_wait)
            if es.buffer == ed.buffer and src_offset < dst_offset + nbytes and dst_offset < src_offset + nbytes:
                raise ValueError(f"source and destination ranges overlap in the same buffer ([{src_offset}, "
                                 f"{src_offset + nbytes}) and [{dst_offset}, {dst_offset + nbytes}))")
        with self._lock:
            ref = self._link_ref_locked()
            ticket, sdone, dready = ref.link.submit(es, ed, nbytes)
            self.src_done = TimelinePoint._trusted(ref.src_sem, sdone, self.src.index)
            self.dst_ready = TimelinePoint._trusted(ref.dst_sem, dready, self.dst.index)
            t = TransferTicket(ref.link, ticket, self.src_done, self.dst_ready, ref)
            ref.submitted(t)
            self._last = t
        # the job is queued: nothing below may raise
        for obj in held:
            obj._track(t)   # its destroy() waits for this transfer
        if images:
            if isinstance(src_image, Image):
                src_image.layout = es.layout_after
            if isinstance(dst_image, Image):
                dst_image.layout = ed.layout_after
        return t

    # -- helpers -------------------------------------------------------------

    def _check_alive(self) -> None:
        self._life.check()
        for label, slot in (("src", self.src), ("dst", self.dst)):
            if getattr(slot, "device", None) is None:
                raise DestroyedError(f"the {label} device of this transfer is destroyed")

    def _require(self, method: str, name: str) -> None:
        if self.method != method:
            raise ValueError(f"{name} called for method {self.method!r}")

    def _link_ref_locked(self) -> _LinkRef:
        if self._ref is not None and self._ref.link.alive:
            return self._ref
        self._refuse_unsupported()
        if self.src.native is None or self.dst.native is None:
            raise ValueError("both slots need live devices with native tables (an active MultiDeviceManager)")
        self._ref = _acquire_link(self.src, self.dst, self.method, *self._ring())
        return self._ref

    def _ring(self) -> tuple[int, int]:
        """(slot size, slot count) of the ring this transfer's link uses."""
        return _ring_shape(self.method, self.src, self.dst, self.slot_size, self.slot_count)

    @staticmethod
    def _wait_point(wait: Any, slot: Any, label: str) -> tuple[int | None, int]:
        point = wait_point(wait, slot, label)
        return point if point is not None else (None, 0)

    def _image_endpoint(self, image: Any, slot: Any, label: str, layout: int | None, final: int | None,
                        wait: Any, slot_size: int | None = None) -> tuple[_Endpoint, int]:
        sem, value = (None, 0) if wait is None else self._wait_point(wait, slot, label.replace("image", "wait"))
        key = None
        if isinstance(image, Image):
            if image.handle is None:
                raise DestroyedError(f"{label} was destroyed")
            if image.slot is not slot:
                raise ValueError(f"{label} belongs to GPU {image.slot.index} ({image.slot.name!r}), "
                                 f"not GPU {slot.index} ({slot.name!r})")
            before = image.layout if layout is None else layout
            if before != image.layout and not (label == "dst_image" and before == vk.VK_IMAGE_LAYOUT_UNDEFINED):
                raise ValueError(f"{label} is in layout {image.layout} as vkmulti tracks it, not {before!r}; "
                                 f"after a transition of your own set image.layout, or pass UNDEFINED as "
                                 f"dst_layout to discard the destination's contents"[:300])
            after = before if final is None else final
            if wait is None and slot_size is not None and type(before) is int and type(after) is int:
                key = (image, label, before, after, slot_size)
                hit = self._endpoints.get(key)
                if hit is not None:
                    return hit
            w, h, bpp, handle = image.width, image.height, image.bytes_per_pixel, image.handle_int
            owner_family = image.owner_family
            kernel, kernel_view = image.kernel_view_format, image.kernel_view_int
        elif isinstance(image, Buffer):
            raise TypeError(f"{label} is a Buffer; pass it as {label.replace('image', 'buffer')}")
        else:
            handle = handle_int(image, "VkImage")
            w, h, bpp = self.width, self.height, self.bytes_per_pixel
            _image_size(w, h, bpp, allow_zero=True)
            if w <= 0 or h <= 0 or bpp <= 0:
                raise ValueError(f"raw image handles need this transfer's width, height and bytes_per_pixel "
                                 f"(got {w}x{h}, {bpp} B per pixel)")
            before = SHADER_READ if layout is None else layout
            owner_family = slot.graphics_queue.family
            kernel, kernel_view = 0, None   # its usage and flags are unknown: copy commands only
        after = before if final is None else final
        usage = image.usage if isinstance(image, Image) else None
        if type(before) is not int or type(after) is not int or (before, after, usage) not in _LAYOUTS_OK:
            check_layout(before, usage, f"{label} layout", undefined_ok=True)
            check_layout(after, usage, f"{label} final layout")
            if len(_LAYOUTS_OK) < 256:
                _LAYOUTS_OK.add((before, after, usage))
        row = w * bpp
        if slot_size is None:
            slot_size = self._ring()[0]
        if row > slot_size:
            raise ValueError(f"{label} rows are {row} B, larger than a ring slot ({slot_size} B); "
                             f"raise slot_size")
        owner = None
        if owner_family is not None and owner_family != slot.copy_queue.family:
            owner = slot.graphics_queue.lock if slot.graphics_queue.family == owner_family else None
            if owner is None:
                raise ValueError(f"{label} is owned by queue family {owner_family}, which has no queue on "
                                 f"GPU {slot.index}")
        made = (_Endpoint(image=handle, width=w, height=h, bytes_per_pixel=bpp, layout_before=before,
                          layout_after=after, owner=owner, wait_semaphore=sem, wait_value=value,
                          kernel=kernel, kernel_view=kernel_view), w * h * bpp)
        if key is not None:
            self._remember_endpoint(key, made)
        return made

    def _buffer_endpoint(self, buf: Any, slot: Any, label: str, offset: int, wait: Any) -> _Endpoint:
        sem, value = (None, 0) if wait is None else self._wait_point(wait, slot, label.replace("buffer", "wait"))
        key = None
        if isinstance(buf, Buffer):
            if buf.slot is not slot:
                raise ValueError(f"{label} belongs to GPU {buf.slot.index} ({buf.slot.name!r}), "
                                 f"not GPU {slot.index} ({slot.name!r})")
            handle = buf.handle_int   # DestroyedError once destroyed
            if wait is None:
                key = (buf, label, offset)
                hit = self._endpoints.get(key)
                if hit is not None:
                    return hit
            kernel = int(bool(buf.usage & vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT))
        elif isinstance(buf, Image):
            raise TypeError(f"{label} is an Image; pass it as {label.replace('buffer', 'image')}")
        else:
            handle = handle_int(buf, "VkBuffer")
            kernel = 0   # its usage is unknown: copy commands only
        made = _Endpoint(buffer=handle, offset=offset, wait_semaphore=sem, wait_value=value, kernel=kernel)
        if key is not None:
            self._remember_endpoint(key, made)
        return made

    def _remember_endpoint(self, key: tuple, endpoint: Any) -> None:
        """Keep an endpoint made and checked for a vkmulti Image or Buffer (`key`:
        the resource itself, its side and every argument it was made from), so
        that a transfer repeated with the same arguments skips the work. The
        resource's destroyed state and slot are checked on every use; the rest
        of an endpoint depends only on the key. At most _ENDPOINTS_KEPT."""
        eps = self._endpoints
        if len(eps) >= _ENDPOINTS_KEPT:
            eps.clear()
        eps[key] = endpoint

    @staticmethod
    def _buffer_size(src: Any, dst: Any, src_offset: int, dst_offset: int, size: int | None) -> int:
        if not (type(src_offset) is int and type(dst_offset) is int and 0 <= src_offset <= MAX_BYTES and
                0 <= dst_offset <= MAX_BYTES):   # else the checks below say which and why
            for label, v in (("src_offset", src_offset), ("dst_offset", dst_offset)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"{label} must be a non-negative int, got {v!r}"[:160])
                if v > MAX_BYTES:
                    raise ValueError(f"{label} must be at most 2**62, got {v}")
        src_vk, dst_vk = isinstance(src, Buffer), isinstance(dst, Buffer)
        if size is None:
            if not src_vk:
                raise ValueError("size is required for raw VkBuffer handles")
            size = src.size - src_offset
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_BYTES:
            raise ValueError(f"size must be a positive int (at most 2**62), got {size!r}"[:160])
        if src_vk and src_offset + size > src.size:
            raise ValueError(f"src_buffer is too small: [{src_offset}, {src_offset + size}) exceeds its "
                             f"{src.size} bytes")
        if dst_vk and dst_offset + size > dst.size:
            raise ValueError(f"dst_buffer is too small: [{dst_offset}, {dst_offset + size}) exceeds its "
                             f"{dst.size} bytes")
        return size
