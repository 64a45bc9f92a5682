"""Transfer methods and which of them a pair of devices supports (policy only)."""
from __future__ import annotations

from typing import Callable, NamedTuple

from ..device.capabilities import EXT_DMA_BUF, EXT_MEMORY_FD, EXT_MEMORY_HOST, DeviceCapabilities

__all__ = ["TransferMethod", "supported_methods", "method_support", "method_problem", "MethodProblem", "CudaProbe"]

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
    from ..device.cuda import cuda_peer_reason   # loads libcuda on first use only

    return cuda_peer_reason(a, b)


class MethodProblem(NamedTuple):
    """Why a transfer method does not work between two devices: one line, and the
    extension and device it is about (None where the reason is not an extension)."""
    reason: str
    extension: str | None = None
    device: str | None = None
    #: True when the driver offers `extension` but the VkDevice was created without it
    not_enabled: bool = False
    #: which device it is about: 0 for a (the source), 1 for b, None for neither
    side: int | None = None


#: What a reason adds when an extension is present but the VkDevice was made without it.
ENABLE_HINT = ("an engine that owns the device: enable what vkmulti.device_requirements() returns and pass "
               "primary_extensions= to MultiDeviceManager")


def method_problem(method: str, a: DeviceCapabilities, b: DeviceCapabilities,
                   enabled_a: frozenset[str] | None = None,
                   enabled_b: frozenset[str] | None = None, *,
                   cuda_probe: CudaProbe | None = None,
                   labels: tuple[str, str] | None = None) -> MethodProblem | None:
    """None when `method` works between a and b, else a MethodProblem.

    With `enabled_*` given, an extension must also have been enabled on the
    logical device, not only be offered by the driver: the reason says which
    of the two is missing. `labels` name the devices in reasons (default:
    their names). CUDA_PEER also needs the CUDA driver to see both devices
    with peer access between them: `cuda_probe` answers that (default:
    vkmulti.cuda.cuda_peer_reason, which asks the driver once per device pair).
    """
    la, lb = labels or (repr(a.name), repr(b.name))

    def lack(ext: str) -> MethodProblem | None:
        for side, (caps, en, label) in enumerate(((a, enabled_a, la), (b, enabled_b, lb))):
            if not caps.has(ext):
                return MethodProblem(f"the driver of {label} lacks {ext}", ext, caps.name, False, side)
            if en is not None and ext not in en:
                return MethodProblem(f"{label} has {ext} but its VkDevice was created without it "
                                     f"({ENABLE_HINT})", ext, caps.name, True, side)
        return None

    if method == TransferMethod.NONE or method == TransferMethod.STAGING_COPY:
        return None
    if method == TransferMethod.HOST_SHARED:
        return lack(EXT_MEMORY_HOST)
    if method == TransferMethod.CUDA_PEER:
        why = (cuda_probe or _cuda_probe)(a, b)
        if why is not None:
            return MethodProblem(why)
        return lack(EXT_MEMORY_FD)   # the link orders CUDA and Vulkan itself: no semaphore export
    if method == TransferMethod.DMABUF:
        if lack(EXT_DMA_BUF) is None and lack(EXT_MEMORY_FD) is None:
            return None
        fd = lack(EXT_MEMORY_FD)
        if fd is not None:
            return fd
        if a.device_uuid != b.device_uuid or a.driver_uuid != b.driver_uuid:
            dma = lack(EXT_DMA_BUF)
            assert dma is not None
            return MethodProblem(f"{dma.reason}, and opaque-fd memory cannot cross between devices with "
                                 f"different deviceUUID/driverUUID ({la} and {lb})", dma.extension, dma.device,
                                 dma.not_enabled, dma.side)
        return None
    raise ValueError(f"unknown transfer method {method!r}; expected one of {TransferMethod.ALL}")


def method_support(method: str, a: DeviceCapabilities, b: DeviceCapabilities,
                   enabled_a: frozenset[str] | None = None,
                   enabled_b: frozenset[str] | None = None, *,
                   cuda_probe: CudaProbe | None = None,
                   labels: tuple[str, str] | None = None) -> str | None:
    """None when `method` works between a and b, else the reason it does not (one line).

    See method_problem, which also names the extension and device."""
    problem = method_problem(method, a, b, enabled_a, enabled_b, cuda_probe=cuda_probe, labels=labels)
    return None if problem is None else problem.reason


def supported_methods(a: DeviceCapabilities, b: DeviceCapabilities,
                      enabled_a: frozenset[str] | None = None,
                      enabled_b: frozenset[str] | None = None, *,
                      cuda_probe: CudaProbe | None = None) -> list[str]:
    """The cross-device methods that work between a and b, best first."""
    return [m for m in TransferMethod.CROSS_DEVICE
            if method_support(m, a, b, enabled_a, enabled_b, cuda_probe=cuda_probe) is None]
