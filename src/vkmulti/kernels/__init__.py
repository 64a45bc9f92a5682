"""The kernels layer: ringkernel-core's `multi_gpu` port (coordinator, strategies,
device registry, topology), on vkmulti's devices and transfer engine.

Rust spelling maps to Python as: struct -> class of the same name, enum ->
enum.Enum with UPPER_SNAKE members, `Option` -> None, `Result` errors ->
exceptions under VkmError, `Duration` -> float seconds, `KernelId` -> a str
subclass (plain str accepted).
"""
from .config import Backend, KernelMode, LaunchOptions, LoadBalancingStrategy, MultiGpuBuilder, MultiGpuConfig
from .coordinator import CoordinatorEvent, CoordinatorEventKind, CustomSelector, MultiGpuCoordinator
from .devices import DeviceInfo, DeviceStatus, MultiGpuStats
from .ids import KernelId
from .plans import (DeviceUnregisterResult, KernelMigrationPlan, MigrationPriority, MigrationRequest,
                    MigrationState)
from .probe import format_topology, probe_topology
from .topology import GpuConnection, GpuTopology, InterconnectType
from .transfer import CrossDeviceTransfer

__all__ = [
    "Backend", "KernelMode", "LaunchOptions", "LoadBalancingStrategy", "MultiGpuBuilder", "MultiGpuConfig",
    "MultiGpuCoordinator", "CoordinatorEvent", "CoordinatorEventKind", "CustomSelector",
    "DeviceInfo", "DeviceStatus", "MultiGpuStats", "KernelId",
    "DeviceUnregisterResult", "KernelMigrationPlan", "MigrationPriority", "MigrationRequest", "MigrationState",
    "GpuConnection", "GpuTopology", "InterconnectType", "CrossDeviceTransfer",
    "probe_topology", "format_topology",
]
