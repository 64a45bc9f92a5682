"""The kernels layer: ringkernel-core's `multi_gpu` port (coordinator, strategies,
device registry, topology), and compute kernels with resident state and
message rings, the runtime that launches and steps them on the coordinator's
devices and the messages they exchange, on vkmulti's devices and transfer engine.

Rust spelling maps to Python as: struct -> class of the same name, enum ->
enum.Enum with UPPER_SNAKE members, `Option` -> None, `Result` errors ->
exceptions under VkmError, `Duration` -> float seconds, `KernelId` -> a str
subclass (plain str accepted).
"""
from .coordinator.builder import MultiGpuBuilder
from .coordinator.config import Backend, KernelMode, LaunchOptions, LoadBalancingStrategy, MultiGpuConfig
from .coordinator.coordinator import MultiGpuCoordinator
from .coordinator.events import CoordinatorEvent, CoordinatorEventKind
from .coordinator.records import CustomSelector, DeviceInfo, DeviceStatus, MultiGpuStats
from .ids import KernelId
from .engine.kernel import InboundBatch, Kernel, OutboxBatch
from .engine.stats import KernelStats
from .engine.spec import KernelSpec
from .messages import (DEFAULT_PAYLOAD_SIZE, HOST_KERNEL_ID, HlcTimestamp, HybridLogicalClock, K2KMessage,
                       MessageEnvelope)
from .coordinator.records import (DeviceUnregisterResult, KernelMigrationPlan, MigrationPriority, MigrationRequest,
                                  MigrationState)
from .coordinator.probe import format_topology, probe_topology
from .reference import counter_kernel, pingpong_kernel, stencil_kernel
from .k2k.router import CrossGpuK2KRouter
from .k2k.routing import (CrossGpuRouterStats, CrossGpuRouterStatsSnapshot, DevicePath, PendingK2KMessage,
                          RoutingDecision, RoutingKind)
from .runtime.runtime import KernelRuntime, RunTicket, StepTicket
from .coordinator.topology import GpuConnection, GpuTopology, InterconnectType
from .coordinator.transfer_spec import CrossDeviceTransfer
# checkpoints, migration, hot reload (issue 16)
from .checkpoint.format import (CHECKPOINT_MAGIC, CHECKPOINT_VERSION, MAX_CHECKPOINT_SIZE, Checkpoint,
                                CheckpointBuilder, CheckpointHeader, CheckpointMetadata, ChunkHeader, ChunkType,
                                DataChunk)
from .checkpoint.storage import CheckpointStorage, FileStorage, MemoryStorage
from .reload.code_source import KernelCodeFormat, KernelCodeSource
from .reload.manager import HotReloadManager
from .reload.types import (HotReloadConfig, HotReloadRequest, HotReloadResult, HotReloadState, HotReloadStats,
                           HotReloadStatsSnapshot)
from .lifecycle.lifecycle import CheckpointPolicy
from .lifecycle.migrator import KernelMigrator, MigrationResult, MigrationStats, MigrationStatsSnapshot, PlanOutcome
from .lifecycle.protocols import CheckpointableKernel, HotReloadableKernel, MigratableKernel

__all__ = [
    "Backend", "KernelMode", "LaunchOptions", "LoadBalancingStrategy", "MultiGpuBuilder", "MultiGpuConfig",
    "MultiGpuCoordinator", "CoordinatorEvent", "CoordinatorEventKind", "CustomSelector",
    "DeviceInfo", "DeviceStatus", "MultiGpuStats", "KernelId",
    "DeviceUnregisterResult", "KernelMigrationPlan", "MigrationPriority", "MigrationRequest", "MigrationState",
    "GpuConnection", "GpuTopology", "InterconnectType", "CrossDeviceTransfer",
    "probe_topology", "format_topology",
    "KernelRuntime", "RunTicket", "StepTicket", "KernelSpec", "Kernel", "KernelStats", "OutboxBatch",
    "InboundBatch",
    "K2KMessage", "MessageEnvelope", "HlcTimestamp", "HybridLogicalClock", "HOST_KERNEL_ID",
    "DEFAULT_PAYLOAD_SIZE", "counter_kernel", "pingpong_kernel", "stencil_kernel",
    "CrossGpuK2KRouter", "CrossGpuRouterStats", "CrossGpuRouterStatsSnapshot", "PendingK2KMessage",
    "RoutingDecision", "RoutingKind", "DevicePath",
    "Checkpoint", "CheckpointBuilder", "CheckpointHeader", "CheckpointMetadata", "ChunkHeader", "ChunkType",
    "DataChunk", "CHECKPOINT_MAGIC", "CHECKPOINT_VERSION", "MAX_CHECKPOINT_SIZE",
    "CheckpointStorage", "FileStorage", "MemoryStorage", "CheckpointPolicy",
    "KernelCodeFormat", "KernelCodeSource", "HotReloadConfig", "HotReloadManager", "HotReloadRequest",
    "HotReloadResult", "HotReloadState", "HotReloadStats", "HotReloadStatsSnapshot",
    "KernelMigrator", "MigrationResult", "MigrationStats", "MigrationStatsSnapshot", "PlanOutcome",
    "CheckpointableKernel", "HotReloadableKernel", "MigratableKernel",
]
