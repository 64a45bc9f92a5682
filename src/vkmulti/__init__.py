"""vkmulti: drive several GPUs through Vulkan.

Places work on GPUs by cost, moves results between them as fast as the
hardware allows, and keeps working when a GPU is slow or gone. One VkDevice
per GPU; GPU 0 is the primary (the one that presents). Without a GPU, the
commands and MultiDeviceManager.create() use a virtual pair of CPU devices
(Mesa's lavapipe) and say so.

A first program::

    import numpy as np, vkmulti
    with vkmulti.MultiDeviceManager.create() as mgr, vkmulti.InterGpuTransfer(mgr) as t:
        copies = t.broadcast_blocking(np.zeros(1 << 20, np.uint8))   # one Buffer per GPU

The main names, by task:

- Devices: MultiDeviceManager (create(), slots, primary, secondaries, destroy()),
  DeviceSlot, device_requirements (for an engine that makes its own VkDevice).
- Memory: Image (RGBA16F by default), Buffer; upload() and download().
- Moving data: CrossDeviceTransfer (submit() -> TransferTicket, wait() or
  await), select_transfer_method, pair_methods, TransferMethod;
  InterGpuTransfer (copy_buffer, broadcast, gather, gather_to_device).
- Placing work: assign_srus, assign_srus_array, SRUOffloadCoordinator
  (render_frame across every GPU), ReferenceRenderer, ReferenceSRU.
- Kernels across GPUs: vkmulti.kernels (KernelRuntime, MultiGpuCoordinator,
  CrossGpuK2KRouter, checkpoints, live migration, hot reload).
- Across machines: vkmulti.cluster (Ray).
- Errors: VkmError and its subclasses (UnsupportedError, TimeoutError,
  DeviceLostError, DestroyedError, ...), all in vkmulti.errors.
- Tests and drills: vkmulti.testing (the virtual pair, lose_device).

Where to read next: help(vkmulti.MultiDeviceManager) and the other classes
above; `python -m vkmulti --help` (info, demo, topology, bench); the docs/
folder of the source distribution (the docs site): tutorials/first-program.md
(first program and the no-GPU rule), tutorials/engine-integration.md,
tutorials/kernels-and-k2k.md, tutorials/failover.md, tutorials/cluster.md;
how-to/ (tasks); reference/api/ (every public name), reference/cli.md,
reference/environment.md (every VKMULTI_* variable); explanation/ (architecture,
transfer methods, seed defects).
"""
from ._version import __version__

from .memory.buffer import Buffer
from .memory.image import Image
from .transfer.inter_gpu import Gathered, InterGpuTransfer
from .device.capabilities import DeviceCapabilities, QueueFamilies, RenderCapabilities, probe_device
from .device.cuda import CudaDevice, cuda_devices, cuda_peer_reason, cuda_status
from .device.logical import LogicalDevice, Queue, create_logical_device
from .errors import (BackendUnavailableError, CudaError, DestroyedError, DeviceLostError, DeviceNotAvailableError,
                     InvalidConfigError, K2KDestinationNotFoundError, KernelNotFoundError, KernelValidationError,
                     InvalidBufferError, LinkStalledError, MigrationError, MigrationFailedError, OutOfDeviceMemoryError,
                     OutOfHostMemoryError, RendererMissingError, TimeoutError, TransferError, UnsupportedError,
                     ValidationError, VkmError, VulkanError)
from .device.instance import Instance
from .transfer.methods import TransferMethod, pair_methods, select_transfer_method, supported_methods
from .device.manager import DeviceSlot, MultiDeviceManager
from .offload.coordinator import OffloadRoute, SRUOffloadCoordinator
from .offload.partition import SRUAssignment, assign_srus, assign_srus_array
from ._core.timeline import TimelinePoint
from .offload.compositor import Compositor
from .offload.render import ReferenceRenderer, ReferenceSRU
from .transfer.cross_device import CrossDeviceTransfer
from .transfer.link import TransferTicket
from .transfer.methods import pair_methods, select_transfer_method
from .transfer.requirements import DeviceRequirements, device_requirements
from . import buffers, images  # the old paths of Buffer and Image, aliases for one release
from . import testing   # vkmulti.testing.install_virtual_gpus(2) works after a plain `import vkmulti`
# ringkernel's multi_gpu port (its CrossDeviceTransfer stays vkmulti.kernels.CrossDeviceTransfer)
from .kernels import (Backend, CoordinatorEvent, CoordinatorEventKind, DeviceInfo, DeviceStatus,
                      DeviceUnregisterResult, GpuConnection, GpuTopology, InterconnectType, KernelId,
                      KernelMigrationPlan, KernelMode, LaunchOptions, LoadBalancingStrategy, MigrationPriority,
                      MigrationRequest, MigrationState, MultiGpuBuilder, MultiGpuConfig, MultiGpuCoordinator,
                      MultiGpuStats, probe_topology)
