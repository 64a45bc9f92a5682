"""Where a new kernel of a KernelRuntime goes and whether it fits there: its
initial state padded to its state buffers, the device (pinned or the
coordinator's choice), the runtime's objects on that device (made on first
use) and that device's limits; then its buffers' first contents, written on
that device."""
from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from ..._core.checks import is_int, seconds_text, short_repr
from ..._core.lifetime import Deadline
from ...errors import DestroyedError, DeviceLostError, TimeoutError as VkmTimeout
from ...memory.image import as_host_bytes
from ..engine.device_context import DeviceContext
from ..engine.recording import barrier
from ..engine.kernel import INLINE_STATE_BYTES, Kernel, check_kernel_code
from ..engine.spec import KernelSpec
from ..engine.stepper import DeviceStepper
from ..lifecycle.image import staged_copies

__all__ = ["initial_state", "place", "Launches", "device_pair", "check_fits", "init_buffers"]

log = logging.getLogger(__name__)


def initial_state(spec: KernelSpec, state: Any) -> list[np.ndarray | None]:
    """`state` (None, bytes-like or a list of them) as one zero-padded array per
    state buffer of `spec` (None: zeros)."""
    out: list[np.ndarray | None] = [None] * len(spec.state_sizes)
    if state is None:
        return out
    if isinstance(state, (bytes, bytearray, memoryview, np.ndarray)):
        state = [state]
    items = list(state)
    if len(items) > len(spec.state_sizes):
        raise ValueError(f"{len(items)} initial states for {len(spec.state_sizes)} state buffers")
    for i, data in enumerate(items):
        if data is None:
            continue
        raw = as_host_bytes(data, f"state[{i}]")
        if raw.nbytes > spec.state_sizes[i]:
            raise ValueError(f"state[{i}] holds {raw.nbytes} bytes; the state buffer has {spec.state_sizes[i]}")
        padded = np.zeros(spec.state_sizes[i], np.uint8)
        padded[:raw.nbytes] = raw
        out[i] = padded
    return out


def place(coordinator: Any, device_count: int, kernel_id: str, device: int | None, options: Any) -> int:
    """The device of a new kernel: `device` when given, else the coordinator's
    choice; either way assigned to the kernel in the coordinator."""
    if device is not None:
        if isinstance(device, np.integer):
            device = int(device)
        if not is_int(device):
            raise TypeError(f"device must be an int or None, got {type(device).__name__}")
        if not 0 <= device < device_count:
            raise IndexError(f"device {short_repr(device)} out of range: {device_count} device(s)")
        coordinator.assign_kernel(kernel_id, device)
        return device
    chooser = getattr(coordinator, "place_kernel", None)
    if callable(chooser):
        idx = chooser(kernel_id, options)
    else:
        idx = coordinator.select_device(options)
        coordinator.assign_kernel(kernel_id, idx)
    if not is_int(idx) or not 0 <= idx < device_count:
        coordinator.remove_kernel(kernel_id)
        raise ValueError(f"the coordinator chose device {short_repr(idx)}, which the manager does not have "
                         f"({device_count} device(s))")
    return idx


class Launches:
    """A runtime's launches under way, so that its destroy() lists the kernels once none
    is: a kernel registered after that list would be left to nobody (its buffers, its
    address), and its launch would go on with the device's objects freed under it."""

    def __init__(self, lock: Any):
        self._cond = threading.Condition(lock)   # (the runtime's lock)
        self.running, self.closed = 0, False

    def begin(self) -> None:
        """A launch starts (the runtime's lock held); DestroyedError once close() began."""
        if self.closed:
            raise DestroyedError("KernelRuntime used after destroy()")
        self.running += 1

    def end(self) -> None:
        with self._cond:
            self.running -= 1
            self._cond.notify_all()

    def close(self, timeout: float | None) -> None:
        """Refuse later launches; wait up to `timeout` s (None: no limit), in slices, for those under way."""
        deadline = Deadline(timeout)
        with self._cond:
            self.closed = True
            while self.running and not deadline.expired():
                self._cond.wait(deadline.slice())
            if self.running:
                log.warning("KernelRuntime.destroy(): going on while %d launch(es) still run", self.running)


