"""The CUDA driver as vkmulti sees it: can CUDA_PEER run between two Vulkan devices?

vkmulti has no build-time CUDA dependency: the native layer opens the NVIDIA
driver library (libcuda.so.1, or the file named by the environment variable
VKMULTI_LIBCUDA) on first use and runs cuInit once. Vulkan and CUDA devices
are matched by UUID (Vulkan's deviceUUID is the CUDA device UUID). Answers are
cached for the life of the process, per device pair for the peer check.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

from .._core import _native
from .._core.reprs import compact_repr
from .._core.checks import short_repr

__all__ = ["CudaDevice", "cuda_status", "cuda_devices", "cuda_device_for", "cuda_peer_reason"]


@dataclass(frozen=True)
class CudaDevice:
    """One device as the CUDA driver reports it; `compute_capability` and
    `multiprocessor_count` are None where the driver does not say."""

    __repr__ = compact_repr

    ordinal: int
    uuid: str
    name: str
    compute_capability: tuple[int, int] | None = None
    multiprocessor_count: int | None = None


@functools.lru_cache(maxsize=None)
def cuda_status() -> str | None:
    """None when the CUDA driver loads and initialises, else why it does not."""
    return _native.cuda_status()


def cuda_devices() -> list[CudaDevice]:
    """The devices CUDA sees (empty without a usable driver)."""
    out = []
    for o, u, n in _native.cuda_devices():
        major, minor, sms = _native.cuda_device_attributes(o) or (0, 0, 0)
        out.append(CudaDevice(o, u, n, (major, minor) if major > 0 else None, sms if sms > 0 else None))
    return out


def cuda_device_for(uuid: str) -> CudaDevice | None:
    """The CUDA device whose UUID is `uuid` (a Vulkan deviceUUID), or None
    (no CUDA driver, or not a CUDA device)."""
    if cuda_status() is not None:
        return None
    want = uuid.replace("-", "").lower()
    return next((d for d in cuda_devices() if d.uuid.replace("-", "").lower() == want), None)


def _uuid_bytes(uuid: str) -> bytes:
    raw = bytes.fromhex(uuid.replace("-", ""))
    if len(raw) != 16:
        raise ValueError(f"a device UUID has 16 bytes, got {short_repr(uuid)}")
    return raw


@functools.lru_cache(maxsize=256)
def _peer_reason(uuid_a: str, name_a: str, uuid_b: str, name_b: str) -> str | None:
    why = cuda_status()
    if why is not None:
        return why
    return _native.cuda_peer_reason(_uuid_bytes(uuid_a), _uuid_bytes(uuid_b), name_a, name_b)


class DeviceIdentity(Protocol):
    """What cuda_peer_reason reads of a device: its UUID and name (DeviceCapabilities has them)."""

    @property
    def device_uuid(self) -> str: ...
    @property
    def name(self) -> str: ...


class WithCapabilities(Protocol):
    """A device whose `capabilities` say its UUID and name (a DeviceSlot)."""

    @property
    def capabilities(self) -> DeviceIdentity | None: ...


def _identity(dev: Any, label: str) -> tuple[str, str]:
    """(device UUID, name) of DeviceCapabilities, a DeviceSlot (its capabilities) or
    anything with `device_uuid` and `name`."""
    caps = getattr(dev, "capabilities", None)
    if caps is not None and not hasattr(dev, "device_uuid"):
        dev = caps
    uuid, name = getattr(dev, "device_uuid", None), getattr(dev, "name", None)
    if not isinstance(uuid, str) or not isinstance(name, str):
        raise TypeError(f"{label} must be DeviceCapabilities or a DeviceSlot (anything with str device_uuid and "
                        f"name), got {type(dev).__name__}")
    return uuid, name


def cuda_peer_reason(a: DeviceIdentity | WithCapabilities, b: DeviceIdentity | WithCapabilities) \
        -> str | None:
    """None when CUDA sees `a` and `b` (DeviceCapabilities, DeviceSlots, or anything
    with `device_uuid` and `name`) as two GPUs with peer access both ways; else why
    not: no CUDA driver, cuInit failing, a device CUDA does not see, one GPU twice,
    or no peer path (NVLink or PCIe P2P). Vulkan extensions are not checked here.
    """
    (ua, na), (ub, nb) = _identity(a, "a"), _identity(b, "b")
    return _peer_reason(ua, na, ub, nb)
