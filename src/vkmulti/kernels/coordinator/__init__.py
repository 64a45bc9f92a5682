"""ringkernel's coordinator: configuration, the device registry and its records, placement
strategies, the topology and its probe. No GPU work but the probe."""
from .builder import MultiGpuBuilder
from .config import Backend, KernelMode, LaunchOptions, LoadBalancingStrategy, MultiGpuConfig
from .coordinator import MultiGpuCoordinator
from .device_facts import (memory_figures, device_info_for_slot, pair_transfer_methods, numa_node, nvlink_links,
                           NvLinkFacts, NVLINK_GBPS_PER_LINK)
from .events import CoordinatorEvent, CoordinatorEventKind
from .probe import probe_topology, cache_dir, cache_path, cache_key, format_topology, CACHE_ENV, CACHE_FORMAT
from .records import (CustomSelector, DeviceInfo, DeviceStatus, MultiGpuStats, MigrationPriority, MigrationState,
                      MigrationRequest, KernelMigrationPlan, DeviceUnregisterResult)
from .topology import InterconnectType, GpuConnection, GpuTopology
from .transfer_spec import CrossDeviceTransfer

__all__ = ["Backend", "KernelMode", "LaunchOptions", "LoadBalancingStrategy", "MultiGpuConfig", "MultiGpuBuilder",
           "MultiGpuCoordinator", "CoordinatorEvent", "CoordinatorEventKind", "CustomSelector", "memory_figures",
           "device_info_for_slot", "pair_transfer_methods", "numa_node", "nvlink_links", "NvLinkFacts",
           "NVLINK_GBPS_PER_LINK", "MigrationPriority", "MigrationState", "MigrationRequest", "KernelMigrationPlan",
           "DeviceUnregisterResult", "probe_topology", "cache_dir", "cache_path", "cache_key", "format_topology",
           "CACHE_ENV", "CACHE_FORMAT", "DeviceInfo", "DeviceStatus", "MultiGpuStats", "InterconnectType",
           "GpuConnection", "GpuTopology", "CrossDeviceTransfer"]
