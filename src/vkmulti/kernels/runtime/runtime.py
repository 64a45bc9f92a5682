"""KernelRuntime: launches compute kernels on the devices a coordinator picks,
steps them with GPU-side ordering, and carries messages between the host and
kernels (H2K / K2H) and between kernels of one device.

"Persistent" kernels here are resident state plus a cheap relaunch per step:
Vulkan gives no forward-progress guarantee to a shader that never exits, so
a kernel is dispatched once per `step()` over its pending inbox, and its
state buffers stay on the device between steps (docs/kernels.md).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Iterable

import numpy as np

from ...errors import DestroyedError, DeviceLostError, KernelMessageError, KernelNotFoundError, MigrationError
from ...errors import TimeoutError as VkmTimeout
from ...memory.image import as_host_bytes
from ..._core.timeline import as_wait_points
from ...transfer.cross_device import TimelinePoint
from ..engine.device_context import DeviceContext
from ..lifecycle.failover import RuntimeFailover
from ..ids import KernelId, as_kernel_id
from ..engine.kernel import INLINE_STATE_BYTES, InboundBatch, Kernel, KernelSpec, OutboxBatch, check_params
from .host_io import HostIO, _count, _timeout
from .inbound import Inbound
from .ports import OutboxFeed
from ..engine.gate import gated_unheld
from ..lifecycle.lifecycle import KernelLifecycle, gated_step
from ..messages import DEFAULT_PAYLOAD_SIZE, ENVELOPE_BYTES, HOST_KERNEL_ID, HybridLogicalClock, check_payload_size
from ..engine.stepper import DeviceStepper

log = logging.getLogger(__name__)

__all__ = ["KernelRuntime", "StepTicket"]

_U32 = (1 << 32) - 1


class StepTicket:
    """What one `step()` submitted: a timeline point per device, the kernels
    that ran, those held back (with the reason) and their new outbox batches."""

    def __init__(self, runtime: "KernelRuntime", points: dict[int, TimelinePoint], launched: list[Kernel],
                 deferred: list[tuple[Kernel, str]], batches: list[OutboxBatch]):
        self._rt, self.points, self.launched, self.deferred, self.batches = runtime, points, launched, deferred, \
            batches

    def wait(self, timeout: float | None = None) -> None:
        """Block (no GIL) until every device of the step is done; vkmulti.TimeoutError after `timeout` s."""
        self._rt._wait_points(self.points.values(), _timeout(timeout))

    def done(self) -> bool:
        """True when every device's part of the step is finished (never blocks)."""
        return all(self._rt._context(p.device_index).completed() >= p.value for p in self.points.values())

    def __repr__(self) -> str:
        return (f"StepTicket(devices={sorted(self.points)}, launched={[k.id for k in self.launched]}, "
                f"deferred={[k.id for k, _ in self.deferred]})")


