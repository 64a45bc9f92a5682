"""What Buffer and Image share: device memory, a lifetime, and the GPU work that still uses them.

A resource is adopted by its manager (destroyed with it, before any device),
runs every operation inside its lifetime (so destroy() on another thread
waits for the operation instead of freeing memory under it), and tracks the
jobs that still use it on the GPU (transfers, host-port copies, abandoned
one-shot submits): destroy() waits for them, and keeps everything, raising
vkmulti.TimeoutError, when they are not done in time.
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Self

import numpy as np
import vulkan as vk

from ..errors import OutOfDeviceMemoryError, UnsupportedError
from ..errors import TimeoutError as VkmTimeoutError
from .._core import vkapi
from .._core.checks import seconds_text
from .._core.lifetime import Deadline, Lifetime
from ..device.slots import slot_lifetime

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from .._core.protocols import HostData
    from ..device.manager import DeviceSlot

log = logging.getLogger(__name__)

__all__ = ["GpuResource", "as_host_bytes", "find_memory_type", "allocate_memory", "MAX_BYTES"]

#: Sizes vkmulti accepts for one buffer or allocation (VkDeviceSize is 64 bits;
#: no device has more memory than this).
MAX_BYTES = 1 << 62


def find_memory_type(slot: DeviceSlot, bits: int, required: int, preferred: int = 0) -> int:
    props = vk.vkGetPhysicalDeviceMemoryProperties(slot.physical_device)
    fallback = -1
    for i in range(props.memoryTypeCount):
        flags = props.memoryTypes[i].propertyFlags
        if bits & (1 << i) and flags & required == required:
            if flags & preferred == preferred:
                return i
            if fallback < 0:
                fallback = i
    if fallback < 0:
        raise UnsupportedError(f"no memory type with flags 0x{required:x} on {slot.name!r}", device=slot.name)
    return fallback


def allocate_memory(slot: Any, req: Any, required: int, preferred: int) -> Any:
    """vkAllocateMemory for requirements `req`; OutOfDeviceMemoryError (no driver
    call) when the size exceeds the memory heap of the type chosen."""
    index = find_memory_type(slot, req.memoryTypeBits, required, preferred)
    props = vk.vkGetPhysicalDeviceMemoryProperties(slot.physical_device)
    heap = int(props.memoryHeaps[props.memoryTypes[index].heapIndex].size)
    if req.size > heap:
        raise OutOfDeviceMemoryError(-2, "vkAllocateMemory", f"{req.size} bytes do not fit the {heap}-byte memory "
                                                             f"heap of {slot.name!r}")
    info = vk.VkMemoryAllocateInfo(sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=req.size,
                                   memoryTypeIndex=index)
    return vkapi.vkAllocateMemory(slot.device, info, None)


#: The transfer usage bits (the same values for buffers and images) by the side of a copy.
_TRANSFER_BITS = {"src": vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT, "dst": vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT}


def require_transfer_usage(usage: int, side: str, kind: str, label: str, hint: str = "") -> None:
    """ValueError naming `label` where a `kind` ("buffer" or "image") made with `usage`
    lacks the transfer usage bit of `side` ("src": a copy reads it, "dst": writes it):
    the copy command would be invalid Vulkan."""
    if not usage & _TRANSFER_BITS[side]:
        raise ValueError(f"{label} lacks VK_{kind.upper()}_USAGE_TRANSFER_{side.upper()}_BIT "
                         f"(usage 0x{usage:x}){hint}")


def as_host_bytes(data: HostData, what: str = "data", *, writable: bool = False) -> NDArray[np.uint8]:
    """The bytes of a C-contiguous buffer of plain data as a 1-D uint8 view (no copy).

    Only plain-old-data is accepted: an array of Python objects (numpy dtype
    object, or any buffer whose format holds 'O') is a TypeError, since its
    bytes are pointers that the GPU would copy or overwrite.
    """
    if isinstance(data, np.ndarray) and data.dtype.hasobject:
        raise TypeError(f"{what} holds Python objects (dtype {data.dtype}); pass plain data (numbers, bytes)")
    try:
        mv = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be bytes, a numpy array or another buffer-protocol object, "
                        f"got {type(data).__name__}") from None
    if "O" in mv.format and _has_objects(mv):
        raise TypeError(f"{what} holds Python objects (buffer format {mv.format[:40]!r}); pass plain data")
    if not mv.c_contiguous:
        raise ValueError(f"{what} is not C-contiguous (shape {mv.shape}, strides {mv.strides}); "
                         f"pass numpy.ascontiguousarray({what})"[:300])
    if writable and mv.readonly:
        raise ValueError(f"{what} is read-only; results need a writable array")
    if mv.nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    return np.frombuffer(mv, dtype=np.uint8)


def _has_objects(mv: memoryview) -> bool:
    """Whether a buffer's PEP 3118 format has object fields ('O' may also be part of a field name)."""
    try:
        return np.asarray(mv).dtype.hasobject
    except (TypeError, ValueError, NotImplementedError):
        return True   # a format numpy cannot read that mentions 'O': refuse rather than guess


class GpuResource:
    """Base of Buffer and Image (see the module docstring)."""

    _teardown_rank = 50   # after transfers and the owners that use resources
    slot: DeviceSlot
    _life: Lifetime
    _free: Callable[[], None]   # each resource frees its own handles (Buffer._free, Image._free)

    def __init__(self, slot: DeviceSlot) -> None:
        """The lifetime (a child of the slot's manager) and the job list; subclasses
        call it once their own fields exist, before they make any handle."""
        self._life = Lifetime(self, type(self).__name__, (slot_lifetime(slot),))
        self._jobs: list[Any] = []
        self._jobs_lock = threading.Lock()
        self._prune_at = 16

    @property
    def destroyed(self) -> bool:
        return self._life.dead

    def operation(self) -> Lifetime:
        """A context manager that counts an operation on this resource: its destroy() waits
        for the operation to end (commands recorded from its handle on another thread, until
        they are submitted and tracked); DestroyedError on entry once it is destroyed."""
        return self._life

    def _track(self, job: Any) -> None:
        """Remember a GPU job that uses this resource (its destroy() waits for it).

        `job` has gpu_done(device_index) and gpu_wait(device_index, timeout)."""
        with self._jobs_lock:
            jobs = self._jobs
            if len(jobs) >= self._prune_at:   # keep it short, at a few native calls per job (amortised)
                jobs[:] = [j for j in jobs if not j.gpu_done(self.slot.index)]
                self._prune_at = max(16, 2 * len(jobs))
            jobs.append(job)

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Free the resource once the GPU work using it is done (idempotent).

        Waits for operations of other threads on it and for transfers and
        copies still queued; vkmulti.TimeoutError after `timeout` s, keeping it."""
        with self._life.ending(timeout) as dl:
            if dl is not None:
                self._settle(dl)
                self._free()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _settle(self, deadline: Deadline) -> None:
        """Wait until no tracked job uses this resource on the GPU any more.
        vkmulti.TimeoutError (the jobs not done stay tracked) when `deadline` passes."""
        while True:
            with self._jobs_lock:
                if not self._jobs:
                    return
                job = self._jobs[0]
            if not job.gpu_wait(self.slot.index, deadline.left()):
                raise VkmTimeoutError(f"GPU work still uses this {type(self).__name__} after {seconds_text(deadline.timeout)} s; "
                                      f"it was not destroyed (call destroy() again later)")
            with self._jobs_lock:
                if self._jobs and self._jobs[0] is job:
                    self._jobs.pop(0)
