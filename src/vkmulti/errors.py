"""The exception hierarchy of vkmulti and the table that maps VkResult to it."""
from __future__ import annotations

import builtins
import re

__all__ = [
    "QueueFullError", "KernelMessageError",
    "VkmError", "VulkanError", "DeviceLostError", "PrimaryDeviceLostError", "OutOfDeviceMemoryError",
    "OutOfHostMemoryError", "UnsupportedError", "TransferError", "TimeoutError",
    "DestroyedError", "LinkStalledError", "CudaError", "InvalidBufferError", "raise_for_result", "result_name",
    "BackendUnavailableError", "KernelNotFoundError", "InvalidConfigError", "DeviceNotAvailableError",
    "K2KDestinationNotFoundError", "MigrationError", "KernelValidationError", "MigrationFailedError",
    "ValidationError",
    "ClusterError", "RayMissingError", "ClusterAddressError", "ClusterConnectionError", "NoAgentError",
    "RendererMissingError",
    "InvalidCheckpointError", "CheckpointStorageError", "CheckpointNotFoundError", "TenantMismatchError",
]


class VkmError(Exception):
    """Base of every error vkmulti raises on purpose."""


class VulkanError(VkmError):
    """A Vulkan call returned an error code."""

    def __init__(self, result: int, call: str, message: str | None = None):
        self.result = result
        self.result_name = result_name(result)
        self.call = call
        super().__init__(message or f"{call} failed: {self.result_name} ({result})")


class DeviceLostError(VulkanError):
    """The device was lost (VK_ERROR_DEVICE_LOST): its objects can only be destroyed."""


class PrimaryDeviceLostError(DeviceLostError):
    """The primary GPU (slot 0, which composites frames and hosts the caller's own
    work) was lost: nothing can fail over from it, so the caller gets this."""


class OutOfDeviceMemoryError(VulkanError, MemoryError):
    """VK_ERROR_OUT_OF_DEVICE_MEMORY."""


class OutOfHostMemoryError(VulkanError, MemoryError):
    """VK_ERROR_OUT_OF_HOST_MEMORY."""


class UnsupportedError(VkmError):
    """A capability is missing: names the extension, the device and what to use instead.

    `extension` (e.g. "VK_EXT_external_memory_host") and `device` (the device's
    name) say what is missing where, when the cause is an extension;
    `device_index` is the device's slot index where known."""

    def __init__(self, message: str, *, extension: str | None = None, device: str | None = None,
                 device_index: int | None = None):
        self.extension = extension
        self.device = device
        self.device_index = device_index
        super().__init__(message)


class TransferError(VkmError):
    """A cross-device transfer could not be carried out."""


class InvalidBufferError(VkmError, IndexError):
    """InterGpuTransfer was given a device index that is not one of its devices
    (oxigdal's GpuError::InvalidBuffer); an IndexError, as bad indices are elsewhere."""


class TimeoutError(VkmError, builtins.TimeoutError):
    """A wait did not complete within its timeout; the object stays usable."""


class QueueFullError(VkmError):
    """A bounded host<->kernel queue is full (back-pressure): receive, step, or wait and retry."""


class KernelMessageError(VkmError):
    """Messages a kernel sent could not be delivered (outbox overflow, unknown or
    cross-tenant destination, no route); `kernel_id` names the sender, `problems` lists what happened
    (the message shows the first few, each cut short: a kernel id can be as long as its caller made it)."""

    #: Problems the message shows, and the characters it shows of the id and of each.
    SHOWN, ID_CHARS, PROBLEM_CHARS = 3, 80, 200

    def __init__(self, kernel_id: str, problems: list[str]):
        self.kernel_id = kernel_id
        self.problems = list(problems)
        kid = repr(kernel_id) if len(kernel_id) <= self.ID_CHARS else repr(kernel_id[:self.ID_CHARS]) + "..."
        shown = [p if len(p) <= self.PROBLEM_CHARS else p[:self.PROBLEM_CHARS] + "..."
                 for p in self.problems[:self.SHOWN]]
        more = len(self.problems) - len(shown)
        super().__init__(f"kernel {kid}: " + "; ".join(shown) + (f"; and {more} more" if more else ""))


