"""Command recording for the kernel runtime's one-shot command buffers.

A step's own command buffer is recorded and submitted natively (the device
context's StepCommands, native/vkm_step.c); the runtime's other command
buffers (replay log copies, checkpoints, migrations) use these, which call the
loader's entry points through the `vulkan` package's cffi `lib` directly with
prebuilt structs (the calls return nothing, so there is no VkResult to check).
`handle_value` gives a cffi handle's int for the native recorder.
"""
from __future__ import annotations

from typing import Any

import vulkan as vk

from ..._core import vkapi
from ...errors import raise_for_result

_lib, _ffi = vk.lib, vk.ffi
_NULL = _ffi.NULL
BIND = vk.VK_PIPELINE_BIND_POINT_COMPUTE
STAGE = vk.VK_SHADER_STAGE_COMPUTE_BIT
ALL = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
_MEMORY = vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT


_VALUES: dict[Any, int] = {}
_MAX_VALUES = 1 << 14


def handle_value(handle: Any) -> int:
    """The int value of a cffi Vulkan handle (an int is returned as is). Kept per
    handle: a cffi pointer hashes and compares by its address, so an entry can never
    give another handle's value, even once its object was destroyed and the address
    reused; the map is emptied when it grows past _MAX_VALUES."""
    v = _VALUES.get(handle)
    if v is None:
        if isinstance(handle, int):
            return handle
        if len(_VALUES) >= _MAX_VALUES:
            _VALUES.clear()
        v = _VALUES[handle] = int(_ffi.cast("uintptr_t", handle))
    return v


def _memory_barrier(dst_access: int) -> Any:
    b = _ffi.new("VkMemoryBarrier*")
    b.sType = vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER
    b.srcAccessMask = _MEMORY
    b.dstAccessMask = dst_access
    return b


_BARRIER = _memory_barrier(_MEMORY)
_BARRIER_HOST = _memory_barrier(_MEMORY | vk.VK_ACCESS_HOST_READ_BIT)


def barrier(cmd: Any, host: bool = False) -> None:
    """A global memory barrier: everything before, for everything after (`host`: and for host reads)."""
    if host:
        _lib.vkCmdPipelineBarrier(cmd, ALL, ALL | vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1, _BARRIER_HOST, 0, _NULL,
                                  0, _NULL)
    else:
        _lib.vkCmdPipelineBarrier(cmd, ALL, ALL, 0, 1, _BARRIER, 0, _NULL, 0, _NULL)


def bind_pipeline(cmd: Any, pipeline: Any) -> None:
    _lib.vkCmdBindPipeline(cmd, BIND, pipeline)


def bind_set(cmd: Any, layout: Any, dset: Any, offsets: tuple[int, ...]) -> None:
    """Bind descriptor set 0 with the dynamic offsets of its dynamic buffers."""
    _lib.vkCmdBindDescriptorSets(cmd, BIND, layout, 0, 1, _ffi.new("VkDescriptorSet[1]", [dset]), len(offsets),
                                 _ffi.new("uint32_t[]", list(offsets)) if offsets else _NULL)


def push(cmd: Any, layout: Any, data: bytes) -> None:
    _lib.vkCmdPushConstants(cmd, layout, STAGE, 0, len(data), _ffi.from_buffer(data))


def dispatch(cmd: Any, x: int, y: int = 1, z: int = 1) -> None:
    _lib.vkCmdDispatch(cmd, x, y, z)


def dispatch_indirect(cmd: Any, buffer: Any, offset: int) -> None:
    """vkCmdDispatchIndirect: the workgroup counts are 3 uint32 at `offset` of `buffer`."""
    _lib.vkCmdDispatchIndirect(cmd, buffer, offset)


def fill(cmd: Any, buffer: Any, offset: int, size: int, value: int = 0) -> None:
    _lib.vkCmdFillBuffer(cmd, buffer, offset, size, value)


def copy(cmd: Any, src: Any, dst: Any, src_offset: int, dst_offset: int, size: int) -> None:
    """vkCmdCopyBuffer of one region."""
    region = _ffi.new("VkBufferCopy*")
    region.srcOffset, region.dstOffset, region.size = src_offset, dst_offset, size
    _lib.vkCmdCopyBuffer(cmd, src, dst, 1, region)


def update(cmd: Any, buffer: Any, offset: int, data: bytes) -> None:
    """vkCmdUpdateBuffer of at most 65536 bytes (a multiple of 4)."""
    _lib.vkCmdUpdateBuffer(cmd, buffer, offset, len(data), _ffi.from_buffer(data))


_BEGIN = _ffi.new("VkCommandBufferBeginInfo*")
_BEGIN.sType = vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO
_BEGIN.flags = vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT


def begin(cmd: Any) -> None:
    """Reset and begin a one-time-submit command buffer (of a pool made resettable)."""
    raise_for_result(_lib.vkResetCommandBuffer(cmd, 0), "vkResetCommandBuffer")
    raise_for_result(_lib.vkBeginCommandBuffer(cmd, _BEGIN), "vkBeginCommandBuffer")


def end(cmd: Any) -> None:
    raise_for_result(_lib.vkEndCommandBuffer(cmd), "vkEndCommandBuffer")


def submit(native: Any, queue: Any, cmd: Any, waits: list[tuple[int, int]], signal: tuple[int, int]) -> None:
    """vkQueueSubmit of one command buffer to `queue` (a devices.Queue) that waits
    (all commands) for timeline points `waits` and signals the timeline point
    `signal`, through the lost flag of `native` (vkapi.queue_submit)."""
    n = len(waits)
    timeline = _ffi.new("VkTimelineSemaphoreSubmitInfo*")
    timeline.sType = vk.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO
    keep = []
    info = _ffi.new("VkSubmitInfo*")
    info.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
    info.pNext = timeline
    if n:
        sems = _ffi.new("VkSemaphore[]", [_ffi.cast("VkSemaphore", s) for s, _ in waits])
        values = _ffi.new("uint64_t[]", [v for _, v in waits])
        stages = _ffi.new("VkPipelineStageFlags[]", [ALL] * n)
        keep += [sems, values, stages]
        info.waitSemaphoreCount = n
        info.pWaitSemaphores = sems
        info.pWaitDstStageMask = stages
        timeline.waitSemaphoreValueCount = n
        timeline.pWaitSemaphoreValues = values
    cmds = _ffi.new("VkCommandBuffer[1]", [cmd])
    sig = _ffi.new("VkSemaphore[1]", [_ffi.cast("VkSemaphore", signal[0])])
    sig_value = _ffi.new("uint64_t[1]", [signal[1]])
    info.commandBufferCount = 1
    info.pCommandBuffers = cmds
    info.signalSemaphoreCount = 1
    info.pSignalSemaphores = sig
    timeline.signalSemaphoreValueCount = 1
    timeline.pSignalSemaphoreValues = sig_value
    vkapi.queue_submit(native, queue, info, call="vkQueueSubmit(kernel step)")
    del keep
