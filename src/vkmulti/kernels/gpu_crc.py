"""CRC32 (zlib's IEEE CRC) of buffer ranges, computed on the GPU that holds them.

Live migration checks that the state that arrived on the destination GPU is
the state that left the source without reading either through the host: each
GPU hashes its own copy (native/shaders/crc32.comp) and only the two 32-bit
results come back. The shader splits a range into 1 KiB chunks, computes
each chunk's raw CRC with slice-by-4 tables in shared memory, then combines
them in order by a tree of "append n zero bytes" steps (a linear map: a
product of precomputed 32x32 bit matrices); the host applies the initial
value and final xor to the one raw CRC that comes back. The result equals
`zlib.crc32` of the same bytes.
"""
from __future__ import annotations

import struct
import threading
from functools import lru_cache
from typing import Any, Iterable, Sequence

import numpy as np
import vulkan as vk

from ..images import Buffer
from ..render import shader_path
from ..transfer import TimelinePoint
from . import commands as cmds
from .device_context import SB, WHOLE_SIZE, MappedBuffer
from .gpu_jobs import GpuJobs

__all__ = ["GpuCrc", "CrcJob", "crc32_finish", "CHUNK_BYTES"]

#: Bytes each invocation hashes in the first pass (4 KiB: on lavapipe fewer, longer chunks
#: beat more tree levels; on a GPU 16 MiB still makes 4096 invocations).
CHUNK_BYTES = 4096
_CHUNK_WORDS = CHUNK_BYTES // 4
_PUSH = struct.Struct("<8I")
_GROUP = 64
_U32 = 0xFFFFFFFF


@lru_cache(maxsize=1)
def _table() -> tuple[int, ...]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        out.append(c)
    return tuple(out)


def _apply(columns: Sequence[int], x: int) -> int:
    r = 0
    j = 0
    while x:
        if x & 1:
            r ^= columns[j]
        x >>= 1
        j += 1
    return r


@lru_cache(maxsize=1)
def shift_matrices() -> tuple[tuple[int, ...], ...]:
    """32 matrices (32 column words each): the k-th appends 2**k zero bytes to a raw CRC."""
    t = _table()
    one = tuple((t[(1 << j) & 0xFF] ^ ((1 << j) >> 8)) for j in range(32))
    mats = [one]
    for _ in range(31):
        m = mats[-1]
        mats.append(tuple(_apply(m, _apply(m, 1 << j)) for j in range(32)))
    return tuple(mats)


def _shift(x: int, nbytes: int) -> int:
    mats = shift_matrices()
    k = 0
    while nbytes:
        if nbytes & 1:
            x = _apply(mats[k], x)
        nbytes >>= 1
        k += 1
    return x


def crc32_finish(raw: int, nbytes: int) -> int:
    """zlib's CRC32 from the raw CRC (register from 0, no final xor) of `nbytes` bytes."""
    return (raw ^ _shift(_U32, nbytes) ^ _U32) & _U32


class CrcJob:
    """CRC32s being computed on one GPU; result() waits and returns them in order."""

    def __init__(self, owner: "GpuCrc", point: TimelinePoint | None, sizes: list[int], results: Any,
                 release: Any):
        self._owner, self.point, self._sizes = owner, point, sizes
        self._results, self._release = results, release
        self._values: list[int] | None = None

    def result(self, timeout: float | None = 60.0) -> list[int]:
        if self._values is None:
            try:
                if self.point is not None:
                    self._owner.jobs.wait(self.point, timeout)
                raw = self._results.words[:len(self._sizes)].tolist() if self._results is not None else []
                self._values = [crc32_finish(int(r), n) if n else 0 for r, n in zip(raw, self._sizes)] \
                    if self._results is not None else [0] * len(self._sizes)
            finally:
                if self._release is not None and self._values is not None:
                    self._release()
                    self._release = None
        return list(self._values)


