"""The host side of KernelRuntime (HostQueues): host <-> kernel message queues (the seed's
H2K / K2H: `send`, `receive`) and reading or writing a kernel's state.

Host messages are packed into slots on the host and written into the
kernel's host-visible H2K region at its next step; messages a kernel sends to
the host come back through its K2H region when the step is harvested.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import vulkan as vk

from ..._core.checks import U32_MAX, int_in, timeout_seconds, short_repr
from ...errors import QueueFullError, TimeoutError as VkmTimeout
from ...memory.image import Buffer, as_host_bytes
from ..engine.device_context import DeviceContext
from ..engine.kernel import Kernel
from ..engine.stepper import DeviceStepper
from ..lifecycle.image import upload
from ..messages import HOST_ADDRESS, HOST_KERNEL_ID, HybridLogicalClock, K2KMessage

__all__ = ["HostQueues"]


class HostQueues:
    """The host's end of the kernels' queues and state buffers, for KernelRuntime:
    send / receive / pending_receives / read_state / write_state. `resolve`
    turns a Kernel or an id into a live kernel of the runtime, `device` gives a
    device's (DeviceContext, DeviceStepper); host messages are stamped by `hlc`."""

    def __init__(self, resolve: Callable[..., Kernel], device: Callable[[int], tuple[DeviceContext, DeviceStepper]],
                 payload_size: int, hlc: HybridLogicalClock):
        self._resolve, self._device = resolve, device
        self.payload_size, self.hlc = payload_size, hlc

    # -- host <-> kernel ---------------------------------------------------------------------

    def send(self, kernel: Any, payload: Any, *, tag: int = 0, priority: int = 0,
             timeout: float | None = 0.0) -> K2KMessage:
        """KernelRuntime.send: queue a host message for `kernel`'s next step."""
        k = self._resolve(kernel)
        if isinstance(payload, K2KMessage):
            if payload.dest_kernel != k.id:
                raise ValueError(f"the message is addressed to {short_repr(payload.dest_kernel)}, not to {short_repr(k.id)}")
            tag, priority, payload = payload.tag, payload.priority, payload.payload
        data = as_host_bytes(payload, "payload").tobytes()
        if len(data) > self.payload_size:
            raise ValueError(f"payload is {len(data)} bytes; this runtime's slots hold {self.payload_size} "
                             f"(KernelRuntime(payload_size=...))")
        int_in(tag, "tag", 0, U32_MAX)
        int_in(priority, "priority", 0, 255)
        timeout = timeout_seconds(timeout)
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while True:
            ctx = k.ctx
            with ctx.lock:
                if k.ctx is not ctx:   # moved meanwhile (a failover's restore): its new device's lock
                    continue
                k.check()
                if k.restoring:   # its queue holds the replayed steps' inputs until the restore ends
                    ctx.cond.wait(0.25)   # (bounded by the restore's own time, whatever `timeout` is)
                    continue
                if len(k.h2k) < k.h2k_capacity:
                    return self._queue(k, data, tag, priority)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise QueueFullError(f"kernel {short_repr(k.id)}: {len(k.h2k)} host messages wait for its next step "
                                         f"(h2k_capacity {k.h2k_capacity}); step it, then send again")
                ctx.cond.wait(min(left, 0.25))

    def _queue(self, k: Any, data: bytes, tag: int, priority: int) -> K2KMessage:
        """Append one host message to k's host queue (k's context lock held)."""
        ts = self.hlc.tick()
        msg = K2KMessage(HOST_KERNEL_ID, k.id, data, tag, k.host_seq, ts, k.tenant, 0, priority)
        env = msg.envelope(HOST_ADDRESS, k.address)
        k.h2k.append(env.pack() + data + bytes(self.payload_size - len(data)))
        k.host_seq += 1
        k.stats.host_messages_sent += 1
        return msg

    def receive(self, kernel: Any, timeout: float | None = None) -> K2KMessage:
        """KernelRuntime.receive: the next message `kernel` sent to the host."""
        k = self._resolve(kernel)
        timeout = timeout_seconds(timeout)
        deadline = time.monotonic() + (timeout if timeout is not None else 1e18)
        while True:   # each wait on k's device of the moment: a migration meanwhile moves its replies
            ctx, stepper = self._device(k.device_index)
            with ctx.lock:
                if k.ctx is not ctx:   # (moved between the two reads)
                    continue
                stepper.harvest()
                if k.received:
                    msg = k.received.popleft()
                    ctx.cond.notify_all()
                    return msg
                k.check()
                ctx.check()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise VkmTimeout(f"no message from kernel {short_repr(k.id)} within {timeout} s")
                pending = next((r.value for r in stepper.inflight if any(x is k for x, _, _ in r.kernels)), 0)
                if pending:
                    try:
                        ctx.wait_unlocked(pending, min(left, 0.25))
                    except VkmTimeout:
                        pass
                else:
                    ctx.cond.wait(min(left, 0.25))

    def pending_receives(self, kernel: Any) -> int:
        """Messages from `kernel` waiting in the host receive queue (harvested so far)."""
        k = self._resolve(kernel)
        with k.ctx.lock:
            self._device(k.device_index)[1].harvest()
            return len(k.received)

    # -- state --------------------------------------------------------------------------------

    def read_state(self, kernel: Any, index: int = 0, *, offset: int = 0, size: int | None = None,
                   timeout: float | None = 60.0) -> np.ndarray:
        """State buffer `index` of `kernel` (uint8) as of its latest submitted step; `offset` and
        `size` (default: to the end) read a byte range of it."""
        k = self._resolve(kernel)
        int_in(index, "index", 0, len(k.states) - 1)
        total = k.states[index].size
        int_in(offset, "offset", 0, total - 1)
        size = total - offset if size is None else int_in(size, "size", 1, total - offset)
        return self.copy_out(k, k.states[index], offset, size, timeout_seconds(timeout))

    def write_state(self, kernel: Any, index: int, data: Any, *, offset: int = 0,
                    timeout: float | None = 60.0) -> None:
        """Overwrite bytes of state buffer `index` (after every submitted step, before later ones)."""
        k = self._resolve(kernel)
        int_in(index, "index", 0, len(k.states) - 1)
        raw = as_host_bytes(data, "data")
        buf = k.states[index]
        int_in(offset, "offset", 0, buf.size)
        if raw.nbytes == 0 or offset + raw.nbytes > buf.size:
            raise ValueError(f"[{offset}, {offset + raw.nbytes}) is outside state buffer {index} of "
                             f"{buf.size} bytes (or empty)")
        with k.ctx.lock:
            k.check()
            upload(k.ctx, buf, offset, raw, timeout_seconds(timeout))

    def copy_out(self, k: Kernel, buf: Buffer, offset: int, size: int, timeout: float | None) -> np.ndarray:
        """`size` bytes of k's device buffer `buf` from `offset`, after k's submitted steps."""
        ctx = k.ctx
        staging = Buffer(ctx.slot, size, usage=vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT, host_visible=True)
        with ctx.lock:
            try:
                k.check()
            except BaseException:
                staging.destroy()
                raise
            # a wait that gives up (timeout, Ctrl-C) leaves the copy queued: the runner frees
            # `staging` once it is done, and `buf`'s destroy() waits for it
            ctx.run_once(lambda cmd: vk.vkCmdCopyBuffer(cmd, buf.handle, staging.handle, 1, [
                vk.VkBufferCopy(srcOffset=offset, dstOffset=0, size=size)]), timeout=timeout, keep=[staging],
                users=[buf])
        try:
            return staging._read(size)
        finally:
            staging.destroy()
