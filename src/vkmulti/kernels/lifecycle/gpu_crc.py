"""CRC32 (zlib's IEEE CRC) of buffer ranges, computed on the GPU that holds them.

Live migration checks that the state that arrived on the destination GPU is
the state that left the source without reading either through the host: each
GPU hashes its own copy (native/shaders/crc32.comp) and only one 32-bit raw
CRC per range comes back. One dispatch per range: each workgroup hashes its
own block (lanes on interleaved words on a GPU, coalesced; on contiguous
pieces on a CPU device), shifts its CRC to the end
of the range with the zero-byte tables (below) and xors it into the
range's result; no pass between workgroups, no tree. The host applies the
initial value and final xor. The result equals `zlib.crc32` of the same bytes.

The GF(2) algebra both CRC32 engines share (zlib's IEEE CRC-32, here and
nowhere else): a raw CRC (register from 0, no final xor) is linear, the raw
CRC of A||B is Z(|B|)(raw(A)) ^ raw(B), where Z(n) appends n zero bytes to a
register, a 32x32 bit matrix applied as 4 lookups in a 4x256 table
(`zero_tables()[k]` is Z(2**k)); any n is the product of the tables of its
set bits. The shader combines its per-lane pieces with the tables, the host
engine (host_crc.py) combines zlib's CRCs of pieces with `crc32_combine`.
"""
from __future__ import annotations

import logging
import struct
import threading
import zlib
from functools import lru_cache
from typing import Any, Iterable

import numpy as np
import vulkan as vk

from ..._core.checks import is_int, short_repr
from ..._core.lifetime import Deadline
from ...errors import TimeoutError as VkmTimeout, VkmError
from ...memory.image import Buffer
from ..._core.shaders import shader_bytes
from ..._core.timeline import TimelinePoint
from ...memory.buffer import MappedBuffer
from ..engine.device_context import SB, WHOLE_SIZE
from ..engine.gpu_jobs import GpuJobs
from ..engine.recording import handle_value
from ..engine.step_ops import BARRIER, HOST_BARRIER, pass_op

log = logging.getLogger(__name__)

__all__ = ["GpuCrc", "CrcJob", "zero_tables", "shift", "crc32_finish", "crc32_combine", "raw_crc", "check_ranges",
           "crc_pass_spec", "LANES"]

# -- the CRC algebra ------------------------------------------------------------------------

_U32 = 0xFFFFFFFF
_POLY = 0xEDB88320


@lru_cache(maxsize=1)
def zero_tables() -> np.ndarray:
    """uint32[32, 4, 256]: [k, j, v] = Z(2**k)(v << 8j). [0, 0] is zlib's byte table."""
    byte = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        byte = np.where(byte & 1, (byte >> 1) ^ np.uint32(_POLY), byte >> 1).astype(np.uint32)
    one = np.empty((4, 256), np.uint32)
    one[0] = byte
    for j in range(1, 4):   # Z(1)(v << 8j) = v << 8(j-1): the low byte is zero
        one[j] = np.arange(256, dtype=np.uint32) << np.uint32(8 * (j - 1))
    out = np.empty((32, 4, 256), np.uint32)
    out[0] = one
    for k in range(1, 32):
        prev = out[k - 1]
        out[k] = _apply(prev, prev)   # Z(2n) = Z(n) o Z(n), column by column
    out.setflags(write=False)
    return out


