"""The virtual GPU pair (or N): copies of Mesa's lavapipe manifest, and the rule for machines without a GPU.

The Vulkan loader lists one physical device per ICD manifest file; N copies of
the lavapipe manifest under different names give N CPU "GPUs". Install them
before any Instance is created (the loader reads VK_DRIVER_FILES then).
Library code that makes its own instance (MultiDeviceManager.create(), the
CLI, the benches) falls back to the pair through `use_virtual_if_no_gpu`.
"""
from __future__ import annotations

import glob
import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator

import vulkan as vk

from .._core.checks import is_int, short_repr
from ..errors import UnsupportedError
from .capabilities import DEVICE_TYPES
from .instance import Instance

__all__ = ["find_lavapipe_icd", "install_virtual_gpus", "virtual_gpus", "VIRTUAL_FALLBACK_ENV", "NO_GPU_NOTE",
           "no_gpu_fallback", "physical_device_types", "use_virtual_if_no_gpu", "is_virtual_setup"]

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
    if not is_int(count) or count < 1:
        raise ValueError(f"count must be a positive int, got {short_repr(count)}")
    icd = find_lavapipe_icd()
    if icd is None:
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
    return [DEVICE_TYPES.get(vk.vkGetPhysicalDeviceProperties(p).deviceType, "other")
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
