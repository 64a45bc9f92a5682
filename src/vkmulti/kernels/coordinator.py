"""MultiGpuCoordinator: the registry of devices and kernels, and the six
load-balancing strategies (ringkernel's `multi_gpu` coordinator, defects fixed).

Every method is thread-safe: the state sits behind one lock, held only for
bookkeeping (never while user code runs: custom selectors and listeners are
called outside it).
"""
from __future__ import annotations

import copy
import dataclasses
import enum
import logging
import operator
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..errors import (BackendUnavailableError, DeviceNotAvailableError, InvalidConfigError, KernelNotFoundError,
                      MigrationError)
from .config import Backend, LaunchOptions, LoadBalancingStrategy, MultiGpuConfig
from .devices import DeviceInfo, DeviceStatus, MultiGpuStats
from .ids import KernelId, as_kernel_id, check_count, check_index, check_number
from .plans import DeviceUnregisterResult, KernelMigrationPlan, MigrationPriority, MigrationRequest
from .topology import GpuConnection, GpuTopology, InterconnectType

if TYPE_CHECKING:
    from ..multi_device import MultiDeviceManager

log = logging.getLogger(__name__)

__all__ = ["MultiGpuCoordinator", "CoordinatorEvent", "CoordinatorEventKind", "CustomSelector"]

#: fn(statuses of every slot, options) -> device index
CustomSelector = Callable[[list[DeviceStatus], LaunchOptions], int]
_UNREGISTERED = " (unregistered)"
#: the seed's fallbacks when a migration has no direct connection to read figures from
_FALLBACK_BANDWIDTH_GBPS = InterconnectType.NONE.estimated_bandwidth_gbps()
_FALLBACK_LATENCY_US = InterconnectType.NONE.estimated_latency_us()


class CoordinatorEventKind(enum.Enum):
    DEVICE_REGISTERED = "device_registered"
    DEVICE_UNREGISTERED = "device_unregistered"
    KERNEL_ASSIGNED = "kernel_assigned"
    KERNEL_REMOVED = "kernel_removed"
    KERNEL_MIGRATED = "kernel_migrated"


@dataclass(frozen=True)
class CoordinatorEvent:
    """A change to the registry, handed to listeners after it happened.

    `device_index` is the device concerned (the new one for assignments and
    migrations), `previous_device` where a kernel came from, `result` the
    DeviceUnregisterResult of DEVICE_UNREGISTERED (its plans are what a
    failover must carry out).
    """
    kind: CoordinatorEventKind
    device_index: int | None
    kernel_id: KernelId | None = None
    previous_device: int | None = None
    result: DeviceUnregisterResult | None = None