class DestroyedError(VkmError, RuntimeError):
    """The object was used after destroy()."""


class RendererMissingError(VkmError, NotImplementedError):
    """An SRU is routed to a device that has no renderer (attach one, or pass a factory)."""


# ---- the kernels layer (ringkernel's RingKernelError variants) ----------------

class BackendUnavailableError(VkmError):
    """No device at all can take the work (ringkernel's BackendUnavailable)."""


class KernelNotFoundError(VkmError, KeyError):
    """A kernel id the coordinator (or a runtime) does not know (ringkernel's KernelNotFound)."""

    def __str__(self) -> str:   # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else ""


class InvalidConfigError(VkmError, ValueError):
    """A configuration value or a request that cannot be honoured (ringkernel's InvalidConfig)."""


class DeviceNotAvailableError(VkmError):
    """The device asked for (or every candidate) is unknown, offline or full (ringkernel's DeviceNotAvailable)."""


class K2KDestinationNotFoundError(VkmError):
    """A kernel-to-kernel message names a kernel with no device (ringkernel's K2KDestinationNotFound)."""


class TenantMismatchError(VkmError, PermissionError):
    """A kernel-to-kernel message would cross tenants (ringkernel's K2K broker's TenantMismatch)."""


class MigrationError(VkmError):
    """A kernel migration could not be carried out (ringkernel's MigrationFailed)."""


class KernelValidationError(VkmError, ValueError):
    """Kernel code or a kernel request failed validation (ringkernel's ValidationError)."""


#: ringkernel's spelling (`RingKernelError::MigrationFailed`): the same class as MigrationError.
MigrationFailedError = MigrationError
#: ringkernel's spelling (`RingKernelError::ValidationError`): the same class as KernelValidationError.
ValidationError = KernelValidationError


class InvalidCheckpointError(VkmError, ValueError):
    """Checkpoint bytes that cannot be loaded: bad magic or version, too large,
    truncated, or a checksum that does not match (ringkernel's InvalidCheckpoint)."""


class CheckpointStorageError(VkmError, OSError):
    """A checkpoint storage backend could not save, load, list or delete (ringkernel's IoError)."""


class CheckpointNotFoundError(CheckpointStorageError, FileNotFoundError):
    """No checkpoint is stored under that name."""


# ---- the cluster layer (vkmulti.cluster) ---------------------------------------

#: What to install for the cluster layer.
INSTALL_HINT_CLUSTER = "pip install 'vkmulti[cluster]'"


class ClusterError(VkmError):
    """The cluster layer could not do what was asked (names the node and why)."""


class RayMissingError(ClusterError, ImportError):
    """Ray is not installed: the cluster layer is an optional extra."""

    def __init__(self, what: str = "vkmulti.cluster"):
        super().__init__(f"{what} needs Ray, which is not installed in this Python ({INSTALL_HINT_CLUSTER})")


class ClusterAddressError(ClusterError, ValueError):
    """A Ray address that is not 'auto', HOST:PORT or ray://HOST:PORT."""


class ClusterConnectionError(ClusterError, ConnectionError):
    """Nothing answered at a Ray address, or Ray refused the connection."""


class NoAgentError(ClusterError):
    """No node of the cluster can run vkmulti work (every node was skipped or lost)."""


# VkResult values (vulkan_core.h). Kept here so errors read by name without a GPU.
_RESULT_NAMES = {
    0: "VK_SUCCESS", 1: "VK_NOT_READY", 2: "VK_TIMEOUT", 3: "VK_EVENT_SET", 4: "VK_EVENT_RESET",
    5: "VK_INCOMPLETE", -1: "VK_ERROR_OUT_OF_HOST_MEMORY", -2: "VK_ERROR_OUT_OF_DEVICE_MEMORY",
    -3: "VK_ERROR_INITIALIZATION_FAILED", -4: "VK_ERROR_DEVICE_LOST", -5: "VK_ERROR_MEMORY_MAP_FAILED",
    -6: "VK_ERROR_LAYER_NOT_PRESENT", -7: "VK_ERROR_EXTENSION_NOT_PRESENT",
    -8: "VK_ERROR_FEATURE_NOT_PRESENT", -9: "VK_ERROR_INCOMPATIBLE_DRIVER", -10: "VK_ERROR_TOO_MANY_OBJECTS",
    -11: "VK_ERROR_FORMAT_NOT_SUPPORTED", -12: "VK_ERROR_FRAGMENTED_POOL", -13: "VK_ERROR_UNKNOWN",
    -1000069000: "VK_ERROR_OUT_OF_POOL_MEMORY", -1000072003: "VK_ERROR_INVALID_EXTERNAL_HANDLE",
    -1000161000: "VK_ERROR_FRAGMENTATION", -1000257000: "VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS",
}

