"""Logical-device creation and the queue wrapper that carries Vulkan's queue lock."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import vulkan as vk

from .._core.checks import is_int, seconds_text, short_repr, short_text
from .._core.lifetime import Deadline
from .._core import _native, vkapi
from .._core.handles import handle_hex, handle_int, to_cffi
from .capabilities import (EXT_DMA_BUF, EXT_FENCE_FD, EXT_MEMORY_BUDGET, EXT_MEMORY_FD,
                           EXT_MEMORY_HOST, EXT_SEMAPHORE_FD, EXT_SYNC2, EXT_TIMELINE,
                           DeviceCapabilities, QueueFamilies, probe_device)
from ..errors import DeviceLostError, UnsupportedError
from ..errors import TimeoutError as VkmTimeoutError

if TYPE_CHECKING:
    from .._core._native import Device as NativeDevice
    from .._core.vktypes import VkDevice, VkPhysicalDevice, VkQueue

log = logging.getLogger(__name__)
_ffi = vk.ffi

#: Extensions enabled on every device that has them.
OPTIONAL_EXTENSIONS = (EXT_MEMORY_FD, EXT_MEMORY_HOST, EXT_DMA_BUF, EXT_SEMAPHORE_FD,
                       EXT_FENCE_FD, EXT_MEMORY_BUDGET)


class Queue:
    """A VkQueue with its family, index and the lock that serialises submits.

    vkmulti's native threads take `lock` around every submit to this queue;
    take it too (``with queue.lock:``) around submits of your own.
    """

    def __init__(self, handle: VkQueue | int, family: int, index: int = 0):
        if not is_int(family) or family < 0:
            raise ValueError(f"queue family must be a non-negative int, got {short_repr(family)}")
        self.handle = to_cffi(handle, "VkQueue")
        self.family = family
        self.index = index
        self.lock = _native.QueueLock(handle_int(handle, "VkQueue"), family, index)

    def __int__(self) -> int:
        return handle_int(self.handle, "VkQueue")

    def __repr__(self) -> str:
        return f"Queue(family={self.family}, index={self.index}, handle=0x{int(self):x})"


def default_queue_families(physical_device: Any, caps: DeviceCapabilities | None = None) -> QueueFamilies | None:
    """Headless resolver: the first graphics family (else compute) for both roles,
    plus the dedicated compute and transfer families. None if no usable family."""
    caps = caps or probe_device(physical_device)
    if caps.graphics_family is None:
        return None
    return QueueFamilies(graphics=caps.graphics_family, present=caps.graphics_family,
                         compute=caps.dedicated_compute_family, transfer=caps.dedicated_transfer_family)


@dataclass
class LogicalDevice:
    """What create_logical_device made. Iterates as the seed's 5-tuple
    (device, graphics, present, compute, transfer)."""
    device: VkDevice
    graphics_queue: Queue
    present_queue: Queue
    compute_queue: Queue | None
    transfer_queue: Queue | None
    queue_families: QueueFamilies
    enabled_extensions: frozenset[str]
    capabilities: DeviceCapabilities
    native: NativeDevice | None = field(repr=False, default=None)
    #: vkmulti's own queue for transfers (second transfer or universal queue), if any
    copy_queue: Queue | None = None
    #: vkmulti's own universal-family queue (second queue of that family), if any
    universal_copy_queue: Queue | None = None
    #: The device features it was made with (Vulkan's names)
    enabled_features: frozenset[str] = frozenset()

    def __iter__(self) -> Iterator[Any]:
        return iter((self.device, self.graphics_queue, self.present_queue,
                     self.compute_queue, self.transfer_queue))

    def queues(self) -> list[Queue]:
        """Every distinct queue of the device (vkmulti's own included)."""
        out: dict[int, Queue] = {}
        for q in (self.graphics_queue, self.present_queue, self.compute_queue, self.transfer_queue,
                  self.copy_queue, self.universal_copy_queue):
            if q is not None:
                out.setdefault(int(q), q)
        return list(out.values())

    def __repr__(self) -> str:
        return (f"LogicalDevice({short_text(self.capabilities.name)}, device={handle_hex(self.device)}, "
                f"families={self.queue_families.graphics}/{self.queue_families.transfer}, "
                f"{len(self.enabled_extensions)} extensions)")


def native_device(physical_device: Any, device: Any, enabled: frozenset[str]) -> Any:
    """The native function table of `device` (loaded once)."""
    return _native.Device(handle_int(physical_device, "VkPhysicalDevice"), handle_int(device, "VkDevice"),
                          EXT_MEMORY_HOST in enabled, EXT_MEMORY_FD in enabled, EXT_DMA_BUF in enabled)


def create_logical_device(physical_device: VkPhysicalDevice | int, queue_families: QueueFamilies | None = None, *,
                          compute_qf: int | None = None, transfer_qf: int | None = None,
                          external_memory_fd: bool = True, extensions: tuple[str, ...] = ()) -> LogicalDevice:
    """Create a VkDevice with timeline semaphores, synchronization2 and every
    external-memory extension the device has; one queue per distinct family.

    `external_memory_fd=False` leaves the fd extensions off (host memory import
    stays on). Raises UnsupportedError for a device without timeline semaphores.
    """
    pd = to_cffi(physical_device, "VkPhysicalDevice")
    caps = probe_device(pd)
    qf = queue_families or default_queue_families(pd, caps)
    if qf is None:
        raise UnsupportedError(f"device {caps.name!r} has no graphics or compute queue family", device=caps.name)
    if not isinstance(qf, QueueFamilies):
        raise TypeError(f"queue_families must be QueueFamilies, got {type(qf).__name__}")
    nfam = len(caps.queue_families)
    compute_qf = compute_qf if compute_qf is not None else qf.compute
    transfer_qf = transfer_qf if transfer_qf is not None else qf.transfer
    for label, fam in (("graphics", qf.graphics), ("present", qf.present), ("compute", compute_qf),
                       ("transfer", transfer_qf)):
        if fam is not None and not (isinstance(fam, int) and 0 <= fam < nfam):
            raise ValueError(f"{label} queue family {short_repr(fam)} out of range for {caps.name!r} ({nfam} families)")
    if not caps.timeline_semaphore:
        raise UnsupportedError(f"device {caps.name!r} lacks timeline semaphores (Vulkan 1.2 or "
                               f"{EXT_TIMELINE}); vkmulti cannot synchronise transfers on it",
                               extension=EXT_TIMELINE, device=caps.name)
    api13 = caps.api_version_tuple >= (1, 3, 0)
    api12 = caps.api_version_tuple >= (1, 2, 0)
    wanted = [e for e in OPTIONAL_EXTENSIONS
              if caps.has(e) and (external_memory_fd or e not in (EXT_MEMORY_FD, EXT_DMA_BUF, EXT_SEMAPHORE_FD,
                                                                  EXT_FENCE_FD))]
    if not api12:
        wanted.append(EXT_TIMELINE)
    if not api13 and caps.has(EXT_SYNC2):
        wanted.append(EXT_SYNC2)
    for e in extensions:
        if not caps.has(e):
            raise UnsupportedError(f"extension {short_repr(e)} is not available on device {caps.name!r}",
                                   extension=e, device=caps.name)
        if e not in wanted:
            wanted.append(e)
    if EXT_DMA_BUF in wanted and EXT_MEMORY_FD not in wanted:
        wanted.remove(EXT_DMA_BUF)

    families = list(dict.fromkeys(f for f in (qf.graphics, qf.present, compute_qf, transfer_qf) if f is not None))
    # vkmulti's own copy queue: a second queue of the dedicated transfer family
    # (the copy engines: fastest for PCIe hops), else of the universal family.
    # A second universal queue (when the family has one) is vkmulti's for
    # device-local copies, which the universal family does several times faster;
    # vkmulti never queues work that waits on another device on your queues.
    two = {f for f in (transfer_qf, qf.graphics) if f is not None and caps.queue_families[f].queue_count >= 2}
    copy_family = next((f for f in (transfer_qf, qf.graphics) if f in two), None)
    prio = _ffi.new("float[]", [1.0, 1.0])
    qinfos = [vk.VkDeviceQueueCreateInfo(sType=vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                         queueFamilyIndex=f, pQueuePriorities=prio,
                                         queueCount=2 if f in two else 1)
              for f in families]
    timeline = _ffi.new("VkPhysicalDeviceTimelineSemaphoreFeatures*")
    timeline.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES
    timeline.timelineSemaphore = 1
    chain = timeline
    sync2 = None
    if caps.synchronization2:
        sync2 = _ffi.new("VkPhysicalDeviceSynchronization2Features*")
        sync2.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SYNCHRONIZATION_2_FEATURES
        sync2.synchronization2 = 1
        sync2.pNext = timeline
        chain = sync2
    shader = _ffi.new("VkPhysicalDeviceFeatures*")   # (the shader arithmetic the GPU offers: kernels may use it)
    for name in caps.shader_features:
        setattr(shader, name, 1)
    info = vk.VkDeviceCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, pNext=chain,
        queueCreateInfoCount=len(qinfos), pQueueCreateInfos=qinfos,
        enabledExtensionCount=len(wanted), ppEnabledExtensionNames=wanted or None, pEnabledFeatures=shader)
    device = vkapi.vkCreateDevice(pd, info, None)
    enabled = frozenset(wanted) | ({EXT_SYNC2} if api13 and caps.synchronization2 else set())
    try:
        nat = native_device(pd, device, enabled)
    except BaseException:
        vk.vkDestroyDevice(device, None)
        raise

    made: dict[int, Queue] = {}

    def queue(fam: int | None) -> Queue | None:
        if fam is None:
            return None
        if fam not in made:
            made[fam] = Queue(vk.vkGetDeviceQueue(device, fam, 0), fam, 0)
        return made[fam]

    g = queue(qf.graphics)
    assert g is not None
    features = frozenset({"timelineSemaphore"} | ({"synchronization2"} if sync2 is not None else set())
                         | caps.shader_features)
    second: dict[int, Queue] = {f: Queue(vk.vkGetDeviceQueue(device, f, 1), f, 1) for f in sorted(two)}
    ld = LogicalDevice(device=device, graphics_queue=g, present_queue=queue(qf.present) or g,
                       compute_queue=queue(compute_qf), transfer_queue=queue(transfer_qf),
                       copy_queue=second.get(copy_family) if copy_family is not None else None,
                       universal_copy_queue=second.get(qf.graphics),
                       queue_families=QueueFamilies(qf.graphics, qf.present, compute_qf, transfer_qf),
                       enabled_extensions=enabled, capabilities=caps, native=nat,
                       enabled_features=features)
    log.debug("created device %s: families %s, extensions %s", caps.name, families, sorted(enabled))
    return ld


