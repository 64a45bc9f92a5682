"""Test helpers: a virtual GPU pair (or N) from Mesa's lavapipe, and a lost-device fault hook.

The Vulkan loader lists one physical device per ICD manifest file; N copies of
the lavapipe manifest under different names give N CPU "GPUs". Call this
before any Instance is created (the loader reads VK_DRIVER_FILES then).

`lose_device(manager, index)` makes a device behave as one that returned
VK_ERROR_DEVICE_LOST (docs/failover.md).
"""
from __future__ import annotations

import glob
import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator

_ICD_DIRS = ("/usr/share/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/etc/vulkan/icd.d")
_ENV_KEYS = ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")


def find_lavapipe_icd() -> str | None:
    """Path of the lavapipe ICD manifest, or None when Mesa's Vulkan drivers are absent."""
    for d in _ICD_DIRS:
        hits = sorted(glob.glob(os.path.join(d, "lvp_icd*.json")))
        if hits:
            return hits[0]
    return None


def install_virtual_gpus(count: int = 2, *, directory: str | None = None) -> list[str]:
    """Write `count` copies of the lavapipe manifest and point the loader at them.

    Returns the manifest paths. Sets VK_DRIVER_FILES (and the older
    VK_ICD_FILENAMES) for this process; use `virtual_gpus()` to restore them.
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    icd = find_lavapipe_icd()
    if icd is None:
        from .errors import UnsupportedError
        raise UnsupportedError("no lavapipe ICD manifest found; install Mesa's Vulkan drivers "
                               "(Debian: apt-get install mesa-vulkan-drivers)")
    directory = directory or tempfile.mkdtemp(prefix="vkmulti-icd-")
    paths = []
    for i in range(count):
        p = os.path.join(directory, f"vkmulti_lvp_{i}.json")
        shutil.copyfile(icd, p)
        paths.append(p)
    value = os.pathsep.join(paths)
    for k in _ENV_KEYS:
        os.environ[k] = value
    return paths


@contextmanager
def virtual_gpus(count: int = 2) -> Iterator[list[str]]:
    """Context manager form of install_virtual_gpus; restores the environment after."""
    saved = {k: os.environ.get(k) for k in _ENV_KEYS}
    directory = tempfile.mkdtemp(prefix="vkmulti-icd-")
    try:
        yield install_virtual_gpus(count, directory=directory)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(directory, ignore_errors=True)


#: Set to "0", vkmulti never switches to the virtual pair on its own (see no_gpu_fallback).
VIRTUAL_FALLBACK_ENV = "VKMULTI_VIRTUAL_FALLBACK"
#: The one line said when vkmulti switches to the virtual pair.
NO_GPU_NOTE = (f"no GPU found: using the virtual lavapipe GPU pair (2 CPU devices; "
               f"{VIRTUAL_FALLBACK_ENV}=0 keeps what Vulkan lists)")


def no_gpu_fallback(device_types: list[str]) -> bool:
    """The one rule for machines without a GPU: True when vkmulti should switch to
    the virtual lavapipe pair, i.e. Vulkan lists no device other than CPU
    devices (`device_types`, as DeviceCapabilities.device_type names them),
    lavapipe is installed, the loader is not already pointed at virtual GPUs,
    and VKMULTI_VIRTUAL_FALLBACK is not "0"."""
    return (os.environ.get(VIRTUAL_FALLBACK_ENV, "") != "0" and not is_virtual_setup()
            and all(t == "cpu" for t in device_types) and find_lavapipe_icd() is not None)


def physical_device_types(instance: object) -> list[str]:
    """The device type of every physical device of a vkmulti Instance ("cpu", "discrete-gpu", ...)."""
    import vulkan as vk

    from .capabilities import _DEVICE_TYPES

    return [_DEVICE_TYPES.get(vk.vkGetPhysicalDeviceProperties(p).deviceType, "other")
            for p in instance.physical_devices()]   # type: ignore[attr-defined]


def use_virtual_if_no_gpu(count: int | None = 0) -> str | None:
    """Install `count` virtual GPUs when asked (count >= 1), or the pair when this
    machine has no GPU (no_gpu_fallback); returns the line saying which, or None
    when the real devices are used. Call before any Instance is created."""
    if count:
        install_virtual_gpus(count)
        return f"using {count} virtual lavapipe GPU{'s' if count != 1 else ''} (--virtual)"
    if is_virtual_setup():
        return "using the virtual lavapipe GPUs named in VK_DRIVER_FILES"
    from .instance import Instance

    inst = Instance(validation=False)
    try:
        types = physical_device_types(inst)
    finally:
        inst.destroy()
    if no_gpu_fallback(types):
        install_virtual_gpus(2)
        return NO_GPU_NOTE
    return None


def is_virtual_setup() -> bool:
    """True when the loader is pointed at vkmulti's lavapipe copies."""
    return "vkmulti_lvp_" in os.environ.get("VK_DRIVER_FILES", "")


def lose_device(manager: Any, index: int, *, timeout: float = 10.0) -> None:
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
    from .errors import TimeoutError as VkmTimeoutError
    from .multi_device import MultiDeviceManager

    if not isinstance(manager, MultiDeviceManager):
        raise TypeError(f"manager must be a MultiDeviceManager, got {type(manager).__name__}")
    slot = manager.slot(index)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}"[:160])
    native = slot.native
    if native is None:
        raise ValueError(f"GPU {index} ({slot.name!r}) has no native device table (a single-device manager "
                         f"drives its engine's device directly); lose_device needs a multi-GPU manager")
    native.mark_lost()
    if not native.drain_queues_raw([q.lock for q in slot.queues()], float(timeout)):
        raise VkmTimeoutError(f"GPU {index} ({slot.name!r}) is marked lost, but work submitted to it before "
                              f"still runs after {timeout} s (it waits for something that never comes)")
    # Everything submitted before ran to its end: what it wrote to host-visible memory can be
    # trusted (the kernel runtime's failover then replays up to the last submitted step).
    slot.lost_drained = True