# ---- vkmulti's own result codes (native/vkm_errors.h; test_native_errors.py
# checks that the two tables agree). The native message says what happened.

class LinkStalledError(TransferError):
    """A link's own work made no progress for its stall timeout once the job's
    wait points were reached (a GPU hung, or work queued ahead of the copy never
    finishes): that job and every later one fail; make a new transfer. A source
    still busy before its wait point is waited for, never a stall."""


class CudaError(TransferError):
    """A CUDA driver call or a CUDA stream failed under a CUDA_PEER link; the link has failed."""


#: an argument is out of range or inconsistent (ValueError)
INVALID_ARGUMENT = -1000990000
#: a link's worker waited past its stall timeout
LINK_STALLED = -1000990001
#: a CUDA call or stream failed
CUDA_FAILED = -1000990002
#: the device, its enabled extensions or the CUDA driver lack what is needed
UNSUPPORTED = -1000990003
#: the calling thread holds the queue's lock already (it is not re-entrant)
QUEUE_LOCK_HELD = -1000990004
_NATIVE_RESULTS: dict[int, tuple[str, type[Exception]]] = {
    INVALID_ARGUMENT: ("VKM_ERROR_INVALID_ARGUMENT", ValueError),
    LINK_STALLED: ("VKM_ERROR_LINK_STALLED", LinkStalledError),
    CUDA_FAILED: ("VKM_ERROR_CUDA", CudaError),
    UNSUPPORTED: ("VKM_ERROR_UNSUPPORTED", UnsupportedError),
    QUEUE_LOCK_HELD: ("VKM_ERROR_QUEUE_LOCK_HELD", RuntimeError),
}
_RESULT_NAMES.update({code: name for code, (name, _) in _NATIVE_RESULTS.items()})

_RESULT_CLASSES: dict[int, type[VulkanError]] = {
    -1: OutOfHostMemoryError,
    -2: OutOfDeviceMemoryError,
    -4: DeviceLostError,
}


#: The native core's UNSUPPORTED messages name the extension and, quoted, the device.
_EXTENSION_IN = re.compile(r"\bVK_[A-Z]+_\w+")
_DEVICE_IN = re.compile(r"'([^']+)'")


def result_name(result: int) -> str:
    """The name of a VkResult (or of one of vkmulti's own result codes)."""
    return _RESULT_NAMES.get(result, f"VkResult({result})")


def raise_for_result(result: int, call: str, message: str | None = None) -> None:
    """Raise the exception for `result` from `call`; return for VK_SUCCESS.

    The single translation point: the native layer and the Python layer both
    come here. `message`, where the native core gives one, says what happened
    (`call` says where).
    """
    if result == 0:
        return
    native = _NATIVE_RESULTS.get(result)
    if native is not None:
        name, cls = native
        exc = cls(message or f"{call}: {name}")
        exc.call = call  # type: ignore[attr-defined]
        if isinstance(exc, UnsupportedError) and message:
            ext, dev = _EXTENSION_IN.search(message), _DEVICE_IN.search(message)
            exc.extension = ext.group(0) if ext else None
            exc.device = dev.group(1) if dev else None
        raise exc
    detail = f"{message} ({call} returned {result_name(result)})" if message else None
    if result == 2:
        raise TimeoutError(detail or f"{call} timed out (VK_TIMEOUT)")
    if result in (-6, -7, -8):
        raise UnsupportedError(detail or f"{call} failed: {result_name(result)}; the driver lacks what was asked for")
    raise _RESULT_CLASSES.get(result, VulkanError)(result, call, detail)
