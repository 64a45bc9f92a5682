"""CrossGpuK2KRouter: ringkernel's cross-GPU kernel-to-kernel router, with real delivery.

On its own (a coordinator only) it is the seed's router: `route_message`
decides a route and files the message in a pending queue per (source device,
first hop), `drain_pending` hands a queue to the caller, `record_delivery` /
`record_failure` count, `stats()` snapshots. The seed's defects are fixed
(docs/explanation/seed-defects.md): route failures and cross-tenant messages count as
failures, multi-hop routes follow the widest P2P path.

Attached to a KernelRuntime (`CrossGpuK2KRouter(coordinator, runtime)` or
`attach(runtime)`) it delivers, on the GPUs:

* messages kernels emit: each step's outbox batches are moved to the devices
  of the route tree with the pair's best transfer method (delivery.py),
  chained by timeline semaphores so the destination's next step waits on the
  GPU; multi-hop routes are forwarded hop by hop;
* messages the host routes with `route_message`: they leave with the source
  kernel's next step, after its own messages (same per-pair sequence numbers
  and clock), and travel like them; `drain_pending` still takes back the ones
  no step has taken yet.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ...errors import K2KDestinationNotFoundError, KernelNotFoundError, QueueFullError, TenantMismatchError
from ...memory.image import as_host_bytes
from ...transfer.methods import TransferMethod
from ..._core.checks import check_count, check_index, int_in, timeout_seconds, short_repr
from .delivery import DeliveryEngine
from ..ids import KernelId, as_kernel_id
from ..engine.kernel import Kernel, OutboxBatch
from ..runtime.runtime import KernelRuntime
from ..messages import HlcTimestamp, K2KMessage, MessageEnvelope
from .routing import (CrossGpuRouterStats, CrossGpuRouterStatsSnapshot, PendingK2KMessage, RoutingDecision,
                      RoutingKind, decide_route)

if TYPE_CHECKING:
    from ..._core.protocols import HostData
    from ..coordinator.coordinator import MultiGpuCoordinator
    from ..coordinator.topology import GpuTopology

log = logging.getLogger(__name__)

__all__ = ["CrossGpuK2KRouter"]

_PRIORITY_SHIFT = 8
#: route_message waits for queue room in slices of at most this many seconds (it stays interruptible)
ROOM_WAIT_SLICE = 0.05
#: How long run()'s quiet hook waits for the steps whose batches of idle senders are still landed
#: in place on other devices (the router's hook for a native run of quiet steps: _quiet_for_run).
QUIET_SETTLE_SECONDS = 0.005


class _Routed:
    """A host-routed message on its way: queued, taken by a step, then delivered or failed."""
    __slots__ = ("pending", "decision", "key", "source", "dest", "slot", "state", "batch", "counted", "device")

    def __init__(self, pending: PendingK2KMessage, decision: RoutingDecision, key: tuple[int, int] | None,
                 source: Kernel, dest: Kernel, slot: bytes):
        self.pending, self.decision, self.key = pending, decision, key
        self.source, self.dest, self.slot = source, dest, slot
        self.state = "queued"            # queued -> taken -> sent -> done | failed; or drained
        self.batch: OutboxBatch | None = None
        self.counted = key is not None   # in the seed's pending count
        self.device = -1                 # the destination's device when its step sent it


class CrossGpuK2KRouter:
    """Routes K2K messages across GPU boundaries (see the module docstring).

    `runtime`: a KernelRuntime whose kernels' messages the router delivers
    (None: the seed's bookkeeping only; `attach()` later). `max_landings`:
    landing regions per device pair in use at once (default 4 x the runtime's
    in_flight) before moves wait and senders are deferred. `max_pending`:
    host-routed messages one source kernel may have waiting for its steps
    (QueueFullError beyond). `submit_timeout`: bound on waits for a transfer's
    submission (single-queue devices) and on teardown (> 0 s; None: 30 s). `transfer_methods`:
    {(from device, to device): TransferMethod} to use instead of the pair's
    best (e.g. to compare methods); the method must be one the pair supports.
    """

    def __init__(self, coordinator: MultiGpuCoordinator, runtime: KernelRuntime | None = None, *, max_landings: int | None = None,
                 max_pending: int = 65536, submit_timeout: float = 30.0,
                 transfer_methods: dict[tuple[int, int], str] | None = None):
        for name in ("get_kernel_device", "topology"):
            if not callable(getattr(coordinator, name, None)):
                raise TypeError(f"coordinator must be a MultiGpuCoordinator (it has no {name}()), "
                                f"got {type(coordinator).__name__}")
        self.coordinator = coordinator
        self.max_landings = None if max_landings is None else int_in(max_landings, "max_landings", 1, 1 << 16)
        self.max_pending = int_in(max_pending, "max_pending", 1, 1 << 30)
        self.submit_timeout = timeout_seconds(submit_timeout, "submit_timeout")
        if self.submit_timeout == 0:   # (no transfer could be submitted, nor the router torn down)
            raise ValueError("submit_timeout must be a number of seconds > 0 (or None: 30 s), got 0")
        self.transfer_methods = self._check_methods(transfer_methods)
        self._stats = CrossGpuRouterStats()
        self._queue_lock = threading.Lock()        # pending queues (taken inside a runtime's device lock)
        self._room = threading.Condition(self._queue_lock)   # notified when queued messages leave the queues
        self._delivery_lock = threading.RLock()    # the engine (taken before any device lock)
        self._pending: dict[tuple[int, int], deque[_Routed]] = {}
        self._by_kernel: dict[Kernel, deque[_Routed]] = {}
        self._sent: list[_Routed] = []
        self._topology: tuple[Any, Any] | None = None
        self._engine: DeliveryEngine | None = None
        self.runtime: KernelRuntime | None = None
        self._unfinished: tuple[KernelRuntime, DeliveryEngine | None] | None = None   # a detach() that gave up
        if runtime is not None:
            self.attach(runtime)

    # -- the seed's API ----------------------------------------------------------------

    def route_message(self, source_kernel: KernelId | str, dest_kernel: KernelId | str,
                      message: HostData | K2KMessage | MessageEnvelope, *,
                      timeout: float | None = 0.0) -> RoutingDecision:
        """Decide how a message from `source_kernel` to `dest_kernel` travels and queue it.

        `message`: bytes, a buffer-protocol object, a K2KMessage (whose ids
        must match) or a MessageEnvelope without payload (its tag, timestamp and priority). Unplaced kernels raise K2KDestinationNotFoundError naming
        the id; with a runtime attached, kernels of different tenants raise
        TenantMismatchError (both count as routing failures), and the message
        leaves with the source kernel's next step (SAME_DEVICE ones too, by the
        device's own delivery). A source with `max_pending` messages waiting
        raises QueueFullError after waiting up to `timeout` s for its steps.
        """
        src = as_kernel_id(source_kernel, "source_kernel")
        dst = as_kernel_id(dest_kernel, "dest_kernel")
        msg = self._as_message(src, dst, message)
        timeout = timeout_seconds(timeout)
        s = self._device_of(src)
        d = self._device_of(dst)
        rt = self.runtime
        kernels = None
        if rt is not None:
            kernels = self._runtime_kernels(rt, src, dst)
            if kernels[0].tenant != kernels[1].tenant:
                self._stats.add_failures(1)
                raise TenantMismatchError(f"kernel {short_repr(src)} (tenant {kernels[0].tenant}) may not send to "
                                          f"kernel {short_repr(dst)} (tenant {kernels[1].tenant}): messages never "
                                          f"cross tenants")
            if len(msg.payload) > rt.payload_size:
                raise ValueError(f"message payload is {len(msg.payload)} bytes; the runtime's slots hold "
                                 f"{rt.payload_size}")
        decision = self.route(s, d)
        key = None
        if decision.kind is RoutingKind.DIRECT_P2P or decision.kind is RoutingKind.HOST_MEDIATED:
            key = (s, d)
        elif decision.kind is RoutingKind.MULTI_HOP:
            key = (s, decision.path[1])  # type: ignore[index]
        pending = PendingK2KMessage(src, dst, msg, hops=decision.hops)
        if kernels is None:
            if key is not None:
                with self._queue_lock:
                    self._pending.setdefault(key, deque()).append(
                        _Routed(pending, decision, key, None, None, b""))   # type: ignore[arg-type]
                self._stats.add_pending(1)
            return decision
        source, dest = kernels
        slot = self._pack(source, dest, msg, rt.payload_size)  # type: ignore[union-attr]
        routed = _Routed(pending, decision, key, source, dest, slot)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._room:
            while True:
                q = self._by_kernel.setdefault(source, deque())
                if sum(1 for r in q if r.state == "queued") < self.max_pending:
                    q.append(routed)
                    if key is not None:
                        self._pending.setdefault(key, deque()).append(routed)
                    break
                left = ROOM_WAIT_SLICE if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise QueueFullError(f"kernel {short_repr(src)} already has {self.max_pending} routed messages waiting "
                                         f"for its steps (max_pending); step the runtime, then route again")
                self._room.wait(min(left, ROOM_WAIT_SLICE))   # take(), settle(), a drain or a detach make room
        if key is not None:
            self._stats.add_pending(1)
        return decision

    def drain_pending(self, source: int, dest: int) -> list[PendingK2KMessage]:
        """Remove and return, in FIFO order, the messages queued for the device pair
        (source device, first hop) that no step has taken yet."""
        key = (check_index(source, "source"), check_index(dest, "dest"))
        with self._queue_lock:
            q = self._pending.pop(key, None)
            out = []
            for r in q or ():
                if r.state == "queued":
                    r.state = "drained"
                    out.append(r.pending)
            if out:
                self._room.notify_all()
        self._stats.add_pending(-len(out))
        return out

    def record_delivery(self, message: PendingK2KMessage, payload_size: int) -> None:
        """Count a message delivered by the caller: routed + 1, bytes + payload_size,
        latency since it was queued."""
        if not isinstance(message, PendingK2KMessage):
            raise TypeError(f"message must be a PendingK2KMessage, got {type(message).__name__}")
        size = check_count(payload_size, "payload_size")
        latency = max(0, int((time.monotonic() - message.queued_at) * 1e6))
        self._stats.add_routed(1, size, latency)

    def record_failure(self) -> None:
        """Count a routing failure."""
        self._stats.add_failures(1)

    def stats(self) -> CrossGpuRouterStatsSnapshot:
        """A snapshot of the counters (deliveries seen so far are counted first)."""
        self._refresh()
        return self._stats.snapshot()

    # -- routes ------------------------------------------------------------------------

    def topology(self) -> GpuTopology:
        """The coordinator's topology (a copy, refreshed when it changes)."""
        gen = getattr(self.coordinator, "topology_generation", None)
        cached = self._topology
        if cached is None or gen is None or cached[0] != gen:
            cached = self._topology = (gen, self.coordinator.topology())
        return cached[1]

    def route(self, source_device: int, dest_device: int) -> RoutingDecision:
        """The decision for a device pair (route_message's, without queueing)."""
        return decide_route(self.topology(), source_device, dest_device)

    def transfer_method(self, source_device: int, dest_device: int) -> str | None:
        """The transfer method the router moved batches with on this edge (None: not yet)."""
        eng = self._engine
        return None if eng is None else eng.method(check_index(source_device, "source_device"),
                                                    check_index(dest_device, "dest_device"))

    @property
    def batches(self) -> int:
        """Outbox batches the router handed on to another device since it was made, once
        per batch and edge (read there in place, or moved by a transfer): 0 while no
        kernel's messages crossed devices."""
        return self._stats.batches_moved

    def edge_traffic(self) -> dict[tuple[int, int], tuple[int, int]]:
        """{(from device, to device): (moves, bytes)} the router made since it was attached
        (hops of multi-hop routes count on each edge; bytes are whole batch regions)."""
        with self._delivery_lock:
            eng = self._engine
            if eng is None:
                return {}
            return {e: (eng.edge_moves[e], eng.edge_bytes[e]) for e in eng.edge_bytes}

    @staticmethod
    def _check_methods(methods: Any) -> dict[tuple[int, int], str]:
        if methods is None:
            return {}
        if not isinstance(methods, dict):
            raise TypeError(f"transfer_methods must be a dict {{(from, to): method}}, got {type(methods).__name__}")
        out = {}
        for key, m in methods.items():
            if not isinstance(key, tuple) or len(key) != 2:
                raise TypeError(f"transfer_methods keys are (from device, to device) pairs, got {short_repr(key)}")
            a, b = check_index(key[0], "from device"), check_index(key[1], "to device")
            if a == b or m not in TransferMethod.CROSS_DEVICE:
                raise ValueError(f"transfer_methods[{short_repr(key)}] must be one of {TransferMethod.CROSS_DEVICE} "
                                 f"between two devices, got {short_repr(m)}")
            out[(a, b)] = m
        return out

    def _device_of(self, kernel_id: KernelId) -> int:
        dev = self.coordinator.get_kernel_device(kernel_id)
        if dev is None:
            self._stats.add_failures(1)
            raise K2KDestinationNotFoundError(f"kernel {short_repr(kernel_id)} is not placed on any device")
        return dev

    def _runtime_kernels(self, rt: KernelRuntime, src: KernelId, dst: KernelId) -> tuple[Kernel, Kernel]:
        out = []
        for kid in (src, dst):
            try:
                k = rt.kernel(kid)
            except KernelNotFoundError:
                self._stats.add_failures(1)
                raise K2KDestinationNotFoundError(f"kernel {short_repr(kid)} is placed but is not a kernel of the attached "
                                                  f"runtime (it cannot receive)") from None
            out.append(k)
        return out[0], out[1]

    @staticmethod
    def _as_message(src: KernelId, dst: KernelId, message: Any) -> K2KMessage:
        if isinstance(message, K2KMessage):
            if (message.source_kernel, message.dest_kernel) != (src, dst):
                raise ValueError(f"the K2KMessage goes from {short_repr(message.source_kernel)} to "
                                 f"{short_repr(message.dest_kernel)}, not from {short_repr(src)} to {short_repr(dst)}")
            return message
        if isinstance(message, MessageEnvelope):   # the seed's example routes an envelope
            if message.payload_len:
                raise ValueError(f"a MessageEnvelope is a header only (payload_len {short_repr(message.payload_len)}, no payload "
                                 f"bytes): route a K2KMessage or the payload bytes instead")
            return K2KMessage(src, dst, b"", tag=message.tag, timestamp=message.timestamp, priority=message.priority)
        try:
            payload = as_host_bytes(message, "message").tobytes()
        except TypeError:
            raise TypeError(f"message must be bytes, a buffer-protocol object, a K2KMessage or a MessageEnvelope, "
                            f"got {type(message).__name__}") from None
        return K2KMessage(src, dst, payload)

    @staticmethod
    def _pack(source: Kernel, dest: Kernel, msg: K2KMessage, payload_size: int) -> bytes:
        env = MessageEnvelope(source.address, dest.address, 0, HlcTimestamp.zero(), len(msg.payload), msg.tag,
                              source.tenant, 0, msg.priority << _PRIORITY_SHIFT)
        return env.pack() + msg.payload + bytes(payload_size - len(msg.payload))

    # -- attached to a runtime ------------------------------------------------------------

    def attach(self, runtime: KernelRuntime) -> "CrossGpuK2KRouter":
        """Deliver the K2K traffic of `runtime` (a KernelRuntime on this coordinator)."""
        if not isinstance(runtime, KernelRuntime):
            raise TypeError(f"runtime must be a KernelRuntime, got {type(runtime).__name__}")
        if runtime.coordinator is not self.coordinator:
            raise ValueError("the runtime places its kernels with another coordinator; build the router with "
                             "runtime.coordinator")
        with self._delivery_lock:
            if self.runtime is runtime:
                return self
            if self.runtime is not None or self._unfinished is not None:
                raise ValueError("this router is already attached to a runtime (or its detach() did not finish); "
                                 "detach() it first")
            runtime.set_outbox_feed(self)
            landings = self.max_landings if self.max_landings is not None else 4 * runtime.in_flight
            self._engine = DeliveryEngine(self, runtime.inbound, self._stats, max_landings=landings,
                                          submit_timeout=self.submit_timeout or 30.0)
            self.runtime = runtime
            runtime.add_step_listener(self._on_step, retain=True, prepare=self._prepare, quiet=self._quiet_for_run)
            life = getattr(runtime.manager, "_life", None)
            if life is not None:
                life.adopt(self)   # the manager's destroy() detaches it first (before the runtime)
        return self

    #: The manager's destroy() detaches the router before it destroys the runtime (3):
    #: its landings are batches the runtime holds, its pools and gathers live on the devices.
    _teardown_rank = 2

    def detach(self, timeout: float | None = 30.0) -> None:
        """Stop delivering (idempotent): moves not yet made are dropped and their
        senders told; host-routed messages no step has taken stay in the pending
        queues (drain_pending); batches landed but not yet delivered are taken back.
        After a vkmulti.TimeoutError or Ctrl-C nothing in use is freed: call it again."""
        with self._delivery_lock:
            rt, eng = self.runtime, self._engine
            if rt is None:
                if self._unfinished is None:
                    return
                rt, eng = self._unfinished   # a detach() that a timeout or Ctrl-C ended: finished here
            timeout = float("inf") if timeout is None else timeout_seconds(timeout)
            rt.remove_step_listener(self._on_step)
            if rt.outbox_feed is self:
                rt.set_outbox_feed(None)
            self.runtime, self._engine, self._unfinished = None, None, (rt, eng)
            try:
                for s in getattr(rt.manager, "_slots", ()):   # a lost device is forgotten, never waited on
                    native = getattr(s, "native", None)
                    if native is not None and native.lost:
                        eng.drop_device(s.index)  # type: ignore[union-attr]
                eng.destroy(timeout)  # type: ignore[arg-type, union-attr]
            finally:
                self._check_sent(final=True)
                with self._room:   # route_message's waiters look again
                    self._room.notify_all()
            self._unfinished = None
            life = getattr(rt.manager, "_life", None)
            if life is not None:
                life.forget(self)

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Same as detach() (the manager's destroy() calls it)."""
        self.detach(timeout)

    def __enter__(self) -> "CrossGpuK2KRouter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def idle(self) -> bool:
        """Whether nothing is on its way right now: no queued or in-flight moves, no
        landed batch waiting for delivery, no host-routed message undelivered.
        Right after a step its batches are still travelling: synchronize the
        runtime and poll this (a landed batch with nothing for its device is
        taken back once the sending step is harvested)."""
        self._refresh()
        with self._delivery_lock:
            eng = self._engine
            busy = eng is not None and eng.busy()
        with self._queue_lock:
            queued = any(r.state == "queued" for q in self._by_kernel.values() for r in q)
        return not busy and not queued and not self._sent

    def quiet(self, kernels: list[Kernel]) -> bool:
        """The runtime's hook (OutboxFeed; asked with no device lock held): whether nothing
        is on its way right now (as idle(), without reaping) and no host-routed message for
        `kernels` is queued, so that steps of them that send nothing need nothing of this router."""
        if self._queued_for(kernels):
            return False
        with self._delivery_lock:
            eng = self._engine
            return eng is None or not eng.busy()

    def _queued_for(self, kernels: list[Kernel]) -> bool:
        """Whether a host-routed message is on its way (sent, not yet resolved) or queued for `kernels`."""
        return bool(self._sent) or any(self._by_kernel.get(k) for k in kernels)

    def _quiet_for_run(self, kernels: list[Kernel]) -> bool:
        """The step listener's quiet hook (run() asks it with no device lock held): quiet(), or,
        where all that keeps the router busy is in-place landings of batches of senders that
        have been sending nothing (kernels on several devices: every step's batch lands on the
        others before anyone knows it is empty), quiet once the steps that wrote and read them
        are done (waited for QUIET_SETTLE_SECONDS at most), read back, and those that hold
        nothing let go."""
        if self.quiet(kernels):
            return True
        if self._queued_for(kernels):
            return False
        with self._delivery_lock:
            eng = self._engine
            return eng is None or eng.settle_idle(time.monotonic() + QUIET_SETTLE_SECONDS)

    def _on_step(self, batches: list[OutboxBatch]) -> None:
        with self._delivery_lock:
            if self._engine is not None:
                self._engine.on_step(batches)
            else:   # detached while the step ran: let its batches go
                for b in batches:
                    b.release()
            self._check_sent()

    def device_lost(self, index: int) -> None:
        """The runtime's failover hook (OutboxFeed): GPU `index` was lost; moves, landings
        and in-place reads involving it are forgotten without touching it."""
        with self._delivery_lock:
            if self._engine is not None:
                self._engine.drop_device(index)

    def flush(self) -> int:
        """The runtime's hook (OutboxFeed): submit what can go of the queued moves, as after
        a step without new batches; returns how many still wait for room on their
        edges (0 while detached)."""
        with self._delivery_lock:
            eng = self._engine
            if eng is None:
                return 0
            eng.on_step([])
            self._check_sent()
            return eng.queued_moves()

    def _prepare(self, kernels: list[Kernel], timeout: float | None) -> None:
        with self._delivery_lock:
            if self._engine is not None:
                self._engine.prepare(kernels, timeout)

    def _refresh(self) -> None:
        with self._delivery_lock:
            if self._engine is not None:
                self._engine.reap()
            self._check_sent()

    # -- the runtime's outbox feed (take and settle are called by its stepper under a device lock) ----

    def take(self, kernel: Kernel, limit: int) -> list[tuple[bytes, _Routed]]:
        """The runtime's hook (OutboxFeed): up to `limit` host-routed messages of `kernel` to send with its
        next step, as (slot bytes, route) pairs."""
        if not self._by_kernel.get(kernel):   # (the common case, read without the lock: nothing queued for it)
            return []
        with self._queue_lock:
            q = self._by_kernel.get(kernel)
            out: list[tuple[bytes, _Routed]] = []
            before = len(q) if q else 0
            while q and len(out) < limit:
                r = q.popleft()
                if r.state != "queued":
                    continue
                if r.dest.destroyed:
                    self._fail(r, f"its destination {r.dest.id!r} was destroyed")
                    continue
                r.state = "taken"
                out.append((r.slot, r))
            if before != (len(q) if q else 0):   # room for route_message's waiters
                self._room.notify_all()
            return out

    def settle(self, kernel: Kernel, batch: OutboxBatch | None, taken: list[_Routed],
               returned: list[tuple[bytes, _Routed]]) -> None:
        """The runtime's hook (OutboxFeed): what became of the messages take() gave for a step (sent in
        `batch`, or `returned` to the queue)."""
        with self._queue_lock:
            q = self._by_kernel.setdefault(kernel, deque())
            for _, r in reversed(returned):
                if kernel.destroyed:
                    self._fail(r, f"its source {short_repr(kernel.id)} was destroyed")
                else:
                    r.state = "queued"
                    q.appendleft(r)
            for r in taken:
                r.state, r.batch, r.device = "sent", batch, r.dest.device_index
                self._sent.append(r)
            if kernel.destroyed and not q:
                self._by_kernel.pop(kernel, None)
            self._room.notify_all()

    def _fail(self, r: _Routed, why: str) -> None:
        r.state = "failed"
        self._forget(r)
        self._stats.add_failures(1)
        if r.counted:
            self._stats.add_pending(-1)
        log.warning("routed message %s -> %s dropped: %s", r.pending.source_kernel, r.pending.dest_kernel, why)

    def _forget(self, r: _Routed) -> None:
        """Take a resolved message out of its device pair's queue (only drain_pending reads those
        queues, for messages still queued: resolved ones would pile up there). Queue lock held."""
        q = self._pending.get(r.key) if r.key is not None else None
        if q:
            try:
                q.remove(r)   # (resolved in about the order queued: near the front)
            except ValueError:
                pass   # (its queue was drained meanwhile)

    def _check_sent(self, final: bool = False) -> None:
        """Resolve host-routed messages whose step was harvested: delivered once the
        batch that carries them is done on the destination's device. Messages
        queued for a kernel destroyed since fail."""
        if self._by_kernel:   # (read without the lock: one added meanwhile is looked at next time)
            with self._queue_lock:
                for kernel in [k for k in self._by_kernel if k.destroyed]:
                    for r in self._by_kernel.pop(kernel):
                        if r.state == "queued":
                            self._fail(r, f"its source {short_repr(kernel.id)} was destroyed")
                    self._room.notify_all()
        if not self._sent:
            return
        keep = []
        for r in self._sent:
            state = self._delivery_state(r)
            if state is None and final:
                state = "the router was detached before it arrived"
            if state is None:
                keep.append(r)
            elif state == "delivered":
                r.state = "done"
                with self._queue_lock:
                    self._forget(r)
                if r.counted:
                    self._stats.add_pending(-1)
            else:
                with self._queue_lock:
                    self._fail(r, state)
        self._sent = keep

    @staticmethod
    def _delivery_state(r: _Routed) -> str | None:
        b = r.batch
        if b is None:
            return "its step was not submitted"
        if r.dest.destroyed:
            return f"its destination {r.dest.id!r} was destroyed"
        # (where the destination was when it left: a migration since took it along from there)
        if r.device == b.device_index:
            return "delivered" if b.done else None
        for dev, inbound in getattr(b, "k2k_landings", ()):
            if dev == r.device:
                if not inbound.done:
                    return None
                return "delivered" if inbound.delivered else "the destination's device took none of its batch"
        if getattr(b, "k2k_moves", 1) == 0:
            return f"no move reached GPU {r.device}"
        return None

    def __repr__(self) -> str:
        s = self._stats.snapshot()
        where = "detached" if self.runtime is None else "attached"
        return (f"CrossGpuK2KRouter({where}, routed={s.messages_routed}, pending={s.messages_pending}, "
                f"failures={s.routing_failures})")
