"""CrossDeviceTransfer: moves an image or a buffer range from one device to another.

The work is done by the native link of the transfer's pair, method and ring
shape (transfer/link.py). `src_done` and `dst_ready` are the link's timeline
semaphores with the value the latest transfer signals, so an engine's own
submit can wait for them on the GPU.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import vulkan as vk

from .._core import _native
from .._core.checks import is_int, seconds_text, short_repr
from .._core.handles import handle_int
from .._core.lifetime import Deadline, Lifetime
from .._core.timeline import TimelinePoint, wait_point
from ..device.manager import DeviceSlot
from ..device.slots import slot_lifetime
from ..errors import DestroyedError, UnsupportedError
from ..errors import TimeoutError as VkmTimeoutError
from ..memory.buffer import Buffer
from ..memory.image import Image, check_layout
from ..memory.resource import MAX_BYTES, require_transfer_usage
from .link import (DEFAULT_SLOT_COUNT, DEFAULT_SLOT_SIZE, LinkRef, TransferTicket, acquire_link, check_ring_shape,
                   ring_shape)
from .methods import TransferMethod, pair_methods, pair_problem, slot_label

if TYPE_CHECKING:
    from .._core.timeline import Wait
    from .._core.vktypes import VkBuffer, VkCommandPool, VkImage

__all__ = ["CrossDeviceTransfer"]

SHADER_READ = vk.VK_IMAGE_LAYOUT_SHADER_READ_ONLY_OPTIMAL


def _image_size(w: Any, h: Any, bpp: Any, *, allow_zero: bool = False) -> None:
    """ValueError unless width, height (< 2**20) and bytes per pixel (1..32) are ints in range."""
    lo = 0 if allow_zero else 1
    for label, v, hi in (("width", w, 1 << 20), ("height", h, 1 << 20), ("bytes_per_pixel", bpp, 32)):
        if not is_int(v) or not lo <= v <= hi:
            raise ValueError(f"{label} must be an int in [{lo}, {hi}], got {short_repr(v)}")


#: Endpoints a transfer keeps for repeated submits (_remember_endpoint).
_ENDPOINTS_KEPT = 16
#: (layout, final layout, usage) triples check_layout accepted, so that a
#: submit checks each combination once (check_layout is pure; ints only).
_LAYOUTS_OK: set[tuple] = set()


#: One side of a job, in the shape the native layer reads (converted once).
_Endpoint = _native.Endpoint


@dataclass
class CrossDeviceTransfer:
    """Moves an image (or a buffer range) from `src` to `dst` with `method`.

    The seed's fields and methods; `submit()` is the asynchronous form. The
    ring shape (`slot_size` x `slot_count`) bounds the memory per device pair;
    left at the defaults it is 8 x 8 MiB between GPUs, 8 x 16 MiB for
    CUDA_PEER and 8 x 1 MiB where a device is a CPU (lavapipe).
    """
    src: DeviceSlot
    dst: DeviceSlot
    method: str
    src_done: TimelinePoint | None = None
    dst_ready: TimelinePoint | None = None
    width: int = 0
    height: int = 0
    bytes_per_pixel: int = 8
    extra: dict[str, Any] = field(default_factory=dict)
    slot_size: int = DEFAULT_SLOT_SIZE
    slot_count: int = DEFAULT_SLOT_COUNT

    _teardown_rank = 20   # after the owners that use transfers, before images and buffers

    def __post_init__(self) -> None:
        for label, slot in (("src", self.src), ("dst", self.dst)):
            if not isinstance(slot, DeviceSlot):
                raise TypeError(f"{label} must be a DeviceSlot (MultiDeviceManager.slot(i)), "
                                f"got {type(slot).__name__}")
        self._check_method()
        check_ring_shape(self.slot_size, self.slot_count)
        _image_size(self.width, self.height, self.bytes_per_pixel, allow_zero=True)
        if not isinstance(self.extra, dict):
            raise TypeError(f"extra must be a dict, got {type(self.extra).__name__}")
        self._refuse_unsupported()
        self._ref: LinkRef | None = None
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

    def _check_method(self) -> None:
        if not isinstance(self.method, str) or self.method not in TransferMethod.ALL:
            raise ValueError(f"unknown cross-device transfer method {short_repr(self.method)}; "
                             f"expected one of {TransferMethod.ALL}")

    @property
    def destroyed(self) -> bool:
        """Whether destroy() began (a destroyed transfer refuses new copies)."""
        return not self._life.open

    _destroyed = destroyed   # (the seed's spelling)

    def __repr__(self) -> str:
        size = f", {self.width}x{self.height}x{self.bytes_per_pixel} B" if self.width and self.height else ""
        state = ", destroyed" if self.destroyed else ""
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

    def run(self, *, src_image: Image | VkImage | int | None = None, dst_image: Image | VkImage | int | None = None,
            timeout: float | None = None, **options: Any) -> None:
        """Transfer and block until the destination holds the data (NONE: nothing to do,
        returns at once, as the seed's, whatever the slots hold)."""
        self._life.check()   # (this transfer and its manager; the slots' devices once there is work to do)
        if self.method == TransferMethod.NONE:
            return
        self._check_method()   # (a method set after construction: the seed's first check)
        if (src_image is None or dst_image is None) and "src_buffer" not in options and "dst_buffer" not in options:
            raise ValueError("both src_image (on the source device) and dst_image (on the destination) are needed")
        Deadline(timeout)   # checks the value before anything is queued
        self.submit(src_image=src_image, dst_image=dst_image, **options).wait(timeout)

    def run_staging_copy(self, *, src_image: Image | VkImage | int | None = None,
                         dst_image: Image | VkImage | int | None = None, **options: Any) -> None:
        """The seed's per-method entry point: run() for a STAGING_COPY transfer (ValueError for another method)."""
        self._require(TransferMethod.STAGING_COPY, "run_staging_copy")
        self.run(src_image=src_image, dst_image=dst_image, **options)

    def run_host_shared(self, *, src_image: Image | VkImage | int | None = None,
                        dst_image: Image | VkImage | int | None = None, **options: Any) -> None:
        """The seed's per-method entry point: run() for a HOST_SHARED transfer (ValueError for another method)."""
        self._require(TransferMethod.HOST_SHARED, "run_host_shared")
        self.run(src_image=src_image, dst_image=dst_image, **options)

    def run_dmabuf(self, *, src_image: Image | VkImage | int | None = None,
                   dst_image: Image | VkImage | int | None = None, **options: Any) -> None:
        """The seed's per-method entry point: run() for a DMABUF transfer (ValueError for another method)."""
        self._require(TransferMethod.DMABUF, "run_dmabuf")
        self.run(src_image=src_image, dst_image=dst_image, **options)

    def ensure_staging(self, src_command_pool: VkCommandPool | int | None = None,
                       dst_command_pool: VkCommandPool | int | None = None) -> dict[str, Any]:
        """Make the ring this transfer uses ready now (it is otherwise made on first use).

        vkmulti records on command pools of its own (never an engine's frame
        pool); pools passed here are kept in the returned dict for the seed's
        callers and not recorded into. Method NONE has no ring: its dict says
        slot_size 0 and slot_count 0. As in the seed, the dict is kept in
        `extra["staging"]`: a later call for the same size only updates its
        two pools and returns that same dict.
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
            size = max(1, self.width * self.height * self.bytes_per_pixel)
            kept = self.extra.get("staging")
            if (isinstance(kept, dict) and kept.get("size") == size and kept.get("method") == self.method
                    and kept.get("slot_size") == slot_size and kept.get("slot_count") == slot_count):
                kept["src_pool"], kept["dst_pool"] = src_command_pool, dst_command_pool
                return kept
            # (the seed's staging buffers are the link's ring here, shared per device pair and not
            # this transfer's to hand out: src_buf, src_mem, dst_buf and dst_mem are None)
            info = {"size": size, "method": self.method,
                    "slot_size": slot_size, "slot_count": slot_count,
                    "src_buf": None, "src_mem": None, "dst_buf": None, "dst_mem": None,
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
                                              f"{seconds_text(timeout)} s; its ring stays held (call destroy() again)")
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

    def submit(self, *, src_image: Image | VkImage | int | None = None, dst_image: Image | VkImage | int | None = None,
               src_buffer: Buffer | VkBuffer | int | None = None, dst_buffer: Buffer | VkBuffer | int | None = None,
               src_offset: int = 0, dst_offset: int = 0, size: int | None = None,
               src_layout: int | None = None, dst_layout: int | None = None,
               src_final_layout: int | None = None, dst_final_layout: int | None = None,
               src_wait: Wait | None = None, dst_wait: Wait | None = None) -> TransferTicket:
        """Queue the transfer and return a ticket at once.

        Either images (vkmulti `Image`s, or raw VkImage handles sized by this
        transfer's width/height/bytes_per_pixel) or buffers (`Buffer`s, or raw
        VkBuffer handles with `size`); a source `Image` or `Buffer` needs the
        TRANSFER_SRC usage bit, a destination one TRANSFER_DST (ValueError
        otherwise). Layouts default to an Image's tracked
        layout, else SHADER_READ_ONLY_OPTIMAL; final layouts default to the
        starting ones. `src_wait`/`dst_wait`: timeline points (semaphore,
        value) on the source/destination device that must be reached before
        the resource is read/overwritten. Where the transfer copies on
        vkmulti's own copy queue (not the device's graphics queue), its worker
        waits for them and submits the copies once they are reached: the
        transfers of other pairs and directions share that queue, and none of
        them is held up behind a copy waiting for your work.
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
            self.src_done = TimelinePoint._trusted(ref.src_sem, sdone, self.src.index, self.src.native)
            self.dst_ready = TimelinePoint._trusted(ref.dst_sem, dready, self.dst.index, self.dst.native)
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

    def _link_ref_locked(self) -> LinkRef:
        if self._ref is not None and self._ref.link.alive:
            return self._ref
        self._refuse_unsupported()
        if self.src.native is None or self.dst.native is None:
            raise ValueError("both slots need live devices with native tables (an active MultiDeviceManager)")
        self._ref = acquire_link(self.src, self.dst, self.method, *self._ring())
        return self._ref

    def _ring(self) -> tuple[int, int]:
        """(slot size, slot count) of the ring this transfer's link uses."""
        return ring_shape(self.method, self.src, self.dst, self.slot_size, self.slot_count)

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
                raise ValueError(f"{label} is in layout {short_repr(image.layout)} as vkmulti tracks it, not "
                                 f"{short_repr(before)}; after a transition of your own set image.layout, or pass "
                                 f"UNDEFINED as dst_layout to discard the destination's contents")
            after = before if final is None else final
            if wait is None and slot_size is not None and type(before) is int and type(after) is int:
                key = (image, label, before, after, slot_size)
                hit = self._endpoints.get(key)
                if hit is not None:
                    return hit
            w, h, bpp, handle = image.width, image.height, image.bytes_per_pixel, image.handle_int
            require_transfer_usage(image.usage, label[:3], "image", label)
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
            require_transfer_usage(buf.usage, label[:3], "buffer", label)
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
                if not is_int(v) or v < 0:
                    raise ValueError(f"{label} must be a non-negative int, got {short_repr(v)}")
                if v > MAX_BYTES:
                    raise ValueError(f"{label} must be at most 2**62, got {short_repr(v)}")
        src_vk, dst_vk = isinstance(src, Buffer), isinstance(dst, Buffer)
        if size is None:
            if not src_vk:
                raise ValueError("size is required for raw VkBuffer handles")
            size = src.size - src_offset
        if not is_int(size) or not 0 < size <= MAX_BYTES:
            raise ValueError(f"size must be a positive int (at most 2**62), got {short_repr(size)}")
        if src_vk and src_offset + size > src.size:
            raise ValueError(f"src_buffer is too small: [{src_offset}, {src_offset + size}) exceeds its "
                             f"{src.size} bytes")
        if dst_vk and dst_offset + size > dst.size:
            raise ValueError(f"dst_buffer is too small: [{dst_offset}, {dst_offset + size}) exceeds its "
                             f"{dst.size} bytes")
        return size
