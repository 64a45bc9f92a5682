"""Compute kernels: `Kernel` (one launched from a KernelSpec on a device, with
its resident state, inbox, outbox and host queues, and the seed's kernel
traits: CheckpointableKernel, MigratableKernel and HotReloadableKernel through
its runtime) and the message batches the runtime and the router move between
them.

Memory of a kernel (all on its device; sizes in docs/reference/kernels.md):
  inbox    device-local ring: 16-word header (head, tail, capacity, slot words) + slots
  outbox   device-local, one region per in-flight step: 16-word header (count, step,
           capacity, slot words) + slots; a region is a *batch* the router can copy as is.
           Where another device of the manager shares memory with this one (DMABUF) it is
           exported, and the router lets that device read its batches in place
  control  device-local, runtime-owned: address, tenant, step, HLC, per-destination sequence table
  state    device-local buffers the kernel owns, kept between steps
  h2k/k2h  host-visible regions per in-flight step: host messages in, host messages out
"""
from __future__ import annotations

import operator
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence

import numpy as np
import vulkan as vk

from ..._core.checks import U32_MAX, int_in, short_repr, short_str, timeout_seconds
from ..._core.lifetime import Deadline, LazyEvent
from ..._core.timeline import TimelinePoint
from ...errors import DestroyedError, DeviceLostError
from ...memory.image import Buffer
from ...transfer.peer import ExportedBuffer
from ..checkpoint.format import Checkpoint
from ..messages import ENVELOPE_BYTES, RING_HEADER_BYTES
from ...memory.buffer import MappedBuffer
from .device_context import KERNEL_PUSH, DeviceContext, align, WHOLE_SIZE, barrier
from .spec import KernelSpec
from .stats import KernelStats
from .step_ops import KernelOps
from .spirv_gate import target_env_of, validate_kernel_spirv

if TYPE_CHECKING:
    from .device_context import ComputePass
    from .gate import KernelHolds
    from ..._core.vktypes import VkCommandBuffer, VkDescriptorPool, VkDescriptorSet

__all__ = ["Kernel", "Residency", "Batch", "OutboxBatch", "InboundBatch", "CodeSwapper",
           "check_params", "check_kernel_code", "finish_buffers", "INLINE_STATE_BYTES"]

#: Initial state up to this size is written inside the launch's command buffer; larger goes through staging.
INLINE_STATE_BYTES = 1 << 20
_MIGRATION = "prepared for migration"
_RELOAD = "prepared for reload"


def finish_buffers(ctx: DeviceContext, k: "Kernel", inbox: tuple[Any, int, int]) -> list[tuple[Any, int, int]]:
    """The buffers of k's finish pass (kernel_finish.comp), `inbox` its inbox binding (the
    kernel's ring, or a batch its step reads in place): control, inbox, outbox and K2H
    regions, and the directory and status ring of the outbox's survey."""
    return [(k.control.handle, 0, WHOLE_SIZE), inbox, (k.outbox.handle, 0, k.outbox_bytes),
            (k.k2h.handle, 0, k.outbox_bytes), (ctx.directory.handle, 0, WHOLE_SIZE),
            (ctx.status.handle, 0, WHOLE_SIZE)]


def check_kernel_code(ctx: DeviceContext, spec: KernelSpec, timeout: float | None = None) -> None:
    """The SPIR-V gate for `spec`'s module on the device of `ctx` (spirv_gate.py):
    KernelValidationError before a driver sees a module that is not valid SPIR-V
    for that device or not a kernel of the ABI; remembered per module."""
    validate_kernel_spirv(spec.spirv, spec.entry_point, len(spec.state_sizes), KERNEL_PUSH, target_env_of(ctx.slot),
                          timeout=timeout, label=f"the SPIR-V of kernel type {short_repr(spec.kernel_type)}")


class SpirvCode(Protocol):
    """New code for a kernel (a SPIR-V KernelCodeSource: its words and entry point)."""

    @property
    def code(self) -> bytes: ...
    @property
    def entry_point(self) -> str: ...


