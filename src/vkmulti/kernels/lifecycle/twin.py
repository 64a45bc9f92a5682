"""The twin mechanism that moves a runtime kernel to another device, shared by
live migration (live_migration.py) and restore (restore.py).

A *twin* is a Kernel with the same id and address whose Residency (its
buffers, descriptor sets and pipelines) is on the target device. It is built
and filled while the kernel stays where it is; at a step boundary the
kernel's Residency is swapped with the twin's, so the Kernel object users
hold stays the same and moves. What the twin is left with (the old device's
half) is freed once nothing reads it.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np
import vulkan as vk

from ..._core.checks import seconds_text, short_repr
from ..._core.lifetime import Deadline
from ...errors import DestroyedError, DeviceLostError, MigrationError, TimeoutError as VkmTimeout, VkmError
from ...memory.image import Buffer
from ...transfer.cross_device import CrossDeviceTransfer
from ...transfer.peer import ExportedBuffer
from ...transfer.methods import select_transfer_method
from ..coordinator.records import MigrationRequest
from ...memory.buffer import MappedBuffer
from ..engine.device_context import WHOLE_SIZE
from ..engine.recording import barrier
from ..engine.kernel import Kernel, OutboxBatch, Residency
from ..messages import RING_HEADER_BYTES
from ..engine.spec import KernelSpec

log = logging.getLogger(__name__)

__all__ = ["RuntimeView", "LifecycleView", "MigrationPool", "Retired", "MoveEngines", "Twin", "state_buffers",
           "twin_buffer_sizes", "twin_mapped_sizes", "check_residency",
           "build_twin", "drop_imports", "free_twin", "retire_half", "free_retired", "hand_back", "finish_move", "assign",
           "source_usable", "drained_lost", "deadline_of", "time_left", "wait_kernel", "wait_jobs"]


class RuntimeView(Protocol):
    """What the lifecycle (checkpoint, restore, migration, replay) uses of its
    KernelRuntime: its registries under `_lock`, its devices and the waits and
    directory updates of its step loop."""
    coordinator: Any
    manager: Any
    payload_size: int
    max_kernels: int
    outbox_feed: Any
    _lock: threading.RLock
    _kernels: dict[str, Kernel]
    _by_index: dict[int, Kernel]
    _contexts: dict[int, tuple[Any, Any]]

    @property
    def kernels(self) -> list[Kernel]: ...
    def _resolve(self, kernel: Any, label: str = "kernel") -> Kernel: ...
    def _context(self, index: int) -> Any: ...
    def _device(self, index: int) -> tuple[Any, Any]: ...
    def _mark_dirty(self, index: int) -> None: ...
    def _wait_points(self, points: Iterable[Any], timeout: float | None) -> None: ...
    def _wait_point(self, p: Any, deadline: float, timeout: float | None) -> None: ...
    def synchronize(self, timeout: float | None = 60.0) -> None: ...
    def accept_batch(self, device: int, buffer: Any, offset: int, size: int) -> Any: ...
    def launch(self, spec: KernelSpec, kernel_id: str | None = None, **kw: Any) -> Kernel: ...
    def destroy_kernel(self, kernel: Any, *, timeout: float = 30.0) -> None: ...
    def device_lost(self, index: int) -> bool: ...
    def exports_outboxes(self, index: int) -> bool: ...
    def record_dead_letters(self, text: str, n: int) -> None: ...
    def restore(self, checkpoint: Any, **kw: Any) -> Kernel: ...
    def latest_checkpoint(self, kernel: Any) -> Any: ...


class LifecycleView(Protocol):
    """What moves, the policy and the replay use of the runtime's Lifecycle: its
    runtime, holds, GPU jobs and CRC32 engines, the migration pool, the transfer
    engines, the retired resources, the count of steps made, the policy's state."""
    rt: RuntimeView
    engines: "MoveEngines"
    prebuild: Any
    steps_done: int
    policy_state: Any
    twins: Any

    @property
    def pool(self) -> "MigrationPool": ...
    def hold(self, kernel: Kernel, why: str, moving: bool = False) -> None: ...
    def release(self, kernel: Kernel, why: str | None = None, moving: bool = False) -> None: ...
    def extras(self, device: int) -> Any: ...
    def extras_if_made(self, device: int) -> Any: ...
    def crc(self, device: int, timeout: float | None = 60.0) -> Any: ...
    def crc_kind(self, ctx: Any) -> str: ...
    def retire(self, item: "Retired") -> None: ...
    def wait_for_step(self, seen: int, timeout: float) -> None: ...


