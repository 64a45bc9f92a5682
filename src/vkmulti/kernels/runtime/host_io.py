"""The host side of KernelRuntime (HostQueues): host <-> kernel message queues (the seed's
H2K / K2H: `send`, `receive`) and reading or writing a kernel's state.

Host messages are packed into slots on the host and written into the
kernel's host-visible H2K region at its next step; messages a kernel sends to
the host come back through its K2H region when the step is harvested.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import vulkan as vk

from ..._core.checks import U32_MAX, int_in, seconds_text, short_repr, timeout_seconds
from ...errors import QueueFullError, TimeoutError as VkmTimeout
from ...memory.image import Buffer, as_host_bytes
from ..engine.device_context import DeviceContext
from ..engine.gate import at_rest
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
                if k.restoring:   # a failover replays its steps: their host messages are sorted out then
                    ctx.cond.wait(0.25)   # (bounded by the restore's own time, whatever `timeout` is)
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
        with at_rest(k) as ctx:
            k.check()
            self._device(ctx.index)[1].harvest()
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
        return self.copy_out(k, index, offset, size, timeout_seconds(timeout))

    def write_state(self, kernel: Any, index: int, data: Any, *, offset: int = 0,
                    timeout: float | None = 60.0) -> None:
        """Overwrite bytes of state buffer `index` (after every submitted step, before later ones)."""
        k = self._resolve(kernel)
        int_in(index, "index", 0, len(k.states) - 1)
        raw = as_host_bytes(data, "data")
        total = k.states[index].size
        int_in(offset, "offset", 0, total)
        if raw.nbytes == 0 or offset + raw.nbytes > total:
            raise ValueError(f"[{offset}, {offset + raw.nbytes}) is outside state buffer {index} of "
                             f"{total} bytes (or empty)")
        timeout = timeout_seconds(timeout)
        with at_rest(k) as ctx, _named_timeout("writing the state of", k, timeout):   # (its buffer of now:
            k.check()                                                             # a restore or move replaces it)
            upload(ctx, k.states[index], offset, raw, timeout)

    def copy_out(self, k: Kernel, index: int, offset: int, size: int, timeout: float | None) -> np.ndarray:
        """`size` bytes of k's state buffer `index` from `offset`, after k's submitted steps."""
        staging = None
        try:
            while True:   # (the staging buffer on k's device of the moment, made without its lock)
                ctx = k.ctx
                if staging is None or staging.slot is not ctx.slot:
                    if staging is not None:
                        staging.destroy()
                        staging = None
                    staging = Buffer(ctx.slot, size, usage=vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT, host_visible=True)
                with at_rest(k) as now:
                    if now is not ctx:   # (moved meanwhile)
                        continue
                    k.check()
                    buf, out = k.states[index], staging
                    # a wait that gives up (timeout, Ctrl-C) leaves the copy queued: the runner frees
                    # `staging` once it is done, and `buf`'s destroy() waits for it
                    staging = None
                    with _named_timeout("reading the state of", k, timeout):
                        ctx.run_once(lambda cmd: vk.vkCmdCopyBuffer(cmd, buf.handle, out.handle, 1, [
                            vk.VkBufferCopy(srcOffset=offset, dstOffset=0, size=size)]), timeout=timeout,
                            keep=[out], users=[buf])
                    staging = out
                    break
            return staging._read(size)
        finally:
            if staging is not None:
                staging.destroy()


@contextmanager
def _named_timeout(what: str, k: Kernel, timeout: float | None) -> Iterator[None]:
    """A vkmulti.TimeoutError of the body said as what was waited for: a copy of k's
    state runs after k's submitted steps, so a step that does not end keeps it waiting."""
    try:
        yield
    except VkmTimeout:
        raise VkmTimeout(f"{what} kernel {short_repr(str(k.id))} on GPU {k.device_index}: the copy did not finish "
                         f"within {seconds_text(timeout)} s (it runs after the kernel's submitted steps, which are "
                         f"still running)") from None
