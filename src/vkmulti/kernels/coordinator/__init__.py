"""ringkernel's coordinator: configuration, the device registry and its records, placement
strategies, the topology and its probe. No GPU work but the probe."""
from .config import Backend, KernelMode, LaunchOptions, LoadBalancingStrategy, MultiGpuConfig, MultiGpuBuilder
from .coordinator import MultiGpuCoordinator, CoordinatorEvent, CoordinatorEventKind, CustomSelector
from .device_facts import (memory_figures, device_info_for_slot, pair_transfer_methods, numa_node, nvlink_links,
                           NvLinkFacts, NVLINK_GBPS_PER_LINK)
from .plans import MigrationPriority, MigrationState, MigrationRequest, KernelMigrationPlan, DeviceUnregisterResult
from .probe import probe_topology, cache_dir, cache_path, cache_key, format_topology, CACHE_ENV, CACHE_FORMAT
from .records import DeviceInfo, DeviceStatus, MultiGpuStats
from .strategies import StrategyMixin
from .topology import InterconnectType, GpuConnection, GpuTopology
from .topology_view import TopologyMixin
from .transfer_spec import CrossDeviceTransfer

__all__ = ["Backend", "KernelMode", "LaunchOptions", "LoadBalancingStrategy", "MultiGpuConfig", "MultiGpuBuilder",
           "MultiGpuCoordinator", "CoordinatorEvent", "CoordinatorEventKind", "CustomSelector", "memory_figures",
           "device_info_for_slot", "pair_transfer_methods", "numa_node", "nvlink_links", "NvLinkFacts",
           "NVLINK_GBPS_PER_LINK", "MigrationPriority", "MigrationState", "MigrationRequest", "KernelMigrationPlan",
           "DeviceUnregisterResult", "probe_topology", "cache_dir", "cache_path", "cache_key", "format_topology",
           "CACHE_ENV", "CACHE_FORMAT", "DeviceInfo", "DeviceStatus", "MultiGpuStats", "StrategyMixin",
           "InterconnectType", "GpuConnection", "GpuTopology", "TopologyMixin", "CrossDeviceTransfer"]
