"""The operations of one recorded step, packed for the native recorder
(StepCommands.record, vkm_step_op in native/vkm_step.h): fixed-size records
of passes, barriers, small updates and copies that the step recorder joins
and hands over in one call. A pass names its pipeline; the native side binds
it only where it is not the one bound already.

A kernel's own two passes of a step (its dispatch, and its finish pass, which
also surveys its new outbox) change little from step to step: KernelOps keeps
them packed per outbox region and patches only the step number and the clock.
"""
from __future__ import annotations

import struct
from typing import Any

from ..._core import _native
from ..._core.checks import U32_MAX

__all__ = ["OP", "OP_BYTES", "BARRIER", "HOST_BARRIER", "pass_op", "update_op", "copy_op", "KernelOps"]

OP = struct.Struct(_native.STEP_OP_FORMAT)
OP_BYTES = _native.STEP_OP_BYTES
if OP.size != OP_BYTES:   # (the two sides of one record layout)
    raise ImportError(f"vkmulti's native step op is {OP_BYTES} bytes, its format {OP.size}: a stale build")
_PASS, _UPDATE, _COPY = _native.STEP_OP_PASS, _native.STEP_OP_UPDATE, _native.STEP_OP_COPY
BARRIER = OP.pack(_native.STEP_OP_BARRIER, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b"")
HOST_BARRIER = OP.pack(_native.STEP_OP_HOST_BARRIER, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                       b"")
_NO_OFFSETS = (0, 0, 0, 0)
#: byte offset of a record's data (push constants, update bytes)
_DATA = OP.size - 128


def pass_op(pipeline: int, layout: int, dset: int, offsets: tuple, push: bytes, groups: tuple = (1, 1, 1),
            indirect: int = 0, indirect_offset: int = 0) -> bytes:
    """A pass: bind `pipeline` (0: the bound one) and set 0 of `layout` (`dset` with the
    dynamic `offsets`), push `push`, dispatch `groups` (or from `indirect` at `indirect_offset`)."""
    n = len(offsets)
    o = offsets + _NO_OFFSETS[n:] if n < 4 else offsets
    return OP.pack(_PASS, n, len(push), 0, groups[0], groups[1], groups[2], 0, o[0], o[1], o[2], o[3],
                   pipeline, layout, dset, indirect, indirect_offset, 0, 0, 0, push)


def update_op(buffer: int, offset: int, data: bytes) -> bytes:
    """vkCmdUpdateBuffer of `data` (4 to 128 bytes, a multiple of 4) at `offset` of `buffer`."""
    return OP.pack(_UPDATE, 0, len(data), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, buffer, offset, 0, 0, 0, data)


def copy_op(src: int, dst: int, src_offset: int, dst_offset: int, size: int) -> bytes:
    """vkCmdCopyBuffer of `size` bytes from `src` at `src_offset` to `dst` at `dst_offset`."""
    return OP.pack(_COPY, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, src, src_offset, dst, dst_offset, size, b"")


_STEP = struct.Struct("<2I")   # (push constants: little-endian, as the GPU reads them)
_OUTBOX_RESET = struct.Struct("<3I")   # count, step, capacity (a batch read in place changed the last two)
_CLOCK_STEP = struct.Struct("<4I")


class KernelOps:
    """One kernel's packed passes of a step in one outbox region: its dispatch and its
    finish pass (with the new outbox's survey), made once per `key` (what they bind
    and push, bar the step and the clock: a kernel that reads some batches in
    place binds other sets at those steps) and kept for the few keys seen last;
    and the update op that resets the region's outbox header.
    Not thread-safe: used by its device's recorder, under the device's lock."""

    __slots__ = ("made", "kernel", "finish", "reset", "reset_of")
    KEEP = 4

    def __init__(self) -> None:
        self.made: dict[Any, tuple[bytearray, bytearray]] = {}
        self.kernel = bytearray()
        self.finish = bytearray()
        self.reset = b""
        self.reset_of: tuple[Any, Any, int] | None = None   # (outbox buffer, spec, offset) it was made for

    def outbox_reset(self, outbox: Any, spec: Any, offset: int) -> bytes:
        """The update op that resets the outbox header (count, step, capacity) at `offset`
        of `outbox` for `spec`'s outbox capacity, made once per buffer, spec and offset."""
        made = self.reset_of
        if made is None or made[0] is not outbox or made[1] is not spec or made[2] != offset:
            self.reset = update_op(outbox.handle_int, offset, _OUTBOX_RESET.pack(0, 0, spec.outbox_capacity))
            self.reset_of = (outbox, spec, offset)
        return self.reset

    def get(self, key: tuple, make: Any, step: int | None = None, now_us: int = 0) -> "KernelOps":
        """These ops, made by `make()` -> (kernel op, finish op) for a `key` not seen lately;
        where `step` is given, stamped with it (the kernel's push words 0-1, the finish
        pass's 2-3) and the clock `now_us` (the finish pass's words 0-1)."""
        ops = self.made.get(key)
        if ops is None:
            if len(self.made) >= self.KEEP:
                self.made.clear()
            k, f = make()
            ops = self.made[key] = (bytearray(k), bytearray(f))
        self.kernel, self.finish = kernel, finish = ops
        if step is not None:
            lo, hi = step & U32_MAX, step >> 32
            _STEP.pack_into(kernel, _DATA, lo, hi)
            _CLOCK_STEP.pack_into(finish, _DATA, now_us & U32_MAX, now_us >> 32, lo, hi)
        return self
