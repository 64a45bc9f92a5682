"""The coordinator's records: DeviceInfo, DeviceStatus and MultiGpuStats of
devices; MigrationPriority, MigrationState, MigrationRequest,
KernelMigrationPlan and DeviceUnregisterResult of migrations; the
CustomSelector type; and the
RegistrySnapshot that the placement strategies and the topology view read."""
from __future__ import annotations

import bisect
import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

from ..._core.checks import U32_MAX, U64_MAX, check_count, check_index, check_number, short_repr
from ..._core.reprs import compact_repr
from ...errors import DeviceNotAvailableError
from ..ids import KernelId, as_kernel_id
from .config import Backend, LaunchOptions

__all__ = ["MAX_DEVICE_INDEX", "keep_in_order", "DeviceInfo", "DeviceStatus", "MultiGpuStats", "RegistrySnapshot", "MigrationPriority",
           "MigrationState", "MigrationRequest", "KernelMigrationPlan", "DeviceUnregisterResult",
           "CustomSelector"]


def _bounded(value: Any, label: str, top: int, check: Callable[[Any, str], int] = check_count) -> int:
    """`check(value, label)`, and ValueError above `top`."""
    v = check(value, label)
    if v > top:
        raise ValueError(f"{label} must be at most {top}, got {short_repr(v)}")
    return v


#: The highest device index a record may have: the registry keeps a slot for every index
#: up to the highest registered (placeholders fill gaps), so it is bounded (2**20 - 1).
MAX_DEVICE_INDEX = (1 << 20) - 1


@dataclass
class DeviceInfo:
    """What the coordinator knows of one device. `DeviceInfo(index, name, backend)`
    takes ringkernel's defaults for the rest; every field is assignable.

    vkmulti adds `device_uuid` and `pci_bus` (filled by
    `MultiGpuCoordinator.from_manager`, None for records without a device).
    """

    __repr__ = compact_repr

    index: int
    name: str
    backend: Backend
    total_memory: int = 0
    available_memory: int = 0
    compute_capability: tuple[int, int] | None = None
    max_threads_per_block: int = 1024
    multiprocessor_count: int = 1
    p2p_capable: bool = False
    device_uuid: str | None = None
    pci_bus: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise TypeError/ValueError naming the first field that is not usable."""
        self.index = _bounded(self.index, "DeviceInfo.index", MAX_DEVICE_INDEX, check_index)
        if not isinstance(self.name, str):
            raise TypeError(f"DeviceInfo.name must be a str, got {type(self.name).__name__}")
        if not isinstance(self.backend, Backend):
            raise TypeError(f"DeviceInfo.backend must be a Backend, got {short_repr(self.backend)}")
        self.total_memory = _bounded(self.total_memory, "DeviceInfo.total_memory", U64_MAX)
        self.available_memory = _bounded(self.available_memory, "DeviceInfo.available_memory", U64_MAX)
        cc = self.compute_capability
        if cc is not None:
            if not isinstance(cc, (tuple, list)) or len(cc) != 2:
                raise TypeError(f"DeviceInfo.compute_capability must be None or (major, minor), got {short_repr(cc)}")
            self.compute_capability = (_bounded(cc[0], "compute capability major", U32_MAX),
                                       _bounded(cc[1], "compute capability minor", U32_MAX))
        self.max_threads_per_block = _bounded(self.max_threads_per_block, "DeviceInfo.max_threads_per_block",
                                              U32_MAX)
        self.multiprocessor_count = _bounded(self.multiprocessor_count, "DeviceInfo.multiprocessor_count", U32_MAX)
        if not isinstance(self.p2p_capable, bool):
            raise TypeError(f"DeviceInfo.p2p_capable must be a bool, got {short_repr(self.p2p_capable)}")
        for label in ("device_uuid", "pci_bus"):
            v = getattr(self, label)
            if v is not None and not isinstance(v, str):
                raise TypeError(f"DeviceInfo.{label} must be a str or None, got {short_repr(v)}")

    def memory_utilization(self) -> float:
        """Fraction of memory in use: 0.0 when the total is unknown (0), else
        1 - available/total, clamped to 0..1."""
        if self.total_memory == 0:
            return 0.0
        return min(1.0, max(0.0, 1.0 - self.available_memory / self.total_memory))

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON-ready data (backend by name)."""
        d = dataclasses.asdict(self)
        d["backend"] = self.backend.name
        return d


