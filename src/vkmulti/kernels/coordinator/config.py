"""Configuration of the kernels layer: Backend, KernelMode, LaunchOptions,
LoadBalancingStrategy and MultiGpuConfig (ringkernel's spelling)."""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from ..._core.checks import check_count, check_index, short_repr
from ..._core.reprs import compact_repr
from ...errors import InvalidConfigError

__all__ = ["Backend", "KernelMode", "LaunchOptions", "LoadBalancingStrategy", "MultiGpuConfig"]


class Backend(enum.Enum):
    """The compute backend a device is driven through. ringkernel's CPU, CUDA,
    METAL, WGPU and AUTO, plus VULKAN: vkmulti drives every GPU through Vulkan
    (a CPU Vulkan device such as lavapipe is CPU)."""
    CPU = "cpu"
    CUDA = "cuda"
    METAL = "metal"
    WGPU = "wgpu"
    VULKAN = "vulkan"
    AUTO = "auto"

    @property
    def display_name(self) -> str:
        """ringkernel's `Backend::name()` ("CPU", "CUDA", "Metal", "WebGPU", "Vulkan", "Auto")."""
        return _BACKEND_NAMES[self]

    def __str__(self) -> str:
        return self.display_name


_BACKEND_NAMES = {Backend.CPU: "CPU", Backend.CUDA: "CUDA", Backend.METAL: "Metal", Backend.WGPU: "WebGPU",
                  Backend.VULKAN: "Vulkan", Backend.AUTO: "Auto"}


class KernelMode(enum.Enum):
    """How a kernel runs: PERSISTENT (resident state, relaunched cheaply; Vulkan
    gives no forward-progress guarantee for a shader that never exits) or
    EVENT_DRIVEN (launched per message batch)."""
    PERSISTENT = "persistent"
    EVENT_DRIVEN = "event_driven"


@dataclass
class LaunchOptions:
    """Options for launching a kernel, with ringkernel's defaults. The
    coordinator only hands them to a custom selector; the runtime uses them.
    The `with_*` methods return a changed copy."""

    __repr__ = compact_repr

    mode: KernelMode = KernelMode.PERSISTENT
    grid_size: int = 1
    block_size: int = 256
    input_queue_capacity: int = 1024
    output_queue_capacity: int = 1024
    shared_memory_size: int = 0
    auto_activate: bool = True
    cooperative: bool = False
    enable_k2k: bool = False
    scheduler_config: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.mode, KernelMode):
            raise TypeError(f"mode must be a KernelMode, got {short_repr(self.mode)}")
        for label in ("grid_size", "block_size", "input_queue_capacity", "output_queue_capacity"):
            check_count(getattr(self, label), label, 1)
        check_count(self.shared_memory_size, "shared_memory_size")
        for label in ("auto_activate", "cooperative", "enable_k2k"):
            if not isinstance(getattr(self, label), bool):
                raise TypeError(f"{label} must be a bool, got {short_repr(getattr(self, label))}")

    @classmethod
    def single_block(cls, block_size: int) -> "LaunchOptions":
        """Options for one block of `block_size` threads (the seed's constructor)."""
        return cls(block_size=block_size)

    @classmethod
    def multi_block(cls, grid_size: int, block_size: int) -> "LaunchOptions":
        """Options for `grid_size` blocks of `block_size` threads (the seed's constructor)."""
        return cls(grid_size=grid_size, block_size=block_size)

    def _with(self, **changes: Any) -> "LaunchOptions":
        return dataclasses.replace(self, **changes)

    def with_mode(self, mode: KernelMode) -> "LaunchOptions":
        """A copy with `mode` set."""
        return self._with(mode=mode)

    def with_queue_capacity(self, capacity: int) -> "LaunchOptions":
        """A copy with both queue capacities set to `capacity`."""
        return self._with(input_queue_capacity=capacity, output_queue_capacity=capacity)

    def with_input_queue_capacity(self, capacity: int) -> "LaunchOptions":
        """A copy with the input (host -> kernel) queue capacity set."""
        return self._with(input_queue_capacity=capacity)

    def with_output_queue_capacity(self, capacity: int) -> "LaunchOptions":
        """A copy with the output (kernel -> host) queue capacity set."""
        return self._with(output_queue_capacity=capacity)

    def with_shared_memory(self, size: int) -> "LaunchOptions":
        """A copy with `shared_memory_size` set (bytes)."""
        return self._with(shared_memory_size=size)

    def without_auto_activate(self) -> "LaunchOptions":
        """A copy that does not activate the kernel at launch."""
        return self._with(auto_activate=False)

    def with_grid_size(self, grid_size: int) -> "LaunchOptions":
        """A copy with `grid_size` set."""
        return self._with(grid_size=grid_size)

    def with_block_size(self, block_size: int) -> "LaunchOptions":
        """A copy with `block_size` set."""
        return self._with(block_size=block_size)

    def with_cooperative(self, cooperative: bool) -> "LaunchOptions":
        """A copy with `cooperative` set."""
        return self._with(cooperative=cooperative)

    def with_k2k(self, enable: bool) -> "LaunchOptions":
        """A copy with kernel-to-kernel messaging enabled or not."""
        return self._with(enable_k2k=enable)

    def with_scheduler(self, config: Any) -> "LaunchOptions":
        """A copy with `scheduler_config` set (kept for the seed; vkmulti does not read it)."""
        return self._with(scheduler_config=config)

    def with_priority(self, priority: int) -> "LaunchOptions":
        """A scheduling hint ringkernel accepts and ignores; checked (0..255), not stored."""
        if check_count(priority, "priority") > 255:
            raise ValueError(f"priority must be 0..255, got {short_repr(priority)}")
        return self._with()


