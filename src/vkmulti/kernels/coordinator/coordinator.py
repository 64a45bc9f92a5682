"""MultiGpuCoordinator: the registry of devices and kernels (ringkernel's
`multi_gpu` coordinator, defects fixed). It picks devices with the pure
functions of strategies.py over a snapshot of its registry and keeps its
topology in a TopologyView (topology.py).

Every method is thread-safe: the state sits behind one lock, held only for
bookkeeping (never while user code runs: custom selectors and listeners are
called outside it).
"""
from __future__ import annotations

import copy
import logging
import threading
import weakref
from typing import Any, Callable

from ..._core.checks import U64_MAX, check_count, check_index, check_number, int_in, short_repr
from ...device.manager import MultiDeviceManager
from ...errors import BackendUnavailableError, DeviceNotAvailableError, InvalidConfigError, KernelNotFoundError, \
    MigrationError
from ..ids import KernelId, as_kernel_id
from . import probe
from .config import Backend, LaunchOptions, LoadBalancingStrategy, MultiGpuConfig
from .device_facts import device_info_for_slot, memory_figures, pair_transfer_methods
from .events import CoordinatorEvent, CoordinatorEventKind, Listeners
from .records import (CustomSelector, DeviceInfo, DeviceStatus, DeviceUnregisterResult, KernelMigrationPlan,
                      MigrationPriority, MigrationRequest, MultiGpuStats, RegistrySnapshot, keep_in_order)
from .strategies import (PICKERS, ask_selector, check_takes_kernel, least_loaded_of, nothing_fits, pick_neighbour,
                         require_candidates)
from .topology import GpuTopology, TopologyView, route

log = logging.getLogger(__name__)

__all__ = ["MultiGpuCoordinator"]

_UNREGISTERED = " (unregistered)"
#: transfer methods that move data device to device (no host memory in between)
_PEER_METHODS = ("cuda_peer", "dmabuf")