class GpuCrc:
    """The CRC32 pass on one runtime device context (pipeline, shift matrices,
    reusable scratch). `submit(ranges, waits)` returns a CrcJob."""

    def __init__(self, ctx: Any, jobs: GpuJobs):
        self.ctx, self.jobs = ctx, jobs
        slot = ctx.slot
        with ctx.lock:
            self.pass_ = ctx.pipeline(shader_path("crc32.comp.spv").read_bytes(), "main", [SB, SB, SB], _PUSH.size)
        self.matrices = Buffer(slot, 32 * 32 * 4)
        self._lock = threading.Lock()
        self._spare: tuple[Buffer, MappedBuffer] | None = None
        self._spare_chunks = 0
        try:
            data = np.array([c for m in shift_matrices() for c in m], np.uint32)
            staging = MappedBuffer(slot, data.nbytes)
            try:
                staging.words[:] = data
                ctx.runner.run(lambda cmd: vk.vkCmdCopyBuffer(cmd, staging.handle, self.matrices.handle, 1, [
                    vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=data.nbytes)]))
            finally:
                staging.destroy()
        except BaseException:
            self.matrices.destroy()
            raise

    def _scratch(self, chunks: int, count: int) -> tuple[Buffer, MappedBuffer, Any]:
        """A scratch buffer of `chunks` words and a results buffer of `count` words,
        with the function that gives them back."""
        with self._lock:
            spare = self._spare
            if spare is not None and self._spare_chunks >= chunks and spare[1].size >= 4 * count:
                self._spare = None

                def give_back() -> None:
                    with self._lock:
                        if self._spare is None:
                            self._spare = spare
                            return
                    spare[0].destroy()
                    spare[1].destroy()
                return spare[0], spare[1], give_back
        size = max(chunks, 1024)
        scratch = Buffer(self.ctx.slot, 4 * size)
        try:
            results = MappedBuffer(self.ctx.slot, 4 * max(count, 16))
        except BaseException:
            scratch.destroy()
            raise

        def keep() -> None:
            with self._lock:
                if self._spare is None or self._spare_chunks < size:
                    old, self._spare, self._spare_chunks = self._spare, (scratch, results), size
                else:
                    old = (scratch, results)
            if old is not None:
                old[0].destroy()
                old[1].destroy()
        return scratch, results, keep

    def submit(self, ranges: Iterable[tuple[Any, int, int]], waits: Iterable[TimelinePoint] = ()) -> CrcJob:
        """CRC32 of each (buffer, offset, size) (offset and size multiples of 4;
        buffers on this device), after the timeline points `waits` (on this device)."""
        ranges = list(ranges)
        for buf, off, size in ranges:
            if off % 4 or size % 4 or off < 0 or size < 0 or off + size > buf.size:
                raise ValueError(f"CRC range [{off}, {off + size}) of a {buf.size}-byte buffer: offsets and sizes "
                                 f"must be multiples of 4 within the buffer")
        sizes = [size for _, _, size in ranges]
        chunk_counts = [(size // 4 + _CHUNK_WORDS - 1) // _CHUNK_WORDS for size in sizes]
        if not any(sizes):
            return CrcJob(self, None, sizes, None, None)
        scratch, results, release = self._scratch(sum(chunk_counts), len(ranges))
        ctx = self.ctx
        sets: list[Any] = []
        try:
            with ctx.lock:
                for buf, _, _ in ranges:
                    sets.append(ctx.descriptor_set(self.pass_, [(buf.handle, 0, WHOLE_SIZE),
                                                                (scratch.handle, 0, WHOLE_SIZE),
                                                                (self.matrices.handle, 0, WHOLE_SIZE)]))
            bases, at = [], 0
            for n in chunk_counts:
                bases.append(at)
                at += n
            layout, pipe = self.pass_.layout, self.pass_.pipeline

            def record(cmd: Any) -> None:
                cmds.barrier(cmd)
                cmds.bind_pipeline(cmd, pipe)
                for (buf, off, size), (_, dset), base, n in zip(ranges, sets, bases, chunk_counts):
                    if not n:
                        continue
                    cmds.bind_set(cmd, layout, dset, ())
                    cmds.push(cmd, layout, _PUSH.pack(0, off // 4, size // 4, _CHUNK_WORDS, 0, n, base, 0))
                    cmds.dispatch(cmd, (n + _GROUP - 1) // _GROUP)
                stride = 1
                while stride < max(chunk_counts):
                    cmds.barrier(cmd)
                    for (buf, off, size), (_, dset), base, n in zip(ranges, sets, bases, chunk_counts):
                        if n <= stride:
                            continue
                        pairs = (n + 2 * stride - 1) // (2 * stride)
                        cmds.bind_set(cmd, layout, dset, ())
                        cmds.push(cmd, layout, _PUSH.pack(1, off // 4, size // 4, _CHUNK_WORDS, stride, n, base, 0))
                        cmds.dispatch(cmd, (pairs + _GROUP - 1) // _GROUP)
                    stride *= 2
                cmds.barrier(cmd)
                for i, (base, n) in enumerate(zip(bases, chunk_counts)):
                    if n:
                        vk.vkCmdCopyBuffer(cmd, scratch.handle, results.handle, 1, [
                            vk.VkBufferCopy(srcOffset=4 * base, dstOffset=4 * i, size=4)])
                cmds.barrier(cmd, host=True)
            point = self.jobs.submit(record, [(p.semaphore, p.value) for p in waits])
        except BaseException:
            with ctx.lock:
                for s in sets:
                    ctx.free_set(s)
            release()
            raise

        def done() -> None:
            with ctx.lock:
                for s in sets:
                    if ctx.alive:
                        ctx.free_set(s)
            release()
        return CrcJob(self, point, sizes, results, done)

    def run(self, ranges: Iterable[tuple[Any, int, int]], waits: Iterable[TimelinePoint] = (),
            timeout: float | None = 60.0) -> list[int]:
        return self.submit(ranges, waits).result(timeout)

    def destroy(self) -> None:
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            spare[0].destroy()
            spare[1].destroy()
        self.matrices.destroy()
