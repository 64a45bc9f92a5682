"""CRC32 of a CPU device's buffers, computed by the host on the device's own memory.

On a CPU Vulkan device (lavapipe) "device memory" is host memory, every
memory type is host-visible and coherent, and the device's "GPU" is the same
CPU cores running llvmpipe's JIT code. There the CRC32 shader costs table
gathers at ~1 GB/s, while zlib's crc32 runs at ~7 GB/s per core and
zlib-ng's (the `zlib-ng` package, when installed: carry-less multiply
instructions) at ~60 GB/s; both release the GIL. So for such a device the check runs here: the buffer's
memory is mapped (the very bytes the device reads and the copy wrote, not a
copy of them), split into pieces hashed with zlib-ng or zlib on a thread pool after the
timeline points the job waits for (host waits, no GIL), and the pieces'
CRCs are combined (gpu_crc.crc32_combine). Same values, same API
(`submit(ranges, waits) -> job.result(timeout)`) as GpuCrc; a GPU never uses
this (`suits()` is False for it): the state never goes through the host there.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
from typing import Any, Iterable

import numpy as np
import vulkan as vk

from ..._core import vkapi
from ..._core.checks import timeout_seconds, short_repr
from ..._core.lifetime import Deadline
from ...errors import DestroyedError, TimeoutError as VkmTimeout, UnsupportedError, VkmError
from ..._core.timeline import TimelinePoint
from .gpu_crc import check_ranges, crc32_combine

__all__ = ["HostCrc", "HostCrcJob", "PIECE_BYTES", "COPY_BLOCK_BYTES", "crc32"]

#: PIECE_BYTES: pieces of at least this many bytes go to separate threads (zlib-ng
#: hashes 16 MiB in ~0.3 ms: below 32 MiB a thread hand-off costs more than it saves).
try:   # the optional `zlib-ng` package (extra "fast-crc"): same values, several times faster
    from zlib_ng.zlib_ng import crc32
    PIECE_BYTES = 32 << 20
except ImportError:   # pragma: no cover - depends on the environment
    from zlib import crc32
    PIECE_BYTES = 1 << 20

#: A host copy between CPU devices goes block by block: each block is hashed on both
#: sides right after its copy, while it is still in the core's cache (1 MiB L2 here).
COPY_BLOCK_BYTES = 256 << 10

_HOST_MEMORY = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
_SLICE = 0.05   # s: how often a job waiting for its timeline points looks whether it was closed
_POOLS: dict[str, cf.ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(name: str, workers: int) -> cf.ThreadPoolExecutor:
    with _POOLS_LOCK:
        p = _POOLS.get(name)
        if p is None:
            p = _POOLS[name] = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"vkm-crc-{name}")
        return p


def _started(name: str, workers: int, count: int) -> None:
    """Have `count` threads of the pool `name` running (a pool starts one thread per
    job while none is idle: the first jobs of a migration would pay for the starts)."""
    pool = _pool(name, workers)
    count = min(count, workers)
    if len(getattr(pool, "_threads", ())) >= count:
        return
    meet = threading.Barrier(count)

    def wait() -> None:
        try:
            meet.wait(5.0)
        except threading.BrokenBarrierError:
            pass
    cf.wait([pool.submit(wait) for _ in range(count)], 10.0)


def _threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


class Cancelled(VkmError):
    """A host CRC32 job closed before it ran (its result() raises this)."""


class HostCrcJob:
    """CRC32s being computed by the host; result() waits and returns them in order."""

    def __init__(self, future: cf.Future, count: int, cancel: threading.Event):
        self._future, self._count, self._cancel = future, count, cancel

    def result(self, timeout: float | None = 60.0) -> list[int]:
        """The zlib CRC32 of each range; vkmulti.TimeoutError after `timeout` s."""
        if not _waited(self._future, Deadline(timeout_seconds(timeout))):
            raise VkmTimeout(f"the host CRC32 of {self._count} range(s) did not finish within {timeout} s")
        return list(self._future.result())

    def wait(self, timeout: float | None = 60.0) -> None:
        """Wait until the job is done (a copy job: its bytes have landed); its errors raise."""
        self.result(timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Cancel the job if it still waits for its timeline points, else wait (bounded)
        for its hashing, so nothing reads the buffers afterwards; errors are the result's."""
        deadline = Deadline(timeout_seconds(timeout))
        self._cancel.set()
        _waited(self._future, deadline)


def _waited(future: cf.Future, deadline: Deadline) -> bool:
    """Whether `future` is done by `deadline`, waited for in slices so that Ctrl-C ends the wait."""
    while not future.done():
        if deadline.expired():
            return False
        cf.wait([future], deadline.slice())
    return True