class MigrationPool:
    """Device buffers a moved kernel left behind, kept for the next kernel that
    moves onto that device with buffers of the same sizes (a migration back
    and forth allocates nothing, and on CPU devices touches no new pages), up
    to `limit` bytes per device; the rest are freed."""

    def __init__(self, limit: int):
        self.limit = limit
        self._lock = threading.Lock()
        self._free: dict[tuple[int, int, bool], list[Any]] = {}
        self._bytes: dict[int, int] = {}

    def take(self, device: int, size: int, mapped: bool = False) -> Any | None:
        """A pooled buffer of `size` bytes on `device` (`mapped`: a MappedBuffer, zeroed), or None."""
        with self._lock:
            free = self._free.get((device, size, mapped))
            if not free:
                return None
            self._bytes[device] -= size
            b = free.pop()
        if mapped:
            b.bytes[:] = 0   # (as a new one is)
        return b

    def held(self, device: int, size: int, mapped: bool = False) -> int:
        """How many buffers of `size` bytes the pool holds on `device`."""
        with self._lock:
            return len(self._free.get((device, size, mapped), ()))

    def bytes_on(self, device: int) -> int:
        """The bytes the pool holds on `device`."""
        with self._lock:
            return self._bytes.get(device, 0)

    def put(self, buffer: Any) -> None:
        """Keep `buffer` for a later move (or free it when the pool of its device is full)."""
        device, size = buffer.slot.index, buffer.size
        key = (device, size, isinstance(buffer, MappedBuffer))
        with self._lock:
            if buffer.handle is not None and self._bytes.get(device, 0) + size <= self.limit:
                self._free.setdefault(key, []).append(buffer)
                self._bytes[device] = self._bytes.get(device, 0) + size
                return
        buffer.destroy()

    def reserve(self, ctx: Any, sizes: list[int], limit: int, mapped: Sequence[int] = ()) -> int:
        """Make buffers of `sizes` (and MappedBuffers of `mapped` sizes) on the device
        of `ctx` ahead of a move there, zeroed (on a CPU device that touches their
        pages), while that device's pool stays within `limit` bytes (and its own
        limit); the bytes added (0: none)."""
        total = sum(sizes) + sum(mapped)
        with self._lock:
            if self._bytes.get(ctx.index, 0) + total > min(limit, self.limit):
                return 0
        made: list[Buffer] = []
        try:
            for n in sizes:
                made.append(Buffer(ctx.slot, n))
        except BaseException:
            for b in made:
                b.destroy()
            raise
        # (if the fill fails, the runner frees them once the GPU is done with them)
        ctx.run_once(lambda cmd: [vk.vkCmdFillBuffer(cmd, b.handle, 0, WHOLE_SIZE, 0) for b in made], keep=made)
        try:
            for n in mapped:
                made.append(MappedBuffer(ctx.slot, n))
        except BaseException:
            for b in made:
                b.destroy()
            raise
        for b in made:
            self.put(b)
        return total

    def clear(self) -> None:
        """Free every pooled buffer."""
        with self._lock:
            free, self._free, self._bytes = self._free, {}, {}
        for bufs in free.values():
            for b in bufs:
                try:
                    b.destroy()
                except VkmError as exc:   # a lost device: its memory goes with it
                    log.warning("could not free a pooled migration buffer: %s", exc)


@dataclass
class Retired:
    """Device resources a moved kernel left behind, freed once nothing uses them."""
    ctx: Any
    buffers: list[Any]
    batches: list[Any] = field(default_factory=list)   # batches that must be done first
    handle: int | None = None                          # an outbox whose receivers' sets go too
    sets: list[Any] = field(default_factory=list)      # a lost device's: freed once its driver ran its work