def _apply(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    return table[0][x & 0xFF] ^ table[1][(x >> 8) & 0xFF] ^ table[2][(x >> 16) & 0xFF] ^ table[3][x >> 24]


def shift(x: int, nbytes: int) -> int:
    """Z(nbytes)(x): the raw CRC register `x` after `nbytes` more zero bytes."""
    if nbytes < 0:
        raise ValueError(f"a shift appends zero bytes: nbytes must be >= 0, got {nbytes}")
    t = zero_tables()
    k = 0
    while nbytes:
        if nbytes & 1:
            x = int(t[k, 0, x & 0xFF] ^ t[k, 1, (x >> 8) & 0xFF] ^ t[k, 2, (x >> 16) & 0xFF] ^ t[k, 3, x >> 24])
        nbytes >>= 1
        k += 1
    return x & _U32


def crc32_finish(raw: int, nbytes: int) -> int:
    """zlib's CRC32 from the raw CRC (register from 0, no final xor) of `nbytes` bytes."""
    return (raw ^ shift(_U32, nbytes) ^ _U32) & _U32


def crc32_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """zlib.crc32(a + b) from zlib.crc32(a), zlib.crc32(b) and len(b) (zlib's crc32_combine)."""
    return (shift(crc_a, len_b) ^ crc_b) & _U32


def raw_crc(data: bytes) -> int:
    """The raw CRC of `data` (for tests: bytewise, the definition itself)."""
    t = zero_tables()[0, 0]
    c = 0
    for b in data:
        c = (c >> 8) ^ int(t[(c ^ b) & 0xFF])
    return c


# -- the shader ---------------------------------------------------------------------------

#: Invocations per workgroup (the shader's local_size_x).
LANES = 64
_PUSH = struct.Struct("<5I")
_MAX_GROUPS = 65535          # maxComputeWorkGroupCount[0] every Vulkan device has
#: Words each lane hashes per block: on a GPU blocks short enough for many workgroups
#: (16 MiB: 1024 of them) and long enough that a workgroup's 4 KiB table load is a
#: small part of its reads (H100, 16 MiB interleaved: 64 words 86 us a job, 16 words
#: 92, 256 words 96); on a CPU device (llvmpipe) long blocks amortise each
#: workgroup's table load (measured: 1024 words ~25% faster than 256).
LANE_WORDS_GPU = 64
LANE_WORDS_CPU = 1024
_SPARES = 4   # results buffers a GpuCrc keeps (a move's jobs on one device: two at once)
_READY = 2    # results buffers and command buffers a GpuCrc makes at once (a move's jobs on one device)
_RESULT_WORDS = 16   # the smallest results buffer (one word per range: a move's jobs hash a few)
_SELF_CHECK_ODD = (4, 4003)   # (offset, bytes) of the odd range a new engine checks itself with


def check_ranges(ranges: Iterable[tuple[Any, int, int]], *, word_tail: bool) -> list[tuple[Any, int, int]]:
    """The (buffer, offset, size) ranges as a list, each checked: ints, offset a
    multiple of 4, within the buffer (`word_tail`: also the word holding a size's
    last 1-3 bytes), size below 4 GiB."""
    out = []
    for item in ranges:
        try:
            buf, off, size = item
        except (TypeError, ValueError):
            raise TypeError(f"a CRC range is (buffer, offset, size), got {short_repr(item)}") from None
        for label, v in (("offset", off), ("size", size)):
            if not is_int(v):
                raise TypeError(f"CRC range {label} must be an int, got {type(v).__name__}")
        total = getattr(buf, "size", None)
        if not isinstance(total, int) or getattr(buf, "handle", None) is None:
            raise TypeError(f"a CRC range's buffer must be a live vkmulti Buffer, got {type(buf).__name__}")
        end = off + ((size + 3) & ~3 if word_tail else size)
        if off % 4 or off < 0 or size < 0 or size >= 1 << 32 or end > total:
            raise ValueError(f"CRC range [{off}, {off + size}) of a {total}-byte buffer: the offset must be a "
                             f"multiple of 4 and the range within the buffer"
                             + (" up to a whole last word" if word_tail else "") + " (size < 4 GiB)")
        out.append((buf, off, size))
    return out


class CrcJob:
    """CRC32s being computed on one GPU; result() waits and returns them in order."""

    def __init__(self, owner: "GpuCrc", point: TimelinePoint | None, sizes: list[int], results: Any,
                 release: Any):
        self._owner, self.point, self._sizes = owner, point, sizes
        self._results, self._release = results, release
        self._values: list[int] | None = None

    def result(self, timeout: float | None = 60.0) -> list[int]:
        """The zlib CRC32 of each range; vkmulti.TimeoutError after `timeout` s."""
        if self._values is None:
            if self.point is not None:
                self._owner.jobs.wait(self.point, timeout)
            raw = self._results.words[:len(self._sizes)].tolist() if self._results is not None else []
            self._values = [crc32_finish(int(r), n) if n else 0 for r, n in zip(raw, self._sizes)] \
                if self._results is not None else [0] * len(self._sizes)
            self.close()
        return list(self._values)

    def close(self, timeout: float | None = 30.0) -> None:
        """Give the job's buffers back once the GPU is done with them (result() does;
        a caller that drops a job unread calls this)."""
        if self._release is None:
            return
        if self.point is not None and self._values is None:
            try:
                self._owner.jobs.wait(self.point, timeout)
            except VkmTimeout:
                return   # still running: its buffers stay (freed with the device)
        release, self._release = self._release, None
        release()


def crc_pass_spec() -> tuple[bytes, str, list, int]:
    """(SPIR-V, entry point, descriptor types, push bytes) of the CRC32 shader's pipeline."""
    return shader_bytes("crc32.comp.spv"), "main", [SB, SB, SB], _PUSH.size


class GpuCrc:
    """The CRC32 shader on one runtime device context (pipeline, zero-byte tables,
    a reusable results buffer). `submit(ranges, waits)` returns a CrcJob."""

    kind = "shader"

    def __init__(self, ctx: Any, jobs: GpuJobs, lane_words: int | None = None, contiguous: bool | None = None,
                 timeout: float | None = 60.0):
        """`lane_words` and `contiguous` (the shader's layout, see crc32.comp):
        by default interleaved with 64 words a lane on a GPU, contiguous with
        1024 on a CPU device (llvmpipe runs interleaved gathers ~2x slower).
        `timeout`: for its set-up (the pipeline, the tables' upload, the self-check)
        all together; vkmulti.TimeoutError after it."""
        deadline = Deadline(timeout)
        self.ctx, self.jobs = ctx, jobs
        slot = ctx.slot
        caps = getattr(slot, "capabilities", None)
        cpu = caps is not None and getattr(caps, "device_type", "") == "cpu"
        if lane_words is None:
            lane_words = LANE_WORDS_CPU if cpu else LANE_WORDS_GPU
        if not is_int(lane_words) or not 1 <= lane_words <= 1 << 16:
            raise ValueError(f"lane_words must be an int in [1, 65536], got {short_repr(lane_words)}")
        if contiguous is None:
            contiguous = cpu
        if not isinstance(contiguous, bool):
            raise TypeError(f"contiguous must be a bool, got {type(contiguous).__name__}")
        self.lane_words, self.contiguous = lane_words, contiguous
        with ctx.lock:
            self.pass_ = ctx.pipeline(*crc_pass_spec(), timeout=deadline.left())
        data = np.ascontiguousarray(zero_tables()).reshape(-1)
        self.tables = Buffer(slot, data.nbytes)
        self._lock = threading.Lock()
        self._spares: list[MappedBuffer] = []
        try:
            staging = MappedBuffer(slot, data.nbytes)
            try:
                staging.words[:] = data
                ctx.runner.run(lambda cmd: vk.vkCmdCopyBuffer(cmd, staging.handle, self.tables.handle, 1, [
                    vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=data.nbytes)]), timeout=deadline.left())
            finally:
                staging.destroy()
            # what a move's jobs use on one device at once, made now: its first jobs allocate
            # nothing (host-visible memory costs ~0.5 ms an allocation on a GPU's driver)
            jobs.prepare(_READY)
            for _ in range(_READY):
                self._spares.append(MappedBuffer(slot, 4 * _RESULT_WORDS))
            self._check_itself(data.view(np.uint8), deadline)
        except BaseException as exc:
            for b in self._spares:
                b.destroy()
            try:   # (not under a self-check still running: kept then, freed with the device)
                self.tables.destroy(deadline.left())
            except Exception as more:   # (the error raised is the one that stopped the engine)
                log.warning("GPU %d: the CRC32 tables of an engine that failed (%s) were not freed: %s",
                            ctx.index, exc, more)
            raise

    def _check_itself(self, tables: np.ndarray, deadline: Deadline) -> None:
        """One job at once, on the engine's own tables (`tables`: their bytes): all of them
        (several workgroups, their results combined) and an odd range (a partial block,
        tail bytes). The pipeline's first dispatch and the queue's first submit are paid
        here, not by a move; a device whose hashes differ from zlib's is refused (both
        sides of a move hash alike: a wrong engine would pass every check)."""
        at, size = _SELF_CHECK_ODD
        want = [zlib.crc32(tables.tobytes()), zlib.crc32(tables[at:at + size].tobytes())]
        job = self.submit([(self.tables, 0, tables.nbytes), (self.tables, at, size)])
        try:
            got = job.result(deadline.left())
        except BaseException:
            job.close(deadline.left())
            raise
        if got != want:
            raise VkmError(f"the CRC32 shader on GPU {self.ctx.index} hashed its own tables to "
                           f"{', '.join(f'{g:#010x}' for g in got)}, zlib to {', '.join(f'{w:#010x}' for w in want)}: "
                           f"its checks cannot be trusted on this device (migrate with verify=False to move "
                           f"without the check)")

    def _results(self, count: int) -> tuple[MappedBuffer, Any]:
        """A zeroed host-visible buffer of `count` words and the function that gives it back
        (kept for the next job: a move's jobs, in flight together, make none)."""
        with self._lock:
            i = next((i for i, b in enumerate(self._spares) if b.size >= 4 * count), None)
            spare = self._spares.pop(i) if i is not None else None
        buf = spare if spare is not None else MappedBuffer(self.ctx.slot, 4 * max(count, _RESULT_WORDS))
        buf.words[:count] = 0

        def give_back() -> None:
            with self._lock:
                keep = len(self._spares) < _SPARES
                if keep:
                    self._spares.append(buf)
            if not keep:
                buf.destroy()
        return buf, give_back

    def submit(self, ranges: Iterable[tuple[Any, int, int]], waits: Iterable[TimelinePoint] = ()) -> CrcJob:
        """CRC32 of each (buffer, offset, size) (offset a multiple of 4, any size;
        buffers on this device), after the timeline points `waits` (on this device)."""
        ranges = check_ranges(ranges, word_tail=True)
        sizes = [size for _, _, size in ranges]
        if not any(sizes):
            return CrcJob(self, None, sizes, None, None)
        results, release = self._results(len(ranges))
        ctx = self.ctx
        sets: list[Any] = []
        try:
            by_buffer: dict[int, Any] = {}   # one descriptor set per buffer (a move's chunks share theirs)
            with ctx.lock:
                for buf, _, size in ranges:
                    if size and id(buf) not in by_buffer:
                        sets.append(ctx.descriptor_set(self.pass_, [(buf.handle, 0, WHOLE_SIZE),
                                                                    (results.handle, 0, WHOLE_SIZE),
                                                                    (self.tables.handle, 0, WHOLE_SIZE)]))
                        by_buffer[id(buf)] = sets[-1][1]
            pipe, layout = self.pass_.pipeline_int, self.pass_.layout_int
            ops = [BARRIER]
            for i, (buf, off, size) in enumerate(ranges):   # independent: no barrier between ranges
                if not size:
                    continue
                words = size // 4
                lane_words = max(self.lane_words, -(-words // (LANES * _MAX_GROUPS)))
                groups = max(1, -(-words // (LANES * lane_words)))
                ops.append(pass_op(pipe, layout, handle_value(by_buffer[id(buf)]), (),
                                   _PUSH.pack(off // 4, size, lane_words, i, int(self.contiguous)), (groups, 1, 1)))
            ops.append(HOST_BARRIER)
            point = self.jobs.submit_ops(b"".join(ops), [(p.semaphore, p.value) for p in waits],
                                         users=[buf for buf, _, _ in ranges])
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
            spares, self._spares = self._spares, []
        for b in spares:
            b.destroy()
        self.tables.destroy()