def destroy_logical_device(device: Any, native: Any, queues: Any, timeout: float | None = 30.0,
                           pending: list[tuple[Any, Any]] | None = None) -> None:
    """Wait until every queue in `queues` (the device's Queues) finished its work, forget
    the native table, destroy the device.

    The wait is an empty fenced submit per queue, bounded by `timeout` s in slices (Ctrl-C
    honoured), lock waits included: vkDeviceWaitIdle has no bound. vkmulti.TimeoutError
    keeps the device (call again once the work can finish); the fences still pending then
    are appended to `pending` as (device, fence) pairs, to be waited and freed before it.
    Once the device's work is over (drained, or lost) its fences in `pending` are freed
    with it."""
    if not native.lost:   # a lost device runs nothing more: its objects are destroyed as they are
        left: list[int] = []
        try:
            drained = native.drain_queues_raw([q.lock for q in queues], timeout, left)
        except DeviceLostError as exc:
            log.warning("device lost while waiting for it to go idle (%s); destroying it", exc)
            drained = True
            pending = [] if pending is None else pending   # (its fences go with it, below)
        finally:
            if left and pending is not None:
                pending.extend((device, _ffi.cast("VkFence", f)) for f in left)
        if not drained:
            raise VkmTimeoutError(f"device {native.name!r} still runs work (or a queue's lock is held) after "
                                  f"{seconds_text(timeout)} s; it was not destroyed (call again once the work "
                                  f"can finish)")
    if pending:   # (its work is over, drained or lost: fences of a destroyed device would dangle)
        dev = handle_int(device, "VkDevice")
        mine = [f for d, f in pending if handle_int(d, "VkDevice") == dev]
        pending[:] = [(d, f) for d, f in pending if handle_int(d, "VkDevice") != dev]
        for fence in mine:
            vk.vkDestroyFence(device, fence, None)
    native.release(destroyed=True)
    vk.vkDestroyDevice(device, None)