class KernelRuntime(HostIO, RuntimeFailover, KernelLifecycle):
    """Compute kernels on the devices of `coordinator` (a MultiGpuCoordinator
    whose devices are the slots of `manager`; by default the manager the
    coordinator was built from).

    `payload_size`: bytes of message payload per slot (a multiple of 16;
    default 256). `in_flight`: steps per device that may be submitted before
    the host must harvest the oldest (also the outbox regions per kernel).
    `max_kernels`: kernel addresses the runtime tells apart (the size of each
    kernel's per-destination sequence table). `h2k_capacity` / `k2h_capacity`:
    bounds of the host's send and receive queues per kernel.
    """

    def __init__(self, coordinator: Any, manager: Any = None, *, payload_size: int = DEFAULT_PAYLOAD_SIZE,
                 in_flight: int = 3, max_kernels: int = 1024, h2k_capacity: int = 1024,
                 k2h_capacity: int = 1024):
        for name in ("select_device", "assign_kernel", "remove_kernel"):
            if not callable(getattr(coordinator, name, None)):
                raise TypeError(f"coordinator must be a MultiGpuCoordinator (it has no {name}()), "
                                f"got {type(coordinator).__name__}")
        manager = manager if manager is not None else getattr(coordinator, "manager", None)
        if manager is None or not callable(getattr(manager, "slot", None)):
            raise TypeError("the runtime needs the MultiDeviceManager of the coordinator's devices: build the "
                            "coordinator with MultiGpuCoordinator.from_manager(mgr), or pass manager=mgr")
        self.coordinator, self.manager = coordinator, manager
        self.payload_size = check_payload_size(payload_size)
        self.slot_size = ENVELOPE_BYTES + self.payload_size
        self.in_flight = _count(in_flight, "in_flight", 2, 16)
        self.max_kernels = _count(max_kernels, "max_kernels", 2, 1 << 20)
        self.h2k_capacity = _count(h2k_capacity, "h2k_capacity", 1, 1 << 24)
        self.k2h_capacity = _count(k2h_capacity, "k2h_capacity", 1, 1 << 24)
        self.hlc = HybridLogicalClock()
        self._lock = threading.RLock()
        self._contexts: dict[int, tuple[DeviceContext, DeviceStepper]] = {}
        self._kernels: dict[str, Kernel] = {}
        self._by_index: dict[int, Kernel] = {}   # address % max_kernels -> kernel
        self._free_index = list(range(self.max_kernels - 1, 0, -1))
        self._generation = [0] * self.max_kernels
        self._exports: dict[int, bool] = {}   # device -> whether its kernels' outboxes are exported
        #: messages that could not be delivered and whose sender is gone or unknown (dead letters)
        self.dead_letters = 0
        self._destroyed = False
        self._counter = 0
        #: the router's side: step listeners, the outbox feed, batches handed in (the RuntimePort)
        self.inbound = Inbound(self, self._check, self._device, self._lock, self._contexts, self._by_index,
                               self._wait_points)
        self._init_failover()
        life = getattr(manager, "_life", None)
        if life is not None:
            life.adopt(self)   # the manager's destroy() destroys the runtime before its buffers and devices

    # -- registry -----------------------------------------------------------------------

    def _check(self) -> None:
        if self._destroyed:
            raise DestroyedError("KernelRuntime used after destroy()")

    def _context(self, index: int) -> DeviceContext:
        return self._device(index)[0]

    def _device(self, index: int) -> tuple[DeviceContext, DeviceStepper]:
        with self._lock:
            self._check()
            pair = self._contexts.get(index)
            if pair is None:
                if self.device_lost(index):
                    raise DeviceLostError(-4, "KernelRuntime", f"GPU {index} is lost: no kernel runs there any more")
                ctx = DeviceContext(self.manager.slot(index), in_flight=self.in_flight, table_size=self.max_kernels)
                ctx.dir_dirty.update(self._by_index)
                pair = self._contexts[index] = (ctx, DeviceStepper(self, ctx))
            return pair

    @property
    def kernels(self) -> list[Kernel]:
        """The live kernels, in launch order."""
        with self._lock:
            return [k for k in self._kernels.values() if k is not None]

    def kernel(self, kernel_id: KernelId | str) -> Kernel:
        """The live kernel with this id (KernelNotFoundError otherwise)."""
        kernel_id = as_kernel_id(kernel_id)
        with self._lock:
            k = self._kernels.get(kernel_id)
        if k is None:
            raise KernelNotFoundError(f"no kernel {kernel_id!r} in this runtime")
        return k

    def _resolve(self, kernel: Any, label: str = "kernel") -> Kernel:
        if isinstance(kernel, Kernel):
            if kernel.runtime is not self:
                raise ValueError(f"{label} {kernel.id!r} belongs to another KernelRuntime")
            kernel.check()
            return kernel
        if isinstance(kernel, str):
            return self.kernel(kernel)
        raise TypeError(f"{label} must be a Kernel or a kernel id (str), got {type(kernel).__name__}")

    def directory_entry(self, index: int) -> bytes:
        """The directory words of address index `index`: (address, device + 1, local slot, tenant)."""
        k = self._by_index.get(index)
        if k is None or k.destroyed:
            return bytes(16)
        return np.array([k.address, k.device_index + 1, k.local_slot, k.tenant], np.uint32).tobytes()

    def exports_outboxes(self, index: int) -> bool:
        """Whether kernels on GPU `index` get outboxes that other devices of the
        manager can import (DMABUF with at least one of them): the K2K router then
        lets those devices read the batches in place instead of copying them."""
        hit = self._exports.get(index)
        if hit is None:
            from ...transfer.peer import shares_memory

            me = self.manager.slot(index)
            hit = self._exports[index] = any(shares_memory(me, self.manager.slot(j))
                                             for j in range(self.manager.device_count) if j != index)
        return hit

    def has_router(self) -> bool:
        """Whether something moves messages to kernels on other devices (a step listener)."""
        return self.inbound.has_listeners()

    def record_dead_letters(self, text: str, n: int) -> None:
        """Count undeliverable messages whose sender cannot be told (destroyed, or an inbound batch's)."""
        with self._lock:
            self.dead_letters += n
        log.info("dead letters: %s", text)

    # -- the router's side (Inbound) ------------------------------------------------------

    @property
    def outbox_feed(self) -> OutboxFeed | None:
        """The source of messages the host routes on kernels' behalf (the K2K router), or None."""
        return self.inbound.feed

    def add_step_listener(self, listener: Callable[[list[OutboxBatch]], Any], *, retain: bool = False,
                          prepare: Callable[[list[Kernel]], Any] | None = None) -> None:
        """Call `listener(batches)` after each step with its new outbox batches (Inbound.add_step_listener)."""
        self.inbound.add_step_listener(listener, retain=retain, prepare=prepare)

    def remove_step_listener(self, listener: Callable[[list[OutboxBatch]], Any]) -> None:
        """Stop calling `listener` (a step already running still hands it its batches)."""
        self.inbound.remove_step_listener(listener)

    def set_outbox_feed(self, feed: OutboxFeed | None) -> None:
        """Install (None: remove) the K2K router as the source of host-routed messages (Inbound.set_outbox_feed)."""
        self.inbound.set_outbox_feed(feed)

    def settle_injected(self, kernel: Kernel, batch: OutboxBatch | None, taken: list, returned: list) -> None:
        """The stepper's report on host-routed messages of one step (see set_outbox_feed)."""
        self.inbound.settle_injected(kernel, batch, taken, returned)

    def accept_batch(self, device: int, buffer: Any, offset: int = 0, size: int | None = None, *,
                     wait: Any = None, source: Kernel | None = None, hops: int = 0, report_unknown: bool = True,
                     submitted: Callable[[float], Any] | None = None, reuse_sets: bool = False,
                     direct: Kernel | None = None, direct_slots: int | None = None,
                     lazy: bool = False) -> InboundBatch:
        """Hand the kernels of `device` a batch in `buffer` from `offset` (Inbound.accept_batch)."""
        return self.inbound.accept_batch(device, buffer, offset, size, wait=wait, source=source, hops=hops,
                                         report_unknown=report_unknown, submitted=submitted, reuse_sets=reuse_sets,
                                         direct=direct, direct_slots=direct_slots, lazy=lazy)

    def withdraw_batch(self, batch: InboundBatch, *, timeout: float | None = 30.0) -> int:
        """Take an accepted batch back; returns how many of its messages were not delivered."""
        return self.inbound.withdraw_batch(batch, timeout=timeout)

    def forget_buffer(self, buffer: Any) -> None:
        """Drop the descriptor sets kept for `buffer` (batches accepted with reuse_sets=True)."""
        self.inbound.forget_buffer(buffer)

    # -- launch ---------------------------------------------------------------------------

    def launch(self, spec: KernelSpec, kernel_id: str | None = None, *, device: int | None = None,
               state: Iterable[Any] | None = None, params: Iterable[int] = (), tenant: int = 0,
               options: Any = None) -> Kernel:
        """Launch `spec` on the device the coordinator selects (or `device`, pinned).

        `state`: initial bytes per state buffer (None or a shorter list: zeros).
        `params`: up to four uint32 words the kernel sees as vkm_step.params.
        `tenant`: a uint32 (0: none); messages never cross tenants.
        `options`: LaunchOptions for the coordinator's selector; its queue
        capacities bound this kernel's host queues.
        """
        self._check()
        if not isinstance(spec, KernelSpec):
            raise TypeError(f"spec must be a KernelSpec, got {type(spec).__name__}")
        params = check_params(tuple(params))
        _count(tenant, "tenant", 0, _U32)
        states = self._initial_state(spec, state)
        with self._lock:
            self._counter += 1
            if kernel_id is None:
                kernel_id = f"{spec.kernel_type}-{self._counter}"
            kernel_id = as_kernel_id(kernel_id)
            if not kernel_id:
                raise ValueError("kernel_id must not be empty")
            if kernel_id == HOST_KERNEL_ID:
                raise ValueError(f"{HOST_KERNEL_ID!r} is the host's id; choose another kernel_id")
            if kernel_id in self._kernels:
                raise ValueError(f"a kernel {kernel_id!r} is already running in this runtime")
            if not self._free_index:
                raise ValueError(f"this runtime already runs {self.max_kernels - 1} kernels (max_kernels)")
            index = self._free_index.pop()
            self._kernels[kernel_id] = None   # type: ignore[assignment]  (reserved)
        try:
            placed = self._place(kernel_id, device, options)
            try:
                k = self._create(spec, kernel_id, index, placed, states, params, tenant, options)
            except BaseException:
                self.coordinator.remove_kernel(kernel_id)
                raise
        except BaseException:
            with self._lock:
                del self._kernels[kernel_id]
                self._free_index.append(index)
            raise
        return k

    def _initial_state(self, spec: KernelSpec, state: Any) -> list[np.ndarray | None]:
        out: list[np.ndarray | None] = [None] * len(spec.state_sizes)
        if state is None:
            return out
        if isinstance(state, (bytes, bytearray, memoryview, np.ndarray)):
            state = [state]
        items = list(state)
        if len(items) > len(spec.state_sizes):
            raise ValueError(f"{len(items)} initial states for {len(spec.state_sizes)} state buffers")
        for i, data in enumerate(items):
            if data is None:
                continue
            raw = as_host_bytes(data, f"state[{i}]")
            if raw.nbytes > spec.state_sizes[i]:
                raise ValueError(f"state[{i}] holds {raw.nbytes} bytes; the state buffer has {spec.state_sizes[i]}")
            padded = np.zeros(spec.state_sizes[i], np.uint8)
            padded[:raw.nbytes] = raw
            out[i] = padded
        return out

    def _place(self, kernel_id: str, device: int | None, options: Any) -> int:
        if device is not None:
            if isinstance(device, bool) or not isinstance(device, int):
                raise TypeError(f"device must be an int or None, got {type(device).__name__}")
            if not 0 <= device < self.manager.device_count:
                raise IndexError(f"device {device} out of range: {self.manager.device_count} device(s)")
            self.coordinator.assign_kernel(kernel_id, device)
            return device
        place = getattr(self.coordinator, "place_kernel", None)
        if callable(place):
            idx = place(kernel_id, options)
        else:
            idx = self.coordinator.select_device(options)
            self.coordinator.assign_kernel(kernel_id, idx)
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < self.manager.device_count:
            self.coordinator.remove_kernel(kernel_id)
            raise ValueError(f"the coordinator chose device {idx!r}, which the manager does not have "
                             f"({self.manager.device_count} device(s))")
        return idx

    def _create(self, spec: KernelSpec, kernel_id: str, index: int, device: int, states: list,
                params: tuple, tenant: int, options: Any) -> Kernel:
        ctx, stepper = self._device(device)
        for i, n in enumerate(spec.state_sizes):
            if n > ctx.max_storage_range:
                raise ValueError(f"state buffer {i} of {spec.kernel_type!r} is {n} bytes; {ctx.slot.name!r} binds at "
                                 f"most {ctx.max_storage_range} bytes per storage buffer (maxStorageBufferRange): "
                                 f"split the state (e.g. more, smaller stencil slabs)")
        for axis, g in enumerate(spec.groups):
            top = ctx.max_group_count[axis]
            if g > top:
                raise ValueError(f"groups[{axis}] = {g} exceeds {ctx.slot.name!r}'s limit {top}")
        address = self._generation[index] * self.max_kernels + index
        if address > _U32:
            self._generation[index] = 0
            address = index
        with ctx.lock:
            ctx.check()
            k = Kernel(self, ctx, spec, kernel_id, address, tenant, params)
        h2k = getattr(options, "input_queue_capacity", None)
        k2h = getattr(options, "output_queue_capacity", None)
        if isinstance(h2k, int) and h2k > 0:
            k.h2k_capacity = h2k
        if isinstance(k2h, int) and k2h > 0:
            k.k2h_capacity = k2h
        try:
            ctx.run_once(k.init_commands(states))
            for i, data in enumerate(states):
                if data is not None and data.nbytes > INLINE_STATE_BYTES:
                    self._copy_in(ctx, k.states[i], 0, data)
        except BaseException:
            with ctx.lock:
                k.free()
            raise
        with self._lock:
            self._kernels[kernel_id] = k
            self._by_index[index] = k
        self._mark_dirty(index)
        return k

    def _mark_dirty(self, index: int) -> None:
        """Every device rewrites directory entry `index` at its next step."""
        with self._lock:
            contexts = [c for c, _ in self._contexts.values()]
        for c in contexts:
            with c.dir_lock:
                c.dir_dirty.add(index)

    # -- stepping ---------------------------------------------------------------------------

    @gated_step
    def step(self, kernels: Any = None, *, wait: Any = None, timeout: float | None = 60.0) -> StepTicket:
        """Launch one step of `kernels` (a Kernel, an id, a list of them; None: all).

        Per device, the kernels there run in one submit that signals the
        device's timeline; the returned ticket holds the points. `wait`:
        TimelinePoint(s) (e.g. a transfer's dst_ready) the GPU reaches before
        the step runs, each applied to the device it belongs to. Raises
        KernelMessageError (nothing submitted) when a kernel's earlier
        messages failed; the errors are then cleared. `timeout` bounds the
        wait for earlier steps when all in-flight slots are taken.
        """
        self._check()
        timeout = _timeout(timeout)
        self._sync_lost_devices()   # PrimaryDeviceLostError when GPU 0 is gone
        if kernels is None:
            targets = self.kernels
        elif isinstance(kernels, (Kernel, str)):
            targets = [] if self._was_lost(kernels) else [self._resolve(kernels)]
        else:
            try:
                targets = [self._resolve(k, "kernels item") for k in kernels if not self._was_lost(k)]
            except TypeError as exc:
                if "not iterable" in str(exc):
                    raise TypeError(f"kernels must be a Kernel, an id, a list of them or None, "
                                    f"got {type(kernels).__name__}") from None
                raise
        seen: set[int] = set()
        targets = [k for k in targets if not (id(k) in seen or seen.add(id(k)))]
        by_device: dict[int, list[Kernel]] = defaultdict(list)
        for k in targets:
            by_device[k.device_index].append(k)
        waits: dict[int, list[TimelinePoint]] = defaultdict(list)
        if wait is not None:
            points = [wait] if isinstance(wait, TimelinePoint) else list(wait)
            for p in points:
                if not isinstance(p, TimelinePoint):
                    raise TypeError(f"wait must be TimelinePoints, got {p!r}")
                if p.device_index not in by_device:
                    raise ValueError(f"wait point {p} is on GPU {p.device_index}, where no kernel of this step runs")
                waits[p.device_index].append(p)
        self._raise_errors(targets)
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        listeners, retain, preparers = self.inbound.step_hooks()   # retaining listeners release each batch once
        for prepare in preparers:   # e.g. the router lets go of batches other devices finished reading
            prepare(targets)
        points, launched, deferred, batches = {}, [], [], []
        stepped: dict[int, tuple[Any, Any]] = {}
        queue = sorted(by_device.items())
        while queue:
            dev, ks = queue.pop(0)
            here = [k for k in ks if not k.destroyed and k.device_index == dev]
            elsewhere: dict[int, list[Kernel]] = defaultdict(list)
            for k in ks:   # restored elsewhere by a failover since the step began
                if not k.destroyed and k.device_index != dev:
                    elsewhere[k.device_index].append(k)
            queue += sorted(elsewhere.items())
            if not here:
                continue
            ks = here
            try:
                ctx, stepper = self._device(dev)
                for src in stepper.surveys_awaited() & stepped.keys():   # done since: read them in place
                    octx, ostepper = stepped[src]
                    with octx.lock:
                        if octx.alive:
                            ostepper.harvest()
                stepped[dev] = (ctx, stepper)
                with ctx.lock:
                    point, ran, held, new = stepper.step(ks, as_wait_points(waits[dev], dev), deadline, retain)
            except DeviceLostError as exc:
                policy = self.__dict__.get("_policy")
                if policy is not None and launched:   # what survivors sent in this call is logged first
                    policy.replay.after_step(launched)
                if self._step_failed(dev, exc):   # a lost secondary: failed over, the others go on
                    moved: dict[int, list[Kernel]] = defaultdict(list)
                    for k in ks:   # restored on a survivor: they make this step there
                        if not k.destroyed and k.device_index != dev and not self.device_lost(k.device_index):
                            moved[k.device_index].append(k)
                    queue += sorted(moved.items())
                    continue
                raise
            if point is not None:
                points[dev] = point if dev not in points or point.value > points[dev].value else points[dev]
            launched += ran
            deferred += held
            batches += new
        for listener in listeners:   # also without new batches: a router may have moves waiting
            listener(batches)
        return StepTicket(self, points, launched, deferred, batches)

    def _raise_errors(self, kernels: list[Kernel]) -> None:
        for k in kernels:
            if k.errors:
                problems, k.errors = k.errors, []
                raise KernelMessageError(k.id, problems)

    def _was_lost(self, kernel: Any) -> bool:
        """Whether `kernel` (a Kernel or an id) was on a device that was lost."""
        kid = kernel.id if isinstance(kernel, Kernel) else kernel
        return isinstance(kid, str) and kid in self.lost_kernels and kid not in self._kernels

    def _wait_points(self, points: Iterable[TimelinePoint], timeout: float | None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        lost = self._sync_lost_devices()
        for p in points:
            if p.device_index in lost:
                continue   # the work of a lost device never completes; its kernels were failed over
            try:
                self._wait_point(p, deadline, timeout)
            except DeviceLostError as exc:
                if not self._step_failed(p.device_index, exc):
                    raise

    def _wait_point(self, p: TimelinePoint, deadline: float, timeout: float | None) -> None:
        ctx, stepper = self._device(p.device_index)
        with ctx.lock:
            while True:
                stepper.harvest()
                ctx.check()
                if ctx.completed() >= p.value:
                    stepper.harvest()
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise VkmTimeout(f"GPU {p.device_index}: kernel step {p.value} not done within {timeout} s")
                try:
                    ctx.wait_unlocked(p.value, min(left, 0.25))
                except VkmTimeout:
                    pass

    def synchronize(self, timeout: float | None = 60.0) -> None:
        """Wait until every submitted step on every device is done and harvested, and
        the checkpoint policy's captures of those steps are complete."""
        with self._lock:
            pairs = list(self._contexts.values())
        timeout = _timeout(timeout)
        self._wait_points([c.point(c.value) for c, _ in pairs if c.value], timeout)
        policy = self.__dict__.get("_policy")
        if policy is not None:
            policy.materialize(wait=True, timeout=timeout)

    def poll(self) -> None:
        """Harvest every step that has completed, on every device, without waiting
        (delivery results, host messages, batch surveys become visible)."""
        with self._lock:
            pairs = list(self._contexts.values())
        for ctx, stepper in pairs:
            with ctx.lock:
                if ctx.alive:
                    stepper.harvest()

    # -- teardown ------------------------------------------------------------------------------

    @gated_unheld
    def destroy_kernel(self, kernel: Any, *, timeout: float = 30.0) -> None:
        """Stop and free `kernel` (idempotent for a Kernel). Steps already submitted
        finish first; its undelivered outgoing messages and unread host messages
        are dropped (and counted in its stats); later calls on it raise DestroyedError."""
        if isinstance(kernel, Kernel):
            if kernel.runtime is not self:
                raise ValueError(f"kernel {kernel.id!r} belongs to another KernelRuntime")
            k = kernel
        else:
            k = self._resolve(kernel)
        timeout = _timeout(timeout)
        ctx = k.ctx
        with ctx.lock:
            if k.destroyed:
                return
            k.destroyed = True
            stepper = self._device(k.device_index)[1]
            with self._lock:
                self._kernels.pop(k.id, None)
                self._by_index.pop(k.address % self.max_kernels, None)
            self._mark_dirty(k.address % self.max_kernels)
            for b in list(stepper.batches):
                if b.source is k:
                    stepper.batches.remove(b)
                    b.done = True
                    b.event.set()
                elif b.pending is not None:
                    b.pending.discard(k)
            for other in ctx.local:
                if other is not None and other is not k:
                    key = next((key for key in other.deliver_sets if key[0] == k.outbox.handle_int), None)
                    if key is not None:
                        stepper.retired.append((k.last_value, other.deliver_sets.pop(key)))
            ctx.cond.notify_all()
        self.inbound.drop_in_place(k, timeout)   # no device lock held: other devices' locks are taken one at a time
        with ctx.lock:
            try:
                while ctx.completed() < k.last_value:
                    ctx.wait_unlocked(k.last_value, timeout)
            finally:
                stepper.harvest()
            k.free()   # copies still reading the outbox (a router's transfer or gather) are waited for by Buffer.destroy
        self.coordinator.remove_kernel(k.id)
        with self._lock:
            index = k.address % self.max_kernels
            self._generation[index] += 1
            self._free_index.append(index)

    #: The manager's destroy() destroys the runtime first: its kernels and
    #: device contexts own buffers, pipelines and pools on the manager's devices.
    _teardown_rank = 3

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Destroy every kernel, then the per-device objects (idempotent; also run by the
        manager's destroy(), before it frees buffers or devices). None: no time limit."""
        timeout = float("inf") if timeout is None else timeout
        with self._lock:
            if self._destroyed:
                return
        from ..engine.gate import gate_of

        with contextlib.ExitStack() as stack:
            try:   # steps of other threads (a failover among them) end first; later ones find it destroyed
                stack.enter_context(gate_of(self).exclusive(None if timeout == float("inf") else timeout,
                                                            "KernelRuntime.destroy()"))
            except (VkmTimeout, MigrationError) as exc:   # (a step that does not end, or one on this thread)
                log.warning("KernelRuntime.destroy(): going on without the steps' gate: %s", exc)
            self._destroy_now(timeout)

    def _destroy_now(self, timeout: float) -> None:
        self._sync_lost_devices(teardown=True)   # kernels of lost devices go without waits
        with self._lock:
            kernels = list(self._kernels.values())
        for k in kernels:
            if k is not None:
                self.destroy_kernel(k, timeout=timeout)
        self._lifecycle_destroy(timeout)
        with self._lock:
            self._destroyed = True
            pairs = list(self._contexts.values())
            self._contexts.clear()
        for ctx, stepper in pairs:
            with ctx.lock:
                stepper.harvest()
                for _, s in stepper.retired:
                    ctx.free_set(s)
                stepper.retired = []
            ctx.destroy(timeout)
        life = getattr(self.manager, "_life", None)
        if life is not None:
            life.forget(self)

    def __enter__(self) -> "KernelRuntime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return (f"KernelRuntime(devices={sorted(self._contexts)}, kernels={len(self._kernels)}, "
                f"payload_size={self.payload_size})")
