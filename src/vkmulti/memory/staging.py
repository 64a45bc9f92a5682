"""Host-visible staging buffers of one device kept between uploads: StagingBuffers.

Making host-visible memory is not free on every driver (NVIDIA's: ~0.5 ms for
a buffer of any size, about as much again to free it), and a kernel restore,
a failover's restore among them, uploads its image through one. A device
keeps its largest recent staging buffer of at most `keep_bytes` and hands it
to the next upload that fits; the others are made and freed as before.
Sizes are rounded up to a power of two (at least MIN_BYTES) so that uploads
of similar sizes share one buffer.

An upload takes a buffer (a MappedBuffer: mapped for its whole life) with
take(), writes it with write(), and gives it back with give_back() once the
GPU no longer reads it (its submit waited for); a buffer whose submit may
still run is destroyed instead (its destroy() waits for the submits that
use it).
"""
from __future__ import annotations

import threading
from typing import Any, Iterable

import numpy as np
import vulkan as vk

from .._core.checks import is_int, short_repr
from .buffer import MappedBuffer

__all__ = ["StagingBuffers", "KEEP_BYTES", "MIN_BYTES", "SpareBuffers", "SPARE_BUFFERS", "SPARE_BYTES"]

#: The largest staging buffer a device keeps for the next upload.
KEEP_BYTES = 16 << 20
#: The smallest staging buffer made (smaller uploads share it).
MIN_BYTES = 64 << 10


def _rounded(nbytes: int) -> int:
    return max(MIN_BYTES, 1 << (nbytes - 1).bit_length())


class StagingBuffers:
    """The staging buffers of uploads on one device `slot` (see the module docstring)."""

    def __init__(self, slot: Any, keep_bytes: int = KEEP_BYTES):
        if not is_int(keep_bytes) or keep_bytes < 0:
            raise ValueError(f"keep_bytes must be a non-negative int, got {short_repr(keep_bytes)}")
        self.slot, self.keep_bytes = slot, keep_bytes
        self._lock = threading.Lock()
        self._kept: MappedBuffer | None = None
        self._closed = False
        #: buffers made, and takes served by the kept one (for tests and benches)
        self.made = self.reused = 0

    def take(self, nbytes: int) -> MappedBuffer:
        """A host-visible transfer-source buffer of at least `nbytes` (> 0) bytes, the
        caller's until give_back() or its destroy()."""
        if not is_int(nbytes) or nbytes < 1:
            raise ValueError(f"nbytes must be a positive int, got {short_repr(nbytes)}")
        with self._lock:
            kept = self._kept
            if kept is not None and kept.size >= nbytes and not kept.destroyed:
                self._kept = None
                self.reused += 1
                return kept
            self.made += 1
        size = _rounded(nbytes) if nbytes <= self.keep_bytes else nbytes
        return MappedBuffer(self.slot, size, usage=vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT, zero=False)

    def write(self, buf: MappedBuffer, places: Iterable[tuple[int, np.ndarray]]) -> None:
        """Write each (offset, bytes) of `places` into `buf`."""
        places = [(at, np.ascontiguousarray(data).reshape(-1).view(np.uint8)) for at, data in places]
        for at, data in places:
            if at < 0 or at + data.nbytes > buf.size:
                raise ValueError(f"the bytes end at {at + data.nbytes}, past the {buf.size}-byte staging buffer")
        for at, data in places:
            buf.bytes[at:at + data.nbytes] = data

    def give_back(self, buf: MappedBuffer) -> None:
        """Keep `buf` (taken here; the GPU no longer reads it) for the next upload, or
        destroy it: larger than keep_bytes, smaller than the one kept, or closed."""
        drop: MappedBuffer | None = buf
        if buf.size <= self.keep_bytes and not buf.destroyed:
            with self._lock:
                if not self._closed and (self._kept is None or self._kept.size < buf.size):
                    drop, self._kept = self._kept, buf
        if drop is not None:
            drop.destroy()

    def destroy(self) -> None:
        """Free the kept buffer; later give_back() calls destroy theirs."""
        with self._lock:
            self._closed = True
            kept, self._kept = self._kept, None
        if kept is not None:
            kept.destroy()


#: Spare copy buffers kept per (device, size): enough for the steps in flight, the
#: completed capture kept and one being read, where they are small.
SPARE_BUFFERS = 6
#: ... and at most this many bytes of them per (device, size) beyond the first two.
SPARE_BYTES = 64 << 20


class SpareBuffers:
    """Free host-visible copy buffers kept per (device, size) for later copies of the same
    size: up to SPARE_BUFFERS of them where they are small, at least two; `largest`: a
    buffer above this many bytes is never kept, `total`: at most this many bytes kept
    in all (None: no bound). Thread-safe; a buffer given after destroy() is freed."""

    def __init__(self, largest: int | None = None, total: int | None = None) -> None:
        self._lock = threading.Lock()
        self._pools: dict[tuple[int, int], list[MappedBuffer]] = {}
        self._largest, self._total = largest, total
        self._bytes = 0
        self._closed = False

    def get(self, slot: Any, size: int) -> MappedBuffer:
        """A host-visible buffer of `size` bytes on the device of `slot`: a kept one, else a new one."""
        return self.take(slot.index, size) or MappedBuffer(slot, size)

    def take(self, device: int, size: int) -> MappedBuffer | None:
        """A kept buffer of `size` bytes on `device`, or None."""
        with self._lock:
            pool = self._pools.get((device, size))
            if not pool:
                return None
            self._bytes -= size
            return pool.pop()

    def give(self, buf: MappedBuffer) -> None:
        """Keep `buf` (nothing reads or writes it any more) for a later copy, or free it."""
        size = buf.size
        with self._lock:
            if not self._closed and (self._largest is None or size <= self._largest) and \
                    (self._total is None or self._bytes + size <= self._total):
                pool = self._pools.setdefault((buf.slot.index, size), [])
                n = len(pool)
                if n < 2 or (n < SPARE_BUFFERS and (n + 1) * size <= SPARE_BYTES):
                    pool.append(buf)
                    self._bytes += size
                    return
        buf.destroy()

    def destroy(self) -> None:
        """Free every kept buffer; later ones given are freed at once."""
        with self._lock:
            pools, self._pools = self._pools, {}
            self._bytes = 0
            self._closed = True
        for pool in pools.values():
            for b in pool:
                b.destroy()