def discard_logical_device(ld: LogicalDevice | None) -> None:
    """Destroy a device made for a create() that then failed (None: none was made; no
    work on it yet: its drain is immediate); an error here is logged, the create()'s
    own is the one raised."""
    if ld is None:
        return
    try:
        destroy_logical_device(ld.device, ld.native, ld.queues())
    except Exception:
        log.exception("tearing down a device after a failed create() failed")


def retire_submits(slot: Any, deadline: Any) -> None:
    """Wait until every queue of `slot` has retired what was submitted to it so far;
    call it before destroying a semaphore that submits waited on.

    Seeing a submit's signal does not mean the driver is done with the
    semaphores it waited on: Mesa's emulated timelines (lavapipe) let go of a
    submit's waits on the queue's submit thread only after its signals are
    visible, so a semaphore destroyed in that window is written to after it
    was freed (a SIGSEGV in that thread, or a corrupted heap). An empty submit
    with a fence on each queue signals only once the queue has let go of
    everything before it. vkmulti.TimeoutError past `deadline` (a Deadline):
    the fences still pending stay in `slot.pending_fences`, waited (and
    freed) first by the next call and by the manager's teardown; a lost
    device holds nothing.
    """
    if getattr(slot, "device", None) is None:
        return   # destroyed: its queues are gone, and everything they held
    shared = getattr(slot, "pending_fences", None)
    mine: list[tuple[Any, Any]] = []
    if shared is not None:
        with slot.children_lock:   # each fence is in one list at a time: no two threads free one
            mine[:], shared[:] = shared, []
    try:
        if slot.native is not None:
            if mine:
                drain_queues(slot, mine, deadline)   # an earlier call's fences first
            drain_queues(slot, mine, deadline)
        else:
            _retire_engine_device(slot, mine, deadline)
    finally:
        if mine and shared is not None:
            with slot.children_lock:
                shared.extend(mine)