def _unregister_when_lost(coord: "MultiGpuCoordinator") -> Callable[[int, str], None]:
    """A manager loss listener that unregisters the lost device from `coord` (held weakly:
    the manager does not keep the coordinator alive)."""
    ref = weakref.ref(coord)

    def lost(index: int, reason: str) -> None:
        c = ref()
        if c is not None:
            c._device_lost(index, reason)
    return lost


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
        self._candidates: list[int] = []   # preferred slots that exist, ascending
        self._live: list[int] = []         # candidates that are registered and online, ascending
        self._rr = 0
        self._launched = 0
        self._selector: CustomSelector | None = None
        self._topology = TopologyView()
        self._listeners = Listeners()
        self._manager: Any = None
        self._transfer_methods: dict[tuple[int, int], str] = {}
        self._pick = PICKERS.get(self._strategy)   # None: CUSTOM
        self._round_robin = self._strategy is LoadBalancingStrategy.ROUND_ROBIN

    # -- construction from real devices -------------------------------------------

    @classmethod
    def from_manager(cls, manager: MultiDeviceManager, config: MultiGpuConfig | None = None) -> \
            "MultiGpuCoordinator":
        """A coordinator with one registered device per slot of `manager`, with
        real figures: name, backend (VULKAN; CPU for a CPU Vulkan device),
        memory (VK_EXT_memory_budget where enabled, else the device-local heap
        size), CUDA compute capability and multiprocessor count for CUDA
        devices, max_threads_per_block, UUID, PCI bus, and p2p_capable from the
        transfer methods of its pairs. `refresh_device_memory()` re-reads the
        budget; `probe_topology()` measures the links.
        """
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
        manager.add_loss_listener(_unregister_when_lost(coord))
        return coord

    def _device_lost(self, index: int, reason: str) -> None:
        """The manager found device `index` lost: unregister it (greedy plans for its
        kernels, DEVICE_UNREGISTERED with them for listeners: the runtime fails over)."""
        if self.is_device_online(index):
            result = self.unregister_device(index)
            log.warning("device %d lost (%s): unregistered; %d kernel(s) planned onto the survivors, %d orphaned",
                        index, reason, len(result.kernels_to_migrate), len(result.orphaned_kernels))

    @property
    def manager(self) -> MultiDeviceManager | None:
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
        `vkmulti.kernels.probe_topology`."""
        if self._manager is None:
            raise InvalidConfigError("this coordinator has no Vulkan devices to measure; build it with "
                                     "MultiGpuCoordinator.from_manager(manager), or call set_topology()")
        topo = probe.probe_topology(self._manager, force=force, cache=cache, **options)
        self.set_topology(topo)
        return self.topology()

    # -- listeners ---------------------------------------------------------------

    def add_listener(self, listener: Callable[[CoordinatorEvent], object]) -> None:
        """Call `listener(event)` after every registry change from now on, in the order the changes
        were applied, outside the lock (how, and in which thread: events.Listeners); its exceptions
        are logged, not raised."""
        self._listeners.add(listener)

    def remove_listener(self, listener: Callable[[CoordinatorEvent], object]) -> None:
        """Stop calling `listener` (one added with add_listener); ValueError for one that is not."""
        self._listeners.remove(listener)

    # -- devices -----------------------------------------------------------------

    def register_device(self, info: DeviceInfo) -> None:
        """Put a copy of `info` in slot `info.index` (padding gaps with
        placeholders); an existing slot is overwritten, keeps its kernels and
        comes back online."""
        if not isinstance(info, DeviceInfo):
            raise TypeError(f"register_device takes a DeviceInfo, got {type(info).__name__}")
        info = copy.copy(info)
        info.validate()
        with self._listeners.change(self._lock) as emit:
            pref = self._preferred
            while len(self._infos) <= info.index:
                i = len(self._infos)
                self._infos.append(info if i == info.index else DeviceInfo(i, "Unknown", Backend.CPU))
                self._registered.append(False)
                self._online.append(False)
                self._counts.append(0)
                self._kernels.append({})
                self._speed.append(1.0)
                if not pref or i in pref:
                    self._candidates.append(i)
            i = info.index
            was_live = self._registered[i] and self._online[i]
            self._infos[i] = info
            self._registered[i] = True
            self._online[i] = True
            if not was_live and (not pref or i in pref):
                keep_in_order(self._live, i, True)
            self._topology.devices_changed()
            emit(CoordinatorEvent(CoordinatorEventKind.DEVICE_REGISTERED, i))

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
        with self._listeners.change(self._lock) as emit:
            if idx >= len(self._infos) or not self._registered[idx]:
                return DeviceUnregisterResult(idx, [], [], False)
            plans: list[KernelMigrationPlan] = []
            orphans: list[KernelId] = []
            events: list[CoordinatorEvent] = []
            targets = [i for i in range(len(self._infos)) if i != idx and self._registered[i] and self._online[i]]
            for kid in list(self._kernels[idx]):
                target = least_loaded_of(self._snapshot_locked(), targets)
                self._move_locked(kid, idx, target if target >= 0 else None)
                if target < 0:
                    orphans.append(kid)
                    events.append(CoordinatorEvent(CoordinatorEventKind.KERNEL_REMOVED, idx, kid))
                else:
                    plans.append(KernelMigrationPlan(kid, idx, target, MigrationPriority.NORMAL))
            info = self._infos[idx]
            if self._online[idx]:
                keep_in_order(self._live, idx, False)
            self._online[idx] = False
            info.available_memory = 0
            if not info.name.endswith(_UNREGISTERED):
                info.name += _UNREGISTERED
            self._topology.devices_changed()
            result = DeviceUnregisterResult(idx, plans, orphans, True)
            emit(*events, CoordinatorEvent(CoordinatorEventKind.DEVICE_UNREGISTERED, idx, result=result))
        return result

    def devices(self) -> list[DeviceInfo]:
        """Copies of every slot's info, placeholders and offline devices included."""
        with self._lock:
            return [copy.copy(i) for i in self._infos]

    def device(self, index: int) -> DeviceInfo | None:
        """A copy of device `index`'s record, or None when there is none."""
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
        avail = int_in(check_count(available_memory, "available_memory"), "available_memory", 0, U64_MAX)
        with self._lock:
            self._snapshot_locked().require_registered(idx, "update memory of")
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
            self._snapshot_locked().require_registered(idx, "set the speed of")
            self._speed[idx] = s
            self._uniform_speed = all(x == 1.0 for x in self._speed)

    def device_speed(self, device_index: int) -> float:
        """The speed weight of a registered device (1.0 unless set)."""
        idx = check_index(device_index, "device_index")
        with self._lock:
            self._snapshot_locked().require_registered(idx, "read the speed of")
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
            with self._listeners.change(self._lock) as emit:
                self._check_takes_kernel_locked(idx, "the custom selector's device")
                emit(self._assign_locked(kid, idx))
        else:
            with self._listeners.change(self._lock) as emit:
                idx = self._select_locked()
                emit(self._assign_locked(kid, idx))
        return idx

    def assign_kernel(self, kernel_id: KernelId | str, device_index: int) -> None:
        """Map `kernel_id` to `device_index` (an online device). Re-assigning moves
        the kernel (and its count). An explicit assignment may exceed
        max_kernels_per_device; the device then reports load > 1 and is not
        available for selection."""
        kid = as_kernel_id(kernel_id)
        idx = check_index(device_index, "device_index")
        with self._listeners.change(self._lock) as emit:
            self._snapshot_locked().require_online(idx, "assign a kernel to")
            emit(self._assign_locked(kid, idx))

    def _assign_locked(self, kid: KernelId, idx: int) -> CoordinatorEvent:
        prev = self._map.get(kid)
        if prev != idx:
            self._move_locked(kid, prev, idx)
        self._launched += 1
        return CoordinatorEvent(CoordinatorEventKind.KERNEL_ASSIGNED, idx, kid, prev)

    def remove_kernel(self, kernel_id: KernelId | str) -> int | None:
        """Forget `kernel_id`; returns the device it was on (None if unknown: nothing happens)."""
        kid = as_kernel_id(kernel_id)
        with self._listeners.change(self._lock) as emit:
            idx = self._map.get(kid)
            if idx is None:
                return None
            self._move_locked(kid, idx, None)
            emit(CoordinatorEvent(CoordinatorEventKind.KERNEL_REMOVED, idx, kid))
        return idx

    def get_kernel_device(self, kernel_id: KernelId | str) -> int | None:
        """The device a kernel is assigned to, or None."""
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
        """DeviceStatus of one device (kernels, load, availability), or None when there is none."""
        idx = check_index(device_index, "device_index")
        with self._lock:
            if idx >= len(self._infos):
                return None
            return self._statuses_locked()[idx]

    def stats(self) -> MultiGpuStats:
        """Totals now: devices, kernels placed, memory, kernels launched so far."""
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

    # -- bookkeeping ---------------------------------------------------------------

    def _move_locked(self, kid: KernelId, src: int | None, dst: int | None) -> None:
        """Take `kid` off device `src` (None: it was on none) and map it to `dst` (None: unmapped)."""
        if src is not None:
            del self._kernels[src][kid]
            self._counts[src] -= 1
        if dst is None:
            self._map.pop(kid, None)
        else:
            self._map[kid] = dst
            self._kernels[dst][kid] = None
            self._counts[dst] += 1

    def _snapshot_locked(self) -> RegistrySnapshot:
        return RegistrySnapshot(self._infos, self._registered, self._online, self._counts, self._speed,
                                self._uniform_speed, self._max, self._candidates, self._live, self._preferred,
                                self._rr)

    def _select_locked(self) -> int:
        snap = self._snapshot_locked()
        require_candidates(snap)
        i = self._pick(snap)   # type: ignore[misc]
        if i < 0:
            return nothing_fits(self._strategy, snap, self._strict)
        if self._round_robin:
            self._rr += 1
        return i

    def _select_custom(self, options: LaunchOptions | None) -> int:
        with self._lock:
            if not self._infos:
                raise BackendUnavailableError("No GPU devices available: no device is registered")
            selector = self._selector
            if selector is None:
                require_candidates(self._snapshot_locked())   # (the seed filters by preference first)
                if self._strict:
                    raise InvalidConfigError("load_balancing is CUSTOM but no selector is set; call "
                                             "set_custom_selector(fn) first")
                return nothing_fits(self._strategy, self._snapshot_locked(), self._strict)
            statuses = self._statuses_locked()
        idx, name = ask_selector(selector, statuses, options)
        with self._lock:
            self._check_takes_kernel_locked(idx, f"the custom selector {name}'s answer")
        return idx

    def _check_takes_kernel_locked(self, idx: int, what: str) -> None:
        check_takes_kernel(self._snapshot_locked(), idx, what, self._strict)

    # -- topology ------------------------------------------------------------------

    def select_device_for_k2k(self, source_kernel: KernelId | str) -> int:
        """The device for a kernel that will talk to `source_kernel`: among the
        source device's P2P neighbours that can take a kernel, the highest
        bandwidth / (load + 0.1) (ties to the lowest index); select_device()
        when the source is unplaced or no neighbour qualifies."""
        kid = as_kernel_id(source_kernel, "source_kernel")
        with self._lock:
            src = self._map.get(kid)
            if src is not None:
                snap = self._snapshot_locked()
                best = pick_neighbour(snap, self._topology.view(snap), src)
                if best >= 0:
                    return best
        return self.select_device()

    def discover_topology(self) -> GpuTopology:
        """Estimate the topology from the device records (no measurement): for two
        online P2P-capable devices of one backend, SAME_DEVICE when they share a
        UUID, NVLINK when both report compute capability >= 8 (CUDA or Vulkan on
        NVIDIA), else PCIE; NONE for the other online pairs; no link to
        placeholders or offline devices. It becomes the coordinator's topology,
        replacing one given to set_topology."""
        with self._lock:
            return self._topology.discover(self._snapshot_locked()).copy()

    @property
    def topology_generation(self) -> int:
        """A counter that changes whenever topology() may answer differently (set,
        probed, estimated anew, devices registered or unregistered): a cheap check
        for callers that cache routes."""
        return self._topology.generation

    def topology(self) -> GpuTopology:
        """A copy of the current topology: the one set (or probed) with the links of
        offline devices, placeholders and indices past the registry removed and new
        devices estimated, else the estimate.
        Register and unregister invalidate it. A topology has a row per slot, at most
        MAX_TOPOLOGY_DEVICES (InvalidConfigError past it, here and wherever a route is needed)."""
        with self._lock:
            return self._topology.view(self._snapshot_locked()).copy()

    def set_topology(self, topology: GpuTopology) -> None:
        """Use `topology` (manual or probed) from now on; a copy is kept."""
        if not isinstance(topology, GpuTopology):
            raise TypeError(f"set_topology takes a GpuTopology, got {type(topology).__name__}")
        with self._lock:
            self._topology.set(topology)

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
                raise KernelNotFoundError(f"kernel {short_repr(kid.as_str())} is not assigned to any device")
            if src == target:
                raise InvalidConfigError(f"Cannot migrate to same device: kernel {short_repr(kid.as_str())} is already "
                                         f"on device {target}")
            if target >= len(self._infos):
                raise DeviceNotAvailableError(f"Device {short_repr(target)} not available: {len(self._infos)} device slot(s)")
            self._snapshot_locked().require_online(target, "migrate a kernel to")
            path, bw, lat = route(self._topology.view(self._snapshot_locked()), src, target)
        return MigrationRequest(kid, src, target, path, bw, lat)

    def complete_migration(self, request: MigrationRequest) -> None:
        """Move the kernel's mapping (and count) from the request's source to its
        target. Done already (the kernel is on the target): nothing happens.
        Unmapped kernel: KernelNotFoundError; on another device: MigrationError."""
        if not isinstance(request, MigrationRequest):
            raise TypeError(f"complete_migration takes a MigrationRequest, got {type(request).__name__}")
        kid, src = as_kernel_id(request.kernel_id), check_index(request.source_device, "source_device")
        target = check_index(request.target_device, "target_device")   # (the fields are assignable)
        with self._listeners.change(self._lock) as emit:
            cur = self._map.get(kid)
            if cur is None:
                raise KernelNotFoundError(f"kernel {short_repr(kid.as_str())} is not assigned to any device")
            if cur == target:
                return
            if cur != src:
                raise MigrationError(f"kernel {short_repr(kid.as_str())} is on device {cur}, not on the request's source "
                                     f"device {src}: the request is stale")
            self._snapshot_locked().require_online(target, "complete a migration to")
            self._move_locked(kid, src, target)
            emit(CoordinatorEvent(CoordinatorEventKind.KERNEL_MIGRATED, target, kid, src))

    def __repr__(self) -> str:
        return (f"MultiGpuCoordinator({self._strategy.name}, devices={len(self._infos)}, "
                f"kernels={len(self._map)})")