@dataclass
class DeviceStatus:
    """One device as the coordinator sees it now: its info, kernel count and ids,
    whether it takes new kernels, and load = kernel_count / max_kernels_per_device.
    `online` (vkmulti's) is False for unregistered devices and placeholders;
    those are never `available`."""

    __repr__ = compact_repr

    info: DeviceInfo
    kernel_count: int
    kernels: list[KernelId] = field(default_factory=list)
    available: bool = True
    load: float = 0.0
    online: bool = True


@dataclass
class MultiGpuStats:
    """Coordinator totals: slots, kernels placed now, memory sums, and
    kernels_launched (every assign_kernel call since creation)."""

    __repr__ = compact_repr

    device_count: int = 0
    total_kernels: int = 0
    total_memory: int = 0
    available_memory: int = 0
    kernels_launched: int = 0


def keep_in_order(indices: list[int], idx: int, member: bool) -> None:
    """Put `idx` into the ascending list `indices` (member) or take it out: a new
    highest index is appended, so registering devices in order is O(1) amortised."""
    at = bisect.bisect_left(indices, idx)
    present = at < len(indices) and indices[at] == idx
    if member and not present:
        indices.insert(at, idx)
    elif not member and present:
        del indices[at]


class RegistrySnapshot(NamedTuple):
    """What the placement strategies and the topology view read of the
    coordinator's registry, slot by slot. Taken and read under the
    coordinator's lock (its sequences are the registry's own, not copies)."""

    infos: Sequence[DeviceInfo]
    registered: Sequence[bool]
    online: Sequence[bool]
    counts: Sequence[int]
    speed: Sequence[float]
    uniform_speed: bool
    max_kernels: int
    candidates: Sequence[int]     # preferred slots that exist, ascending
    live: Sequence[int]           # candidates that are registered and online, ascending
    preferred: frozenset[int]
    turn: int                     # the round-robin counter

    def is_live(self, i: int) -> bool:
        """Whether slot `i` exists and is a registered, online device."""
        return i < len(self.infos) and self.registered[i] and self.online[i]

    def require_registered(self, idx: int, action: str) -> None:
        """DeviceNotAvailableError ("cannot {action} device {idx}") unless slot `idx` is a registered device."""
        if idx >= len(self.infos) or not self.registered[idx]:
            listed = [i for i, r in enumerate(self.registered) if r]
            raise DeviceNotAvailableError(f"cannot {action} device {short_repr(idx)}: it is not a registered device "
                                          f"({len(self.infos)} slot(s), registered: {listed})")

    def require_online(self, idx: int, action: str) -> None:
        """As require_registered, and DeviceNotAvailableError for an unregistered (offline) device."""
        self.require_registered(idx, action)
        if not self.online[idx]:
            raise DeviceNotAvailableError(f"cannot {action} device {idx}: it was unregistered (offline)")


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
            raise TypeError(f"path must be a list of device indices, got {short_repr(self.path)}")
        self.path = [check_index(p, "path entry") for p in self.path]
        self.estimated_bandwidth_gbps = check_number(self.estimated_bandwidth_gbps, "estimated_bandwidth_gbps",
                                                     positive=True)
        self.estimated_latency_us = check_number(self.estimated_latency_us, "estimated_latency_us")
        if not isinstance(self.state, MigrationState):
            raise TypeError(f"state must be a MigrationState, got {short_repr(self.state)}")

    def estimate_transfer_time(self, state_size_bytes: int) -> float:
        """Seconds to move `state_size_bytes` (at most 2**64 - 1): size / bandwidth + latency,
        truncated to whole microseconds (1 GB at 300 GB/s plus 1 us: 0.003334 s). The
        figures are checked again here: the fields are assignable."""
        n = _bounded(state_size_bytes, "state_size_bytes", U64_MAX)
        bw = check_number(self.estimated_bandwidth_gbps, "estimated_bandwidth_gbps", positive=True)
        total_us = (n / 1e9) / bw * 1e6 + check_number(self.estimated_latency_us, "estimated_latency_us")
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
            raise TypeError(f"priority must be a MigrationPriority, got {short_repr(self.priority)}")


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


#: fn(statuses of every slot, options) -> device index
CustomSelector = Callable[[list[DeviceStatus], LaunchOptions], int]
