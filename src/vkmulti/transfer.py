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
from dataclasses import dataclass, field
from typing import Any

import vulkan as vk

from . import _native
from ._handles import handle_int
from .capabilities import EXT_DMA_BUF, RenderCapabilities
from .errors import DestroyedError, UnsupportedError
from .images import Buffer, Image
from .methods import TransferMethod, method_support

log = logging.getLogger(__name__)

__all__ = ["TransferMethod", "select_transfer_method", "CrossDeviceTransfer", "TransferTicket", "TimelinePoint",
           "DEFAULT_SLOT_SIZE", "DEFAULT_SLOT_COUNT"]

#: Ring shape per device pair and method: 8 slots of 8 MiB (64 MiB). Jobs
#: under 128 MiB are cut into about sixteen chunks of at least 2 MiB instead.
DEFAULT_SLOT_SIZE = 8 << 20
DEFAULT_SLOT_COUNT = 8
#: CUDA_PEER's default ring: 8 slots of 16 MiB (128 MiB a side). Each chunk
#: costs its worker ~25 us of host work, so chunks are large: a 4K frame goes
#: in eight, 256 MiB in sixteen (bench/RESULTS.md has the shapes measured).
CUDA_PEER_SLOT_SIZE = 16 << 20
CUDA_PEER_SLOT_COUNT = 8
#: The default ring where a device of the pair is a CPU (lavapipe): 8 slots of
#: 1 MiB. The copies there are CPU work, and chunks that stay in the caches run
#: 1.2-1.7x faster than 8 MiB ones (bench/RESULTS.md, 2026-11-30 session 4).
CPU_SLOT_SIZE = 1 << 20
CPU_SLOT_COUNT = 8


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


@dataclass(frozen=True)
class TimelinePoint:
    """A value of a timeline semaphore on one device: "done when it reaches `value`"."""
    semaphore: int
    value: int
    device_index: int

    @property
    def handle(self) -> Any:
        """The semaphore as a `vulkan` package handle (for VkSubmitInfo)."""
        return vk.ffi.cast("VkSemaphore", self.semaphore)


#: CUDA_PEER comes first wherever CUDA can serve the pair (on two H200s it moves
#: 256 MiB at ~320 GB/s, HOST_SHARED at ~45); this environment variable set to
#: "0" keeps select_transfer_method from choosing it. Forcing the method on a
#: CrossDeviceTransfer works regardless.
CUDA_PEER_ENV = "VKMULTI_CUDA_PEER"


def cuda_peer_auto() -> bool:
    """Whether select_transfer_method may pick CUDA_PEER (yes unless VKMULTI_CUDA_PEER=0)."""
    return os.environ.get(CUDA_PEER_ENV, "") != "0"


def wait_point(value: Any, slot: Any, label: str) -> tuple[int, int] | None:
    """(semaphore, value) from a TimelinePoint of `slot` or a (semaphore, value)
    pair; None for None. `label` names the argument in errors."""
    if value is None:
        return None
    if isinstance(value, TimelinePoint):
        if value.device_index != slot.index:
            raise ValueError(f"{label} is a semaphore of GPU {value.device_index}, not of GPU {slot.index}")
        return value.semaphore, value.value
    try:
        sem, v = value
    except (TypeError, ValueError):
        raise TypeError(f"{label} must be a TimelinePoint or a (semaphore, value) pair, got {value!r}") from None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{label} value must be a non-negative int, got {v!r}")
    return handle_int(sem, "VkSemaphore"), v