def _retire_engine_device(slot: Any, pending: list[tuple[Any, Any]], deadline: Any) -> None:
    """retire_submits for an engine's device without a native table (a single-device manager)."""
    dev = slot.device
    if not pending:
        for q in slot.queues():
            fence = vkapi.vkCreateFence(dev, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO),
                                        None)
            try:
                _submit_fence(slot, None, q, fence, deadline, "vkQueueSubmit(retire)")
            except BaseException:
                vk.vkDestroyFence(dev, fence, None)
                raise
            pending.append((dev, fence))
    while pending:
        fence = pending[0][1]
        _driver_wait(slot, fence, deadline)
        vk.vkDestroyFence(dev, fence, None)
        pending.pop(0)


def _driver_wait(slot: Any, fence: Any, deadline: Any) -> None:
    """Wait through the driver (not the native lost flag) until `fence` of `slot` signals or
    the driver reports the device lost, in 50 ms slices (Ctrl-C lands between them);
    vkmulti.TimeoutError past `deadline`."""
    while vk.lib.vkWaitForFences(slot.device, 1, _ffi.new("VkFence[1]", [fence]), vk.VK_TRUE,
                                 50_000_000) == vk.VK_TIMEOUT:
        left = deadline.left()
        if left is not None and left <= 0:
            raise VkmTimeoutError(f"GPU {slot.index} ({slot.name!r}) still runs work after {deadline.timeout} "
                                  f"s; nothing was freed (call destroy() again once the work can finish)")