class HostCrc:
    """The host CRC32 engine of one CPU device context (see the module docstring)."""

    kind = "host"

    def __init__(self, ctx: Any):
        if not self.suits(ctx.slot):
            raise UnsupportedError(f"GPU {ctx.slot.index} ({ctx.slot.name!r}) is not a CPU device whose memory is "
                                   f"all host-visible and coherent, so the host cannot hash its buffers in place: "
                                   f"use the GPU shader (migration_crc 'auto' or 'shader')",
                                   device=ctx.slot.name, device_index=ctx.slot.index)
        self.ctx = ctx
        self._maps: dict[int, list[Any]] = {}   # id(buffer) -> [buffer, mapped view, users]
        self._lock = threading.Lock()
        self._jobs: set[cf.Future] = set()
        self._destroyed = False
        _started("jobs", 8, 8)   # every thread a migration's jobs use, started ahead of the move

    @staticmethod
    def suits(slot: Any) -> bool:
        """Whether `slot` is a CPU device all of whose memory types are host-visible and coherent."""
        caps = getattr(slot, "capabilities", None)
        if caps is None or getattr(caps, "device_type", "") != "cpu" or getattr(slot, "physical_device", None) is None:
            return False
        props = vk.vkGetPhysicalDeviceMemoryProperties(slot.physical_device)
        return props.memoryTypeCount > 0 and all(
            props.memoryTypes[i].propertyFlags & _HOST_MEMORY == _HOST_MEMORY for i in range(props.memoryTypeCount))

    def submit(self, ranges: Iterable[tuple[Any, int, int]], waits: Iterable[TimelinePoint] = (),
               timeout: float | None = 60.0) -> HostCrcJob:
        """CRC32 of each (buffer, offset, size) of this device, hashed once the
        timeline points `waits` (on this device) are reached (within `timeout` s)."""
        timeout = timeout_seconds(timeout)
        ranges = check_ranges(ranges, word_tail=False)
        slot = self.ctx.slot
        points = []
        for p in waits:
            if not isinstance(p, TimelinePoint) or p.device_index != slot.index:
                raise ValueError(f"a CRC job of GPU {slot.index} waits on timeline points of that GPU, got {short_repr(p)}")
            points.append(p)
        for buf, _, _ in ranges:
            if getattr(buf, "slot", slot) is not slot:
                raise ValueError(f"a buffer of GPU {getattr(buf.slot, 'index', '?')} given to GPU {slot.index}'s CRC32")
        with self._lock:
            if self._destroyed:
                raise DestroyedError(f"the host CRC32 engine of GPU {slot.index} was destroyed")
            cancel = threading.Event()
            fut = _pool("jobs", 8).submit(self._work, ranges, points, timeout, cancel)
            self._jobs.add(fut)
        fut.add_done_callback(self._finished)
        return HostCrcJob(fut, len(ranges), cancel)

    def run(self, ranges: Iterable[tuple[Any, int, int]], waits: Iterable[TimelinePoint] = (),
            timeout: float | None = 60.0) -> list[int]:
        return self.submit(ranges, waits, timeout).result(timeout)

    def copy_to(self, dst: "HostCrc", ranges: Iterable[tuple[Any, Any, int, int]], *, hash: bool = True,
                timeout: float | None = 60.0) -> list[HostCrcJob]:
        """Copy each (buffer of this device, buffer of `dst`'s device, offset, bytes) by
        the host, both buffers' memory mapped (no staging), one job per range run on
        the pool's threads side by side. With `hash` each job's result is [CRC32 of the
        source range, CRC32 of the destination range after the copy], each block
        hashed on both sides right after its copy (COPY_BLOCK_BYTES: still in cache),
        else []. The caller keeps both buffers' contents still meanwhile (a quiesced
        kernel, a twin nothing runs on yet)."""
        if not isinstance(dst, HostCrc):
            raise TypeError(f"a host copy goes to another HostCrc engine, got {type(dst).__name__}")
        items = []
        for item in ranges:
            try:
                a, b, off, size = item
            except (TypeError, ValueError):
                raise TypeError(f"a host copy range is (source, destination, offset, size), got "
                                f"{short_repr(item)}") from None
            (a, off, size), = check_ranges([(a, off, size)], word_tail=False)
            check_ranges([(b, off, size)], word_tail=False)
            for buf, eng in ((a, self), (b, dst)):
                if getattr(buf, "slot", eng.ctx.slot) is not eng.ctx.slot:
                    raise ValueError(f"a buffer of GPU {getattr(buf.slot, 'index', '?')} given as one of GPU "
                                     f"{eng.ctx.slot.index} to a host copy")
            items.append((a, b, off, size))
        jobs = []
        with self._lock:
            if self._destroyed or dst._destroyed:
                raise DestroyedError(f"the host CRC32 engine of GPU "
                                     f"{(self if self._destroyed else dst).ctx.slot.index} was destroyed")
            for a, b, off, size in items:
                cancel = threading.Event()
                fut = _pool("jobs", 8).submit(self._copy, dst, a, b, off, size, hash, cancel)
                self._jobs.add(fut)
                fut.add_done_callback(self._finished)
                jobs.append(HostCrcJob(fut, 1, cancel))
        return jobs

    def _copy(self, dst: "HostCrc", a: Any, b: Any, off: int, size: int, hash: bool,
              cancel: threading.Event) -> list[int]:
        if cancel.is_set():
            raise Cancelled("the host copy was closed before it ran")
        with a._life, b._life:   # their destroy() waits for this copy
            src_view, dst_view = self._map(a), dst._map(b)
            try:
                s = np.frombuffer(src_view, np.uint8, count=size, offset=off)
                d = np.frombuffer(dst_view, np.uint8, count=size, offset=off)
                cs = cd = 0
                for at in range(0, size, COPY_BLOCK_BYTES):
                    end = min(size, at + COPY_BLOCK_BYTES)
                    np.copyto(d[at:end], s[at:end])
                    if hash:
                        cs, cd = crc32(s[at:end], cs), crc32(d[at:end], cd)
                return [cs, cd] if hash else []
            finally:
                self._unmap(a)
                dst._unmap(b)

    def _finished(self, fut: cf.Future) -> None:
        with self._lock:
            self._jobs.discard(fut)

    def _work(self, ranges: list[tuple[Any, int, int]], points: list[TimelinePoint], timeout: float | None,
              cancel: threading.Event) -> list[int]:
        deadline = None if timeout is None else time.monotonic() + timeout
        native = self.ctx.slot.native
        for p in points:   # in slices: a job closed while its points are not reached stops waiting
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if cancel.is_set():
                    raise Cancelled("the CRC32 job was closed before its timeline points were reached")
                if left is not None and left <= 0:
                    raise VkmTimeout(f"GPU {self.ctx.slot.index}: timeline point {p.value} not reached within "
                                     f"{timeout} s")
                try:
                    native.wait_timeline(p.semaphore, p.value, _SLICE if left is None else min(left, _SLICE))
                    break
                except VkmTimeout:
                    continue
        return [self._hash(buf, off, size) if size else 0 for buf, off, size in ranges]

    def _hash(self, buf: Any, off: int, size: int) -> int:
        with buf._life:   # its destroy() waits for this read
            view = self._map(buf)
            try:
                data = view[off:off + size]
                n = max(1, min(_threads(), size // PIECE_BYTES))
                if n == 1:
                    return crc32(data)
                bounds = [size * i // n for i in range(n + 1)]
                futs = [_pool("pieces", _threads()).submit(crc32, data[a:b])
                        for a, b in zip(bounds[1:-1], bounds[2:])]
                crc = crc32(data[:bounds[1]])   # this thread hashes the first piece
                for (a, b), f in zip(zip(bounds[1:-1], bounds[2:]), futs):
                    crc = crc32_combine(crc, f.result(), b - a)
                return crc
            finally:
                self._unmap(buf)

    def _map(self, buf: Any) -> memoryview:
        """A byte view of the buffer's memory (mapped once while hashes read it)."""
        if getattr(buf, "bytes", None) is not None:   # a MappedBuffer: mapped for its whole life
            return memoryview(buf.bytes)
        with self._lock:
            entry = self._maps.get(id(buf))
            if entry is None:
                mapped = vkapi.vkMapMemory(self.ctx.slot.device, buf.memory, 0, buf.size, 0)
                entry = self._maps[id(buf)] = [buf, memoryview(np.frombuffer(mapped, np.uint8, count=buf.size)), 0]  # type: ignore[arg-type]
            entry[2] += 1
            return entry[1]

    def _unmap(self, buf: Any) -> None:
        if getattr(buf, "bytes", None) is not None:
            return
        with self._lock:
            entry = self._maps[id(buf)]
            entry[2] -= 1
            if entry[2]:
                return
            del self._maps[id(buf)]
            vk.vkUnmapMemory(self.ctx.slot.device, buf.memory)

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Refuse new jobs and wait (bounded) for those running: they read the device's memory.
        vkmulti.TimeoutError when some still run after `timeout` s (calling again waits for them)."""
        deadline = Deadline(timeout_seconds(timeout))
        with self._lock:
            self._destroyed = True
            jobs = list(self._jobs)
        for job in jobs:
            if not _waited(job, deadline):
                raise VkmTimeout(f"the host CRC32 engine of GPU {self.ctx.slot.index}: {len(jobs)} job(s) still "
                                 f"running after {timeout} s")