class CodeSwapper(Protocol):
    """What Kernel.apply_code asks of the kernel's runtime: check new code, build it
    on the kernel's device and swap it in at a step boundary, state kept."""

    def apply_code(self, kernel: "Kernel", code: Any, timeout: float | None) -> None:
        """Run `code` (a SPIR-V KernelCodeSource, checked there) on `kernel` from its next step on."""


class KernelHost(CodeSwapper, Protocol):
    """What a Kernel asks of the runtime that launched it (a KernelRuntime)."""

    @property
    def payload_size(self) -> int: ...
    @property
    def h2k_capacity(self) -> int: ...
    @property
    def k2h_capacity(self) -> int: ...
    @property
    def holds(self) -> KernelHolds: ...
    def exports_outboxes(self, index: int) -> bool: ...
    def destroy_kernel(self, kernel: "Kernel", *, timeout: float | None = ...) -> None: ...
    def checkpoint(self, kernel: "Kernel", *, timeout: float | None = ...) -> Checkpoint: ...
    def restore(self, checkpoint: Checkpoint, *, into: "Kernel | None" = ..., timeout: float | None = ...) -> "Kernel": ...
    def _wait_points(self, points: Iterable[TimelinePoint], timeout: float | None) -> None: ...


class Batch:
    """A batch of message slots on one device that kernels there may take from
    (an outbox region, a host region or a landing buffer of the router)."""

    # flags and counts: class defaults until set on the batch (a step's new batches set only their own fields)
    surveyed = False               # a survey pass was recorded
    pending: set | None = None     # local kernels that may still have messages in it (None: unknown)
    delivered = 0
    rejected = 0
    unknown = 0                    # messages to addresses no kernel has
    count = 0
    local = 0                      # messages for kernels of this device (after the survey)
    remote = 0
    remote_devices = 0
    done = False
    last_value = 0                 # the latest step that read it (a survey or a delivery)
    retained = 0                   # holders (the K2K router) that still need its region as it is
    lazy = False                   # read only once written, by a step that need not wait for it
    # an inbound batch's own fields (InboundBatch), so any batch of a device is read without a probe
    submitted: Callable[[float], object] | None = None
    direct: "Kernel | None" = None   # the kernel here it is likely all for (a direct landing)
    direct_slots = 0                 # its slots worth copying into that kernel's inbox by a copy command
    hops = 0
    report_unknown = True
    exclusive = False   # no other device reads it meanwhile (the router says): its kernel may read it in place
    k2k_origin: "OutboxBatch | None" = None

    def __init__(self, ctx: DeviceContext, buffer: Any, offset: int, size: int, *, source: "Kernel | None",
                 waits: Sequence[TimelinePoint] = ()):
        self.ctx, self.buffer, self.offset, self.size, self.source = ctx, buffer, offset, size, source
        self.waits = list(waits)       # GPU waits before the first step that reads it
        self.cleared: set = set()      # kernels that took all of theirs
        self.event = LazyEvent()   # (most batches are never waited on)
        self.passed: set[int] = set()  # ids of the kernels a delivery pass over it was recorded for

    def takes(self, kernel: "Kernel") -> bool:
        """Whether `kernel` needs a delivery pass over this batch."""
        if kernel in self.cleared:
            return False
        return self.pending is None or kernel in self.pending

    def finish_if_done(self, completed: int) -> bool:
        """Mark it done once no kernel here waits for its messages and no
        submitted step still reads it (`completed`: the device's completed value)."""
        if not self.done and self.pending is not None and not self.pending and self.last_value <= completed \
                and not self.retained:
            self.done = True
            self.event.set()
        return self.done


