"""KernelRuntime: launches compute kernels on the devices a coordinator picks, steps them with GPU-side
ordering, and carries messages between the host and kernels (H2K / K2H) and between kernels of one device.

"Persistent" kernels here are resident state plus a cheap relaunch per step: Vulkan gives no forward-progress
guarantee to a shader that never exits, so a kernel is dispatched once per `step()` over its pending inbox,
and its state buffers stay on the device between steps (docs/explanation/kernels.md).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np

from ..._core.checks import U32_MAX, int_in, seconds_text, timeout_seconds, wait_bound, short_repr
from ...errors import DestroyedError, DeviceLostError, KernelNotFoundError, MigrationError, TimeoutError as VkmTimeout
from ..._core.lifetime import Deadline
from ..._core.timeline import TimelinePoint
from ...transfer.peer import shares_memory
from ..checkpoint.format import Checkpoint
from ..coordinator.records import MigrationRequest
from ..engine.device_context import DeviceContext
from ..engine.gate import KernelHolds, RuntimeGate, gate_of, gated, gated_unheld
from ..engine.kernel import INLINE_STATE_BYTES, InboundBatch, Kernel, OutboxBatch, check_params
from ..engine.spec import KernelSpec
from ..engine.stepper import DeviceStepper
from ..ids import KernelId, as_kernel_id
from ...device.failover import FailoverStats
from ..lifecycle.failover import Failover
from .placement import Launches, init_buffers
from ..lifecycle.lifecycle import CheckpointPolicy, Lifecycle, check_choice
from ..lifecycle.ready_twins import ReadyTwins
from ..lifecycle.migrator import MigrationResult
from ..lifecycle.replay import restore_lost_kernels
from ..lifecycle.twin import drop_imports
from ..messages import DEFAULT_PAYLOAD_SIZE, ENVELOPE_BYTES, HOST_KERNEL_ID, HybridLogicalClock, K2KMessage
from ..messages import check_payload_size
from ..reload.swap import apply_code
from .host_io import HostQueues
from .inbound import Inbound
from .ports import OutboxFeed
from .placement import check_fits, device_pair, initial_state, place
from .stepping import RunTicket, StepTicket, Stepping

if TYPE_CHECKING:
    from .ports import (Buffer, HostData, KernelCodeSource, KernelRef, LaunchOptions, MultiDeviceManager, NDArray,
                        MultiGpuCoordinator, Points, Prebuilder)

log = logging.getLogger(__name__)

__all__ = ["KernelRuntime", "RunTicket", "StepTicket"]


class KernelRuntime:
    """Compute kernels on the devices of `coordinator` (a MultiGpuCoordinator whose devices are the
    slots of `manager`; by default the manager the coordinator was built from).

    `payload_size`: bytes of message payload per slot (a multiple of 16; default 256). `in_flight`: steps per
    device that may be submitted before the host must harvest the oldest (also the outbox regions per kernel).
    `max_kernels`: kernel addresses the runtime tells apart (the size of each kernel's per-destination sequence
    table). `h2k_capacity` / `k2h_capacity`: bounds of the host's send and receive queues per kernel.
    """

    def __init__(self, coordinator: MultiGpuCoordinator, manager: MultiDeviceManager | None = None, *,
                 payload_size: int = DEFAULT_PAYLOAD_SIZE, in_flight: int = 3, max_kernels: int = 1024,
                 h2k_capacity: int = 1024, k2h_capacity: int = 1024):
        for name in ("select_device", "assign_kernel", "remove_kernel"):
            if not callable(getattr(coordinator, name, None)):
                raise TypeError(f"coordinator must be a MultiGpuCoordinator (it has no {name}()), "
                                f"got {type(coordinator).__name__}")
        manager = manager if manager is not None else getattr(coordinator, "manager", None)
        if manager is None or not callable(getattr(manager, "slot", None)):
            raise TypeError("the runtime needs the MultiDeviceManager of the coordinator's devices: build the "
                            "coordinator with MultiGpuCoordinator.from_manager(mgr), or pass manager=mgr")
        self.coordinator, self.manager, self.payload_size = coordinator, manager, check_payload_size(payload_size)
        self.slot_size = ENVELOPE_BYTES + self.payload_size
        self.in_flight = int_in(in_flight, "in_flight", 2, 16)
        self.max_kernels = int_in(max_kernels, "max_kernels", 2, 1 << 20)
        self.h2k_capacity = int_in(h2k_capacity, "h2k_capacity", 1, 1 << 24)
        self.k2h_capacity = int_in(k2h_capacity, "k2h_capacity", 1, 1 << 24)
        self.hlc = HybridLogicalClock()
        self._lock = threading.RLock()
        self.gate = RuntimeGate()   # steps pass it shared; a migration's switch or a reload's swap exclusively
        self._contexts: dict[int, tuple[DeviceContext, DeviceStepper]] = {}
        self._kernels: dict[str, Kernel] = {}
        self._by_index: dict[int, Kernel] = {}   # address % max_kernels -> kernel
        self._free_index = list(range(self.max_kernels - 1, 0, -1))
        self._generation = [0] * self.max_kernels
        self._exports: dict[int, bool] = {}   # device -> whether its kernels' outboxes are exported
        #: messages that could not be delivered and whose sender is gone or unknown (dead letters)
        self.dead_letters = 0
        self._destroyed, self._torn_down, self._counter = False, False, 0   # destroy() began, finished
        self._stopped: list[Kernel] = []   # destroyed by destroy_kernel, not yet freed (a timeout, Ctrl-C)
        self._closing: list[tuple[DeviceContext, DeviceStepper]] = []   # contexts destroy() has yet to free
        self._launches = Launches(self._lock)   # destroy() lists the kernels once none is under way
        #: the router's side: step listeners, the outbox feed, batches handed in (the RuntimePort)
        self.inbound = Inbound(self, self._check, self._device, self._lock, self._contexts, self._by_index,
                               self._wait_points)
        self._host = HostQueues(self._resolve, self._device, self.payload_size, self.hlc)
        self._lifecycle = Lifecycle(self, lambda: self.migration_pool_bytes)  # type: ignore[arg-type]
        self._failover = Failover(manager, coordinator, self._lock, self._kernels, self._contexts,
                                  self.inbound.device_lost, self._unregister, self._release_address,
                                  functools.partial(restore_lost_kernels, self._lifecycle), self._lifecycle.turn)
        self._steps = Stepping(self._check, self._resolve, lambda: self.kernels, self._kernels, self._device,
                               self._lock, self.inbound.step_hooks, self._failover, self._lifecycle,
                               self.inbound.listeners_quiet)
        if (life := getattr(manager, "_life", None)) is not None:
            life.adopt(self)   # the manager's destroy() destroys the runtime before its buffers and devices

    # -- registry -----------------------------------------------------------------------
    def _check(self) -> None:
        if self._destroyed:
            raise DestroyedError("KernelRuntime used after destroy()")

    def _context(self, index: int) -> DeviceContext:
        return self._device(index)[0]

    def _device(self, index: int, timeout: float | None = 60.0) -> tuple[DeviceContext, DeviceStepper]:
        pair = self._contexts.get(index)   # (a made pair, without the lock: destroy() and a failover take
        if pair is not None and not self._destroyed:   # pairs out under it, destroy() once _destroyed is set)
            return pair
        return device_pair(self, index, timeout)

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
            raise KernelNotFoundError(f"no kernel {short_repr(kernel_id)} in this runtime")
        return k

    def _resolve(self, kernel: KernelRef, label: str = "kernel") -> Kernel:
        if isinstance(kernel, Kernel):
            if kernel.runtime is not self:
                raise ValueError(f"{label} {short_repr(kernel.id)} belongs to another KernelRuntime")
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
        """Whether kernels on GPU `index` get outboxes other devices of the manager can import (DMABUF
        with at least one of them): the K2K router then lets those devices read the batches in place."""
        hit = self._exports.get(index)
        if hit is None:
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

    def add_step_listener(self, listener: Callable[[list[OutboxBatch]], object], *, retain: bool = False,
                          prepare: Callable[[list[Kernel], float | None], object] | None = None,
                          quiet: Callable[[list[Kernel]], bool] | None = None) -> None:
        """Call `listener(batches)` after each step with its new outbox batches (Inbound.add_step_listener)."""
        self.inbound.add_step_listener(listener, retain=retain, prepare=prepare, quiet=quiet)

    def remove_step_listener(self, listener: Callable[[list[OutboxBatch]], object]) -> None:
        """Stop calling `listener` (a step already running still hands it its batches)."""
        self.inbound.remove_step_listener(listener)

    def set_outbox_feed(self, feed: OutboxFeed | None) -> None:
        """Install (None: remove) the K2K router as the source of host-routed messages (Inbound.set_outbox_feed)."""
        self.inbound.set_outbox_feed(feed)

    def settle_injected(self, kernel: Kernel, batch: OutboxBatch | None, taken: list[Any], returned: list[Any]) -> None:
        """The stepper's report on host-routed messages of one step (see set_outbox_feed)."""
        self.inbound.settle_injected(kernel, batch, taken, returned)

    def accept_batch(self, device: int, buffer: Buffer, offset: int = 0, size: int | None = None, *,
                     wait: Points = None, source: Kernel | None = None, hops: int = 0, report_unknown: bool = True,
                     submitted: Callable[[float], object] | None = None, reuse_sets: bool = False,
                     direct: Kernel | None = None, direct_slots: int | None = None, lazy: bool = False) -> InboundBatch:
        """Hand the kernels of `device` a batch in `buffer` from `offset` (Inbound.accept_batch)."""
        return self.inbound.accept_batch(device, buffer, offset, size, wait=wait, source=source, hops=hops,
                                         report_unknown=report_unknown, submitted=submitted, reuse_sets=reuse_sets,
                                         direct=direct, direct_slots=direct_slots, lazy=lazy)

    def withdraw_batch(self, batch: InboundBatch, *, timeout: float | None = 30.0) -> int:
        """Take an accepted batch back; returns how many of its messages were not delivered."""
        return self.inbound.withdraw_batch(batch, timeout=timeout)

    def forget_buffer(self, buffer: Buffer) -> None:
        """Drop the descriptor sets kept for `buffer` (batches accepted with reuse_sets=True)."""
        self.inbound.forget_buffer(buffer)

    # -- launch ---------------------------------------------------------------------------

    def launch(self, spec: KernelSpec, kernel_id: str | None = None, *, device: int | None = None,
               state: HostData | Iterable[HostData | None] | None = None, params: Iterable[int] = (),
               tenant: int = 0, options: LaunchOptions | None = None, timeout: float | None = 60.0) -> Kernel:
        """Launch `spec` on the device the coordinator selects (or `device`, pinned).

        `state`: initial bytes per state buffer (None or a shorter list: zeros).
        `params`: up to four uint32 words the kernel sees as vkm_step.params.
        `tenant`: a uint32 (0: none); messages never cross tenants.
        `options`: LaunchOptions for the coordinator's selector; its queue
        capacities bound this kernel's host queues.
        `timeout`: seconds the kernel's initialisation on its device may take (it
        runs after the work already queued there); vkmulti.TimeoutError after it,
        and nothing is launched.
        """
        self._check()
        if not isinstance(spec, KernelSpec):
            raise TypeError(f"spec must be a KernelSpec, got {type(spec).__name__}")
        params = check_params(tuple(params))
        int_in(tenant, "tenant", 0, U32_MAX)
        deadline = Deadline(timeout_seconds(timeout))   # (the device's set-up, the pipeline, the initialisation)
        states = initial_state(spec, state)
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
                raise ValueError(f"a kernel {short_repr(kernel_id)} is already running in this runtime")
            if not self._free_index:
                raise ValueError(f"this runtime already runs {self.max_kernels - 1} kernels (max_kernels)")
            self._launches.begin()
            index = self._free_index.pop()
            self._kernels[kernel_id] = None   # type: ignore[assignment]  # (reserved)
        try:
            placed = place(self.coordinator, self.manager.device_count, kernel_id, device, options)
            try:
                k = self._create(spec, kernel_id, index, placed, states, params, tenant, options, deadline)
            except BaseException:
                self.coordinator.remove_kernel(kernel_id)
                raise
        except BaseException:
            with self._lock:
                del self._kernels[kernel_id]
                self._free_index.append(index)
            raise
        finally:
            self._launches.end()
        return k

    def _create(self, spec: KernelSpec, kernel_id: str, index: int, device: int, states: list,
                params: tuple, tenant: int, options: Any, deadline: Deadline) -> Kernel:
        ctx, _ = self._device(device, deadline.left())
        check_fits(ctx, spec, deadline.left())
        # its pipeline built (or another thread's build waited for) within the deadline; the Kernel holds it
        ctx.kernel_pass(spec.spirv, spec.entry_point, len(spec.state_sizes), timeout=deadline.left())
        address = self._generation[index] * self.max_kernels + index
        if address > U32_MAX:
            self._generation[index] = 0
            address = index
        with ctx.lock:
            ctx.check()
            k = Kernel(self, ctx, spec, kernel_id, address, tenant, params)
        for option, field in (("input_queue_capacity", "h2k_capacity"), ("output_queue_capacity", "k2h_capacity")):
            cap = getattr(options, option, None)
            if isinstance(cap, int) and cap > 0:
                setattr(k, field, cap)
        init_buffers(ctx, k, states, deadline)
        with self._lock:
            self._kernels[kernel_id] = k
            self._by_index[index] = k
        self._mark_dirty(index)
        self._lifecycle.launched(k)
        return k

    def _mark_dirty(self, index: int) -> None:
        """Every device rewrites directory entry `index` at its next step."""
        with self._lock:
            contexts = [c for c, _ in self._contexts.values()]
        for c in contexts:
            with c.dir_lock:
                c.dir_dirty.add(index)

    # -- stepping ---------------------------------------------------------------------------

    def step(self, kernels: KernelRef | Iterable[KernelRef] | None = None, *, wait: Points = None,
             timeout: float | None = 60.0) -> StepTicket:
        """Launch one step of `kernels` (a Kernel, an id, a list of them; None: all).

        Per device, the kernels there run in one submit that signals the
        device's timeline; the returned ticket holds the points. `wait`:
        TimelinePoint(s) (e.g. a transfer's dst_ready) the GPU reaches before
        the step runs, each applied to the device it belongs to. Raises
        KernelMessageError (nothing submitted) when a kernel's earlier
        messages failed; the errors are then cleared. `timeout` bounds the
        wait for earlier steps when all in-flight slots are taken.
        """
        return self._lifecycle.gated_step(self._steps.step, kernels, wait, timeout)

    def run(self, steps: int, kernels: KernelRef | Iterable[KernelRef] | None = None, *,
            timeout: float | None = 60.0) -> RunTicket:
        """`steps` steps of `kernels` (read and checked once, at the start), each as `step()` (migrations and
        reloads swap between two), one ticket; an error or Ctrl-C stops it between two steps, those run stand."""
        return self._steps.run(self._lifecycle.gated_step, steps, kernels, timeout)

    def _wait_points(self, points: Iterable[TimelinePoint], timeout: float | None) -> None:
        self._steps.wait_points(points, timeout)

    def _wait_point(self, p: TimelinePoint, deadline: float, timeout: float | None) -> None:
        self._steps.wait_point(p, deadline, timeout)

    def synchronize(self, timeout: float | None = 60.0) -> None:
        """Wait until every submitted step on every device is done and harvested (and their captures)."""
        with self._lock:
            pairs = list(self._contexts.values())
        deadline = Deadline(timeout_seconds(timeout))
        self._wait_points([c.point(c.value) for c, _ in pairs if c.value], deadline.left())
        policy = self._lifecycle.policy_state
        if policy is not None:
            policy.materialize(wait=True, timeout=deadline.left())

    def poll(self) -> None:
        """Harvest every completed step on every device, without waiting (results become visible)."""
        with self._lock:
            pairs = list(self._contexts.values())
        self._steps.poll(pairs)

    # -- host <-> kernel (HostQueues) ------------------------------------------------------

    def send(self, kernel: KernelRef, payload: HostData | K2KMessage, *, tag: int = 0, priority: int = 0,
             timeout: float | None = 0.0) -> K2KMessage:
        """Queue a message from the host to `kernel` (delivered at its next step).

        `payload`: bytes, a buffer-protocol object or a K2KMessage (its payload,
        tag and priority are used) of at most payload_size bytes. A full queue
        (h2k_capacity) raises QueueFullError, after waiting up to `timeout` s
        for a step to make room. Returns the message as sent.
        """
        return self._host.send(kernel, payload, tag=tag, priority=priority, timeout=timeout)

    def receive(self, kernel: KernelRef, timeout: float | None = None) -> K2KMessage:
        """The next message `kernel` sent to the host (FIFO). Blocks until one arrives from a submitted
        step; vkmulti.TimeoutError after `timeout` s (None: no limit; the wait is interruptible)."""
        return self._host.receive(kernel, timeout)

    def pending_receives(self, kernel: KernelRef) -> int:
        """Messages from `kernel` waiting in the host receive queue (harvested so far)."""
        return self._host.pending_receives(kernel)

    @gated
    def read_state(self, kernel: KernelRef, index: int = 0, *, offset: int = 0, size: int | None = None,
                   timeout: float | None = 60.0) -> NDArray[np.uint8]:
        """State buffer `index` of `kernel` (uint8) as of its latest submitted step; `offset` and
        `size` (default: to the end) read a byte range of it."""
        return self._host.read_state(kernel, index, offset=offset, size=size, timeout=timeout)

    @gated_unheld
    def write_state(self, kernel: KernelRef, index: int, data: HostData, *, offset: int = 0,
                    timeout: float | None = 60.0) -> None:
        """Overwrite bytes of state buffer `index` (after every submitted step, before later ones)."""
        self._host.write_state(kernel, index, data, offset=offset, timeout=timeout)

    # -- lost devices (Failover) -------------------------------------------------------------

    def device_lost(self, index: int) -> bool:
        """Whether device `index` is lost (the manager's view)."""
        return self._failover.device_lost(index)

    @property
    def failover_stats(self) -> FailoverStats:
        """What lost devices cost this runtime (devices, times)."""
        return self._failover.stats

    @property
    def lost_kernels(self) -> dict[str, int]:
        """Kernels that were on a lost device and could not be restored: id -> that device."""
        return self._failover.lost_kernels

    @property
    def restored_kernels(self) -> dict[str, tuple[int, int]]:
        """Kernels of a lost device restored from their checkpoints: id -> (lost device, new device)."""
        return self._failover.restored_kernels

    # -- checkpoints, restore, migration (Lifecycle) -------------------------------------------

    #: Bytes of buffers per device that migrations keep for kernels moving onto that device later (MigrationPool)
    migration_pool_bytes = 512 << 20

    @property
    def migration_crc(self) -> str:
        """The engine checking a live migration's CRC32s: "auto" (zlib on a CPU device whose memory is all
        host-visible, e.g. lavapipe; else the GPU shader), "shader" or "host" (UnsupportedError on a GPU)."""
        return self._lifecycle.crc_choice

    @migration_crc.setter
    def migration_crc(self, choice: str) -> None:
        self._lifecycle.crc_choice = check_choice(choice)

    def is_held(self, kernel: KernelRef) -> bool:
        """Whether `kernel` is held back from stepping (being migrated or reloaded)."""
        return self._lifecycle.is_held(self._resolve(kernel))

    @property
    def prebuild(self) -> Prebuilder:
        """The Prebuilder of the kernels' pipelines (its `devices`: where; engine/prebuild.py)."""
        return self._lifecycle.prebuild

    @property
    def ready_twins(self) -> ReadyTwins:
        """The kernels' twins made ahead (lifecycle/ready_twins.py)."""
        return self._lifecycle.twins

    @property
    def holds(self) -> KernelHolds:
        """The holds that keep kernels from stepping while they move or reload."""
        return self._lifecycle

    def release_migration_buffers(self) -> None:
        """Free the buffers migrations kept for later moves (see migration_pool_bytes)."""
        self._lifecycle.pool.clear()

    @gated
    def checkpoint(self, kernel: KernelRef, *, timeout: float | None = 60.0) -> Checkpoint:
        """A Checkpoint of `kernel` after its submitted steps (see lifecycle/lifecycle.py)."""
        return self._lifecycle.checkpoint(kernel, timeout)

    def set_checkpoint_policy(self, policy: CheckpointPolicy | None) -> None:
        """Install (None: remove) the policy by which the runtime checkpoints its kernels."""
        self._lifecycle.set_policy(policy)

    @property
    def checkpoint_policy(self) -> CheckpointPolicy | None:
        """The installed CheckpointPolicy, or None."""
        st = self._lifecycle.policy_state
        return None if st is None else st.policy

    def latest_checkpoint(self, kernel: KernelRef) -> Checkpoint | None:
        """The newest completed policy checkpoint of a kernel (a Kernel or its id;
        also one destroyed or lost since), None if there is none."""
        return self._lifecycle.latest_checkpoint(kernel)

    def restore(self, checkpoint: Checkpoint, *, device: int | None = None, kernel_id: str | None = None,
                into: Kernel | None = None, timeout: float | None = 60.0) -> Kernel:
        """Bring a checkpoint back as a new kernel, or into an existing one (see
        lifecycle/lifecycle.py)."""
        return self._lifecycle.restore(checkpoint, device, kernel_id, into, timeout)

    def migrate(self, kernel: KernelRef, device: int, *, timeout: float | None = 60.0,
                verify: bool = True) -> MigrationResult:
        """Live-migrate `kernel` to `device` (a MigrationResult; see KernelMigrator)."""
        return self._lifecycle.migrate(kernel, device, timeout, verify)

    def _migrate_live(self, kernel: Kernel, request: MigrationRequest, *, timeout: float | None,
                      verify: bool) -> MigrationResult:
        return self._lifecycle.migrate_live(kernel, request, timeout, verify)

    def apply_code(self, kernel: Kernel, code: KernelCodeSource, timeout: float | None) -> None:
        """Swap `code` into `kernel` as a hot reload does (Kernel.apply_code's CodeSwapper)."""
        apply_code(self._resolve(kernel), code, timeout)

    # -- teardown ------------------------------------------------------------------------------

    @gated_unheld
    def destroy_kernel(self, kernel: KernelRef, *, timeout: float | None = 30.0) -> None:
        """Stop and free `kernel` (idempotent for a Kernel). Steps already submitted
        finish first; its undelivered outgoing messages and unread host messages
        are dropped (and counted in its stats); later calls on it raise DestroyedError.
        After a vkmulti.TimeoutError or Ctrl-C it is stopped; call it again to free it."""
        if isinstance(kernel, Kernel):
            if kernel.runtime is not self:
                raise ValueError(f"kernel {short_repr(kernel.id)} belongs to another KernelRuntime")
            k = kernel
        else:
            k = self._resolve(kernel)
        deadline = Deadline(timeout_seconds(timeout))   # (one for the readers, the steps and the buffers)
        ctx = k.ctx
        if not self._contexts.get(k.device_index) and self.device_lost(k.device_index):
            return self._failover.free_stopped(k, self._stopped)   # (lost meanwhile: nothing to wait for)
        with ctx.lock:
            if k.destroyed and not k.buffers:   # (one that a timeout or Ctrl-C left unfreed is freed here)
                return
            stepper = self._device(k.device_index)[1]
            if not k.destroyed:
                k.destroyed = True
                self._unregister(k)
                self._mark_dirty(k.address % self.max_kernels)
                stepper.drop(k)
                with self._lock:
                    self._stopped.append(k)
        drop_imports(k, deadline.left())   # (no device lock held: other devices' locks are taken one at a time)
        with ctx.lock:
            try:
                while ctx.completed() < k.last_value:
                    ctx.wait_unlocked(k.last_value, deadline.left())
            except VkmTimeout:
                raise VkmTimeout(f"kernel {short_repr(str(k.id))} on GPU {k.device_index}: its submitted steps did "
                                 f"not finish within {seconds_text(timeout)} s; it is stopped, not freed (a later "
                                 f"destroy_kernel() or destroy() frees it)") from None
            finally:
                stepper.harvest()
            if not k.buffers:   # (another call freed it meanwhile)
                return
            # copies still reading the outbox (a router's transfer or gather) are waited for by Buffer.destroy
            k.free(deadline)
            with self._lock:
                self._stopped.remove(k)
        self._release_address(k)

    def _unregister(self, k: Kernel) -> None:
        """Take `k` out of the registries (no step finds it from here)."""
        with self._lock:
            self._kernels.pop(k.id, None)
            self._by_index.pop(k.address % self.max_kernels, None)

    def _release_address(self, k: Kernel) -> None:
        """After _unregister and k.free(): the coordinator forgets k, its address
        index is rewritten on every device and can be given to a new kernel."""
        index = k.address % self.max_kernels
        self._mark_dirty(index)
        self.coordinator.remove_kernel(k.id)
        with self._lock:
            self._generation[index] += 1
            self._free_index.append(index)

    #: The manager's destroy() destroys it before buffers and devices: its kernels and contexts own objects there.
    _teardown_rank = 3

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Destroy every kernel, then the per-device objects (idempotent; also run by the
        manager's destroy(), before it frees buffers or devices). None: no time limit. After
        a vkmulti.TimeoutError or Ctrl-C, call it again to free what is left."""
        timeout = float("inf") if (t := wait_bound(timeout_seconds(timeout))) is None else t
        with self._lock:
            if self._torn_down:
                return
        self.inbound.close(None if timeout == float("inf") else timeout)   # (the router first, as the manager's)
        with contextlib.ExitStack() as stack:
            try:   # steps of other threads (a failover among them) end first; later ones find it destroyed
                stack.enter_context(gate_of(self).exclusive(None if timeout == float("inf") else timeout,
                                                            "KernelRuntime.destroy()", closing=True))
            except (VkmTimeout, MigrationError) as exc:   # (a step that does not end, or one on this thread)
                log.warning("KernelRuntime.destroy(): going on without the steps' gate: %s", exc)
            self._destroy_now(timeout)

    def _destroy_now(self, timeout: float) -> None:
        self._failover.sync_lost_devices(teardown=True)   # kernels of lost devices go without waits
        self._launches.close(None if timeout == float("inf") else timeout)
        with self._lock:   # (those a destroy_kernel that gave up left stopped too)
            kernels = [k for k in self._kernels.values() if k is not None] + self._stopped
        for k in kernels:
            self.destroy_kernel(k, timeout=timeout)
        self._lifecycle.destroy(timeout)
        with self._lock:
            self._destroyed = True
            self._closing += self._contexts.values()   # (a destroy() that gave up may leave some: freed now)
            self._contexts.clear()
        while self._closing:
            self._closing[0][1].close(timeout)
            self._closing.pop(0)
        self._torn_down = True
        self._failover.release()   # the contexts of lost devices, kept since their failover
        if (life := getattr(self.manager, "_life", None)) is not None:
            life.forget(self)

    def __enter__(self) -> "KernelRuntime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        state = ", destroyed" if self._destroyed else ""
        return (f"KernelRuntime(devices={sorted(self._contexts)}, kernels={len(self._kernels)}, "
                f"payload_size={self.payload_size}{state})")
