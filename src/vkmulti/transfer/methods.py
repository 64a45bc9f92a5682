"""Transfer methods, which of them a pair of devices supports, and the choice of one (policy only).

`method_problem` answers for two devices' capabilities; `pair_problem` and
`pair_methods` for two DeviceSlots (what their VkDevices enabled counts);
`select_transfer_method` picks the best method that works.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol

from .._core.checks import is_int, short_repr, short_text
from ..device import cuda
from ..device.capabilities import (EXT_DMA_BUF, EXT_MEMORY_FD, EXT_MEMORY_HOST, DeviceCapabilities,
                                   as_render_capabilities)
from ..device.manager import DeviceSlot
from .._core.reprs import compact_repr

if TYPE_CHECKING:
    from ..device.capabilities import RenderCapabilities, RenderCapabilitiesLike

log = logging.getLogger(__name__)

__all__ = ["TransferMethod", "supported_methods", "method_support", "method_problem", "MethodProblem", "CudaProbe",
           "select_transfer_method", "pair_methods", "pair_problem", "slot_label", "cuda_peer_auto", "CUDA_PEER_ENV"]

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
    return cuda.cuda_peer_reason(a, b)   # looked up per call: tests put a probe of their own there


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

    def __repr__(self) -> str:
        return compact_repr(self)


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
    _check_caps(a, "a")
    _check_caps(b, "b")
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
    raise ValueError(f"unknown transfer method {short_repr(method)}; expected one of {TransferMethod.ALL}")


def _check_caps(caps: Any, label: str) -> None:
    """TypeError unless `caps` reads as DeviceCapabilities (a name and has())."""
    if not callable(getattr(caps, "has", None)) or not hasattr(caps, "name"):
        raise TypeError(f"{label} must be DeviceCapabilities (e.g. slot.capabilities), got {type(caps).__name__}")


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
    _check_caps(a, "a")
    _check_caps(b, "b")
    return [m for m in TransferMethod.CROSS_DEVICE
            if method_support(m, a, b, enabled_a, enabled_b, cuda_probe=cuda_probe) is None]


#: CUDA_PEER comes first wherever CUDA can serve the pair (on two H200s it moves
#: 256 MiB at ~320 GB/s, HOST_SHARED at ~45); this environment variable set to
#: "0" keeps select_transfer_method from choosing it. Forcing the method on a
#: CrossDeviceTransfer works regardless.
CUDA_PEER_ENV = "VKMULTI_CUDA_PEER"


def cuda_peer_auto() -> bool:
    """Whether select_transfer_method may pick CUDA_PEER (yes unless VKMULTI_CUDA_PEER=0)."""
    return os.environ.get(CUDA_PEER_ENV, "") != "0"


def slot_label(slot: DeviceSlot) -> str:
    """"GPU i ('name')" for messages."""
    return f"GPU {slot.index} ({short_text(slot.name)})"


def pair_problem(method: str, src: DeviceSlot, dst: DeviceSlot) -> MethodProblem | None:
    """Why `method` cannot move data from slot `src` to slot `dst` (with the
    extensions their VkDevices enabled), or None when it can."""
    a, b = src.capabilities, dst.capabilities
    if a is None or b is None:
        return None if method in (TransferMethod.STAGING_COPY, TransferMethod.NONE) else \
            MethodProblem("the devices' capabilities are unknown")
    return method_problem(method, a, b, src.enabled_extensions, dst.enabled_extensions,
                          labels=(slot_label(src), slot_label(dst)))


def pair_methods(src: DeviceSlot, dst: DeviceSlot) -> list[str]:
    """The cross-device methods that work from slot `src` to slot `dst`, best first
    (what their VkDevices enabled counts; CUDA_PEER as the driver answers)."""
    for label, slot in (("src", src), ("dst", dst)):
        if not isinstance(slot, DeviceSlot):
            raise TypeError(f"{label} must be a DeviceSlot (e.g. mgr.slot(0)), got {type(slot).__name__}")
    return [m for m in TransferMethod.CROSS_DEVICE if pair_problem(m, src, dst) is None]


_reported: set[tuple] = set()
_reported_lock = threading.Lock()


def _report_skipped(key: tuple, problem: MethodProblem) -> None:
    """Log once per pair and method why a better method was passed over because a
    VkDevice lacks an extension its driver offers (an engine's own device)."""
    with _reported_lock:
        if key in _reported:
            return
        _reported.add(key)
    log.warning("vkmulti: %s not used: %s", key[-1], problem.reason)


class Placed(Protocol):
    """What select_transfer_method reads of an assignment: the device it is on (an SRUAssignment)."""

    @property
    def device_index(self) -> int: ...


def select_transfer_method(assignment: Placed | DeviceSlot,
                           capabilities: RenderCapabilities | RenderCapabilitiesLike | DeviceSlot | None, *,
                           prefer_dmabuf: bool = True, dst_index: int = 0) -> str:
    """The best method both devices of the pair support (DMABUF only when preferred,
    CUDA_PEER unless VKMULTI_CUDA_PEER=0).

    The seed's form: `assignment` has a `device_index` (an SRUAssignment) and
    `capabilities` is the manager's RenderCapabilities (`mgr.capabilities`,
    or the seed's own object, read by its fields);
    the destination is `dst_index`, the primary by default. NONE for work
    already on the destination; the floor, STAGING_COPY, when the
    capabilities do not describe both devices. The pair form:
    `select_transfer_method(src_slot, dst_slot)` with two DeviceSlots.

    A method passed over because a VkDevice was created without an extension
    its driver offers (an engine's own device) is logged once, in one line
    that names the extension and vkmulti.device_requirements().
    """
    if isinstance(assignment, DeviceSlot) or isinstance(capabilities, DeviceSlot):
        if not (isinstance(assignment, DeviceSlot) and isinstance(capabilities, DeviceSlot)):
            raise TypeError(f"select_transfer_method(src_slot, dst_slot) needs two DeviceSlots, got "
                            f"{type(assignment).__name__} and {type(capabilities).__name__}")
        return _select_for_slots(assignment, capabilities, prefer_dmabuf)
    src_index = getattr(assignment, "device_index", None)
    if not is_int(src_index) or src_index < 0:  # type: ignore[operator]
        raise TypeError(f"assignment must have a non-negative int device_index (an SRUAssignment), or pass two "
                        f"DeviceSlots; got {type(assignment).__name__} with device_index {short_repr(src_index)}")
    if not is_int(dst_index) or dst_index < 0:
        raise TypeError(f"dst_index must be a non-negative int, got {short_repr(dst_index)}")
    capabilities = as_render_capabilities(capabilities)   # the seed's own RenderCapabilities too
    if src_index == dst_index:
        return TransferMethod.NONE
    if capabilities is None or max(src_index, dst_index) >= len(capabilities.devices):  # type: ignore[operator, type-var]
        return TransferMethod.STAGING_COPY
    a, b = capabilities.devices[src_index], capabilities.devices[dst_index]  # type: ignore[index]
    en = capabilities.enabled_extensions
    ea = en[src_index] if src_index < len(en) else None  # type: ignore[index, operator]
    eb = en[dst_index] if dst_index < len(en) else None
    labels = (f"GPU {src_index} ({short_text(a.name)})", f"GPU {dst_index} ({short_text(b.name)})")
    return _first_working(lambda m: method_problem(m, a, b, ea, eb, labels=labels), prefer_dmabuf,
                          (src_index, dst_index))  # type: ignore[arg-type]


def _select_for_slots(src: DeviceSlot, dst: DeviceSlot, prefer_dmabuf: bool) -> str:
    if src is dst or src.index == dst.index and src.device is dst.device:
        return TransferMethod.NONE
    return _first_working(lambda m: pair_problem(m, src, dst), prefer_dmabuf, (src.index, dst.index))


def _first_working(problem_of: Callable[[str], MethodProblem | None], prefer_dmabuf: bool,
                   pair: tuple[int, int]) -> str:
    for method in TransferMethod.CROSS_DEVICE:
        if method == TransferMethod.DMABUF and not prefer_dmabuf:
            continue
        if method == TransferMethod.CUDA_PEER and not cuda_peer_auto():
            continue
        problem = problem_of(method)
        if problem is None:
            return method
        if problem.not_enabled:
            _report_skipped((*pair, problem.device, method), problem)
    return TransferMethod.STAGING_COPY