class OutboxBatch(Batch):
    """The outbox region one step of a kernel wrote: `buffer` [offset, offset+size)
    is a batch (16-word header with the message count, then the slots) that the
    router can copy to another device as is. `ready` marks it written. The region
    is reused `in_flight` steps later; hold(point) keeps it until `point`."""

    def __init__(self, kernel: "Kernel", step: int, region: int, ready: TimelinePoint):
        super().__init__(kernel.ctx, kernel.outbox, region * kernel.outbox_region, kernel.outbox_region,
                         source=kernel)
        self.kernel, self.step, self.region, self.ready = kernel, step, region, ready
        self.holds: list[TimelinePoint] = []
        self.hold_hooks: list[Any] = []   # run before a step queues a wait on the holds (see hold())
        self.single_dest: int | None = None   # from its survey: the one address all its messages go to

    @property
    def device_index(self) -> int:
        """The device the batch's memory is on."""
        return self.ctx.index

    def hold(self, point: TimelinePoint, submitted: Callable[[float], object] | None = None) -> None:
        """Keep the region from being overwritten until `point` (on this kernel's device) is reached.

        `submitted(timeout)` runs before the step that reuses the region queues its
        wait on `point` (a transfer's TransferTicket.wait_submitted where that
        transfer's source side shares the step's queue: an in-order queue cannot
        run a wait placed before its signal)."""
        if not isinstance(point, TimelinePoint):
            raise TypeError(f"hold() takes a TimelinePoint, got {type(point).__name__}")
        if point.device_index != self.ctx.index:
            raise ValueError(f"{short_repr(point)} is on GPU {short_repr(point.device_index)}; the outbox is on GPU {self.ctx.index}")
        if submitted is not None and not callable(submitted):
            raise TypeError(f"submitted must be callable or None, got {type(submitted).__name__}")
        with self.ctx.lock:
            self.holds.append(point)
            if submitted is not None:
                self.hold_hooks.append(submitted)

    def retain(self) -> None:
        """Keep the batch from counting as done (so its kernel is deferred before the
        region is reused) until release(): the router could not move it yet."""
        with self.ctx.lock:
            self.retained += 1

    def release(self) -> None:
        """Undo one retain() (after hold()ing the point that the move reads it by)."""
        with self.ctx.lock:
            if self.retained <= 0:
                raise ValueError(f"{self!r} is not retained")
            self.retained -= 1
            if not self.retained and self.ctx.alive:
                try:
                    self.finish_if_done(self.ctx.completed())
                except DeviceLostError:   # a lost device's batch: its failover lets it go
                    pass
            self.ctx.cond.notify_all()

    def __repr__(self) -> str:
        return (f"OutboxBatch(kernel={short_repr(self.kernel.id)}, step={self.step}, device={self.ctx.index}, "
                f"offset={self.offset}, size={self.size}, done={self.done})")


class InboundBatch(Batch):
    """A batch another party (the router) put on this device; kernels here take
    their messages at their next steps. `wait(timeout)` blocks until every
    message addressed to a kernel here was delivered (or rejected).

    `hops` is added to the hop count of every message delivered from it;
    `report_unknown=False` leaves messages to unknown addresses unreported (the
    sending device's own survey reported them); `submitted(timeout)` is called
    before a step first queues a wait on the batch's points (a transfer's
    TransferTicket.wait_submitted, where that transfer shares the step's queue)."""

    def __init__(self, ctx: DeviceContext, buffer: Buffer, offset: int, size: int, waits: list[TimelinePoint], *,
                 hops: int = 0, report_unknown: bool = True, submitted: Callable[[float], object] | None = None,
                 reuse_sets: bool = False, direct: "Kernel | None" = None, direct_slots: int = 0, lazy: bool = False):
        super().__init__(ctx, buffer, offset, size, source=None, waits=waits)
        self.sets: list[Any] = []      # descriptor sets made for it (freed when done)
        self.reuse_sets = reuse_sets   # its sets are cached per buffer (KernelRuntime.forget_buffer frees them)
        self.hops, self.report_unknown, self.submitted = hops, report_unknown, submitted
        self.direct, self.direct_slots = direct, direct_slots   # (the slots past direct_slots a shader copies)
        self.lazy = lazy   # (a batch of a sender that has been sending nothing)
        self._origin: weakref.ref[OutboxBatch] | None = None

    @property
    def k2k_origin(self) -> OutboxBatch | None:
        """The sender's outbox batch this batch is a copy or a view of (the K2K router sets it),
        while that batch lives: a weak reference (the batch lists its landings in turn)."""
        return self._origin() if self._origin is not None else None

    @k2k_origin.setter
    def k2k_origin(self, batch: OutboxBatch | None) -> None:
        self._origin = weakref.ref(batch) if batch is not None else None

    @property
    def device_index(self) -> int:
        """The device the batch landed on."""
        return self.ctx.index

    def wait(self, timeout: float | None = None) -> bool:
        """True once fully delivered; False if `timeout` s passed first (steps must run meanwhile)."""
        return self.event.wait(timeout_seconds(timeout))

    def __repr__(self) -> str:
        return f"InboundBatch(device={self.ctx.index}, offset={self.offset}, size={self.size}, done={self.done})"


