"""DeviceSlot and MultiDeviceManager: one VkDevice per GPU, GPU 0 is the primary."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import vulkan as vk

from ._handles import cstr, handle_int, to_cffi
from .capabilities import EXT_MEMORY_FD, DeviceCapabilities, QueueFamilies, RenderCapabilities, probe_device
from .devices import (LogicalDevice, Queue, create_logical_device, default_queue_families,
                      destroy_logical_device, native_device)
from .errors import DestroyedError

log = logging.getLogger(__name__)

__all__ = ["DeviceSlot", "MultiDeviceManager"]


@dataclass
class DeviceSlot:
    """One GPU: its physical and logical device, queues and optional renderer."""
    index: int
    physical_device: Any
    queue_families: QueueFamilies
    device: Any = None
    graphics_queue: Any = None
    present_queue: Any = None
    compute_queue: Any = None
    transfer_queue: Any = None
    name: str = ""
    renderer: Any = None
    capabilities: DeviceCapabilities | None = None
    enabled_extensions: frozenset[str] = frozenset()
    native: Any = dataclasses.field(default=None, repr=False)
    owned: bool = dataclasses.field(default=False, repr=False)
    #: Per-device helpers vkmulti caches (transfer links, command runners);
    #: each has destroy() and goes before any device is destroyed.
    children: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    #: A queue reserved for vkmulti's transfers (made by vkmulti), if any.
    dedicated_copy_queue: Any = dataclasses.field(default=None, repr=False)
    #: A universal-family queue reserved for vkmulti (made by vkmulti), if any.
    dedicated_universal_queue: Any = dataclasses.field(default=None, repr=False)

    @property
    def is_primary(self) -> bool:
        return self.index == 0

    @property
    def copy_queue(self) -> Queue:
        """The queue vkmulti copies on: its own queue when vkmulti made the device,
        else the transfer queue, else compute, else graphics."""
        return self.dedicated_copy_queue or self.transfer_queue or self.compute_queue or self.graphics_queue

    @property
    def universal_copy_queue(self) -> Queue:
        """The universal-family queue vkmulti does device-local copies on: its own
        when it made the device, else the graphics queue."""
        return self.dedicated_universal_queue or self.graphics_queue

    def release_children(self) -> None:
        """Destroy the cached helpers, newest first."""
        while self.children:
            _, child = self.children.popitem()
            child.destroy()


def _device_name(pd: Any) -> str:
    try:
        return cstr(vk.vkGetPhysicalDeviceProperties(pd).deviceName)
    except Exception:  # the seed's behaviour: never fail on a name
        return "<unknown>"


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
    creates nothing. `MultiDeviceManager.create()` builds everything itself
    (instance included) for users without an engine, and destroys it all.
    """

    def __init__(self, *, primary_physical_device: Any, primary_queue_families: QueueFamilies,
                 primary_device: Any, primary_graphics_queue: Any, primary_present_queue: Any,
                 physical_devices: list[Any], enabled: bool,
                 capabilities: RenderCapabilities | None = None, primary_compute_queue: Any = None,
                 primary_transfer_queue: Any = None, find_queue_families: Callable[[Any], Any] | None = None,
                 primary_extensions: Iterable[str] | None = None):
        if not isinstance(primary_queue_families, QueueFamilies):
            raise TypeError(f"primary_queue_families must be QueueFamilies, "
                            f"got {type(primary_queue_families).__name__}")
        if not isinstance(physical_devices, (list, tuple)):
            raise TypeError(f"physical_devices must be a list, got {type(physical_devices).__name__}")
        if len(physical_devices) == 0:
            raise ValueError("physical_devices is empty: it must list every GPU, the primary included")
        if find_queue_families is not None and not callable(find_queue_families):
            raise TypeError("find_queue_families must be callable or None")
        if capabilities is not None and not isinstance(capabilities, RenderCapabilities):
            raise TypeError(f"capabilities must be RenderCapabilities, got {type(capabilities).__name__}")
        primary_pd = to_cffi(primary_physical_device, "VkPhysicalDevice")
        primary_key = handle_int(primary_pd, "VkPhysicalDevice")
        pds = [to_cffi(p, "VkPhysicalDevice") for p in physical_devices]
        if primary_key not in [handle_int(p, "VkPhysicalDevice") for p in pds]:
            raise ValueError("primary_physical_device is not among physical_devices")
        device = to_cffi(primary_device, "VkDevice")
        pext = frozenset(primary_extensions or ())

        self._teardown: list[Callable[[], Any]] = []
        self._destroyed = False
        self._owned_instance: Any = None
        self._physical_devices = list(pds)
        self.external_memory_fd_enabled = False
        pcaps = probe_device(primary_pd)
        qf = primary_queue_families
        self._slots: list[DeviceSlot] = [DeviceSlot(
            index=0, physical_device=primary_pd, queue_families=qf, device=device,
            graphics_queue=_as_queue(primary_graphics_queue, qf.graphics, "primary_graphics_queue"),
            present_queue=_as_queue(primary_present_queue, qf.present, "primary_present_queue"),
            compute_queue=_as_queue(primary_compute_queue,
                                    qf.compute if qf.compute is not None else pcaps.dedicated_compute_family,
                                    "primary_compute_queue"),
            transfer_queue=_as_queue(primary_transfer_queue,
                                     qf.transfer if qf.transfer is not None else pcaps.dedicated_transfer_family,
                                     "primary_transfer_queue"),
            name=_device_name(primary_pd), capabilities=pcaps, enabled_extensions=pext,
        )]
        if self._slots[0].graphics_queue is None:
            raise ValueError("primary_graphics_queue is required")
        self._multi_gpu = bool(enabled) and len(pds) > 1
        self.capabilities = capabilities
        if self._multi_gpu:
            self._slots[0].native = native_device(primary_pd, device, pext)
            try:
                self._create_secondaries(primary_key, find_queue_families)
            except BaseException:
                self._destroy_secondaries()
                raise
        elif enabled:
            log.info("multi-GPU requested but only %d physical device(s); using the single-device path", len(pds))
        self._refresh_capabilities()

    # -- construction ------------------------------------------------------

    def _create_secondaries(self, primary_key: int, find_queue_families: Callable[[Any], Any] | None) -> None:
        for pd in self._physical_devices:
            if handle_int(pd, "VkPhysicalDevice") == primary_key:
                continue   # by handle value: cffi may hand out a new object per enumeration
            caps = probe_device(pd)
            qf = find_queue_families(pd) if find_queue_families else default_queue_families(pd, caps)
            if qf is None:
                log.warning("no graphics queue family resolved for %s; skipping", caps.name)
                continue
            if not isinstance(qf, QueueFamilies):
                qf = QueueFamilies(graphics=qf.graphics, present=qf.present)
            if qf.compute is None or qf.transfer is None:
                qf = QueueFamilies(qf.graphics, qf.present,
                                   qf.compute if qf.compute is not None else caps.dedicated_compute_family,
                                   qf.transfer if qf.transfer is not None else caps.dedicated_transfer_family)
            ld = create_logical_device(pd, qf)
            self._slots.append(self._slot_from(len(self._slots), pd, ld))
            log.info("created secondary logical device %d (%s)", len(self._slots) - 1, caps.name)

    @staticmethod
    def _slot_from(index: int, pd: Any, ld: LogicalDevice, owned: bool = True) -> DeviceSlot:
        return DeviceSlot(index=index, physical_device=pd, queue_families=ld.queue_families, device=ld.device,
                          graphics_queue=ld.graphics_queue, present_queue=ld.present_queue,
                          compute_queue=ld.compute_queue, transfer_queue=ld.transfer_queue,
                          name=ld.capabilities.name, capabilities=ld.capabilities,
                          enabled_extensions=ld.enabled_extensions, native=ld.native, owned=owned,
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
               validation: bool | None = None, instance: Any = None) -> "MultiDeviceManager":
        """Make an instance (unless given) and one device per GPU; destroy() frees all.

        `device_indices` picks physical devices by enumeration index (the first
        is the primary); default: all of them.
        """
        from .instance import Instance

        own_instance = instance is None
        inst = Instance(validation=validation) if own_instance else instance
        if not isinstance(inst, Instance):
            raise TypeError(f"instance must be a vkmulti Instance, got {type(inst).__name__}")
        primary_ld: LogicalDevice | None = None
        try:
            pds = inst.physical_devices()
            if not pds:
                raise ValueError("no Vulkan physical device found (install a driver, or use "
                                 "vkmulti.testing.virtual_gpus() for a CPU pair)")
            if device_indices is None:
                device_indices = list(range(len(pds)))
            if not isinstance(device_indices, (list, tuple)) or not device_indices:
                raise ValueError(f"device_indices must be a non-empty list, got {device_indices!r}")
            for i in device_indices:
                if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(pds):
                    raise IndexError(f"device index {i!r} out of range: {len(pds)} physical device(s)")
            if len(set(device_indices)) != len(device_indices):
                raise ValueError(f"device_indices has duplicates: {device_indices!r}")
            chosen = [pds[i] for i in device_indices]
            primary_ld = create_logical_device(chosen[0])
            mgr = cls(primary_physical_device=chosen[0], primary_queue_families=primary_ld.queue_families,
                      primary_device=primary_ld.device, primary_graphics_queue=primary_ld.graphics_queue,
                      primary_present_queue=primary_ld.present_queue, physical_devices=chosen,
                      enabled=enabled, primary_compute_queue=primary_ld.compute_queue,
                      primary_transfer_queue=primary_ld.transfer_queue,
                      primary_extensions=primary_ld.enabled_extensions)
        except BaseException:
            if primary_ld is not None:
                destroy_logical_device(primary_ld.device, primary_ld.native)
            if own_instance:
                inst.destroy()
            raise
        p = mgr._slots[0]
        if p.native is not None and primary_ld.native is not None:
            p.native.release()
        p.native = primary_ld.native
        p.owned = True
        p.dedicated_copy_queue = primary_ld.copy_queue
        p.dedicated_universal_queue = primary_ld.universal_copy_queue
        mgr._owned_instance = inst if own_instance else None
        mgr.instance = inst
        return mgr

    # -- the seed's API ----------------------------------------------------

    def _check(self) -> None:
        if self._destroyed:
            raise DestroyedError("MultiDeviceManager used after destroy()")

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    @property
    def multi_gpu(self) -> bool:
        return not self._destroyed and self._multi_gpu and len(self._slots) > 1

    @property
    def device_count(self) -> int:
        self._check()
        return len(self._slots)

    @property
    def primary(self) -> DeviceSlot:
        self._check()
        return self._slots[0]

    @property
    def secondaries(self) -> list[DeviceSlot]:
        self._check()
        return self._slots[1:]

    @property
    def slots(self) -> list[DeviceSlot]:
        self._check()
        return list(self._slots)

    def slot(self, index: int) -> DeviceSlot:
        self._check()
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"slot index must be an int, got {type(index).__name__}")
        if not 0 <= index < len(self._slots):
            raise IndexError(f"slot index {index} out of range: {len(self._slots)} slot(s)")
        return self._slots[index]

    def attach_renderer(self, index: int, renderer: Any) -> None:
        self.slot(index).renderer = renderer

    def register_teardown(self, hook: Callable[[], Any]) -> None:
        self._check()
        if not callable(hook):
            raise TypeError(f"teardown hook must be callable, got {type(hook).__name__}")
        self._teardown.append(hook)

    def _destroy_secondaries(self) -> None:
        for s in self._slots:   # children (links between any two slots) before any device
            s.release_children()
        for s in self._slots[1:]:
            if s.device is not None:
                destroy_logical_device(s.device, s.native)
                s.device = None
                s.native = None
        del self._slots[1:]

    def destroy(self) -> None:
        """Run teardown hooks, wait for and destroy the devices vkmulti made.

        Idempotent. The primary is destroyed only when create() made it.
        """
        if self._destroyed:
            return
        hooks, self._teardown = self._teardown, []
        errors: list[BaseException] = []
        for hook in hooks:
            try:
                hook()
            except Exception as exc:  # keep tearing down; report the first
                log.exception("teardown hook %r failed", hook)
                errors.append(exc)
        self._destroy_secondaries()
        p = self._slots[0]
        p.release_children()
        if p.owned and p.device is not None:
            destroy_logical_device(p.device, p.native)
            p.device = None
        elif p.native is not None:
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
        if self._destroyed:
            return "MultiDeviceManager(destroyed)"
        return f"MultiDeviceManager(multi_gpu={self.multi_gpu}, slots={[s.name for s in self._slots]})"
