"""InterGpuTransfer: device buffers between GPUs (copy, broadcast, gather).

The buffer API of oxigdal-gpu's `InterGpuTransfer`, on real device buffers:
device->device moves go through the cross-device transfer engine
(`CrossDeviceTransfer`, best method of each pair), host<->device copies through
`HostPort` (the GPU reads/writes the numpy array itself where the device can
import host memory).

Every operation has a blocking form (`*_blocking`) and an asyncio form named
like the seed's (`await t.gather(0)`). The asyncio form runs the blocking form
on this object's thread pool (`loop.run_in_executor`), where every wait is a
native fence/semaphore wait without the GIL, so the event loop never blocks
and no polling is involved. Cancelling the awaiting task does not stop the
copy; it finishes in the background.

Results: host results are numpy uint8 arrays owned by the caller (the GPU wrote
them directly, or they are the caller's `out=` arrays); device results are
`Buffer`s this object created: they stay valid until you `destroy()` them, or
until this InterGpuTransfer is destroyed (it frees the ones it made; `detach()`
hands one over to you for good).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, Sequence

import numpy as np
import vulkan as vk

from .._core.checks import is_int, short_repr
from .._core.handles import handle_int
from .._core.lifetime import Deadline, Lifetime
from .._core.timeline import wait_point
from ..device.manager import MultiDeviceManager
from ..errors import DestroyedError, InvalidBufferError
from ..memory.buffer import Buffer
from ..memory.image import Image
from ..memory.resource import MAX_BYTES, as_host_bytes, require_transfer_usage
from .link import DEFAULT_SLOT_COUNT, DEFAULT_SLOT_SIZE, check_ring_shape
from .methods import TransferMethod
from .routes import NOTHING_RAN, Holds, Registration, Routes, wait_all
from .._core.reprs import compact_repr

if TYPE_CHECKING:
    from .._core.protocols import HostData
    from .._core.timeline import Wait
    from .._core.vktypes import VkBuffer

log = logging.getLogger(__name__)

__all__ = ["InterGpuTransfer", "Gathered"]

#: Offsets in gather_to_device are multiples of this (>= any minStorageBufferOffsetAlignment).
GATHER_ALIGNMENT = 256
_SEGMENT_MIN = 16 << 20


class Gathered(NamedTuple):
    """gather_to_device's result: one buffer on the destination device holding every
    registered device's bytes.

    `offsets` and `sizes` are dicts keyed by device index (only the devices that
    had a buffer registered, in ascending order), not lists: device i's bytes are
    `buffer[offsets[i]:offsets[i] + sizes[i]]`. Iterate `offsets.items()` (or
    `sorted(offsets)`) rather than zipping the two with a list of devices."""
    buffer: Buffer
    #: device index -> byte offset of its data in `buffer` (a multiple of 256)
    offsets: dict[int, int]
    #: device index -> byte count of its data
    sizes: dict[int, int]

    def __repr__(self) -> str:
        return compact_repr(self)


#: Methods whose device->device path goes through host memory (broadcast uploads to them directly).
_VIA_HOST = (TransferMethod.HOST_SHARED, TransferMethod.STAGING_COPY)


def _segment_size(n: int) -> int:
    """Broadcast segment: the upload of segment k+1 overlaps the fan-out of segment k."""
    if n <= 2 * _SEGMENT_MIN:
        return n
    return -(-max(_SEGMENT_MIN, -(-n // 8)) // (1 << 20)) * (1 << 20)


class InterGpuTransfer:
    """Copy, broadcast and gather device buffers across the GPUs of a MultiDeviceManager.

    One registration slot per device (the seed's "last result buffer"), sized
    by the manager's device count at construction. `host_import=False` makes
    host copies use the staging ring even where memory import works;
    `prefer_dmabuf` is select_transfer_method's (each pair gets the best
    method both devices support); `slot_size`/`slot_count` shape the
    device->device rings; `max_workers` sizes the pool of the asyncio forms.
    """

    def __init__(self, manager: MultiDeviceManager, *, host_import: bool | None = None, prefer_dmabuf: bool = True,
                 slot_size: int = DEFAULT_SLOT_SIZE, slot_count: int = DEFAULT_SLOT_COUNT,
                 max_workers: int | None = None):
        if not isinstance(manager, MultiDeviceManager):
            raise TypeError(f"manager must be a MultiDeviceManager, got {type(manager).__name__}")
        check_ring_shape(slot_size, slot_count)
        if max_workers is not None and (not is_int(max_workers) or not 0 < max_workers <= 256):
            raise ValueError(f"max_workers must be an int in [1, 256] or None, got {short_repr(max_workers)}")
        if host_import not in (None, True, False):
            raise TypeError(f"host_import must be None, True or False, got {type(host_import).__name__}")
        self.manager = manager
        self._slots = manager.slots      # raises DestroyedError for a destroyed manager
        self.device_count = len(self._slots)
        self._max_workers = max_workers or max(4, 2 * self.device_count)
        self._routes = Routes(self._slots, host_import=host_import, prefer_dmabuf=bool(prefer_dmabuf),
                              slot_size=slot_size, slot_count=slot_count)
        self._regs: dict[int, Registration] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._cond = threading.Condition()
        self._life = Lifetime(self, "InterGpuTransfer", (manager._life,))
        manager._life.adopt(self)   # destroyed with the manager unless destroyed first

    # -- registration --------------------------------------------------------

    def set_device_buffer(self, device_idx: int, buffer: Buffer | VkBuffer | int | None,
                          size_bytes: int | None = None, *, ready: Wait | None = None) -> None:
        """Register the result buffer of work on `device_idx` (replacing the previous one).

        `buffer`: a vkmulti `Buffer` of that device (its TRANSFER_SRC usage and
        size are checked), a raw `VkBuffer` handle (cffi or int) with
        `size_bytes` (trusted: Vulkan cannot check a raw handle; it must be
        usable on the device's copy queue family), or None to clear the slot.
        `ready`: a TimelinePoint or (semaphore, value) on that device that the
        GPU reaches once the buffer is written; every read waits for it on the
        GPU. On a device with a single queue, the work that signals it must
        be submitted first (for a transfer: `ticket.wait_submitted()`).
        """
        self._check()
        i = self._index(device_idx, "device_idx", "device_idx out of range")
        if buffer is None:
            with self._cond:
                self._regs.pop(i, None)
            return
        slot = self._slots[i]
        if isinstance(buffer, Image):
            raise TypeError("buffer is an Image; InterGpuTransfer moves buffers (use CrossDeviceTransfer for images)")
        if isinstance(buffer, Buffer):
            self._check_buffer(buffer, i, "buffer")
            require_transfer_usage(buffer.usage, "src", "buffer", "buffer", "; create it with transfer-source usage")
            size = buffer.size if size_bytes is None else self._size(size_bytes, "size_bytes")
            if size > buffer.size:
                raise ValueError(f"buffer is too small: size_bytes {short_repr(size)} exceeds its {buffer.size} bytes")
            obj: Any = buffer
        else:
            obj = handle_int(buffer, "VkBuffer")
            if size_bytes is None:
                raise ValueError("size_bytes is required for a raw VkBuffer handle")
            size = self._size(size_bytes, "size_bytes")
        point = self._wait_point(ready, slot, "ready")
        with self._cond:
            self._regs[i] = Registration(i, obj, size, point)

    def registered(self, device_idx: int) -> tuple[Buffer | int, int] | None:
        """(buffer, size) registered for `device_idx`, or None."""
        self._check()
        reg = self._regs.get(self._index(device_idx, "device_idx"))
        return None if reg is None else (reg.buffer, reg.size)

    def transfer_method(self, src_device: int, dst_device: int) -> str:
        """The cross-device method used from `src_device` to `dst_device`."""
        self._check()
        s, d = self._index(src_device, "src_device"), self._index(dst_device, "dst_device")
        return self._routes.method(s, d)

    # -- blocking forms ------------------------------------------------------

    def copy_buffer_blocking(self, src_device: int, dst_device: int, data: HostData | Buffer | None = None, *,
                             dst_buffer: Buffer | None = None, dst_offset: int = 0,
                             timeout: float | None = None) -> Buffer:
        """Copy to `dst_device` and return the destination buffer.

        `data` None: the buffer registered for `src_device`; a vkmulti `Buffer`
        of `src_device`: that buffer (both move device->device, or on-device
        when the devices are equal); host bytes (bytes, numpy, any C-contiguous
        buffer-protocol object): uploaded to `dst_device` (`src_device` is
        only validated, as in the seed). `dst_buffer`: a Buffer of
        `dst_device` (or a raw VkBuffer handle, trusted to be large enough),
        written at `dst_offset`; default a new Buffer.
        """
        with self._op() as holds:
            dl = Deadline(timeout)
            src = self._index(src_device, "src_device", "Invalid source device")
            dst = self._index(dst_device, "dst_device", "Invalid destination device")
            host, reg = self._source(src, data, "data", holds)
            size = host.nbytes if host is not None else reg.size  # type: ignore[union-attr]
            target, handle = self._target(dst, dst_buffer, size, dst_offset, "dst_buffer", holds)
            if host is None and src == dst and handle == reg.handle() and dst_offset < size:  # type: ignore[union-attr]
                raise ValueError(f"source and destination ranges overlap in the same buffer "
                                 f"([0, {size}) and [{dst_offset}, {dst_offset + size}))")
            made: list[Buffer] = []
            if target is None:
                target, handle = self._routes.create(dst, size, made, holds)
            users = holds(target, None if reg is None else reg.buffer)
            try:
                if host is not None:
                    job: Any = self._routes.port(dst).start_upload(handle, dst_offset, host, deadline=dl, users=users)
                elif src == dst:
                    job = self._routes.port(dst, local=True).start_copy(reg.handle(), 0, handle, dst_offset, size,  # type: ignore[union-attr]
                                                                        waits=reg.waits, users=users)  # type: ignore[union-attr]
                else:
                    job = self._routes.transfer(src, dst).submit(src_buffer=reg.buffer, dst_buffer=target,  # type: ignore[union-attr]
                                                                 dst_offset=dst_offset, size=size, src_wait=reg.ready)  # type: ignore[union-attr]
            except NOTHING_RAN:
                self._routes.discard(made)
                raise
            job.wait(dl.left())
            return target

    def broadcast_blocking(self, data: HostData | Buffer | None = None, *, src_device: int | None = None,
                           dst_buffers: Sequence[Buffer | None] | None = None,
                           timeout: float | None = None) -> list[Buffer]:
        """Put the same bytes on every device; returns one buffer per device (index = device).

        Host data is uploaded once, to `src_device` (default 0), and fanned out
        device->device to all others at once, the upload of each segment
        overlapping the fan-out of the previous one; a device whose path from
        `src_device` goes through host memory anyway (HOST_SHARED,
        STAGING_COPY) and that can import host memory is written straight
        from the caller's memory instead, in parallel (one PCIe hop instead of
        two, no extra host copy). A vkmulti `Buffer` (or
        None: the buffer registered for `src_device`) is fanned out from its
        device; that entry of the result is the source buffer itself.
        `dst_buffers`: optional per-device destinations (None entries: new).
        """
        with self._op() as holds:
            dl = Deadline(timeout)
            if isinstance(data, Buffer):
                own = next((s.index for s in self._slots if s is data.slot), None)
                if own is None:
                    raise ValueError(f"data is a Buffer of a device ({data.slot.name!r}) "
                                     f"that is not part of this manager")
                if src_device is not None and self._index(src_device, "src_device") != own:
                    raise ValueError(f"data belongs to GPU {own}, not src_device {src_device}")
                src_device = own
            src = 0 if src_device is None else self._index(src_device, "src_device")
            host, reg = self._source(src, data, "data", holds)
            size = host.nbytes if host is not None else reg.size  # type: ignore[union-attr]
            if dst_buffers is not None:
                if isinstance(dst_buffers, (str, bytes)) or not isinstance(dst_buffers, Sequence):
                    raise TypeError(f"dst_buffers must be a sequence (one entry per device), "
                                    f"got {type(dst_buffers).__name__}")
                if len(dst_buffers) != self.device_count:
                    raise ValueError(f"dst_buffers has {len(dst_buffers)} entries; this manager has "
                                     f"{self.device_count} device(s)")
            out: list[Any] = [None] * self.device_count
            handles: list[int] = [0] * self.device_count
            for i in range(self.device_count):     # check every given destination before making any
                given = None if dst_buffers is None else dst_buffers[i]
                if i == src and host is None:
                    if given is not None:
                        raise ValueError(f"dst_buffers[{i}] must be None: GPU {i} holds the source")
                    out[i], handles[i] = reg.buffer, reg.handle()  # type: ignore[union-attr]
                else:
                    out[i], handles[i] = self._target(i, given, size, 0, f"dst_buffers[{i}]", holds)
            made: list[Buffer] = []
            for i in range(self.device_count):
                if out[i] is None:
                    out[i], handles[i] = self._routes.create(i, size, made, holds)
            others = [i for i in range(self.device_count) if i != src]
            jobs: list[Any] = []
            with self._routes.settled(jobs, dl, made):
                if host is None:
                    for d in others:
                        jobs.append(self._routes.transfer(src, d).submit(src_buffer=reg.buffer, dst_buffer=out[d],  # type: ignore[union-attr]
                                                                         size=size, src_wait=reg.ready))  # type: ignore[union-attr]
                else:
                    # a pair whose device->device path bounces through host memory anyway
                    # gets the bytes straight from the caller's memory, at the same time
                    direct = [d for d in others
                              if self.transfer_method(src, d) in _VIA_HOST and self._routes.port(d).host_import]
                    fan = [d for d in others if d not in direct]
                    for d in direct:
                        jobs.append(self._routes.port(d).start_upload(handles[d], 0, host, deadline=dl,
                                                                      users=holds(out[d])))
                    seg = _segment_size(size) if fan else size
                    port = self._routes.port(src)
                    for a in range(0, size, seg):
                        b = min(size, a + seg)
                        up = port.start_upload(handles[src], a, host[a:b], deadline=dl, users=holds(out[src]))
                        jobs.append(up)
                        if fan:
                            up.wait(dl.left())
                        for d in fan:
                            jobs.append(self._routes.transfer(src, d).submit(
                                src_buffer=out[src], dst_buffer=out[d], src_offset=a, dst_offset=a, size=b - a))
            return out

    def gather_blocking(self, dst_device: int, *, out: Sequence[np.ndarray | None] | None = None, reuse: bool = False,
                        timeout: float | None = None) -> list[np.ndarray]:
        """Read every registered buffer back to the host, as the seed does.

        One uint8 array per source device in ascending index order, skipping
        `dst_device`; an empty array for a device with no registered buffer.
        The readbacks of all devices run at once, the GPU writing straight into
        the result memory where the device can import host memory. Default:
        new arrays, yours to keep. `out`: arrays to read into (one per entry,
        None for new; any dtype, C-contiguous, writable, exactly the registered
        size in bytes), returned as given. `reuse=True`: zero-copy read-only
        views of host memory this object keeps imported per source device (no
        allocation, page faults or per-call import): their bytes are valid
        until the next `reuse=True` gather on this object; the memory itself
        stays valid for as long as you hold a view, even after destroy().
        """
        with self._op() as holds:
            dl = Deadline(timeout)
            dst = self._index(dst_device, "dst_device")
            sources = [i for i in range(self.device_count) if i != dst]
            if out is not None:
                if reuse:
                    raise ValueError("pass out= or reuse=True, not both")
                if isinstance(out, (str, bytes, np.ndarray)) or not isinstance(out, Sequence):
                    raise TypeError(f"out must be a list with one entry per source device, got {type(out).__name__}")
                if len(out) != len(sources):
                    raise ValueError(f"out has {len(out)} entries; gather to GPU {dst} returns {len(sources)}")
            with self._cond:
                regs = dict(self._regs)
            results: list[Any] = []
            jobs: list[tuple[int, int, Registration, np.ndarray | None]] = []
            for k, i in enumerate(sources):
                reg = regs.get(i)
                given = None if out is None else out[k]
                if reg is None:
                    results.append(np.empty(0, dtype=np.uint8))
                    continue
                reg.hold(holds)
                if given is not None:
                    u8 = as_host_bytes(given, f"out[{k}]", writable=True)
                    if u8.nbytes != reg.size:
                        raise ValueError(f"out[{k}] holds {u8.nbytes} bytes; GPU {i}'s registered buffer has "
                                         f"{reg.size}")
                    jobs.append((len(results), i, reg, u8))
                    results.append(given)
                else:
                    jobs.append((len(results), i, reg, None))
                    results.append(None)
            with ExitStack() as held:
                pending: list[Any] = []
                try:
                    for pos, i, reg, u8 in jobs:  # type: ignore[assignment]
                        arena = None
                        if reuse:
                            arena = held.enter_context(self._routes.port(i).arena(reg.size))
                            u8 = arena.array[:reg.size]
                            view = u8.view()
                            view.flags.writeable = False
                            results[pos] = view
                        elif u8 is None:
                            u8 = np.empty(reg.size, dtype=np.uint8)
                            results[pos] = u8
                        pending.append(self._routes.port(i).start_download(reg.handle(), 0, u8, waits=reg.waits,
                                                                           deadline=dl, arena=arena,
                                                                           users=holds(reg.buffer)))
                except BaseException:
                    wait_all(pending, dl, quiet=True)
                    raise
                wait_all(pending, dl)
            return results

    def gather_to_device_blocking(self, dst_device: int, *, dst_buffer: Buffer | None = None,
                                  timeout: float | None = None) -> Gathered:
        """Land every registered buffer (dst_device's own included) in one buffer on `dst_device`.

        Device i's bytes go to offsets[i] (ascending device order, each offset
        a multiple of 256 so it can be bound as a storage buffer). Returns
        Gathered(buffer, offsets, sizes), offsets and sizes being dicts keyed by
        device index (see Gathered). `dst_buffer`: a Buffer of that device
        large enough (or a raw handle, trusted); default a new one.
        """
        with self._op() as holds:
            dl = Deadline(timeout)
            dst = self._index(dst_device, "dst_device")
            with self._cond:
                regs = dict(sorted(self._regs.items()))
            if not regs:
                raise ValueError("no device has a registered buffer; call set_device_buffer first")
            offsets, sizes, cursor = {}, {}, 0
            for i, reg in regs.items():
                reg.hold(holds)
                offsets[i] = -(-cursor // GATHER_ALIGNMENT) * GATHER_ALIGNMENT
                sizes[i] = reg.size
                cursor = offsets[i] + reg.size
            target, handle = self._target(dst, dst_buffer, cursor, 0, "dst_buffer", holds)
            for i, reg in regs.items():
                if handle and reg.handle() == handle:
                    raise ValueError(f"dst_buffer is the buffer registered for GPU {i}: the gather would "
                                     f"overwrite what it reads")
            made: list[Buffer] = []
            if target is None:
                target, handle = self._routes.create(dst, cursor, made, holds)
            waits: list[Any] = []
            with self._routes.settled(waits, dl, made):
                for i, reg in regs.items():     # the cross-device moves first: they take longest
                    if i != dst:
                        waits.append(self._routes.transfer(i, dst).submit(src_buffer=reg.buffer, dst_buffer=target,
                                                                          dst_offset=offsets[i], size=reg.size,
                                                                          src_wait=reg.ready))
                own = regs.get(dst)
                if own is not None:
                    waits.append(self._routes.port(dst, local=True).start_copy(
                        own.handle(), 0, handle, offsets[dst], own.size, waits=own.waits,
                        users=holds(own.buffer, target)))
            return Gathered(target, offsets, sizes)

    # -- asyncio forms (the seed's names) ------------------------------------

    async def copy_buffer(self, src_device: int, dst_device: int, data: HostData | Buffer | None = None,
                          **kw: Any) -> Buffer:
        """Asyncio form of copy_buffer_blocking."""
        return await self._run(self.copy_buffer_blocking, src_device, dst_device, data, **kw)

    async def broadcast(self, data: HostData | Buffer | None = None, **kw: Any) -> list[Buffer]:
        """Asyncio form of broadcast_blocking."""
        return await self._run(self.broadcast_blocking, data, **kw)

    async def gather(self, dst_device: int, **kw: Any) -> list[np.ndarray]:
        """Asyncio form of gather_blocking."""
        return await self._run(self.gather_blocking, dst_device, **kw)

    async def gather_to_device(self, dst_device: int, **kw: Any) -> Gathered:
        """Asyncio form of gather_to_device_blocking."""
        return await self._run(self.gather_to_device_blocking, dst_device, **kw)

    # -- ownership and lifetime -----------------------------------------------

    def detach(self, buffer: Buffer) -> Buffer:
        """Hand a Buffer this object created over to the caller (who must destroy it)."""
        if self._routes.detach(buffer):
            return buffer
        raise ValueError("buffer was not created by this InterGpuTransfer (or was detached already)")

    _teardown_rank = 10   # before the transfers, ports and buffers it made

    @property
    def destroyed(self) -> bool:
        """True once destroy() was called."""
        return not self._life.open

    def destroy(self, timeout: float | None = None) -> None:
        """Wait for running operations, then free the rings, copies and buffers this object made.

        Idempotent; also run by the manager's destroy(). Operations that start
        once it was called raise DestroyedError. On timeout
        (vkmulti.TimeoutError) or Ctrl-C nothing the GPU may still touch is
        freed, and destroy() may be called again.
        """
        with self._life.ending(timeout) as dl:
            if dl is None:
                return
            self._routes.destroy(dl)
            with self._cond:
                self._regs = {}
                executor, self._executor = self._executor, None
            if executor is not None:
                executor.shutdown(wait=False)

    def __enter__(self) -> "InterGpuTransfer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        if not self._life.open:
            return "InterGpuTransfer(destroyed)"
        return f"InterGpuTransfer(devices={self.device_count}, registered={len(self._regs)})"

    # -- helpers ---------------------------------------------------------------

    def _check(self) -> None:
        self._life.check()

    @contextmanager
    def _op(self) -> Iterator[Holds]:
        """An operation: counted in this object's (and the manager's) lifetime, and
        holding the Buffers it uses (their destroy() waits until it returns)."""
        with self._life, ExitStack() as stack:
            yield Holds(stack)

    async def _run(self, fn: Any, *args: Any, **kw: Any) -> Any:
        loop = asyncio.get_running_loop()
        # the call is handed to the executor inside the lifetime: destroy() shuts the executor
        # down only after this, so a racing destroy() ends the call with DestroyedError (from
        # `fn`), never with the executor's RuntimeError
        with self._life, self._cond:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._max_workers, thread_name_prefix="vkmulti-buffers")
            future = loop.run_in_executor(self._executor, functools.partial(fn, *args, **kw))
        return await future

    def _index(self, value: Any, label: str, seed: str | None = None) -> int:
        """`value` as a device index; InvalidBufferError out of range (the seed's text `seed` first)."""
        if not (is_int(value) or isinstance(value, np.integer)):
            raise TypeError(f"{label} must be an int device index, got {type(value).__name__} {short_repr(value)}")
        if not 0 <= value < self.device_count:
            text = f"{label} {short_repr(value)} is out of range (num_devices = {self.device_count})"
            raise InvalidBufferError(text if seed is None else f"{seed}: {text}")
        return int(value)

    @staticmethod
    def _size(value: Any, label: str) -> int:
        if not (is_int(value) or isinstance(value, np.integer)) or value <= 0:
            raise ValueError(f"{label} must be a positive int, got {short_repr(value)}")
        return int(value)

    def _check_buffer(self, buf: Buffer, device: int, label: str) -> None:
        if buf.handle is None:
            raise DestroyedError(f"{label} was destroyed")
        if buf.slot is not self._slots[device]:
            where = (f"GPU {buf.slot.index} ({buf.slot.name!r})" if any(s is buf.slot for s in self._slots)
                     else f"{buf.slot.name!r} of another manager")
            raise ValueError(f"{label} belongs to {where}, not GPU {device} ({self._slots[device].name!r})")

    @staticmethod
    def _wait_point(value: Any, slot: Any, label: str) -> tuple[int, int] | None:
        return wait_point(value, slot, label)

    def _source(self, device: int, data: Any, label: str,
                holds: Holds) -> tuple[np.ndarray | None, Registration | None]:
        """(host bytes, None) or (None, a registration-like view of the device source)."""
        if data is None:
            with self._cond:
                reg = self._regs.get(device)
            if reg is None:
                raise ValueError(f"GPU {device} has no registered buffer; call set_device_buffer({device}, ...) "
                                 f"or pass {label}")
            reg.hold(holds)
            return None, reg
        if isinstance(data, Image):
            raise TypeError(f"{label} is an Image; InterGpuTransfer moves buffers")
        if isinstance(data, Buffer):
            holds(data)
            self._check_buffer(data, device, label)
            require_transfer_usage(data.usage, "src", "buffer", label)
            return None, Registration(device, data, data.size, None)
        host = as_host_bytes(data, label)
        if host.nbytes == 0:
            raise ValueError(f"{label} is empty: nothing to copy")
        return host, None

    def _target(self, device: int, given: Any, size: int, offset: int, label: str,
                holds: Holds) -> tuple[Any, int]:
        """The given destination checked, as (object to return, handle); (None, 0) for none."""
        if not (is_int(offset) or isinstance(offset, np.integer)) or offset < 0:
            raise ValueError(f"dst_offset must be a non-negative int, got {short_repr(offset)}")
        if offset > MAX_BYTES:
            raise ValueError(f"dst_offset must be at most 2**62, got {short_repr(offset)}")
        offset = int(offset)
        if given is None:
            if offset:
                raise ValueError(f"dst_offset {offset} needs a dst_buffer (a new buffer is written at 0)")
            return None, 0
        if isinstance(given, Image):
            raise TypeError(f"{label} is an Image; InterGpuTransfer moves buffers")
        if isinstance(given, Buffer):
            holds(given)
            self._check_buffer(given, device, label)
            require_transfer_usage(given.usage, "dst", "buffer", label)
            if offset + size > given.size:
                raise ValueError(f"{label} is too small: [{offset}, {offset + size}) exceeds its {given.size} bytes")
            return given, given.handle_int
        return given, handle_int(given, "VkBuffer")