class MoveEngines:
    """The transfer engines that move kernels between two devices, one per
    ordered pair with the pair's best method, kept until destroy()."""

    def __init__(self, coordinator: Any, manager: Any):
        self._coordinator, self._manager = coordinator, manager
        self._engines: dict[tuple[int, int], tuple[str, CrossDeviceTransfer]] = {}
        self._lock = threading.Lock()   # a move and the background build may ask for one pair at once
        self._closed = False   # destroy() took the engines: none is made after (it would not be freed)

    def get(self, a: int, b: int) -> tuple[str, CrossDeviceTransfer]:
        """(method, engine) for copies from device `a` to device `b`; DestroyedError after destroy()."""
        with self._lock:
            if self._closed:
                raise DestroyedError("KernelRuntime used after destroy(): no engine for a move is made")
            return self._get(a, b)

    def _get(self, a: int, b: int) -> tuple[str, CrossDeviceTransfer]:
        coord = self._coordinator
        method = coord.transfer_method(a, b) if callable(getattr(coord, "transfer_method", None)) else None
        if method is None or method == "none":
            class _Src:
                device_index = a
            method = select_transfer_method(_Src(), self._manager.capabilities, dst_index=b)
        cached = self._engines.get((a, b))
        if cached is not None and cached[0] == method and not cached[1].destroyed:
            return cached
        eng = CrossDeviceTransfer(self._manager.slot(a), self._manager.slot(b), method)
        self._engines[(a, b)] = (method, eng)
        return method, eng

    def destroy(self, timeout: float) -> None:
        """Destroy the engines (the runtime's destroy())."""
        with self._lock:
            engines, self._engines, self._closed = self._engines, {}, True
        for _, eng in engines.values():
            try:
                eng.destroy(timeout)
            except VkmError as exc:
                log.warning("a migration transfer did not finish at teardown: %s", exc)


class Twin(Kernel):
    """A kernel being built on a target device: its device-local buffers come from
    `pool` where one of the size is free; state buffers given as `states`
    (already being filled by the copies) are adopted."""

    def __init__(self, *args: Any, pool: MigrationPool, states: list | None = None, ahead: bool = False):
        self.pool, self.ahead = pool, ahead
        self.presets = list(states) if states is not None else None
        super().__init__(*args)

    def _take_local_slot(self, ctx: Any) -> int:
        """No slot (-1) for a twin made ahead (the move that takes it gives it one): a background build
        never takes a slot a launch of the caller's may need."""
        return -1 if self.ahead else super()._take_local_slot(ctx)

    def _state_buffer(self, index: int, size: int) -> Any:
        presets = self.presets
        if presets is not None and presets[index] is not None:
            b, presets[index] = presets[index], None
            self.buffers.append(b)   # the twin owns it from here (freed or pooled with the rest)
            return b
        return super()._state_buffer(index, size)

    def _buffer(self, size: int, mapped: bool = False, exported: bool = False) -> Any:
        if not exported:   # (an exported outbox is made for the kernel: other devices import it)
            b = self.pool.take(self.ctx.index, size, mapped)
            if b is not None:
                self.buffers.append(b)
                return b
        return super()._buffer(size, mapped, exported)


def twin_buffer_sizes(rt: RuntimeView, k: Kernel, ctx: Any) -> list[int]:
    """The sizes of the device-local buffers a twin of k on the device of `ctx`
    takes from the pool (as Kernel._create makes them: inbox, control, outbox
    unless exported there, state buffers)."""
    spec = k.spec
    sizes = [RING_HEADER_BYTES + spec.inbox_capacity * k.slot_size, RING_HEADER_BYTES + ctx.table_size * 16]
    if not rt.exports_outboxes(ctx.index):
        sizes.append(ctx.in_flight * Residency(ctx, spec, k.slot_size).outbox_region)
    return sizes + list(spec.state_sizes)


def twin_mapped_sizes(k: Kernel, ctx: Any) -> list[int]:
    """The sizes of the mapped rings a twin of k on the device of `ctx` takes from
    the pool (host-to-kernel messages, reports)."""
    res = Residency(ctx, k.spec, k.slot_size)
    return [ctx.in_flight * res.h2k_region, ctx.in_flight * res.k2h_region]


def _check_state_sizes(rt: RuntimeView, k: Kernel, device: int, spec: KernelSpec) -> Any:
    ctx, _ = rt._device(device)
    for i, n in enumerate(spec.state_sizes):
        if n > ctx.max_storage_range:
            raise MigrationError(f"state buffer {i} of {short_repr(k.id)} is {n} bytes; GPU {device} binds at most "
                                 f"{ctx.max_storage_range} (maxStorageBufferRange)")
    return ctx


