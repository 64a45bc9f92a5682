"""Where a new kernel of a KernelRuntime goes and whether it fits there: its
initial state padded to its state buffers, the device (pinned or the
coordinator's choice) and that device's limits."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..._core.checks import is_int, short_repr
from ...memory.image import as_host_bytes
from ..engine.device_context import DeviceContext
from ..engine.kernel import check_kernel_code
from ..engine.spec import KernelSpec

__all__ = ["initial_state", "place", "check_fits"]


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


def check_fits(ctx: DeviceContext, spec: KernelSpec) -> None:
    """ValueError when a state buffer or the workgroup count of `spec` exceeds the
    limits of the device of `ctx`; KernelValidationError when its SPIR-V does not
    pass the gate (checked here, before the device's lock is taken)."""
    for i, n in enumerate(spec.state_sizes):
        if n > ctx.max_storage_range:
            raise ValueError(f"state buffer {i} of {short_repr(spec.kernel_type)} is {short_repr(n)} bytes; {ctx.slot.name!r} binds at "
                             f"most {ctx.max_storage_range} bytes per storage buffer (maxStorageBufferRange): "
                             f"split the state (e.g. more, smaller stencil slabs)")
    for axis, g in enumerate(spec.groups):
        top = ctx.max_group_count[axis]
        if g > top:
            raise ValueError(f"groups[{axis}] = {short_repr(g)} exceeds {ctx.slot.name!r}'s limit {top}")
    check_kernel_code(ctx, spec)
