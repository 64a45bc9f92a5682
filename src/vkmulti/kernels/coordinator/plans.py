"""Migration records: MigrationPriority, MigrationState, MigrationRequest,
KernelMigrationPlan and DeviceUnregisterResult."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..._core.reprs import compact_repr
from ..ids import KernelId, as_kernel_id, check_count, check_index, check_number

__all__ = ["MigrationPriority", "MigrationState", "MigrationRequest", "KernelMigrationPlan",
           "DeviceUnregisterResult"]


class MigrationPriority(enum.Enum):
    """How urgently a planned migration should run (a label; nothing schedules by it yet)."""
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"
    CRITICAL = "critical"


class MigrationState(enum.Enum):
    """Where a migration is: PENDING -> QUIESCING -> CHECKPOINTING -> TRANSFERRING
    -> RESTORING -> COMPLETED, or FAILED / CANCELLED."""
    PENDING = "pending"
    QUIESCING = "quiescing"
    CHECKPOINTING = "checkpointing"
    TRANSFERRING = "transferring"
    RESTORING = "restoring"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass
class MigrationRequest:
    """A request to move `kernel_id` from `source_device` to `target_device`
    along `path`, with the path's estimated bandwidth (GB/s) and latency (us).
    `started_at` is a time.monotonic() value once the migration starts."""

    __repr__ = compact_repr

    kernel_id: KernelId
    source_device: int
    target_device: int
    path: list[int]
    estimated_bandwidth_gbps: float
    estimated_latency_us: float
    state: MigrationState = MigrationState.PENDING
    started_at: float | None = None

    def __post_init__(self) -> None:
        self.kernel_id = as_kernel_id(self.kernel_id)
        self.source_device = check_index(self.source_device, "source_device")
        self.target_device = check_index(self.target_device, "target_device")
        if not isinstance(self.path, (list, tuple)):
            raise TypeError(f"path must be a list of device indices, got {self.path!r}")
        self.path = [check_index(p, "path entry") for p in self.path]
        self.estimated_bandwidth_gbps = check_number(self.estimated_bandwidth_gbps, "estimated_bandwidth_gbps",
                                                     positive=True)
        self.estimated_latency_us = check_number(self.estimated_latency_us, "estimated_latency_us")
        if not isinstance(self.state, MigrationState):
            raise TypeError(f"state must be a MigrationState, got {self.state!r}")

    def estimate_transfer_time(self, state_size_bytes: int) -> float:
        """Seconds to move `state_size_bytes`: size / bandwidth + latency, truncated
        to whole microseconds (1 GB at 300 GB/s plus 1 us: 0.003334 s)."""
        n = check_count(state_size_bytes, "state_size_bytes")
        total_us = (n / 1e9) / self.estimated_bandwidth_gbps * 1e6 + self.estimated_latency_us
        return int(total_us) / 1e6


@dataclass
class KernelMigrationPlan:
    """One kernel to move off an unregistered device, and where to."""

    __repr__ = compact_repr

    kernel_id: KernelId
    source_device: int
    target_device: int
    priority: MigrationPriority = MigrationPriority.NORMAL

    def __post_init__(self) -> None:
        self.kernel_id = as_kernel_id(self.kernel_id)
        self.source_device = check_index(self.source_device, "source_device")
        self.target_device = check_index(self.target_device, "target_device")
        if not isinstance(self.priority, MigrationPriority):
            raise TypeError(f"priority must be a MigrationPriority, got {self.priority!r}")


@dataclass
class DeviceUnregisterResult:
    """What `unregister_device` did: the migrations it planned (the kernels are
    already mapped to their targets), the kernels it could place nowhere (now
    unmapped), and success (False for an index that was never a device)."""

    __repr__ = compact_repr

    device_index: int
    kernels_to_migrate: list[KernelMigrationPlan] = field(default_factory=list)
    orphaned_kernels: list[KernelId] = field(default_factory=list)
    success: bool = True