def device_pair(rt: Any, index: int, timeout: float | None) -> tuple[DeviceContext, DeviceStepper]:
    """KernelRuntime `rt`'s (DeviceContext, DeviceStepper) of GPU `index`, made on first use
    (its set-up waits up to `timeout` s). Made without the runtime's lock: the set-up waits
    behind the work queued on the GPU, which would hold every launch, step and destroy()
    of the runtime meanwhile. A thread that raced this one made its own: the first kept."""
    with rt._lock:
        rt._check()
        if (pair := rt._contexts.get(index)) is not None:
            return pair
        if rt.device_lost(index):
            raise DeviceLostError(-4, "KernelRuntime", f"GPU {index} is lost: no kernel runs there any more")
    ctx = DeviceContext(rt.manager.slot(index), in_flight=rt.in_flight, table_size=rt.max_kernels, timeout=timeout)
    with rt._lock:
        if not rt._destroyed and (pair := rt._contexts.get(index)) is None:
            ctx.dir_dirty.update(rt._by_index)
            pair = rt._contexts[index] = (ctx, DeviceStepper(rt, ctx))
            return pair
    ctx.destroy()
    rt._check()
    return pair  # type: ignore[return-value]   # (another thread's; None only once destroyed: _check raised)


def check_fits(ctx: DeviceContext, spec: KernelSpec, timeout: float | None = None) -> None:
    """ValueError when a state buffer or the workgroup count of `spec` exceeds the
    limits of the device of `ctx`; KernelValidationError when its SPIR-V does not
    pass the gate (checked here, before the device's lock is taken, within `timeout` s)."""
    for i, n in enumerate(spec.state_sizes):
        if n > ctx.max_storage_range:
            raise ValueError(f"state buffer {i} of {short_repr(spec.kernel_type)} is {short_repr(n)} bytes; {ctx.slot.name!r} binds at "
                             f"most {ctx.max_storage_range} bytes per storage buffer (maxStorageBufferRange): "
                             f"split the state (e.g. more, smaller stencil slabs)")
    for axis, g in enumerate(spec.groups):
        top = ctx.max_group_count[axis]
        if g > top:
            raise ValueError(f"groups[{axis}] = {short_repr(g)} exceeds {ctx.slot.name!r}'s limit {top}")
    check_kernel_code(ctx, spec, timeout)


def init_buffers(ctx: DeviceContext, k: Kernel, states: list[np.ndarray | None], deadline: Deadline) -> None:
    """Write the first contents of new kernel k's buffers on its device (rings, control block,
    `states`: the small ones inline, the rest through one staging buffer) in one submit,
    waited for until `deadline`. When it fails k is freed; buffers a submit that gave up
    (a timeout, Ctrl-C, a device still busy with earlier work) may still write are left
    to the command runner, which frees them once the GPU is done with them."""
    handed = False
    staged = None
    try:
        init = k.init_commands(states)
        big = [(k.states[i], 0, d) for i, d in enumerate(states)
               if d is not None and d.nbytes > INLINE_STATE_BYTES]   # (the rest: inline in `init`)
        staged = staged_copies(ctx.staging, big) if big else None

        def record(cmd: Any) -> None:
            init(cmd)
            if staged is not None:
                barrier(cmd)
                staged.record(cmd)
        handed = True   # (from here the runner frees `keep` if the run fails: at once, or once the GPU is done)
        ctx.run_once(record, timeout=deadline.left(), keep=[*k.buffers, *([staged.buffer] if staged is not None else [])])
    except BaseException as exc:
        if handed:
            k.buffers = []
        elif staged is not None:
            staged.buffer.destroy()
        with ctx.lock:
            k.free()
        if isinstance(exc, VkmTimeout):
            raise VkmTimeout(f"launching kernel {short_repr(str(k.id))} on GPU {ctx.index}: its initialisation did "
                             f"not finish within {seconds_text(deadline.timeout)} s (it runs after the work queued on the "
                             f"device before it); its buffers are freed once the GPU is done with them") from None
        raise
    if staged is not None:
        ctx.staging.give_back(staged.buffer)
