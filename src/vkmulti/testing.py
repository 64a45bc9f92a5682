"""Test helpers: the virtual GPU pair (from vkmulti.device.virtual) and a lost-device fault hook.

`install_virtual_gpus(n)` / `virtual_gpus(n)` point the Vulkan loader at n
copies of Mesa's lavapipe manifest (before any Instance is created);
`lose_device(manager, index)` makes a device behave as one that returned
VK_ERROR_DEVICE_LOST (docs/explanation/failover.md). The library never imports this module.
"""
from __future__ import annotations

from .device.logical import drain_through_driver
from .device.manager import MultiDeviceManager
from .device.virtual import (NO_GPU_NOTE, VIRTUAL_FALLBACK_ENV, find_lavapipe_icd, install_virtual_gpus,
                             is_virtual_setup, no_gpu_fallback, physical_device_types, use_virtual_if_no_gpu,
                             virtual_gpus)
from .errors import TimeoutError as VkmTimeoutError
from ._core.checks import short_repr

__all__ = ["find_lavapipe_icd", "install_virtual_gpus", "virtual_gpus", "VIRTUAL_FALLBACK_ENV", "NO_GPU_NOTE",
           "no_gpu_fallback", "physical_device_types", "use_virtual_if_no_gpu", "is_virtual_setup", "lose_device"]


def lose_device(manager: MultiDeviceManager, index: int, *, timeout: float = 10.0) -> None:
    """Make GPU `index` of `manager` fail from now on exactly as a lost device does.

    The device's native lost flag is set: every submit and wait through
    vkmulti (the Python layer's `vkapi.queue_submit`, the native link workers,
    command runners, renderers, the kernel runtime) returns
    VK_ERROR_DEVICE_LOST and raises `DeviceLostError` through the one error
    path, without calling the driver. Components that watch the manager
    (`MultiDeviceManager.check_devices`) then fail over as for a real loss.

    The driver itself keeps working (nothing is lost for real), so the work
    submitted before the call is waited for here through the driver, bounded by
    `timeout` s: afterwards the lost device's objects can be freed without
    the driver still running work that uses them, as on a real lost device,
    whose work never runs again. vkmulti.TimeoutError when that work is still
    running then (something waits for a semaphore that never comes); the
    device stays marked lost. The mark is never undone: make a new manager.
    """
    if not isinstance(manager, MultiDeviceManager):
        raise TypeError(f"manager must be a MultiDeviceManager, got {type(manager).__name__}")
    slot = manager.slot(index)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout must be a non-negative number of seconds, got {short_repr(timeout)}")
    native = slot.native
    if native is None:
        raise ValueError(f"GPU {index} ({slot.name!r}) has no native device table (a single-device manager "
                         f"drives its engine's device directly); lose_device needs a multi-GPU manager")
    native.mark_lost()
    if not drain_through_driver(slot, float(timeout)):   # (fences given up on: the manager's teardown frees them)
        raise VkmTimeoutError(f"GPU {index} ({slot.name!r}) is marked lost, but work submitted to it before "
                              f"still runs after {timeout} s (it waits for something that never comes)")
    # Everything submitted before ran to its end: what it wrote to host-visible memory can be
    # trusted (the kernel runtime's failover then replays up to the last submitted step).
    slot.lost_drained = True  # type: ignore[attr-defined]
