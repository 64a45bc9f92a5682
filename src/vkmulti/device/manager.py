"""DeviceSlot and MultiDeviceManager: one VkDevice per GPU, GPU 0 is the primary."""
from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

import vulkan as vk

from .._core.checks import is_int, short_repr, short_text
from .._core.handles import cstr, handle_hex, handle_int, to_cffi
from .capabilities import (EXT_MEMORY_FD, DeviceCapabilities, QueueFamilies, QueueFamiliesLike, RenderCapabilities,
                           RenderCapabilitiesLike, as_queue_families, as_render_capabilities, probe_device)
from .logical import (LogicalDevice, Queue, create_logical_device, default_queue_families, destroy_logical_device,
                      discard_logical_device, drain_queues, native_device)
from ..errors import DestroyedError, UnsupportedError, VkmError
from ..errors import TimeoutError as VkmTimeoutError
from .._core.lifetime import Deadline, Lifetime
from . import virtual
from .instance import Instance
from .passthrough import has_placeholders, is_placeholder_primary, skip_placeholder_secondaries
from .slots import enabled_names
from .._core.vktypes import VkDevice, VkFence, VkPhysicalDevice, VkQueue

if TYPE_CHECKING:
    from .._core._native import Device as NativeDevice
    from .._core.protocols import SlotChild

log = logging.getLogger(__name__)

__all__ = ["DeviceSlot", "MultiDeviceManager"]


@dataclass
class DeviceSlot:
    """One GPU: its physical and logical device, queues and optional renderer."""
    index: int
    physical_device: VkPhysicalDevice
    queue_families: QueueFamilies
    device: VkDevice | None = None
    graphics_queue: Queue | None = None
    present_queue: Queue | None = None
    compute_queue: Queue | None = None
    transfer_queue: Queue | None = None
    name: str = ""
    #: The SRU renderer of this GPU (attach_renderer): the offload coordinator's protocol,
    #: any object with its `render` method.
    renderer: object = None
    capabilities: DeviceCapabilities | None = None
    enabled_extensions: frozenset[str] = frozenset()
    #: The features its VkDevice was made with ("shaderInt64"); None: not told (an engine's device
    #: handed over without primary_features), and kernels that need one are refused there.
    enabled_features: frozenset[str] | None = dataclasses.field(default=None, repr=False)
    native: NativeDevice | None = dataclasses.field(default=None, repr=False)
    owned: bool = dataclasses.field(default=False, repr=False)
    #: Per-device helpers vkmulti caches (transfer links, command runners);
    #: each has destroy() and goes before any device is destroyed.
    children: dict[str, SlotChild] = dataclasses.field(default_factory=dict, repr=False)
    #: A queue reserved for vkmulti's transfers (made by vkmulti), if any.
    dedicated_copy_queue: Queue | None = dataclasses.field(default=None, repr=False)
    #: A universal-family queue reserved for vkmulti (made by vkmulti), if any.
    dedicated_universal_queue: Queue | None = dataclasses.field(default=None, repr=False)
    #: The life of the manager that owns this slot: every object made on the slot
    #: counts its operations there and is destroyed with the manager.
    lifetime: Lifetime = dataclasses.field(default_factory=lambda: Lifetime(None, "device slot"), repr=False,
                                           compare=False)
    #: Guards `children` (one link table, one command runner per slot, whoever asks first).
    children_lock: threading.RLock = dataclasses.field(default_factory=threading.RLock, repr=False, compare=False)
    #: (device, fence) of queue drains that timed out (devices.retire_submits): waited and
    #: freed first by the next one, and before the device is destroyed.
    pending_fences: list[tuple[VkDevice, VkFence]] = dataclasses.field(default_factory=list, repr=False,
                                                                        compare=False)

    def __repr__(self) -> str:
        state = "destroyed" if self.device is None else f"device={handle_hex(self.device)}"
        return f"DeviceSlot({self.index}, {short_text(self.name)}, {state}{', owned' if self.owned else ''})"

    @property
    def is_primary(self) -> bool:
        """True for slot 0, the primary GPU (the engine's device; SRUs are composited there)."""
        return self.index == 0

    @property
    def copy_queue(self) -> Queue:
        """The queue vkmulti copies on: its own queue when vkmulti made the device,
        else the transfer queue, else compute, else graphics."""
        return self.dedicated_copy_queue or self.transfer_queue or self.compute_queue or self.graphics_queue  # type: ignore[return-value]

    @property
    def universal_copy_queue(self) -> Queue:
        """The universal-family queue vkmulti does device-local copies on: its own
        when it made the device, else the graphics queue."""
        return self.dedicated_universal_queue or self.graphics_queue  # type: ignore[return-value]

    def queues(self) -> list[Queue]:
        """Every distinct queue of this slot (vkmulti's own included)."""
        out: dict[int, Queue] = {}
        for q in (self.graphics_queue, self.present_queue, self.compute_queue, self.transfer_queue,
                  self.dedicated_copy_queue, self.dedicated_universal_queue):
            if isinstance(q, Queue):
                out.setdefault(int(q), q)
        return list(out.values())

    def release_children(self, timeout: float | None = None) -> None:
        """Destroy the cached helpers (transfer links, command runner), newest first.

        Each waits for its queued GPU work; vkmulti.TimeoutError after `timeout`
        s keeps the ones not yet destroyed."""
        dl = Deadline(timeout)
        with self.children_lock:
            items = list(self.children.items())
        for key, child in reversed(items):
            child.destroy(timeout=dl.left())
            with self.children_lock:
                if self.children.get(key) is child:
                    del self.children[key]