class MultiGpuCoordinator:
    """Places kernels on devices and keeps the kernel -> device map.

    Devices are slots by index. `register_device` pads gaps with placeholder
    slots (name "Unknown", backend CPU) that are never selected;
    `unregister_device` keeps the slot (indices stay stable) but takes it
    offline: it holds no kernels and is never selected until registered again.

    Selection (`select_device`): candidates are the slots in
    `preferred_devices` (all slots when empty); a device can take a kernel
    when it is registered, online and holds fewer than
    `max_kernels_per_device` kernels. Ties go to the lowest index for every
    strategy:

    - FIRST_AVAILABLE: the first candidate that can take a kernel.
    - LEAST_LOADED: the fewest kernels (divided by the device's speed weight,
      1.0 unless `set_device_speed` says otherwise).
    - ROUND_ROBIN: the devices that can take a kernel, in turn (one counter
      shared by all callers, advanced on every successful pick).
    - MEMORY_BASED: the most `available_memory`.
    - COMPUTE_CAPABILITY: the highest (major, minor); None counts as (0, 0).
    - CUSTOM: the selector's answer (it sees every slot's status), checked.

    No slot at all, or no preferred slot that exists: BackendUnavailableError.
    Candidates but none can take a kernel: DeviceNotAvailableError (with
    `strict=False` the seed's answer instead, if that is an online device).
    """

    def __init__(self, config: MultiGpuConfig | None = None):
        if config is None:
            config = MultiGpuConfig()
        if not isinstance(config, MultiGpuConfig):
            raise TypeError(f"config must be a MultiGpuConfig, got {type(config).__name__}")
        config.validate()
        self._config = config.copy()
        self._strategy = config.load_balancing
        self._max = config.max_kernels_per_device
        self._strict = config.strict
        self._preferred = frozenset(config.preferred_devices)
        self._lock = threading.Lock()
        self._infos: list[DeviceInfo] = []
        self._registered: list[bool] = []
        self._online: list[bool] = []
        self._counts: list[int] = []
        self._kernels: list[dict[KernelId, None]] = []   # insertion-ordered sets
        self._speed: list[float] = []
        self._uniform_speed = True
        self._map: dict[KernelId, int] = {}
        self._candidates: tuple[int, ...] = ()   # preferred slots that exist
        self._live: tuple[int, ...] = ()         # candidates that are registered and online
        self._rr = 0
        self._launched = 0
        self._selector: CustomSelector | None = None
        self._topology_base: GpuTopology | None = None
        self._topology_view: GpuTopology | None = None
        self._listeners: list[Callable[[CoordinatorEvent], Any]] = []
        self._manager: Any = None
        self._transfer_methods: dict[tuple[int, int], str] = {}
        self._pick = {
            LoadBalancingStrategy.FIRST_AVAILABLE: self._pick_first_available,
            LoadBalancingStrategy.LEAST_LOADED: self._pick_least_loaded,
            LoadBalancingStrategy.ROUND_ROBIN: self._pick_round_robin,
            LoadBalancingStrategy.MEMORY_BASED: self._pick_memory,
            LoadBalancingStrategy.COMPUTE_CAPABILITY: self._pick_compute,
        }.get(self._strategy)

    # -- construction from real devices -------------------------------------------

    @classmethod
    def from_manager(cls, manager: "MultiDeviceManager", config: MultiGpuConfig | None = None) -> \
            "MultiGpuCoordinator":
        """A coordinator with one registered device per slot of `manager`, with
        real figures: name, backend (VULKAN; CPU for a CPU Vulkan device),
        memory (VK_EXT_memory_budget where enabled, else the device-local heap
        size), CUDA compute capability and multiprocessor count for CUDA
        devices, max_threads_per_block, UUID, PCI bus, and p2p_capable from the
        transfer methods of its pairs. `refresh_device_memory()` re-reads the
        budget; `probe_topology()` measures the links.
        """
        from .device_facts import device_info_for_slot, pair_transfer_methods

        from ..multi_device import MultiDeviceManager

        if not isinstance(manager, MultiDeviceManager):
            raise TypeError(f"manager must be a MultiDeviceManager, got {type(manager).__name__}")
        coord = cls(config)
        slots = manager.slots
        methods = pair_transfer_methods(manager)
        for slot in slots:
            info = device_info_for_slot(slot)
            info.p2p_capable = any(m in _PEER_METHODS for (a, _), m in methods.items() if a == slot.index)
            coord.register_device(info)
        coord._manager = manager
        coord._transfer_methods = methods
        return coord

    @property
    def manager(self) -> Any:
        """The MultiDeviceManager this coordinator was built from, or None."""
        return self._manager

    @property
    def config(self) -> MultiGpuConfig:
        """A copy of the configuration (the coordinator's own cannot change)."""
        return self._config.copy()

    def transfer_method(self, source: int, destination: int) -> str | None:
        """The transfer method vkmulti uses from source to destination (devices of
        from_manager; None for records without a device)."""
        s, d = check_index(source, "source"), check_index(destination, "destination")
        if s == d:
            return "none" if s < len(self._infos) else None
        return self._transfer_methods.get((s, d))

    def refresh_device_memory(self) -> dict[int, int]:
        """Re-read every online device's available memory (VK_EXT_memory_budget
        where enabled, else the heap size) and return {index: bytes}."""
        from .device_facts import memory_figures

        if self._manager is None:
            raise InvalidConfigError("this coordinator has no Vulkan devices to read memory from; build it with "
                                     "MultiGpuCoordinator.from_manager(manager), or call update_device_memory()")
        slots = self._manager.slots
        out: dict[int, int] = {}
        for slot in slots:
            _, available, _ = memory_figures(slot)
            with self._lock:
                if slot.index < len(self._infos) and self._online[slot.index]:
                    self._infos[slot.index].available_memory = available
                    out[slot.index] = available
        return out

    def probe_topology(self, *, force: bool = False, cache: bool = True, **options: Any) -> GpuTopology:
        """Measure the topology of the manager's devices (or read it from the
        per-machine cache; `force=True` re-measures), make it this
        coordinator's topology and return a copy. Options go to
        `vkmulti.kernels.probe.probe_topology`."""
        from .probe import probe_topology

        if self._manager is None:
            raise InvalidConfigError("this coordinator has no Vulkan devices to measure; build it with "
                                     "MultiGpuCoordinator.from_manager(manager), or call set_topology()")
        topo = probe_topology(self._manager, force=force, cache=cache, **options)
        self.set_topology(topo)
        return self.topology()

    # -- listeners ---------------------------------------------------------------

    def add_listener(self, listener: Callable[[CoordinatorEvent], Any]) -> None:
        """Call `listener(event)` after every registry change (outside the lock, in
        the thread that made the change; its exceptions are logged, not raised)."""
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {type(listener).__name__}")
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[CoordinatorEvent], Any]) -> None:
        with self._lock:
            try:
                self._listeners.remove(listener)
            except ValueError:
                raise ValueError(f"listener {listener!r} is not registered") from None

    def _notify(self, events: list[CoordinatorEvent]) -> None:
        listeners = self._listeners
        if not listeners or not events:
            return
        for fn in list(listeners):
            for ev in events:
                try:
                    fn(ev)
                except Exception:   # a listener's failure must not undo the change
                    log.exception("coordinator listener %r failed on %s", fn, ev.kind.name)

    # -- devices -----------------------------------------------------------------

    def register_device(self, info: DeviceInfo) -> None:
        """Put a copy of `info` in slot `info.index` (padding gaps with
        placeholders); an existing slot is overwritten, keeps its kernels and
        comes back online."""
        if not isinstance(info, DeviceInfo):
            raise TypeError(f"register_device takes a DeviceInfo, got {type(info).__name__}")
        info = copy.copy(info)
        info.validate()
        with self._lock:
            while len(self._infos) <= info.index:
                i = len(self._infos)
                self._infos.append(DeviceInfo(i, "Unknown", Backend.CPU))
                self._registered.append(False)
                self._online.append(False)
                self._counts.append(0)
                self._kernels.append({})
                self._speed.append(1.0)
            i = info.index
            self._infos[i] = info
            self._registered[i] = True
            self._online[i] = True
            self._changed_devices_locked()
        self._notify([CoordinatorEvent(CoordinatorEventKind.DEVICE_REGISTERED, i)])

    def unregister_device(self, index: int) -> DeviceUnregisterResult:
        """Take device `index` offline and move its kernels away.

        Each kernel goes to the then least-loaded online device with room
        (ties to the lowest index), so the load spreads; kernels that fit
        nowhere are orphaned (unmapped). The map points at the targets at
        once; carry the plans out with a migrator. The slot stays (indices are
        stable): available_memory 0, " (unregistered)" added to its name once.
        An index that is not a registered device gives success=False.
        """
        idx = check_index(index, "index")
        with self._lock:
            if idx >= len(self._infos) or not self._registered[idx]:
                return DeviceUnregisterResult(idx, [], [], False)
            plans: list[KernelMigrationPlan] = []
            orphans: list[KernelId] = []
            events: list[CoordinatorEvent] = []
            targets = [i for i in range(len(self._infos)) if i != idx and self._registered[i] and self._online[i]]
            for kid in list(self._kernels[idx]):
                target = self._least_loaded_of(targets)
                del self._kernels[idx][kid]
                self._counts[idx] -= 1
                if target < 0:
                    del self._map[kid]
                    orphans.append(kid)
                    events.append(CoordinatorEvent(CoordinatorEventKind.KERNEL_REMOVED, idx, kid))
                else:
                    self._map[kid] = target
                    self._kernels[target][kid] = None
                    self._counts[target] += 1
                    plans.append(KernelMigrationPlan(kid, idx, target, MigrationPriority.NORMAL))
            info = self._infos[idx]
            self._online[idx] = False
            info.available_memory = 0
            if not info.name.endswith(_UNREGISTERED):
                info.name += _UNREGISTERED
            self._changed_devices_locked()
            result = DeviceUnregisterResult(idx, plans, orphans, True)
        self._notify(events + [CoordinatorEvent(CoordinatorEventKind.DEVICE_UNREGISTERED, idx, result=result)])
        return result

    def devices(self) -> list[DeviceInfo]:
        """Copies of every slot's info, placeholders and offline devices included."""
        with self._lock:
            return [copy.copy(i) for i in self._infos]

    def device(self, index: int) -> DeviceInfo | None:
        idx = check_index(index, "index")
        with self._lock:
            return copy.copy(self._infos[idx]) if idx < len(self._infos) else None

    def device_count(self) -> int:
        """Slots, placeholders and offline devices included (as in the seed)."""
        return len(self._infos)

    def is_device_online(self, index: int) -> bool:
        """Whether slot `index` is a registered device that has not been unregistered."""
        idx = check_index(index, "index")
        with self._lock:
            return idx < len(self._infos) and self._registered[idx] and self._online[idx]

    def online_devices(self) -> list[int]:
        """Indices of the registered, online devices, ascending."""
        with self._lock:
            return [i for i in range(len(self._infos)) if self._registered[i] and self._online[i]]

    def update_device_memory(self, device_index: int, available_memory: int) -> None:
        """Set a device's available memory (what MEMORY_BASED compares)."""
        idx = check_index(device_index, "device_index")
        avail = check_count(available_memory, "available_memory")
        with self._lock:
            self._require_registered_locked(idx, "update memory of")
            info = self._infos[idx]
            if info.total_memory and avail > info.total_memory:
                raise ValueError(f"available_memory {avail} exceeds device {idx}'s total memory {info.total_memory}")
            info.available_memory = avail

    def set_device_speed(self, device_index: int, speed: float) -> None:
        """A relative speed weight for LEAST_LOADED and failover planning (default
        1.0): a device twice as fast (2.0) is given twice the kernels."""
        idx = check_index(device_index, "device_index")
        s = check_number(speed, "speed", positive=True)
        with self._lock:
            self._require_registered_locked(idx, "set the speed of")
            self._speed[idx] = s
            self._uniform_speed = all(x == 1.0 for x in self._speed)

    def device_speed(self, device_index: int) -> float:
        idx = check_index(device_index, "device_index")
        with self._lock:
            self._require_registered_locked(idx, "read the speed of")
            return self._speed[idx]

    # -- selection -----------------------------------------------------------------

    def set_custom_selector(self, selector: CustomSelector | None) -> None:
        """The function CUSTOM asks: selector(statuses, options) -> index. It sees every
        slot (offline ones with online=False, available=False); its answer must be
        an online device with room. None removes it."""
        if selector is not None and not callable(selector):
            raise TypeError(f"selector must be callable or None, got {type(selector).__name__}")
        with self._lock:
            self._selector = selector

    def select_device(self, options: LaunchOptions | None = None) -> int:
        """The device a new kernel should go to (the rules are in the class
        docstring). Records nothing: call assign_kernel, or use place_kernel."""
        if options is not None and not isinstance(options, LaunchOptions):
            raise TypeError(f"options must be LaunchOptions or None, got {type(options).__name__}")
        if self._pick is None:
            return self._select_custom(options)
        with self._lock:
            return self._select_locked()

    def place_kernel(self, kernel_id: KernelId | str, options: LaunchOptions | None = None) -> int:
        """select_device and assign_kernel in one step, atomic against other
        threads placing kernels; returns the device index."""
        kid = as_kernel_id(kernel_id)
        if options is not None and not isinstance(options, LaunchOptions):
            raise TypeError(f"options must be LaunchOptions or None, got {type(options).__name__}")
        if self._pick is None:
            idx = self._select_custom(options)
            with self._lock:
                self._check_takes_kernel_locked(idx, "the custom selector's device")
                ev = self._assign_locked(kid, idx)
        else:
            with self._lock:
                idx = self._select_locked()
                ev = self._assign_locked(kid, idx)
        self._notify([ev])
        return idx

    def select_device_for_k2k(self, source_kernel: KernelId | str) -> int:
        """The device for a kernel that will talk to `source_kernel`: among the
        source device's P2P neighbours that can take a kernel, the highest
        bandwidth / (load + 0.1) (ties to the lowest index); select_device()
        when the source is unplaced or no neighbour qualifies."""
        kid = as_kernel_id(source_kernel, "source_kernel")
        with self._lock:
            src = self._map.get(kid)
            if src is not None:
                topo = self._view_locked()
                best, best_score = -1, -1.0
                for n in topo.neighbors(src):
                    if n < len(self._infos) and self._registered[n] and self._online[n] \
                            and self._counts[n] < self._max:
                        conn = topo.get_connection(src, n)
                        bw = conn.bandwidth_gbps if conn is not None else 1.0
                        score = bw / (self._counts[n] / self._max + 0.1)
                        if score > best_score:
                            best, best_score = n, score
                if best >= 0:
                    return best
        return self.select_device()

    def _select_locked(self) -> int:
        if not self._infos:
            raise BackendUnavailableError("No GPU devices available: no device is registered")
        if not self._candidates:
            raise BackendUnavailableError(f"No suitable GPU device available: none of the preferred devices "
                                          f"{sorted(self._preferred)} is registered ({len(self._infos)} slot(s))")
        i = self._pick()   # type: ignore[misc]
        return i if i >= 0 else self._nothing_fits_locked()

    def _pick_first_available(self) -> int:
        counts, mx = self._counts, self._max
        for i in self._live:
            if counts[i] < mx:
                return i
        return -1

    def _pick_least_loaded(self) -> int:
        counts, mx = self._counts, self._max
        best, best_load = -1, float("inf")
        if self._uniform_speed:
            for i in self._live:
                c = counts[i]
                if c < mx and c < best_load:
                    best, best_load = i, c
        else:
            speed = self._speed
            for i in self._live:
                c = counts[i]
                if c < mx and c / speed[i] < best_load:
                    best, best_load = i, c / speed[i]
        return best

    def _pick_round_robin(self) -> int:
        counts, mx = self._counts, self._max
        ready = [i for i in self._live if counts[i] < mx]
        if not ready:
            return -1
        i = ready[self._rr % len(ready)]
        self._rr += 1
        return i

    def _pick_memory(self) -> int:
        counts, mx, infos = self._counts, self._max, self._infos
        best, most = -1, -1
        for i in self._live:
            if counts[i] < mx and infos[i].available_memory > most:
                best, most = i, infos[i].available_memory
        return best

    def _pick_compute(self) -> int:
        counts, mx, infos = self._counts, self._max, self._infos
        best, top = -1, (-1, -1)
        for i in self._live:
            if counts[i] < mx:
                cc = infos[i].compute_capability or (0, 0)
                if cc > top:
                    best, top = i, cc
        return best

    def _nothing_fits_locked(self) -> int:
        """No candidate can take a kernel: the error, or (strict=False) the seed's answer."""
        if not self._strict:
            s = self._strategy
            seed = self._candidates[0] if s in (LoadBalancingStrategy.FIRST_AVAILABLE,
                                                LoadBalancingStrategy.ROUND_ROBIN) else 0
            if seed < len(self._infos) and self._registered[seed] and self._online[seed]:
                return seed
        raise DeviceNotAvailableError(f"no device can take a kernel ({self._strategy.name}): "
                                      f"{self._describe_candidates_locked()}")

    def _describe_candidates_locked(self) -> str:
        parts = []
        for i in self._candidates[:8]:
            if not self._registered[i]:
                parts.append(f"device {i} is a placeholder")
            elif not self._online[i]:
                parts.append(f"device {i} is offline")
            else:
                parts.append(f"device {i} is full ({self._counts[i]}/{self._max} kernels)")
        more = len(self._candidates) - 8
        return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")

    def _select_custom(self, options: LaunchOptions | None) -> int:
        with self._lock:
            if not self._infos:
                raise BackendUnavailableError("No GPU devices available: no device is registered")
            selector = self._selector
            if selector is None:
                if self._strict:
                    raise InvalidConfigError("load_balancing is CUSTOM but no selector is set; call "
                                             "set_custom_selector(fn) first")
                return self._nothing_fits_locked()
            statuses = self._statuses_locked()
        name = getattr(selector, "__qualname__", type(selector).__name__)
        try:
            answer = selector(statuses, options if options is not None else LaunchOptions())
        except Exception as exc:
            raise DeviceNotAvailableError(f"the custom selector {name} raised {type(exc).__name__}: {exc}") from exc
        if isinstance(answer, bool):
            raise DeviceNotAvailableError(f"the custom selector {name} returned {answer!r}, not a device index")
        try:
            idx = operator.index(answer)
        except TypeError:
            raise DeviceNotAvailableError(f"the custom selector {name} returned {type(answer).__name__} "
                                          f"{answer!r:.60}, not a device index") from None
        with self._lock:
            self._check_takes_kernel_locked(idx, f"the custom selector {name}'s answer")
        return idx

    def _check_takes_kernel_locked(self, idx: int, what: str) -> None:
        if not 0 <= idx < len(self._infos):
            raise DeviceNotAvailableError(f"{what} is device {idx}, which does not exist "
                                          f"({len(self._infos)} slot(s))")
        if not (self._registered[idx] and self._online[idx]):
            raise DeviceNotAvailableError(f"{what} is device {idx}, which is "
                                          f"{'a placeholder' if not self._registered[idx] else 'offline'}")
        if self._strict and self._counts[idx] >= self._max:
            raise DeviceNotAvailableError(f"{what} is device {idx}, which is full "
                                          f"({self._counts[idx]}/{self._max} kernels)")

    def _least_loaded_of(self, targets: list[int]) -> int:
        best, best_load = -1, float("inf")
        for i in targets:
            c = self._counts[i]
            if c < self._max and c / self._speed[i] < best_load:
                best, best_load = i, c / self._speed[i]
        return best

    # -- kernels -------------------------------------------------------------------

    def assign_kernel(self, kernel_id: KernelId | str, device_index: int) -> None:
        """Map `kernel_id` to `device_index` (an online device). Re-assigning moves
        the kernel (and its count). An explicit assignment may exceed
        max_kernels_per_device; the device then reports load > 1 and is not
        available for selection."""
        kid = as_kernel_id(kernel_id)
        idx = check_index(device_index, "device_index")
        with self._lock:
            self._require_online_locked(idx, "assign a kernel to")
            ev = self._assign_locked(kid, idx)
        self._notify([ev])

    def _assign_locked(self, kid: KernelId, idx: int) -> CoordinatorEvent:
        prev = self._map.get(kid)
        if prev != idx:
            if prev is not None:
                del self._kernels[prev][kid]
                self._counts[prev] -= 1
            self._map[kid] = idx
            self._kernels[idx][kid] = None
            self._counts[idx] += 1
        self._launched += 1
        return CoordinatorEvent(CoordinatorEventKind.KERNEL_ASSIGNED, idx, kid, prev)

    def remove_kernel(self, kernel_id: KernelId | str) -> int | None:
        """Forget `kernel_id`; returns the device it was on (None if unknown: nothing happens)."""
        kid = as_kernel_id(kernel_id)
        with self._lock:
            idx = self._map.pop(kid, None)
            if idx is None:
                return None
            del self._kernels[idx][kid]
            self._counts[idx] -= 1
        self._notify([CoordinatorEvent(CoordinatorEventKind.KERNEL_REMOVED, idx, kid)])
        return idx

    def get_kernel_device(self, kernel_id: KernelId | str) -> int | None:
        return self._map.get(as_kernel_id(kernel_id))

    def kernels_on_device(self, device_index: int) -> list[KernelId]:
        """The kernels mapped to a device, in the order they arrived (empty for an unknown index)."""
        idx = check_index(device_index, "device_index")
        with self._lock:
            return list(self._kernels[idx]) if idx < len(self._kernels) else []

    def kernel_map(self) -> dict[KernelId, int]:
        """A snapshot of the whole kernel -> device map."""
        with self._lock:
            return dict(self._map)

    # -- status and stats ------------------------------------------------------------

    def _statuses_locked(self) -> list[DeviceStatus]:
        mx = self._max
        out = []
        for i, info in enumerate(self._infos):
            c = self._counts[i]
            live = self._registered[i] and self._online[i]
            out.append(DeviceStatus(info=copy.copy(info), kernel_count=c, kernels=list(self._kernels[i]),
                                    available=live and c < mx, load=c / mx, online=live))
        return out

    def get_all_status(self) -> list[DeviceStatus]:
        """One DeviceStatus per slot, in index order."""
        with self._lock:
            return self._statuses_locked()

    def get_device_status(self, device_index: int) -> DeviceStatus | None:
        idx = check_index(device_index, "device_index")
        with self._lock:
            if idx >= len(self._infos):
                return None
            return self._statuses_locked()[idx]

    def stats(self) -> MultiGpuStats:
        with self._lock:
            return MultiGpuStats(device_count=len(self._infos), total_kernels=sum(self._counts),
                                 total_memory=sum(i.total_memory for i in self._infos),
                                 available_memory=sum(i.available_memory for i in self._infos),
                                 kernels_launched=self._launched)

    def can_p2p(self, device_a: int, device_b: int) -> bool:
        """Whether P2P is enabled in the config and both devices are online and P2P-capable."""
        a, b = check_index(device_a, "device_a"), check_index(device_b, "device_b")
        if not self._config.enable_p2p:
            return False
        with self._lock:
            n = len(self._infos)
            return (a < n and b < n and self._registered[a] and self._online[a] and self._registered[b]
                    and self._online[b] and self._infos[a].p2p_capable and self._infos[b].p2p_capable)

    # -- topology ------------------------------------------------------------------

    def discover_topology(self) -> GpuTopology:
        """Estimate the topology from the device records (no measurement): for two
        online P2P-capable devices of one backend, SAME_DEVICE when they share a
        UUID, NVLINK when both report compute capability >= 8 (CUDA or Vulkan on
        NVIDIA), else PCIE; NONE for the other online pairs; no link to
        placeholders or offline devices. It becomes the coordinator's topology,
        replacing one given to set_topology."""
        with self._lock:
            topo = self._estimate_locked()
            self._topology_base = None
            self._topology_view = topo
            return topo.copy()

    def topology(self) -> GpuTopology:
        """A copy of the current topology: the one set (or probed) with offline
        devices' links removed and new devices estimated, else the estimate.
        Register and unregister invalidate it."""
        with self._lock:
            return self._view_locked().copy()

    def set_topology(self, topology: GpuTopology) -> None:
        """Use `topology` (manual or probed) from now on; a copy is kept."""
        if not isinstance(topology, GpuTopology):
            raise TypeError(f"set_topology takes a GpuTopology, got {type(topology).__name__}")
        with self._lock:
            self._topology_base = topology.copy()
            self._topology_view = None

    def _changed_devices_locked(self) -> None:
        n = len(self._infos)
        pref = self._preferred
        self._candidates = tuple(i for i in range(n) if not pref or i in pref)
        self._live = tuple(i for i in self._candidates if self._registered[i] and self._online[i])
        self._topology_view = None

    def _is_live(self, i: int) -> bool:
        return i < len(self._infos) and self._registered[i] and self._online[i]

    def _estimated_link(self, i: int, j: int) -> GpuConnection | None:
        if not (self._is_live(i) and self._is_live(j)):
            return None
        a, b = self._infos[i], self._infos[j]
        kind = InterconnectType.NONE
        if a.p2p_capable and b.p2p_capable and a.backend == b.backend:
            if a.device_uuid is not None and a.device_uuid == b.device_uuid:
                kind = InterconnectType.SAME_DEVICE
            elif a.backend in (Backend.CUDA, Backend.VULKAN) and (a.compute_capability or (0, 0))[0] >= 8 \
                    and (b.compute_capability or (0, 0))[0] >= 8:
                kind = InterconnectType.NVLINK
            else:
                kind = InterconnectType.PCIE
        return GpuConnection(i, j, kind, bidirectional=False)

    def _estimate_locked(self) -> GpuTopology:
        n = len(self._infos)
        topo = GpuTopology(n)
        for i in range(n):
            for j in range(n):
                if i != j:
                    c = self._estimated_link(i, j)
                    if c is not None:
                        topo.set_connection(c)
        return topo

    def _view_locked(self) -> GpuTopology:
        if self._topology_view is not None:
            return self._topology_view
        base = self._topology_base
        if base is None:
            view = self._estimate_locked()
        else:
            n = len(self._infos)
            view = base.copy()
            if base.device_count < n:   # devices registered after it was made: estimated links
                grown = GpuTopology(n)
                for s in range(n):
                    for d in range(n):
                        if s < base.device_count and d < base.device_count:
                            grown._connections[s][d] = view._connections[s][d]
                        elif s != d:
                            grown._connections[s][d] = self._estimated_link(s, d)
                grown.numa_nodes[:base.device_count] = view.numa_nodes
                grown.details, grown.last_updated = view.details, view.last_updated
                view = grown
            for s in range(n):
                if not self._is_live(s):   # offline devices and placeholders have no links
                    for d in range(view.device_count):
                        if d != s:
                            view._connections[s][d] = view._connections[d][s] = None
            view.probed = base.probed and base.device_count >= n
        self._topology_view = view
        return view

    # -- migration -----------------------------------------------------------------

    def request_migration(self, kernel_id: KernelId | str, target_device: int) -> MigrationRequest:
        """A PENDING request to move `kernel_id` to `target_device` along the
        topology's best path, with that path's bandwidth (its narrowest link) and
        latency (16 GB/s and 10 us when no link is known)."""
        kid = as_kernel_id(kernel_id)
        target = check_index(target_device, "target_device")
        with self._lock:
            src = self._map.get(kid)
            if src is None:
                raise KernelNotFoundError(f"kernel {kid.as_str()!r} is not assigned to any device")
            if src == target:
                raise InvalidConfigError(f"Cannot migrate to same device: kernel {kid.as_str()!r} is already "
                                         f"on device {target}")
            if target >= len(self._infos):
                raise DeviceNotAvailableError(f"Device {target} not available: {len(self._infos)} device slot(s)")
            self._require_online_locked(target, "migrate a kernel to")
            topo = self._view_locked()
            path = topo.best_path(src, target)
            if len(path) == 2:
                conn = topo.get_connection(src, target)
                bw, lat = (conn.bandwidth_gbps, conn.latency_us) if conn is not None else \
                    (_FALLBACK_BANDWIDTH_GBPS, _FALLBACK_LATENCY_US)
            else:
                bw, lat = topo.path_figures(path)
            if not bw > 0:
                bw = _FALLBACK_BANDWIDTH_GBPS
        return MigrationRequest(kid, src, target, path, bw, lat)

    def complete_migration(self, request: MigrationRequest) -> None:
        """Move the kernel's mapping (and count) from the request's source to its
        target. Done already (the kernel is on the target): nothing happens.
        Unmapped kernel: KernelNotFoundError; on another device: MigrationError."""
        if not isinstance(request, MigrationRequest):
            raise TypeError(f"complete_migration takes a MigrationRequest, got {type(request).__name__}")
        kid, src, target = request.kernel_id, request.source_device, request.target_device
        with self._lock:
            cur = self._map.get(kid)
            if cur is None:
                raise KernelNotFoundError(f"kernel {kid.as_str()!r} is not assigned to any device")
            if cur == target:
                return
            if cur != src:
                raise MigrationError(f"kernel {kid.as_str()!r} is on device {cur}, not on the request's source "
                                     f"device {src}: the request is stale")
            self._require_online_locked(target, "complete a migration to")
            del self._kernels[src][kid]
            self._counts[src] -= 1
            self._map[kid] = target
            self._kernels[target][kid] = None
            self._counts[target] += 1
        self._notify([CoordinatorEvent(CoordinatorEventKind.KERNEL_MIGRATED, target, kid, src)])

    # -- helpers -------------------------------------------------------------------

    def _require_registered_locked(self, idx: int, action: str) -> None:
        if idx >= len(self._infos) or not self._registered[idx]:
            raise DeviceNotAvailableError(f"cannot {action} device {idx}: it is not a registered device "
                                          f"({len(self._infos)} slot(s), registered: {self._registered_list()})")

    def _require_online_locked(self, idx: int, action: str) -> None:
        self._require_registered_locked(idx, action)
        if not self._online[idx]:
            raise DeviceNotAvailableError(f"cannot {action} device {idx}: it was unregistered (offline)")

    def _registered_list(self) -> list[int]:
        return [i for i, r in enumerate(self._registered) if r]

    def __repr__(self) -> str:
        return (f"MultiGpuCoordinator({self._strategy.name}, devices={len(self._infos)}, "
                f"kernels={len(self._map)})")


_PEER_METHODS = ("cuda_peer", "dmabuf")