def state_buffers(rt: RuntimeView, pool: MigrationPool, k: Kernel, device: int) -> list[Buffer]:
    """Device-local buffers on `device` for k's state (from `pool` where it has
    them), to copy into before the twin exists (build_twin(states=...))."""
    ctx = _check_state_sizes(rt, k, device, k.spec)
    out: list[Buffer] = []
    try:
        for n in k.spec.state_sizes:
            b = pool.take(ctx.index, n)
            out.append(b if b is not None else Buffer(ctx.slot, n))
    except BaseException:
        for b in out:
            b.destroy()
        raise
    return out


def build_twin(rt: RuntimeView, pool: MigrationPool, k: Kernel, device: int, spec: KernelSpec | None = None,
               states: list[Buffer] | None = None,
               then: Callable[[Kernel], tuple[Callable[[Any], None], list[Buffer]]] | None = None,
               ahead: bool = False, timeout: float | None = 60.0) -> Kernel:
    """A Kernel with k's id, address, tenant and params, its resources on `device`,
    initialised (rings zeroed, headers written) except its state buffers, which
    the caller fills whole (or `states`, buffers of that device it adopts: the
    caller keeps those it did not adopt, None in the list marking adopted ones);
    not registered anywhere. `then(twin)`: (a recorder of more commands for the
    twin's buffers, run in the same submit after the initialisation (a restore's
    uploads), the other buffers those commands read); the submit is waited for up to
    `timeout` s. If that wait gives up, the twin's buffers are freed once the GPU is
    done with them (the command runner keeps them), and freeing the buffers the
    commands read waits for it. `ahead`: made before any move asks for it
    (ReadyTwins), without a local slot until one takes it."""
    spec = spec or k.spec
    ctx = _check_state_sizes(rt, k, device, spec)
    # built ahead (engine/prebuild.py), or waited for where that build runs: not under the device lock
    ctx.kernel_pass(spec.spirv, spec.entry_point, len(spec.state_sizes), locked=False)
    with ctx.lock:
        ctx.check()
        twin = Twin(rt, ctx, spec, k.id, k.address, k.tenant, tuple(k.params), pool=pool, states=states, ahead=ahead)
    if states is not None:
        states[:] = twin.presets  # type: ignore[assignment] # adopted ones are None now
    handed = False
    try:
        init = twin.init_commands([np.zeros(0, np.uint8)] * len(spec.state_sizes))   # empty: left as is
        more, reads = then(twin) if then is not None else (None, [])

        def record(cmd: Any) -> None:
            init(cmd)
            if more is not None:
                barrier(cmd)
                more(cmd)
        handed = True   # (from here the runner frees the twin's buffers if the run fails, once the GPU is done)
        ctx.run_once(record, timeout=timeout, keep=list(twin.buffers), users=list(reads))
    except BaseException as exc:
        if handed:
            twin.buffers = []
        drop_imports(twin)
        with ctx.lock:
            twin.free()
        if isinstance(exc, VkmTimeout):
            raise VkmTimeout(f"the initialisation of {short_repr(str(k.id))}'s twin on GPU {device} did not finish "
                             f"within {seconds_text(timeout)} s (it runs after the work queued there)") from None
        raise
    return twin


def drop_imports(k: Kernel, timeout: float | None = 30.0, buffers: Sequence[Buffer] | None = None) -> None:
    """Other devices' imports of k's buffers (or of `buffers`) go, each after the steps
    that read it in place, under that device's lock. Called before freeing k under its
    own device's lock, so that the free takes no other device's lock: device locks are
    only ever taken in index order (finish_move), never one while holding a higher one."""
    deadline = Deadline(timeout)
    for b in list(k.buffers if buffers is None else buffers):
        if isinstance(b, ExportedBuffer):
            b.destroy_imports(deadline.left())


def free_twin(twin: Kernel) -> None:
    """Free a twin that never became the kernel (the GPU no longer uses it)."""
    ctx = twin.ctx
    twin.destroyed = True
    try:
        drop_imports(twin)
        with ctx.lock:
            twin.free()
    except VkmError as exc:
        log.warning("could not free the migration target's resources on GPU %d: %s", ctx.index, exc)