def select_transfer_method(assignment: Any, capabilities: RenderCapabilities | None, *,
                           prefer_dmabuf: bool = True, dst_index: int = 0) -> str:
    """The best method both devices of the pair support (DMABUF only when preferred,
    CUDA_PEER unless VKMULTI_CUDA_PEER=0).

    NONE for work already on the destination (the primary by default); the
    floor, STAGING_COPY, when the capabilities do not describe both devices.
    """
    src_index = getattr(assignment, "device_index", None)
    if isinstance(src_index, bool) or not isinstance(src_index, int) or src_index < 0:
        raise TypeError(f"assignment must have a non-negative int device_index, got {assignment!r}")
    if src_index == dst_index:
        return TransferMethod.NONE
    if capabilities is None or max(src_index, dst_index) >= len(capabilities.devices):
        return TransferMethod.STAGING_COPY
    a, b = capabilities.devices[src_index], capabilities.devices[dst_index]
    en = capabilities.enabled_extensions
    ea = en[src_index] if src_index < len(en) else None
    eb = en[dst_index] if dst_index < len(en) else None
    for method in TransferMethod.CROSS_DEVICE:
        if method == TransferMethod.DMABUF and not prefer_dmabuf:
            continue
        if method == TransferMethod.CUDA_PEER and not cuda_peer_auto():
            continue
        if method_support(method, a, b, ea, eb) is None:
            return method
    return TransferMethod.STAGING_COPY


class _Endpoint:
    """One side of a job, in the shape the native layer reads."""
    __slots__ = ("buffer", "offset", "image", "width", "height", "bytes_per_pixel", "mip_level", "array_layer",
                 "layout_before", "layout_after", "owner", "wait_semaphore", "wait_value", "kernel",
                 "kernel_view")

    def __init__(self, buffer: Any = None, offset: int = 0, image: Any = None, width: int = 0, height: int = 0,
                 bytes_per_pixel: int = 0, layout_before: int = 0, layout_after: int = 0, owner: Any = None,
                 wait_semaphore: Any = None, wait_value: int = 0, kernel: int = 0, kernel_view: Any = None):
        self.buffer, self.offset, self.image, self.width, self.height = buffer, offset, image, width, height
        self.bytes_per_pixel, self.mip_level, self.array_layer = bytes_per_pixel, 0, 0
        self.layout_before, self.layout_after, self.owner = layout_before, layout_after, owner
        self.wait_semaphore, self.wait_value, self.kernel, self.kernel_view = wait_semaphore, wait_value, kernel, \
            kernel_view


class _LinkRef:
    """A shared native link with a reference count (destroyed at zero, or with its slot)."""

    def __init__(self, link: Any, key: tuple, links: "_Links"):
        self.link, self.key, self.links, self.refs = link, key, links, 0

    def release(self) -> None:
        with self.links.lock:
            self.refs -= 1
            if self.refs > 0:
                return
            if self.links.by_key.get(self.key) is self:
                del self.links.by_key[self.key]
        self.link.destroy()

    def destroy(self) -> None:
        self.link.destroy()


class _Links:
    """The links whose source is one slot (kept in slot.children["links"])."""

    def __init__(self) -> None:
        self.by_key: dict[tuple, _LinkRef] = {}
        self.lock = threading.Lock()

    def destroy(self) -> None:
        for ref in list(self.by_key.values()):
            ref.destroy()
        self.by_key.clear()


def _export_type(src: Any, dst: Any) -> int:
    both_dmabuf = EXT_DMA_BUF in src.enabled_extensions and EXT_DMA_BUF in dst.enabled_extensions
    return _DMA_BUF if both_dmabuf else _OPAQUE_FD


def _acquire_link(src: Any, dst: Any, method: str, slot_size: int, slot_count: int) -> _LinkRef:
    links = src.children.get("links")
    if links is None:
        links = src.children["links"] = _Links()
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
            ref = _LinkRef(link, key, links)
            links.by_key[key] = ref
        ref.refs += 1
        return ref


