"""Transfer methods and which of them a pair of devices supports (policy only)."""
from __future__ import annotations

from typing import Callable

from .capabilities import (EXT_DMA_BUF, EXT_MEMORY_FD, EXT_MEMORY_HOST,
                           DeviceCapabilities)

__all__ = ["TransferMethod", "supported_methods", "method_support", "CudaProbe"]

#: The runtime half of the CUDA_PEER check: (a, b) -> None, or why CUDA cannot
#: serve the pair (no driver, not CUDA devices, no peer access).
CudaProbe = Callable[[DeviceCapabilities, DeviceCapabilities], "str | None"]


class TransferMethod:
    """Names of the ways an image or buffer moves between two devices (best first)."""
    NONE = "none"
    CUDA_PEER = "cuda_peer"
    DMABUF = "dmabuf"
    HOST_SHARED = "host_shared"
    STAGING_COPY = "staging_copy"

    ALL = (NONE, CUDA_PEER, DMABUF, HOST_SHARED, STAGING_COPY)
    CROSS_DEVICE = (CUDA_PEER, DMABUF, HOST_SHARED, STAGING_COPY)


def _cuda_probe(a: DeviceCapabilities, b: DeviceCapabilities) -> str | None:
    from .cuda import cuda_peer_reason   # loads libcuda on first use only

    return cuda_peer_reason(a, b)


def method_support(method: str, a: DeviceCapabilities, b: DeviceCapabilities,
                   enabled_a: frozenset[str] | None = None,
                   enabled_b: frozenset[str] | None = None, *,
                   cuda_probe: CudaProbe | None = None) -> str | None:
    """None when `method` works between a and b, else the reason it does not.

    With `enabled_*` given, an extension must also have been enabled on the
    logical device, not only be present on the physical one. CUDA_PEER also
    needs the CUDA driver to see both devices with peer access between them:
    `cuda_probe` answers that (default: vkmulti.cuda.cuda_peer_reason, which
    asks the driver once per device pair).
    """
    def have(caps: DeviceCapabilities, enabled: frozenset[str] | None, ext: str) -> bool:
        return caps.has(ext) and (enabled is None or ext in enabled)

    def lack(ext: str) -> str | None:
        for caps, en in ((a, enabled_a), (b, enabled_b)):
            if not have(caps, en, ext):
                where = "available" if not caps.has(ext) else "enabled"
                return f"{ext} is not {where} on {caps.name!r}"
        return None

    if method == TransferMethod.NONE or method == TransferMethod.STAGING_COPY:
        return None
    if method == TransferMethod.HOST_SHARED:
        return lack(EXT_MEMORY_HOST)
    if method == TransferMethod.CUDA_PEER:
        why = (cuda_probe or _cuda_probe)(a, b)
        if why is not None:
            return why
        return lack(EXT_MEMORY_FD)   # the link orders CUDA and Vulkan itself: no semaphore export
    if method == TransferMethod.DMABUF:
        if lack(EXT_DMA_BUF) is None and lack(EXT_MEMORY_FD) is None:
            return None
        why = lack(EXT_MEMORY_FD)
        if why is not None:
            return why
        if a.device_uuid != b.device_uuid or a.driver_uuid != b.driver_uuid:
            return (f"{lack(EXT_DMA_BUF)}, and opaque-fd memory cannot cross between devices with different "
                    f"deviceUUID/driverUUID ({a.name!r} and {b.name!r})")
        return None
    raise ValueError(f"unknown transfer method {method!r}; expected one of {TransferMethod.ALL}")


def supported_methods(a: DeviceCapabilities, b: DeviceCapabilities,
                      enabled_a: frozenset[str] | None = None,
                      enabled_b: frozenset[str] | None = None, *,
                      cuda_probe: CudaProbe | None = None) -> list[str]:
    """The cross-device methods that work between a and b, best first."""
    return [m for m in TransferMethod.CROSS_DEVICE
            if method_support(m, a, b, enabled_a, enabled_b, cuda_probe=cuda_probe) is None]