class Residency:
    """A kernel's device half: the device (`ctx`), the spec it was built from, its
    buffers, descriptor sets, pipeline and per-region bookkeeping. A migration or
    a restore builds a twin's Residency on the target and swaps the two whole, so
    no device field can be left behind; Kernel reads these through properties."""

    __slots__ = ("ctx", "spec", "kernel_type", "last_value", "region_users", "region_harvested",
                 "outbox_batches", "local_slot", "buffers", "sets", "deliver_sets", "outbox_bytes",
                 "outbox_region", "h2k_bytes", "h2k_region", "k2h_region", "inbox", "outbox", "control", "states",
                 "h2k_buffer", "k2h", "kernel_pass", "kernel_set", "finish_set", "step_ops")

    def __init__(self, ctx: DeviceContext, spec: KernelSpec, slot_size: int):
        self.ctx, self.spec, self.kernel_type = ctx, spec, spec.kernel_type
        self.last_value = 0                   # the device timeline value of the last step that used it
        d = ctx.in_flight
        self.region_users = [0] * d           # timeline value of the last step per region
        self.region_harvested = [True] * d
        self.outbox_batches: list[OutboxBatch | None] = [None] * d
        self.local_slot = -1
        self.buffers: list[Any] = []
        self.sets: list[Any] = []
        self.deliver_sets: dict[tuple[int, int], Any] = {}
        align_to = ctx.min_offset_alignment
        self.outbox_bytes = RING_HEADER_BYTES + spec.outbox_capacity * slot_size
        self.outbox_region = align(self.outbox_bytes, align_to)
        self.h2k_bytes = RING_HEADER_BYTES + spec.inbox_capacity * slot_size
        self.h2k_region = align(self.h2k_bytes, align_to)
        self.k2h_region = self.outbox_region
        self.inbox: Any = None                # the buffers and the pipeline: made by Kernel._create
        self.outbox: Any = None
        self.control: Any = None
        self.states: list[Any] = []
        self.h2k_buffer: Any = None
        self.k2h: Any = None
        self.kernel_pass: Any = None
        self.kernel_set: Any = None
        self.finish_set: Any = None
        self.step_ops = [KernelOps() for _ in range(d)]   # its passes of a step, packed, per region


def _on_residency(name: str) -> property:
    def put(kernel: Any, value: Any) -> None:
        setattr(kernel.residency, name, value)
    return property(operator.attrgetter(f"residency.{name}"), put, doc=f"The Residency's {name}.")