def retire_half(life: LifecycleView, half: Kernel, lost: bool) -> None:
    """Free what a moved kernel left on its old device: at once, except its outbox
    while batches it sent there are not yet delivered; the buffers on a lost device
    on the ready-twin thread (nothing runs there: a failover's restore does not
    wait for the driver to free that memory)."""
    ctx = half.ctx
    half.destroyed = True
    outbox = half.outbox
    stepper = life.rt._contexts.get(ctx.index, (None, None))[1]
    pending = [] if lost or stepper is None else \
        [b for b in stepper.batches if isinstance(b, OutboxBatch) and b.buffer is outbox and not b.done]
    keep = [] if lost else [outbox]
    sets = half.sets + list(half.deliver_sets.values())
    try:
        with ctx.lock:
            for s in sets if ctx.alive and not lost else ():
                ctx.free_set(s)
            half.sets, half.deliver_sets = [], {}
            ctx.let_go(half.residency)   # (its pipeline: kept while kernels that may run here have its code)
            if half.local_slot >= 0:
                if ctx.local[half.local_slot] is half:
                    ctx.release_local_slot(half.local_slot)
                half.local_slot = -1
        if lost:   # (a reported loss: the driver may still run the steps that used them)
            life.twins.free_later(Retired(ctx, half.buffers, sets=sets))
        else:
            for b in half.buffers:
                if b is outbox:
                    continue
                if isinstance(b, ExportedBuffer):
                    b.destroy()
                else:   # no GPU work uses it any more (the runtime's steps and the copies are done), nor the host
                    life.pool.put(b)
    except VkmError as exc:
        log.warning("could not free a moved kernel's resources on GPU %d: %s", ctx.index, exc)
    half.buffers = []
    if keep:
        life.retire(Retired(ctx, keep, pending, outbox.handle_int))


def free_retired(rt: RuntimeView, r: Retired) -> None:
    """Free retired resources; an outbox's receivers drop their descriptor sets for it."""
    ctx = r.ctx
    if r.handle is not None and ctx.alive:
        with rt._lock:
            kernels = [k for k in rt._kernels.values() if k is not None]
        pair = rt._contexts.get(ctx.index)
        with ctx.lock:
            for other in kernels:
                if other.ctx is ctx and not other.destroyed:
                    for key in [key for key in other.deliver_sets if key[0] == r.handle]:
                        s = other.deliver_sets.pop(key)
                        if pair is not None:
                            pair[1].retired.append((ctx.value, s))
                        else:
                            ctx.free_set(s)
    for b in r.buffers:
        try:
            b.destroy()
        except VkmError as exc:   # a lost device: its memory goes with it
            log.warning("could not free a moved kernel's buffer on GPU %d: %s", ctx.index, exc)


def hand_back(life: LifecycleView, device: int, rings: list[Buffer], front: bool = False) -> None:
    """Give staging batches to the kernels of `device`, in order (freed once
    delivered); `front`: before every batch already there (their messages are
    older than any still waiting there)."""
    rt = life.rt
    ctx, stepper = rt._device(device)
    for i, ring in enumerate(rings):
        b = rt.accept_batch(device, ring, 0, ring.size)
        if front:
            with ctx.lock:
                stepper.batches.remove(b)
                stepper.batches.insert(i, b)
        life.retire(Retired(ctx, [ring], [b]))


# -- waits ------------------------------------------------------------------------------------

def deadline_of(timeout: float | None) -> float:
    """The monotonic time by which `timeout` seconds are up (None: practically never)."""
    return time.monotonic() + (timeout if timeout is not None else 1e18)


def time_left(deadline: float, what: str) -> float:
    """Seconds left until `deadline`; vkmulti.TimeoutError naming `what` when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise VkmTimeout(f"{what} did not finish in time")
    return left


def check_residency(k: Kernel, residency: Residency) -> None:
    """MigrationError once k's Residency is no longer `residency`: another move or restore
    replaced it while this one was under way (checked with the gate held, before the switch)."""
    if k.residency is not residency:
        raise MigrationError(f"{short_repr(k.id)} was restored or moved by another call meanwhile; it stays where that "
                             f"call put it (move or restore it again)")


def wait_kernel(rt: RuntimeView, k: Kernel, deadline: float) -> None:
    """Wait until k's submitted steps are done."""
    if k.last_value:
        rt._wait_points([k.ctx.point(k.last_value)], time_left(deadline, f"the steps of {short_repr(k.id)}"))