from .errors import KernelMessageError, QueueFullError, TenantMismatchError
# compute kernels with resident state and message rings (vkmulti.kernels)
from .kernels import HlcTimestamp, K2KMessage, Kernel, KernelRuntime, KernelSpec, MessageEnvelope
# the cross-GPU K2K router (ringkernel's CrossGpuK2KRouter, delivering for real)
from .kernels import (CrossGpuK2KRouter, CrossGpuRouterStats, CrossGpuRouterStatsSnapshot, PendingK2KMessage,
                      RoutingDecision, RoutingKind)
# checkpoints, migration and hot reload of kernels (vkmulti.kernels)
from .kernels import (CHECKPOINT_MAGIC, CHECKPOINT_VERSION, MAX_CHECKPOINT_SIZE, Checkpoint, CheckpointBuilder,
                      CheckpointHeader, CheckpointMetadata, CheckpointPolicy, CheckpointStorage,
                      CheckpointableKernel, ChunkHeader, ChunkType, DataChunk, FileStorage, HotReloadConfig,
                      HotReloadManager, HotReloadRequest, HotReloadResult, HotReloadState, HotReloadStats,
                      HotReloadStatsSnapshot, HotReloadableKernel, KernelCodeFormat, KernelCodeSource,
                      KernelMigrator, MemoryStorage, MigratableKernel, MigrationResult, MigrationStats,
                      MigrationStatsSnapshot, PlanOutcome)
from .errors import CheckpointNotFoundError, CheckpointStorageError, InvalidCheckpointError

__all__ = [
    "DeviceCapabilities", "QueueFamilies", "RenderCapabilities", "probe_device",
    "LogicalDevice", "Queue", "create_logical_device", "Instance",
    "DeviceSlot", "MultiDeviceManager", "TransferMethod", "supported_methods",
    "SRUAssignment", "assign_srus", "assign_srus_array", "CrossDeviceTransfer", "TimelinePoint", "TransferTicket",
    "select_transfer_method", "pair_methods", "InterGpuTransfer", "Gathered", "Image", "Buffer",
    "DeviceRequirements", "device_requirements",
    "CudaDevice", "cuda_devices", "cuda_peer_reason", "cuda_status",
    "OffloadRoute", "SRUOffloadCoordinator", "ReferenceSRU", "ReferenceRenderer", "Compositor",
    "VkmError", "VulkanError", "DeviceLostError", "OutOfDeviceMemoryError", "OutOfHostMemoryError",
    "UnsupportedError", "TransferError", "TimeoutError", "DestroyedError", "RendererMissingError",
    "LinkStalledError", "CudaError", "InvalidBufferError",
    "BackendUnavailableError", "KernelNotFoundError", "InvalidConfigError", "DeviceNotAvailableError",
    "K2KDestinationNotFoundError", "MigrationError", "KernelValidationError", "MigrationFailedError",
    "ValidationError",
    "Backend", "KernelMode", "LaunchOptions", "LoadBalancingStrategy", "MultiGpuConfig", "MultiGpuBuilder",
    "MultiGpuCoordinator", "CoordinatorEvent", "CoordinatorEventKind", "DeviceInfo", "DeviceStatus",
    "MultiGpuStats", "KernelId", "DeviceUnregisterResult", "KernelMigrationPlan", "MigrationPriority",
    "MigrationRequest", "MigrationState", "GpuConnection", "GpuTopology", "InterconnectType", "probe_topology",
    "KernelMessageError", "QueueFullError",
    "KernelRuntime", "KernelSpec", "Kernel", "K2KMessage", "MessageEnvelope", "HlcTimestamp",
    "CrossGpuK2KRouter", "CrossGpuRouterStats", "CrossGpuRouterStatsSnapshot", "PendingK2KMessage",
    "RoutingDecision", "RoutingKind", "TenantMismatchError",
    "Checkpoint", "CheckpointBuilder", "CheckpointHeader", "CheckpointMetadata", "ChunkHeader", "ChunkType",
    "DataChunk", "CHECKPOINT_MAGIC", "CHECKPOINT_VERSION", "MAX_CHECKPOINT_SIZE",
    "CheckpointStorage", "FileStorage", "MemoryStorage", "CheckpointPolicy",
    "KernelCodeFormat", "KernelCodeSource", "HotReloadConfig", "HotReloadManager", "HotReloadRequest",
    "HotReloadResult", "HotReloadState", "HotReloadStats", "HotReloadStatsSnapshot",
    "KernelMigrator", "MigrationResult", "MigrationStats", "MigrationStatsSnapshot", "PlanOutcome",
    "CheckpointableKernel", "HotReloadableKernel", "MigratableKernel",
    "InvalidCheckpointError", "CheckpointStorageError", "CheckpointNotFoundError",
]

# failure handling: a lost GPU (docs/explanation/failover.md)
from .errors import PrimaryDeviceLostError  # noqa: E402
from .device.failover import FailoverStats, Recovery  # noqa: E402

__all__ += ["PrimaryDeviceLostError", "FailoverStats", "Recovery"]