class TransferTicket:
    """An in-flight transfer: wait(timeout) blocks without the GIL; done() polls."""

    def __init__(self, link: Any, ticket: int, src_done: TimelinePoint, dst_ready: TimelinePoint):
        self._link, self.ticket, self.src_done, self.dst_ready = link, ticket, src_done, dst_ready
        self._complete = False

    def wait(self, timeout: float | None = None) -> None:
        """Block until the destination holds the data; vkmulti.TimeoutError after `timeout` s."""
        if not self._complete:
            self._link.wait(self.ticket, self.dst_ready.value, timeout)
            self._complete = True

    def wait_submitted(self, timeout: float | None = None) -> None:
        """Block until all of this transfer's GPU work is submitted (not finished).

        A submit of your own that waits on `dst_ready` on a queue the transfer
        also uses (a device with a single queue) must come after this: an
        in-order queue cannot run a wait placed before its signal.
        """
        if not self._complete:
            self._link.wait(self.ticket, self.dst_ready.value, timeout, True)

    def wait_source(self, timeout: float | None = None) -> None:
        """Block until the source side's work is done too (`src_done`: the source
        read, and an exclusive image handed back to its owner). Returns at once
        when the link is gone: its destroy() waited for everything."""
        if self._link.alive:
            self._link.src.wait_timeline(self.src_done.semaphore, self.src_done.value, timeout)

    def done(self) -> bool:
        if not self._complete:
            self._complete = self._link.poll(self.ticket, self.dst_ready.value, 0.0)
        return self._complete

    def __repr__(self) -> str:
        return f"TransferTicket({self.ticket}, done={self.done()})"


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

    def __post_init__(self) -> None:
        if self.method not in TransferMethod.ALL:
            raise ValueError(f"unknown cross-device transfer method {self.method!r}; "
                             f"expected one of {TransferMethod.ALL}")
        for label, v in (("slot_size", self.slot_size), ("slot_count", self.slot_count)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{label} must be a positive int, got {v!r}")
        self._ref: _LinkRef | None = None
        self._last: TransferTicket | None = None
        self._destroyed = False
        self._lock = threading.Lock()

    # -- the seed's API ----------------------------------------------------

    def run(self, *, src_image: Any = None, dst_image: Any = None, timeout: float | None = None,
            **options: Any) -> None:
        """Transfer and block until the destination holds the data (NONE: nothing to do)."""
        if self.method == TransferMethod.NONE:
            self._check_alive()
            return
        self.submit(src_image=src_image, dst_image=dst_image, **options).wait(timeout)

    def run_staging_copy(self, *, src_image: Any = None, dst_image: Any = None, **options: Any) -> None:
        self._require(TransferMethod.STAGING_COPY, "run_staging_copy")
        self.run(src_image=src_image, dst_image=dst_image, **options)

    def run_host_shared(self, *, src_image: Any = None, dst_image: Any = None, **options: Any) -> None:
        self._require(TransferMethod.HOST_SHARED, "run_host_shared")
        self.run(src_image=src_image, dst_image=dst_image, **options)

    def run_dmabuf(self, *, src_image: Any = None, dst_image: Any = None, **options: Any) -> None:
        self._require(TransferMethod.DMABUF, "run_dmabuf")
        self.run(src_image=src_image, dst_image=dst_image, **options)

    def ensure_staging(self, src_command_pool: Any = None, dst_command_pool: Any = None) -> dict:
        """Make the ring this transfer uses ready now (it is otherwise made on first use).

        vkmulti records on command pools of its own (never an engine's frame
        pool); pools passed here are kept in the returned dict for the seed's
        callers and not recorded into.
        """
        for label, pool in (("src_command_pool", src_command_pool), ("dst_command_pool", dst_command_pool)):
            if pool is not None:
                handle_int(pool, "VkCommandPool")
        ref = self._link_ref()
        info = {"size": max(1, self.width * self.height * self.bytes_per_pixel), "method": self.method,
                "slot_size": ref.link.slot_size, "slot_count": self._ring()[1],
                "src_pool": src_command_pool, "dst_pool": dst_command_pool}
        self.extra["staging"] = info
        return info

    def destroy(self, timeout: float | None = None) -> None:
        """Wait for this transfer's jobs, then release its share of the ring (idempotent).

        On timeout (vkmulti.TimeoutError) the ring stays held, so nothing the
        GPU may still touch is freed; the manager's destroy() frees it later.
        """
        with self._lock:
            if self._destroyed:
                return
            self._destroyed = True
            last, ref = self._last, self._ref
            self._last = self._ref = None
        if last is not None and ref is not None and ref.link.alive:
            last.wait(timeout)
        if ref is not None and ref.link.alive:
            ref.release()
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
        self._check_alive()
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
            es, nbytes = self._image_endpoint(src_image, self.src, "src_image", src_layout, src_final_layout,
                                              src_wait)
            ed, nbytes_d = self._image_endpoint(dst_image, self.dst, "dst_image", dst_layout, dst_final_layout,
                                                dst_wait)
            if (es.width, es.height) != (ed.width, ed.height) or nbytes != nbytes_d:
                raise ValueError(f"size mismatch: source {es.width}x{es.height}x{es.bytes_per_pixel} B, "
                                 f"destination {ed.width}x{ed.height}x{ed.bytes_per_pixel} B")
        else:
            if src_buffer is None or dst_buffer is None:
                raise ValueError("both src_buffer and dst_buffer are needed")
            nbytes = self._buffer_size(src_buffer, dst_buffer, src_offset, dst_offset, size)
            es = self._buffer_endpoint(src_buffer, self.src, "src_buffer", src_offset, src_wait)
            ed = self._buffer_endpoint(dst_buffer, self.dst, "dst_buffer", dst_offset, dst_wait)
        with self._lock:
            if self._destroyed:
                raise DestroyedError("CrossDeviceTransfer used after destroy()")
            ref = self._link_ref_locked()
            ticket, sdone, dready = ref.link.submit(es, ed, nbytes)
            self.src_done = TimelinePoint(ref.link.src_timeline, sdone, self.src.index)
            self.dst_ready = TimelinePoint(ref.link.dst_timeline, dready, self.dst.index)
            t = TransferTicket(ref.link, ticket, self.src_done, self.dst_ready)
            self._last = t
        # the job is queued: nothing below may raise
        for obj in (src_image, dst_image, src_buffer, dst_buffer):
            if isinstance(obj, (Image, Buffer)):
                obj._track(t)   # its destroy() waits for this transfer
        for obj, ep in ((src_image, es), (dst_image, ed)):
            if isinstance(obj, Image):
                obj.layout = ep.layout_after
        return t

    # -- helpers -------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._destroyed:
            raise DestroyedError("CrossDeviceTransfer used after destroy()")
        for label, slot in (("src", self.src), ("dst", self.dst)):
            if getattr(slot, "device", None) is None:
                raise DestroyedError(f"the {label} device of this transfer is destroyed")

    def _require(self, method: str, name: str) -> None:
        if self.method != method:
            raise ValueError(f"{name} called for method {self.method!r}")

    def _link_ref(self) -> _LinkRef:
        self._check_alive()
        with self._lock:
            return self._link_ref_locked()

    def _link_ref_locked(self) -> _LinkRef:
        if self._ref is not None and self._ref.link.alive:
            return self._ref
        why = self._unsupported_reason()
        if why is not None:
            raise UnsupportedError(f"transfer method {self.method!r} is not possible from {self.src.name!r} "
                                   f"(GPU {self.src.index}) to {self.dst.name!r} (GPU {self.dst.index}): {why}; "
                                   f"use {TransferMethod.HOST_SHARED!r} or {TransferMethod.STAGING_COPY!r}")
        if self.src.native is None or self.dst.native is None:
            raise ValueError("both slots need live devices with native tables (an active MultiDeviceManager)")
        self._ref = _acquire_link(self.src, self.dst, self.method, *self._ring())
        return self._ref

    def _ring(self) -> tuple[int, int]:
        """(slot size, slot count) of the ring this transfer's link uses."""
        return _ring_shape(self.method, self.src, self.dst, self.slot_size, self.slot_count)

    def _unsupported_reason(self) -> str | None:
        a, b = self.src.capabilities, self.dst.capabilities
        if a is None or b is None:
            return None if self.method == TransferMethod.STAGING_COPY else "device capabilities unknown"
        return method_support(self.method, a, b, self.src.enabled_extensions, self.dst.enabled_extensions)

    @staticmethod
    def _wait_point(wait: Any, slot: Any, label: str) -> tuple[int | None, int]:
        point = wait_point(wait, slot, label)
        return point if point is not None else (None, 0)

    def _image_endpoint(self, image: Any, slot: Any, label: str, layout: int | None, final: int | None,
                        wait: Any) -> tuple[_Endpoint, int]:
        sem, value = self._wait_point(wait, slot, label.replace("image", "wait"))
        if isinstance(image, Image):
            if image.handle is None:
                raise DestroyedError(f"{label} was destroyed")
            if image.slot is not slot:
                raise ValueError(f"{label} belongs to GPU {image.slot.index} ({image.slot.name!r}), "
                                 f"not GPU {slot.index} ({slot.name!r})")
            w, h, bpp, handle = image.width, image.height, image.bytes_per_pixel, image.handle_int
            before = image.layout if layout is None else layout
            owner_family = image.owner_family
            kernel, kernel_view = image.kernel_view_format, image.kernel_view_int
        elif isinstance(image, Buffer):
            raise TypeError(f"{label} is a Buffer; pass it as {label.replace('image', 'buffer')}")
        else:
            handle = handle_int(image, "VkImage")
            w, h, bpp = self.width, self.height, self.bytes_per_pixel
            if w <= 0 or h <= 0 or bpp <= 0:
                raise ValueError(f"raw image handles need this transfer's width, height and bytes_per_pixel "
                                 f"(got {w}x{h}, {bpp} B per pixel)")
            before = SHADER_READ if layout is None else layout
            owner_family = slot.graphics_queue.family
            kernel, kernel_view = 0, None   # its usage and flags are unknown: copy commands only
        after = before if final is None else final
        for name, lay in (("layout", before), ("final layout", after)):
            if isinstance(lay, bool) or not isinstance(lay, int) or lay < 0 or lay == vk.VK_IMAGE_LAYOUT_UNDEFINED \
                    and name == "final layout":
                raise ValueError(f"{label} {name} {lay!r} is not a valid target layout")
        row, slot_size = w * bpp, self._ring()[0]
        if row > slot_size:
            raise ValueError(f"{label} rows are {row} B, larger than a ring slot ({slot_size} B); "
                             f"raise slot_size")
        owner = None
        if owner_family is not None and owner_family != slot.copy_queue.family:
            owner = slot.graphics_queue.lock if slot.graphics_queue.family == owner_family else None
            if owner is None:
                raise ValueError(f"{label} is owned by queue family {owner_family}, which has no queue on "
                                 f"GPU {slot.index}")
        return _Endpoint(image=handle, width=w, height=h, bytes_per_pixel=bpp, layout_before=before,
                         layout_after=after, owner=owner, wait_semaphore=sem, wait_value=value,
                         kernel=kernel, kernel_view=kernel_view), w * h * bpp

    def _buffer_endpoint(self, buf: Any, slot: Any, label: str, offset: int, wait: Any) -> _Endpoint:
        sem, value = self._wait_point(wait, slot, label.replace("buffer", "wait"))
        if isinstance(buf, Buffer):
            if buf.slot is not slot:
                raise ValueError(f"{label} belongs to GPU {buf.slot.index} ({buf.slot.name!r}), "
                                 f"not GPU {slot.index} ({slot.name!r})")
            handle = buf.handle_int
            kernel = int(bool(buf.usage & vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT))
        elif isinstance(buf, Image):
            raise TypeError(f"{label} is an Image; pass it as {label.replace('buffer', 'image')}")
        else:
            handle = handle_int(buf, "VkBuffer")
            kernel = 0   # its usage is unknown: copy commands only
        return _Endpoint(buffer=handle, offset=offset, wait_semaphore=sem, wait_value=value, kernel=kernel)

    @staticmethod
    def _buffer_size(src: Any, dst: Any, src_offset: int, dst_offset: int, size: int | None) -> int:
        for label, v in (("src_offset", src_offset), ("dst_offset", dst_offset)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{label} must be a non-negative int, got {v!r}")
        if size is None:
            if not isinstance(src, Buffer):
                raise ValueError("size is required for raw VkBuffer handles")
            size = src.size - src_offset
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive int, got {size!r}")
        for label, b, off in (("src_buffer", src, src_offset), ("dst_buffer", dst, dst_offset)):
            if isinstance(b, Buffer) and off + size > b.size:
                raise ValueError(f"{label} is too small: [{off}, {off + size}) exceeds its {b.size} bytes")
        return size