def _device_name(pd: Any) -> str:
    props = vk.vkGetPhysicalDeviceProperties(pd)   # void in Vulkan: cannot fail (kept: owns deviceName)
    return cstr(props.deviceName)


def _as_queue(q: Any, family: int | None, what: str) -> Queue | None:
    if q is None:
        return None
    if isinstance(q, Queue):
        return q
    if family is None:
        raise ValueError(f"{what} was given but its queue family is unknown; "
                         f"set it in primary_queue_families")
    return Queue(q, family)


class MultiDeviceManager:
    """Owns the secondary logical devices; the primary belongs to the caller.

    Disabled, or with one physical device, it is a one-slot passthrough that
    creates nothing (over placeholder handles, as a GPU-less test gives it, it
    makes no Vulkan call). `primary_queue_families` and `capabilities` may be
    the seed's own objects: they are read by their fields. `MultiDeviceManager.create()` builds everything itself
    (instance included) for users without an engine, and destroys it all.

    An engine that made its own device passes it with the seed's keywords,
    plus `primary_extensions` and `primary_features`: the device extensions
    and features it enabled on it (Vulkan cannot be asked; vkmulti trusts the
    answer). `vkmulti.device_requirements(physical_device)` says what to
    enable; without `primary_extensions` the primary gets only staging_copy.
    """

    def __init__(self, *, primary_physical_device: VkPhysicalDevice | int,
                 primary_queue_families: QueueFamilies | QueueFamiliesLike,
                 primary_device: VkDevice | int, primary_graphics_queue: Queue | VkQueue | int,
                 primary_present_queue: Queue | VkQueue | int | None,
                 physical_devices: list[VkPhysicalDevice] | list[int], enabled: bool,
                 capabilities: RenderCapabilities | RenderCapabilitiesLike | None = None,
                 primary_compute_queue: Queue | VkQueue | int | None = None,
                 primary_transfer_queue: Queue | VkQueue | int | None = None,
                 find_queue_families: Callable[[VkPhysicalDevice], QueueFamilies | QueueFamiliesLike | None]
                 | None = None,
                 primary_extensions: Iterable[str] | None = None, primary_features: Iterable[str] | None = None):
        primary_queue_families = as_queue_families(primary_queue_families, "primary_queue_families")
        if not isinstance(physical_devices, (list, tuple)):
            raise TypeError(f"physical_devices must be a list, got {type(physical_devices).__name__}")
        if len(physical_devices) == 0:
            raise ValueError("physical_devices is empty: it must list every GPU, the primary included")
        if find_queue_families is not None and not callable(find_queue_families):
            raise TypeError("find_queue_families must be callable or None")
        capabilities = as_render_capabilities(capabilities)
        self._teardown: list[Callable[[], Any]] = []
        self._lost: dict[int, str] = {}
        self._loss_listeners: list[Callable[[int, str], Any]] = []
        self._loss_lock = threading.Lock()
        self._life = Lifetime(self, "MultiDeviceManager")
        self._destroyed = False
        self._drain_fences: list[tuple[Any, Any]] = []
        self._owned_instance: Any = None
        self._physical_devices = list(physical_devices)
        self.external_memory_fd_enabled = False
        self._multi_gpu = False
        self.capabilities = capabilities
        if has_placeholders(primary_physical_device, physical_devices):
            # the seed's passthrough over a GPU-less test's placeholders: no Vulkan call
            if not any(is_placeholder_primary(p, primary_physical_device) for p in physical_devices):
                raise ValueError("primary_physical_device is not among physical_devices")
            if primary_graphics_queue is None:
                raise ValueError("primary_graphics_queue is required")
            self._slots: list[DeviceSlot] = [DeviceSlot(
                index=0, physical_device=primary_physical_device, queue_families=primary_queue_families,  # type: ignore[arg-type]
                device=primary_device, graphics_queue=primary_graphics_queue, present_queue=primary_present_queue,  # type: ignore[arg-type]
                compute_queue=primary_compute_queue, transfer_queue=primary_transfer_queue, name="<unknown>",  # type: ignore[arg-type]
                lifetime=self._life)]
            if enabled and len(physical_devices) > 1:
                skip_placeholder_secondaries(primary_physical_device, physical_devices, find_queue_families)
            elif enabled:
                log.info("multi-GPU requested but only %d physical device(s); using the single-device path",
                         len(physical_devices))
            self._refresh_capabilities()
            return
        primary_pd = to_cffi(primary_physical_device, "VkPhysicalDevice")
        primary_key = handle_int(primary_pd, "VkPhysicalDevice")
        pds = [to_cffi(p, "VkPhysicalDevice") for p in physical_devices]
        if primary_key not in [handle_int(p, "VkPhysicalDevice") for p in pds]:
            raise ValueError("primary_physical_device is not among physical_devices")
        device = to_cffi(primary_device, "VkDevice")
        pext = enabled_names(primary_extensions, "primary_extensions")
        pfeat = enabled_names(primary_features, "primary_features")

        self._physical_devices = list(pds)
        pcaps = probe_device(primary_pd)
        qf = primary_queue_families
        self._slots = [DeviceSlot(
            index=0, physical_device=primary_pd, queue_families=qf, device=device,
            graphics_queue=_as_queue(primary_graphics_queue, qf.graphics, "primary_graphics_queue"),
            present_queue=_as_queue(primary_present_queue, qf.present, "primary_present_queue"),
            compute_queue=_as_queue(primary_compute_queue,
                                    qf.compute if qf.compute is not None else pcaps.dedicated_compute_family,
                                    "primary_compute_queue"),
            transfer_queue=_as_queue(primary_transfer_queue,
                                     qf.transfer if qf.transfer is not None else pcaps.dedicated_transfer_family,
                                     "primary_transfer_queue"),
            name=_device_name(primary_pd), capabilities=pcaps, enabled_extensions=pext, lifetime=self._life,
            enabled_features=pfeat if primary_features is not None else None,
        )]
        if self._slots[0].graphics_queue is None:
            raise ValueError("primary_graphics_queue is required")
        self._multi_gpu = bool(enabled) and len(pds) > 1
        if self._multi_gpu and primary_features is not None and "timelineSemaphore" not in pfeat:
            raise UnsupportedError(
                f"the primary device ({self._slots[0].name!r}) was created without the timelineSemaphore feature "
                f"(primary_features={short_repr(sorted(pfeat), 200)}); vkmulti orders every transfer with timeline semaphores: "
                f"enable what vkmulti.device_requirements() returns", device=self._slots[0].name)
        if self._multi_gpu:
            self._slots[0].native = native_device(primary_pd, device, pext)
            try:
                self._create_secondaries(primary_key, find_queue_families)
            except BaseException:
                self._destroy_secondaries(Deadline(None))
                raise
        elif enabled:
            log.info("multi-GPU requested but only %d physical device(s); using the single-device path", len(pds))
        self._refresh_capabilities()

    # -- construction ------------------------------------------------------

    def _create_secondaries(self, primary_key: int, find_queue_families:
                            Callable[[VkPhysicalDevice], QueueFamilies | QueueFamiliesLike | None] | None) -> None:
        for pd in self._physical_devices:
            if handle_int(pd, "VkPhysicalDevice") == primary_key:
                continue   # by handle value: cffi may hand out a new object per enumeration
            caps = probe_device(pd)  # type: ignore[arg-type]
            qf = find_queue_families(pd) if find_queue_families else default_queue_families(pd, caps)  # type: ignore[arg-type]
            if qf is None:
                log.warning("no graphics queue family resolved for %s; skipping", caps.name)
                continue
            qf = as_queue_families(qf, f"find_queue_families({caps.name!r})")
            if qf.compute is None or qf.transfer is None:
                qf = QueueFamilies(qf.graphics, qf.present,
                                   qf.compute if qf.compute is not None else caps.dedicated_compute_family,
                                   qf.transfer if qf.transfer is not None else caps.dedicated_transfer_family)
            ld = create_logical_device(pd, qf)  # type: ignore[arg-type]
            slot = self._slot_from(len(self._slots), pd, ld)
            slot.lifetime = self._life
            self._slots.append(slot)
            log.info("created secondary logical device %d (%s)", len(self._slots) - 1, caps.name)

    @staticmethod
    def _slot_from(index: int, pd: Any, ld: LogicalDevice, owned: bool = True) -> DeviceSlot:
        return DeviceSlot(index=index, physical_device=pd, queue_families=ld.queue_families, device=ld.device,
                          graphics_queue=ld.graphics_queue, present_queue=ld.present_queue,
                          compute_queue=ld.compute_queue, transfer_queue=ld.transfer_queue,
                          name=ld.capabilities.name, capabilities=ld.capabilities,
                          enabled_extensions=ld.enabled_extensions, enabled_features=ld.enabled_features,
                          native=ld.native, owned=owned,
                          dedicated_copy_queue=ld.copy_queue,
                          dedicated_universal_queue=ld.universal_copy_queue)

    def _refresh_capabilities(self) -> None:
        self.external_memory_fd_enabled = len(self._slots) > 1 and all(
            EXT_MEMORY_FD in s.enabled_extensions for s in self._slots)
        base = self.capabilities or RenderCapabilities(physical_device_count=len(self._physical_devices))
        self.capabilities = dataclasses.replace(
            base,
            external_memory_fd_enabled=self.external_memory_fd_enabled,
            devices=tuple(s.capabilities for s in self._slots if s.capabilities is not None),
            enabled_extensions=tuple(s.enabled_extensions for s in self._slots))

    @classmethod
    def create(cls, enabled: bool = True, *, device_indices: list[int] | None = None,
               validation: bool | None = None, instance: Instance | None = None) -> "MultiDeviceManager":
        """Make an instance (unless given) and one device per GPU; destroy() frees all.

        `device_indices` picks physical devices by enumeration index (the first
        is the primary); default: all of them. On a machine without a GPU
        (Vulkan lists only CPU devices) and without `instance`, it uses the
        virtual lavapipe pair instead and logs one warning line saying so
        (VKMULTI_VIRTUAL_FALLBACK=0 turns that off; see vkmulti.device.virtual).
        """
        own_instance = instance is None
        if not own_instance and not isinstance(instance, Instance):
            raise TypeError(f"instance must be a vkmulti Instance, got {type(instance).__name__}")
        inst = cls._own_instance(validation) if own_instance else instance
        primary_ld: LogicalDevice | None = None
        try:
            pds = inst.physical_devices()  # type: ignore[union-attr]
            if not pds:
                raise ValueError("no Vulkan physical device found (install a driver, or use "
                                 "vkmulti.testing.virtual_gpus() for a CPU pair)")
            if device_indices is None:
                device_indices = list(range(len(pds)))
            if not isinstance(device_indices, (list, tuple)) or not device_indices:
                raise ValueError(f"device_indices must be a non-empty list, got {short_repr(device_indices)}")
            for i in device_indices:
                if not is_int(i) or not 0 <= i < len(pds):
                    raise IndexError(f"device index {short_repr(i)} out of range: {len(pds)} physical device(s)")
            if len(set(device_indices)) != len(device_indices):
                raise ValueError(f"device_indices has duplicates: {short_repr(device_indices)}")
            chosen = [pds[i] for i in device_indices]
            primary_ld = create_logical_device(chosen[0])
            mgr = cls(primary_physical_device=chosen[0], primary_queue_families=primary_ld.queue_families,
                      primary_device=primary_ld.device, primary_graphics_queue=primary_ld.graphics_queue,
                      primary_present_queue=primary_ld.present_queue, physical_devices=chosen,
                      enabled=enabled, primary_compute_queue=primary_ld.compute_queue,
                      primary_transfer_queue=primary_ld.transfer_queue,
                      primary_extensions=primary_ld.enabled_extensions,
                      primary_features=primary_ld.enabled_features)
        except BaseException:
            discard_logical_device(primary_ld)   # (never raises: the error that stopped create() is raised)
            if own_instance:
                inst.destroy()  # type: ignore[union-attr]
            raise
        p = mgr._slots[0]
        if p.native is not None and primary_ld.native is not None:
            p.native.release()
        p.native = primary_ld.native
        p.owned = True
        p.dedicated_copy_queue = primary_ld.copy_queue
        p.dedicated_universal_queue = primary_ld.universal_copy_queue
        mgr._owned_instance = inst if own_instance else None
        mgr.instance = inst  # type: ignore[attr-defined]
        return mgr

    @staticmethod
    def _own_instance(validation: bool | None) -> Any:
        """create()'s instance; on a machine without a GPU (virtual.no_gpu_fallback) the
        loader is pointed at the virtual lavapipe pair first, and one warning line says so."""
        inst = Instance(validation=validation)
        try:
            fallback = virtual.no_gpu_fallback(virtual.physical_device_types(inst))
        except BaseException:
            inst.destroy()
            raise
        if not fallback:
            return inst
        inst.destroy()
        virtual.install_virtual_gpus(2)
        log.warning("vkmulti: %s", virtual.NO_GPU_NOTE)
        return Instance(validation=validation)

    # -- the seed's API ----------------------------------------------------

    def _check(self) -> None:
        if not self._life.open:
            raise DestroyedError("MultiDeviceManager used after destroy()")

    @property
    def destroyed(self) -> bool:
        """True once destroy() was called (every object of this manager raises DestroyedError)."""
        return not self._life.open

    @property
    def multi_gpu(self) -> bool:
        """True while more than one device is in use (False when disabled, single-device or destroyed)."""
        return self._life.open and self._multi_gpu and len(self._slots) > 1

    @property
    def device_count(self) -> int:
        """The number of slots (devices in use), the primary included."""
        self._check()
        return len(self._slots)

    @property
    def primary(self) -> DeviceSlot:
        """Slot 0: the primary device (the engine's, or the one create() made)."""
        self._check()
        return self._slots[0]

    @property
    def secondaries(self) -> list[DeviceSlot]:
        """Every slot but the primary, in index order."""
        self._check()
        return self._slots[1:]

    @property
    def slots(self) -> list[DeviceSlot]:
        """Every slot, primary first (a new list each call)."""
        self._check()
        return list(self._slots)

    def slot(self, index: int) -> DeviceSlot:
        """The slot of device `index` (negative: from the end); TypeError/IndexError naming a bad index."""
        self._check()
        if not is_int(index):
            raise TypeError(f"slot index must be an int, got {type(index).__name__}")
        if not -len(self._slots) <= index < len(self._slots):
            raise IndexError(f"slot index {short_repr(index)} out of range: {len(self._slots)} slot(s)")
        return self._slots[index]   # negative indices count from the end, as the seed's list indexing

    def attach_renderer(self, index: int, renderer: object) -> None:
        """Use `renderer` for the SRUs of device `index` (None detaches); the offload coordinator prefers it to
        its factory."""
        self.slot(index).renderer = renderer

    # -- lost devices -----------------------------------------------------

    @property
    def lost_devices(self) -> dict[int, str]:
        """Devices known to be lost (VK_ERROR_DEVICE_LOST, or a test's
        vkmulti.testing.lose_device): index -> what revealed it."""
        with self._loss_lock:
            return dict(self._lost)

    def device_lost(self, index: int) -> bool:
        """Whether GPU `index` is lost (reported, or its native lost flag is set).

        Also answers while destroy() runs: the owners it tears down ask it to
        know which devices still have work to wait for. A device already
        destroyed runs nothing, and counts as lost then."""
        if self._life.open:
            slot = self.slot(index)
        else:
            if not is_int(index):
                raise TypeError(f"slot index must be an int, got {type(index).__name__}")
            slots = self._slots
            if not 0 <= index < len(slots) or slots[index].native is None:
                return True
            slot = slots[index]
        return slot.index in self._lost or (slot.native is not None and slot.native.lost)

    def add_loss_listener(self, listener: Callable[[int, str], object]) -> None:
        """Call `listener(index, reason)` once for each device found lost (on the
        thread that found it, outside any lock of the manager)."""
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {type(listener).__name__}")
        with self._loss_lock:
            self._loss_listeners.append(listener)

    def remove_loss_listener(self, listener: Callable[[int, str], object]) -> None:
        """Stop calling `listener` on a device loss (one added with add_loss_listener; unknown ones are ignored)."""
        with self._loss_lock:
            if listener in self._loss_listeners:
                self._loss_listeners.remove(listener)

    def report_device_lost(self, index: int, reason: str) -> bool:
        """Record that GPU `index` is lost (idempotent): marks its native flag so
        that every later submit and wait on it fails at once, logs it and tells
        the loss listeners (coordinators fail over). True the first time."""
        slot = self.slot(index)
        index = slot.index   # (a negative index counts from the end: one record per device)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        with self._loss_lock:
            if index in self._lost:
                return False
            self._lost[index] = reason
            listeners = list(self._loss_listeners)
        if slot.native is not None:
            slot.native.mark_lost()
        log.error("GPU %d (%s) lost: %s%s", index, slot.name, reason,
                  " (the primary: frames and kernels on it cannot go on)" if index == 0 else
                  "; its work fails over to the other GPUs")
        for fn in listeners:
            try:
                fn(index, reason)
            except Exception:   # a listener's failure must not hide the loss from the others
                log.exception("device-loss listener %s failed for GPU %d", _short(fn), index)
        return True

    def check_devices(self) -> dict[int, str]:
        """Look at every device's native lost flag (set by the driver's
        VK_ERROR_DEVICE_LOST anywhere in vkmulti, native link workers included,
        or by a test), report the newly lost ones, and return every lost device.
        One atomic read per device: cheap enough for every frame and step."""
        for s in list(self._slots):
            if s.native is not None and s.native.lost and s.index not in self._lost:
                self.report_device_lost(s.index, "the device returned VK_ERROR_DEVICE_LOST")
        return self.lost_devices if self._lost else {}   # (none lost: no copy under the lock)

    def register_teardown(self, hook: Callable[[], object]) -> None:
        """Call `hook()` first thing in destroy() (engines free their per-device objects there)."""
        self._check()
        if not callable(hook):
            raise TypeError(f"teardown hook must be callable, got {type(hook).__name__}")
        self._teardown.append(hook)

    def _destroy_children(self, dl: Deadline) -> None:
        """Destroy every object made on this manager's devices: owners of other
        objects first (coordinators, InterGpuTransfers, renderers, transfers),
        then ports, images and buffers; newest first within a kind."""
        kids = self._life.children()
        order = sorted(range(len(kids)), key=lambda k: (getattr(kids[k], "_teardown_rank", 50), -k))
        for k in order:
            child = kids[k]
            try:
                child.destroy(timeout=dl.left())
            except VkmTimeoutError:
                raise
            except VkmError as exc:   # e.g. a lost device: go on freeing the rest
                log.warning("MultiDeviceManager.destroy: destroying %s failed (%s); going on with the rest",
                            _short(child), exc)

    def _destroy_secondaries(self, dl: Deadline) -> None:
        for s in self._slots:   # children (links between any two slots) before any device
            s.release_children(dl.left())
        for s in self._slots[1:]:
            if s.device is not None:
                self._drain(s, dl)
                destroy_logical_device(s.device, s.native, s.queues(), dl.left(), s.pending_fences)
                s.device = None
                s.native = None
        del self._slots[1:]

    def _drain(self, slot: DeviceSlot, dl: Deadline) -> None:
        """Wait (bounded, interruptible) until every queue of `slot` has finished
        what was submitted to it, so that vkDestroyDevice never waits unbounded."""
        if slot.pending_fences:   # a semaphore's retire that timed out: its fences first
            drain_queues(slot, slot.pending_fences, dl)
        drain_queues(slot, self._drain_fences, dl)

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Run teardown hooks, destroy every object made on these devices, then the
        devices vkmulti made (idempotent).

        From the moment it is called, every object of this manager (images,
        buffers, transfers and their links, ports, renderers, coordinators)
        raises DestroyedError for new operations. It then waits for the
        operations already running on other threads, destroys the objects
        (each waits for its queued GPU work) and the devices. The whole wait is
        bounded by `timeout` seconds (None: no bound) and Ctrl-C ends it; on
        vkmulti.TimeoutError (a transfer stuck behind a wait semaphore that
        never comes, say) or KeyboardInterrupt nothing the GPU may still touch
        is freed, and destroy() may be called again once the work can finish.
        The primary is destroyed only when create() made it.
        """
        with self._life.ending(timeout) as dl:
            if dl is None:
                return
            hooks, self._teardown = self._teardown, []
            errors: list[BaseException] = []
            for hook in hooks:
                try:
                    hook()
                except Exception as exc:  # keep tearing down; report the first
                    log.exception("teardown hook %s failed", _short(hook))
                    errors.append(exc)
            self._destroy_children(dl)
            self._destroy_secondaries(dl)
            p = self._slots[0]
            p.release_children(dl.left())
            if p.owned and p.device is not None:
                self._drain(p, dl)
                destroy_logical_device(p.device, p.native, p.queues(), dl.left(), p.pending_fences)
                p.device = None
            elif p.native is not None:   # the engine's device: its queues are the engine's business
                p.native.release()
            p.native = None
            self._multi_gpu = False
            self._destroyed = True
            if self._owned_instance is not None:
                self._owned_instance.destroy()
                self._owned_instance = None
        if errors:
            raise errors[0]

    def __enter__(self) -> "MultiDeviceManager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        if not self._life.open:
            return "MultiDeviceManager(destroyed)" if self._destroyed else "MultiDeviceManager(destroying)"
        return f"MultiDeviceManager(multi_gpu={self.multi_gpu}, devices={len(self._slots)})"


def _short(obj: Any) -> str:
    """A short description of an object for logs (never a whole repr)."""
    text = repr(obj)
    return text if len(text) <= 80 else f"<{type(obj).__name__}>"