class LoadBalancingStrategy(enum.Enum):
    """How `MultiGpuCoordinator.select_device` picks a device (rules in its docstring)."""
    FIRST_AVAILABLE = "first_available"
    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"
    MEMORY_BASED = "memory_based"
    COMPUTE_CAPABILITY = "compute_capability"
    CUSTOM = "custom"


@dataclass
class MultiGpuConfig:
    """Coordinator configuration with ringkernel's defaults.

    `strict` (vkmulti's): True (default) raises DeviceNotAvailableError when no
    device fits; False gives the seed's answer instead (device 0 or the first
    candidate), still never an offline device or a placeholder.
    """

    __repr__ = compact_repr

    load_balancing: LoadBalancingStrategy = LoadBalancingStrategy.LEAST_LOADED
    auto_select_device: bool = True
    max_kernels_per_device: int = 64
    enable_p2p: bool = True
    preferred_devices: list[int] = field(default_factory=list)
    strict: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise InvalidConfigError (or TypeError) for a value the coordinator cannot use."""
        if not isinstance(self.load_balancing, LoadBalancingStrategy):
            raise TypeError(f"load_balancing must be a LoadBalancingStrategy, got {short_repr(self.load_balancing)}")
        for label in ("auto_select_device", "enable_p2p", "strict"):
            if not isinstance(getattr(self, label), bool):
                raise TypeError(f"{label} must be a bool, got {short_repr(getattr(self, label))}")
        try:
            check_count(self.max_kernels_per_device, "max_kernels_per_device", 1)
        except ValueError as exc:
            raise InvalidConfigError(f"{exc} (a device must be able to hold at least one kernel)") from None
        if not isinstance(self.preferred_devices, (list, tuple)):
            raise TypeError(f"preferred_devices must be a list of device indices, got {short_repr(self.preferred_devices)}")
        for d in self.preferred_devices:   # a filter: order and repeats do not matter, as in the seed
            check_index(d, "preferred_devices entry")

    def copy(self) -> "MultiGpuConfig":
        """An independent copy (its preferred_devices list is copied too)."""
        return dataclasses.replace(self, preferred_devices=list(self.preferred_devices))