def wait_jobs(life: LifecycleView, device: int, deadline: float) -> None:
    """Wait for the runtime's own GPU jobs on `device` (policy captures reading state)."""
    ext = life.extras_if_made(device)
    if ext is not None and ext.jobs.value:
        ext.jobs.wait(ext.jobs.point(ext.jobs.value), time_left(deadline, f"GPU {device}'s checkpoint captures"))


# -- finishing a move -----------------------------------------------------------------------------

def _swap_residency(k: Kernel, twin: Kernel) -> None:
    k.residency, twin.residency = twin.residency, k.residency
    if k.local_slot >= 0:
        k.ctx.local[k.local_slot] = k
    if twin.local_slot >= 0:
        twin.ctx.local[twin.local_slot] = twin


def finish_move(rt: RuntimeView, k: Kernel, twin: Kernel, residency: Residency, failover: bool = False) -> None:
    """The swap (runtime gate held, or k's device lost): k takes the twin's Residency, the
    directory is rewritten everywhere, batches on other devices stop delivering to k.
    MigrationError, nothing swapped, once k's Residency is no longer `residency` (another
    move or restore came first), a failover restores k (unless this is that failover's
    restore) or the twin's device is lost: checked under both devices' locks, which a
    failover takes to list the kernels of a lost device, so that a kernel never lands on
    a device whose failover has passed it by."""
    old_ctx, new_ctx = k.ctx, twin.ctx
    locks = sorted({old_ctx.index: old_ctx, new_ctx.index: new_ctx}.items())
    for _, c in locks:
        c.lock.acquire()
    try:
        k.check()
        check_residency(k, residency)
        if k.restoring and not failover:
            raise MigrationError(f"{k.id!r} is being restored after its GPU was lost; move or restore it again "
                                 f"once that is done")
        if new_ctx is not old_ctx and (not new_ctx.alive or rt.device_lost(new_ctx.index)):
            raise MigrationError(f"GPU {new_ctx.index} was lost while {k.id!r} moved there; it stays on "
                                 f"GPU {old_ctx.index}")
        _swap_residency(k, twin)
        if old_ctx is not new_ctx:
            with rt._lock:
                pairs = list(rt._contexts.values())
            for c, stepper in pairs:
                if c is new_ctx:
                    for b in stepper.batches:   # their copies of k's messages were taken on the source
                        b.cleared.add(k)
                        if b.pending is not None:
                            b.pending.discard(k)
                elif c is old_ctx:
                    for b in stepper.batches:
                        if b.pending is not None:
                            b.pending.discard(k)
                        b.cleared.add(k)
                else:
                    for b in stepper.batches:
                        b.cleared.add(k)
        for _, c in locks:
            c.cond.notify_all()
    finally:
        for _, c in reversed(locks):
            c.lock.release()
    rt._mark_dirty(k.address % rt.max_kernels)


def assign(coordinator: Any, k: Kernel, device: int, request: MigrationRequest | None) -> None:
    """Tell the coordinator where k runs now (completing `request` when there is one), once k
    swapped: a coordinator that cannot take it (the device unregistered by a loss reported
    meanwhile, whose failover then restores k from there) is logged, not raised."""
    try:
        if request is not None:
            coordinator.complete_migration(request)
        elif coordinator.get_kernel_device(k.id) != device:
            coordinator.assign_kernel(k.id, device)
    except VkmError as exc:
        log.warning("kernel %r runs on GPU %d now; its coordinator could not be told: %s", k.id, device, exc)


def drained_lost(rt: RuntimeView, device: int) -> frozenset[int]:
    """{device} when it is lost and known to have run all its submitted work (the fault
    hook's drain finished: what it wrote can be read), else an empty set."""
    if not rt.device_lost(device):
        return frozenset()
    slot = rt.manager.slot(device)
    return frozenset({device}) if getattr(slot, "lost_drained", False) else frozenset()


def source_usable(ctx: Any, rt: RuntimeView | None = None) -> bool:
    """Whether the device of `ctx` still runs (not destroyed, not lost)."""
    if not ctx.alive:
        return False
    lost = getattr(rt, "device_lost", None)
    if callable(lost) and lost(ctx.index):
        return False
    try:
        ctx.completed()
    except DeviceLostError:
        return False
    return True