def drain_through_driver(slot: Any, timeout: float | None) -> bool:
    """Whether the work submitted to `slot`'s queues so far has all run, waited for through
    the driver even when the device is marked lost (the fault hook leaves the driver
    running what it was given), bounded by `timeout` s (None: no bound; in slices, Ctrl-C
    lands between them). The fences an earlier drain gave up on (`slot.pending_fences`)
    are waited for first and freed once signalled. False when work still runs then: the
    fences stay alive in `slot.pending_fences` (the manager's teardown waits for them).
    DeviceLostError when the driver itself reports the device lost: nothing of it runs
    any more, so the fences are freed."""
    native = getattr(slot, "native", None)
    dev = getattr(slot, "device", None)
    if native is None or dev is None:
        return True
    deadline = Deadline(timeout)
    with slot.children_lock:   # (each fence is in one list at a time: no two threads free one)
        mine = [f for d, f in slot.pending_fences if d is dev]
        slot.pending_fences[:] = [(d, f) for d, f in slot.pending_fences if d is not dev]
    left: list[int] = []
    try:
        while mine:
            _driver_wait(slot, mine[0], deadline)
            vk.vkDestroyFence(dev, mine.pop(0), None)
        return bool(native.drain_queues_raw([q.lock for q in slot.queues()], deadline.left(), left))
    except VkmTimeoutError:
        return False
    except DeviceLostError:
        for fence in mine + [_ffi.cast("VkFence", f) for f in left]:   # (the driver is done with them)
            vk.vkDestroyFence(dev, fence, None)
        mine, left = [], []
        raise
    finally:
        if mine or left:
            with slot.children_lock:
                slot.pending_fences.extend((dev, f) for f in mine + [_ffi.cast("VkFence", h) for h in left])


def drain_queues(slot: Any, fences: list[tuple[Any, Any]], deadline: Any) -> None:
    """Wait until every queue of `slot` has finished the work submitted to it so far.

    An empty submit with a fence on each queue signals once all earlier work
    there is done; the fences are waited in slices (Ctrl-C lands), bounded by
    `deadline` (vkmulti.TimeoutError, keeping the device). Fences still
    pending then are kept in `fences` ((device, fence) pairs) and waited
    first on the next call; a lost device counts as drained.
    """
    dev, native = slot.device, slot.native
    if native is None:
        return
    mine = [f for d, f in fences if d is dev]
    if not mine:
        for q in slot.queues():
            fence = vkapi.vkCreateFence(dev, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
            try:
                _submit_fence(slot, native, q, fence, deadline, "vkQueueSubmit(drain)")
            except DeviceLostError as exc:
                vk.vkDestroyFence(dev, fence, None)
                log.info("GPU %d (%s) is lost (%s): nothing to drain; destroying it", slot.index, slot.name, exc)
                break
            except BaseException:
                vk.vkDestroyFence(dev, fence, None)
                raise
            fences.append((dev, fence))
            mine.append(fence)
    for fence in mine:
        try:
            native.wait_fence(handle_int(fence, "VkFence"), deadline.left())
        except VkmTimeoutError:
            raise VkmTimeoutError(f"GPU {slot.index} ({slot.name!r}) still runs work after {deadline.timeout} s; "
                                  f"its device was not destroyed (call destroy() again once the work can finish)"
                                  ) from None
        except DeviceLostError as exc:
            log.warning("GPU %d (%s) lost while draining its queues (%s); destroying it anyway",
                        slot.index, slot.name, exc)
            # marked lost by the fault hook, the driver still runs what the queue holds (a relay may
            # still signal it): the fence is freed once the driver is done with it; a device really
            # lost answers at once
            _driver_wait(slot, fence, deadline)
    for fence in mine:
        vk.vkDestroyFence(dev, fence, None)
    fences[:] = [(d, f) for d, f in fences if d is not dev]


def _submit_fence(slot: Any, native: Any, queue: Any, fence: Any, deadline: Any, call: str) -> None:
    """An empty submit signalling `fence` on `queue`; the wait for the queue's lock is
    bounded by `deadline` (a thread that keeps it held must not stall a teardown)."""
    try:
        vkapi.queue_submit(native, queue, [], fence, call=call, lock_timeout=deadline.left())
    except VkmTimeoutError:
        raise VkmTimeoutError(f"GPU {slot.index} ({slot.name!r}): the lock of queue family {queue.family} was still "
                              f"held by another thread after {seconds_text(deadline.timeout)} s; nothing was "
                              f"destroyed (call destroy() again once it is released)") from None
