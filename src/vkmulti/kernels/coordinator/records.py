"""DeviceInfo, DeviceStatus and MultiGpuStats: the coordinator's records of devices."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..._core.reprs import compact_repr
from .config import Backend
from ..ids import KernelId, check_count, check_index

__all__ = ["DeviceInfo", "DeviceStatus", "MultiGpuStats"]


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
        self.index = check_index(self.index, "DeviceInfo.index")
        if not isinstance(self.name, str):
            raise TypeError(f"DeviceInfo.name must be a str, got {type(self.name).__name__}")
        if not isinstance(self.backend, Backend):
            raise TypeError(f"DeviceInfo.backend must be a Backend, got {self.backend!r}")
        self.total_memory = check_count(self.total_memory, "DeviceInfo.total_memory")
        self.available_memory = check_count(self.available_memory, "DeviceInfo.available_memory")
        cc = self.compute_capability
        if cc is not None:
            if not isinstance(cc, (tuple, list)) or len(cc) != 2:
                raise TypeError(f"DeviceInfo.compute_capability must be None or (major, minor), got {cc!r}")
            self.compute_capability = (check_count(cc[0], "compute capability major"),
                                       check_count(cc[1], "compute capability minor"))
        self.max_threads_per_block = check_count(self.max_threads_per_block, "DeviceInfo.max_threads_per_block")
        self.multiprocessor_count = check_count(self.multiprocessor_count, "DeviceInfo.multiprocessor_count")
        if not isinstance(self.p2p_capable, bool):
            raise TypeError(f"DeviceInfo.p2p_capable must be a bool, got {self.p2p_capable!r}")
        for label in ("device_uuid", "pci_bus"):
            v = getattr(self, label)
            if v is not None and not isinstance(v, str):
                raise TypeError(f"DeviceInfo.{label} must be a str or None, got {v!r}")

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