class Kernel:
    """A kernel launched by a KernelRuntime on one device (see the module docstring).

    Made by `KernelRuntime.launch`; use the runtime to step it, send to it and
    receive from it. `destroy()` frees it (also through the runtime).
    """

    # its Residency's fields, read and written through the properties set below the class
    ctx: DeviceContext
    spec: KernelSpec
    kernel_type: str
    last_value: int
    region_users: list[int]
    region_harvested: list[bool]
    outbox_batches: list[OutboxBatch | None]
    local_slot: int
    buffers: list[Buffer]
    sets: list[tuple[VkDescriptorPool, VkDescriptorSet]]
    deliver_sets: dict[tuple[int, int], tuple[VkDescriptorPool, VkDescriptorSet]]
    outbox_bytes: int
    outbox_region: int
    h2k_bytes: int
    h2k_region: int
    k2h_region: int
    inbox: Buffer
    outbox: Buffer
    control: Buffer
    states: list[Buffer]
    h2k_buffer: MappedBuffer
    k2h: MappedBuffer
    kernel_pass: ComputePass
    kernel_set: VkDescriptorSet
    finish_set: VkDescriptorSet
    step_ops: list[KernelOps]

    def __init__(self, runtime: KernelHost, ctx: DeviceContext, spec: KernelSpec, kernel_id: str, address: int,
                 tenant: int, params: tuple[int, int, int, int]):
        self.payload_size = runtime.payload_size
        self.slot_size = ENVELOPE_BYTES + self.payload_size
        #: its device half (buffers, descriptor sets, pipeline, bookkeeping): a move swaps it whole
        self.residency = Residency(ctx, spec, self.slot_size)
        self.runtime, self.id = runtime, kernel_id
        self.address, self.tenant, self.params = address, tenant, params
        self.destroyed = False
        #: running a step again from the replay log (failover): it takes only the logged inputs
        self.replaying = False
        #: being restored by a failover: its host queue holds the replay's inputs (send() waits)
        self.restoring = False
        self.slot_words = self.slot_size // 4
        self.steps = 0                      # steps submitted
        self.stats = KernelStats()
        self.errors: list[str] = []
        self.h2k: deque[bytes] = deque()    # packed slots the host sent, not yet on the device
        self.h2k_capacity, self.k2h_capacity = runtime.h2k_capacity, runtime.k2h_capacity
        self.received: deque[Any] = deque()  # K2KMessages for the host
        self.host_seq = 0
        self.injecting: tuple[int, list] | None = None   # (step, items) of host-routed messages in flight
        #: what its latest non-empty outbox batch held, from the step's survey: (the one destination
        #: address of all its messages or None for several, message count); the K2K router's hint
        self.dest_hint: tuple[int | None, int] = (None, 0)
        self.quiet_batches = 0   # its latest outbox batches in a row that held nothing
        try:
            self._create()
        except BaseException:
            self.free()
            raise

    # -- resources ------------------------------------------------------------------

    def _buffer(self, size: int, mapped: bool = False, exported: bool = False) -> Any:
        if mapped:
            b: Buffer = MappedBuffer(self.ctx.slot, size)
        elif exported:   # devices that share memory with this one read it in place (the K2K router)
            b = ExportedBuffer(self.ctx.slot, size)
        else:
            b = Buffer(self.ctx.slot, size)
        self.buffers.append(b)
        return b

    def _take_local_slot(self, ctx: Any) -> int:
        return ctx.take_local_slot(self)

    def _state_buffer(self, index: int, size: int) -> Any:
        """State buffer `index` (a migration's twin takes one already being filled)."""
        return self._buffer(size)

    def _create(self) -> None:
        ctx, spec, d = self.ctx, self.spec, self.ctx.in_flight
        self.inbox = self._buffer(RING_HEADER_BYTES + spec.inbox_capacity * self.slot_size)
        self.outbox = self._buffer(d * self.outbox_region, exported=self.runtime.exports_outboxes(ctx.index))
        self.control = self._buffer(RING_HEADER_BYTES + ctx.table_size * 16)
        self.states = [self._state_buffer(i, size) for i, size in enumerate(spec.state_sizes)]
        self.h2k_buffer = self._buffer(d * self.h2k_region, mapped=True)
        self.k2h = self._buffer(d * self.k2h_region, mapped=True)
        for r in range(d):
            h = self.h2k_buffer.words[r * self.h2k_region // 4:]
            h[2], h[3] = spec.inbox_capacity, self.slot_words
        self.local_slot = self._take_local_slot(ctx)
        check_kernel_code(ctx, spec)
        self.kernel_pass = ctx.hold_pass(spec.spirv, spec.entry_point, len(spec.state_sizes))
        whole = WHOLE_SIZE
        kset = ctx.descriptor_set(self.kernel_pass, [(self.inbox.handle, 0, whole),
                                                     (self.outbox.handle, 0, self.outbox_bytes)]
                                  + [(s.handle, 0, whole) for s in self.states])
        self.sets.append(kset)
        self.kernel_set = kset[1]
        fset = ctx.descriptor_set(ctx.finish, finish_buffers(ctx, self, (self.inbox.handle, 0, whole)))
        self.sets.append(fset)
        self.finish_set = fset[1]

    def init_commands(self, state: list[np.ndarray | None]) -> Callable[[VkCommandBuffer], None]:
        """The recorder that zeroes the kernel's memory, writes the headers and the initial state."""
        spec, d = self.spec, self.ctx.in_flight
        header = np.zeros(4, np.uint32)
        control = np.zeros(16, np.uint32)
        control[0], control[1], control[7] = self.address, self.tenant, self.ctx.table_size

        def update(cmd: VkCommandBuffer, buf: Buffer, offset: int, data: np.ndarray) -> None:
            raw = data.tobytes()
            for start in range(0, len(raw), 65536):
                part = raw[start:start + 65536]
                vk.vkCmdUpdateBuffer(cmd, buf.handle, offset + start, len(part), vk.ffi.new("char[]", part))

        def record(cmd: VkCommandBuffer) -> None:
            for b in (self.inbox, self.outbox, self.control):
                vk.vkCmdFillBuffer(cmd, b.handle, 0, WHOLE_SIZE, 0)
            for b, data in zip(self.states, state):
                if data is None:
                    vk.vkCmdFillBuffer(cmd, b.handle, 0, WHOLE_SIZE, 0)
            barrier(cmd)
            header[2], header[3] = spec.inbox_capacity, self.slot_words
            update(cmd, self.inbox, 0, header)
            header[2] = spec.outbox_capacity
            for r in range(d):
                update(cmd, self.outbox, r * self.outbox_region, header)
            update(cmd, self.control, 0, control)
            for b, data in zip(self.states, state):
                if data is not None and data.nbytes <= INLINE_STATE_BYTES:
                    update(cmd, b, 0, data)
        return record

    def check(self) -> None:
        """DestroyedError if this kernel was destroyed."""
        if self.destroyed:
            raise DestroyedError(f"kernel {short_repr(self.id)} was destroyed")

    def free(self, deadline: Deadline | None = None) -> None:
        """Free the Vulkan objects (the GPU no longer uses them; copies reading a buffer: until `deadline`)."""
        for s in self.sets + list(self.deliver_sets.values()):
            self.ctx.free_set(s)
        self.sets, self.deliver_sets = [], {}
        self.ctx.let_go(self.residency)   # (its pipeline: another kernel may hold it still)
        for b in reversed(self.buffers):
            b.destroy(deadline.left() if deadline is not None else 30.0)
        self.buffers = []
        if self.local_slot >= 0:
            self.ctx.release_local_slot(self.local_slot)
            self.local_slot = -1

    # -- public ---------------------------------------------------------------------

    @property
    def device_index(self) -> int:
        """The device the kernel lives on."""
        return self.ctx.index

    @property
    def last_point(self) -> TimelinePoint | None:
        """The point that marks this kernel's last submitted step done (None before the first)."""
        return self.ctx.point(self.last_value) if self.last_value else None

    def outbox_batch(self, step: int | None = None) -> OutboxBatch:
        """The outbox batch of `step` (default: the latest), while its region is not yet reused."""
        with self.ctx.lock:
            self.check()
            if self.steps == 0:
                raise ValueError(f"kernel {short_repr(self.id)} has not stepped yet: no outbox batch")
            step = self.steps - 1 if step is None else step
            int_in(step, "step", 0, self.steps - 1)
            b = self.outbox_batches[step % self.ctx.in_flight]
            if b is None or b.step != step:
                raise ValueError(f"the outbox region of step {step} of kernel {short_repr(self.id)} was reused; the "
                                 f"runtime keeps the last {self.ctx.in_flight} (hold() a batch to keep it longer)")
            return b

    def set_params(self, *params: int) -> None:
        """The four user words of the push constants (vkm_step.params) for later steps."""
        self.params = check_params(params)

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Same as runtime.destroy_kernel(self)."""
        self.runtime.destroy_kernel(self, timeout=timeout)

    # -- CheckpointableKernel ------------------------------------------------------------

    def create_checkpoint(self, *, timeout: float | None = 60.0) -> Checkpoint:
        """runtime.checkpoint(self, timeout=timeout)."""
        return self.runtime.checkpoint(self, timeout=timeout)

    def restore_from_checkpoint(self, checkpoint: Checkpoint, *, timeout: float | None = 60.0) -> None:
        """runtime.restore(checkpoint, into=self): this kernel takes the checkpoint's state."""
        self.runtime.restore(checkpoint, into=self, timeout=timeout)

    def checkpoint_kernel_id(self) -> str:
        """The id a checkpoint of this kernel records."""
        return self.id

    def checkpoint_kernel_type(self) -> str:
        """The kernel type a checkpoint of this kernel records."""
        return self.kernel_type

    def supports_incremental(self) -> bool:
        """True: create_incremental_checkpoint gives the chunks changed since a base."""
        return True

    def create_incremental_checkpoint(self, base: Checkpoint) -> Checkpoint:
        """The chunks that changed since `base` (Checkpoint.delta_from)."""
        if not isinstance(base, Checkpoint):
            raise TypeError(f"base must be a Checkpoint, got {type(base).__name__}")
        return Checkpoint.delta_from(base, self.create_checkpoint())

    # -- MigratableKernel ----------------------------------------------------------------

    def _quiesce(self, why: str, timeout: float | None) -> None:
        timeout = timeout_seconds(timeout)   # (before the hold: a bad one leaves it stepping)
        self.runtime.holds.hold(self, why)
        try:
            self.runtime._wait_points([self.ctx.point(self.last_value)] if self.last_value else [], timeout)
        except BaseException:
            self.runtime.holds.release(self, why)
            raise

    def _done(self) -> bool:
        return not self.last_value or self.ctx.completed() >= self.last_value

    def prepare_for_migration(self, *, timeout: float | None = 60.0) -> None:
        """Hold the kernel back from stepping and wait (up to `timeout` s) for its submitted steps."""
        self._quiesce(_MIGRATION, timeout)

    def cancel_migration(self) -> None:
        """Let it step again."""
        self.runtime.holds.release(self, _MIGRATION)

    def is_quiescent(self) -> bool:
        """Held back and with no step in flight."""
        return self.runtime.holds.is_held(self) and self._done()

    def estimated_state_size(self) -> int:
        """Bytes a migration moves: state buffers, control block and inbox."""
        return sum(s.size for s in self.states) + self.control.size + self.inbox.size

    # -- HotReloadableKernel -------------------------------------------------------------

    def prepare_for_reload(self, *, timeout: float | None = 60.0) -> None:
        """Hold the kernel back from stepping and wait (up to `timeout` s) for its submitted steps."""
        self._quiesce(_RELOAD, timeout)

    def apply_code(self, code: SpirvCode, timeout: float | None = 30.0) -> None:
        """Run `code` (a SPIR-V KernelCodeSource) from the next step on, state kept
        (checked, built and swapped as a hot reload does, by the runtime: a CodeSwapper)."""
        swapper: CodeSwapper = self.runtime
        swapper.apply_code(self, code, timeout)

    def resume_after_reload(self) -> None:
        """Let it step again."""
        self.runtime.holds.release(self, _RELOAD)

    def is_ready_for_reload(self) -> bool:
        """No step of it in flight: its code can be swapped."""
        return self._done()

    def __repr__(self) -> str:
        state = "destroyed" if self.destroyed else f"GPU {self.ctx.index}"
        return f"Kernel({short_repr(self.id)}, {short_str(self.kernel_type, 40)}, address={self.address}, {state}, steps={self.steps})"


for _name in Residency.__slots__:
    setattr(Kernel, _name, _on_residency(_name))
del _name


def check_params(params: Any) -> tuple[int, int, int, int]:
    """Up to four u32 user parameters (numpy integers too), as a 4-tuple padded with zeros."""
    if len(params) == 1 and not isinstance(params[0], (int, np.integer)) and hasattr(params[0], "__iter__"):
        params = tuple(params[0])
    if len(params) > 4:
        raise ValueError(f"at most 4 user parameters, got {len(params)}")
    out = [int(int_in(int(p) if isinstance(p, np.integer) else p, f"params[{i}]", 0, U32_MAX))
           for i, p in enumerate(params)]
    return tuple(out + [0] * (4 - len(out)))   # type: ignore[return-value]
