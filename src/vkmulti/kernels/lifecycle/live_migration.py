"""Moving a runtime kernel to another device: live migration (GPU to GPU); the
same mechanism restores a kernel from a checkpoint (kernel_restore.py).

A *twin* (a Kernel object with the same id and address, its buffers and
descriptor sets on the target device) is built and filled while the kernel
stays where it is; then, at a step boundary of the whole runtime (its gate
held exclusively: no step is being recorded or submitted), the kernel's
device resources are swapped with the twin's, so the Kernel object users
hold stays the same and moves. What the twin leaves behind is freed once
nothing reads it (its outbox only after the batches it sent are delivered).

Live migration (`migrate_live`):

1. quiesce: the kernel is held back from stepping (a step() that took it
   before the hold is let finish submitting: the gate, once) and its
   submitted steps finish; its state can no longer change;
2. the source's state buffers are hashed (CRC32 job on the source device)
   and copied GPU to GPU with the pair's best transfer method into state
   buffers on the target, while the twin is built around them and the other
   kernels keep stepping; the target's hash of what arrived is queued behind
   the copies' timeline points (no host round trip between copy and hash):
   at once by the host engine, at the switch by a GPU's shader (its job
   waits on the step queue, which must not hold back the others' steps);
3. the switch, with the runtime's gate held: every submitted step finishes,
   the K2K router's queued moves are submitted (their batches land), then one
   GPU pass on the source takes every message still waiting for the kernel
   there (in local outboxes and landed batches, in delivery order) into a
   staging batch, marking them delivered where they were; control block,
   inbox and staging batch follow the state and are hashed on both sides;
   the hashes are compared with the source's;
4. the kernel's resources are swapped with the twin's, its directory entry is
   rewritten on every device (their next steps), batches still on the other
   devices are told not to deliver to it (their copies of its messages were
   taken on the source), the staging batch is handed to the target; the
   coordinator completes the migration. Steps resume: messages sent during
   the move reach the kernel after those taken over, none twice.

The CRC32 engine of each device is `runtime._crc(device)` (see
`KernelLifecycle.migration_crc`): the GPU shader (gpu_crc.py), or on a CPU
device whose memory is host-visible (lavapipe) the host's zlib over the
device's own mapped memory (host_crc.py), the same check on the same bytes.

Any failure before the swap leaves the kernel where it was: messages taken
into the staging batch are handed back to it on the source, the twin is freed.
"""
from __future__ import annotations

import logging
import struct
import time
from typing import Any

import numpy as np
import vulkan as vk

from ...errors import DeviceLostError, MigrationError, TimeoutError as VkmTimeout, VkmError
from ...memory.image import Buffer
from ...transfer.cross_device import CrossDeviceTransfer as Engine
from ...transfer.methods import select_transfer_method
from ..engine import recording as cmds
from ..engine.device_context import WHOLE_SIZE, MappedBuffer
from ..engine.kernel import InboundBatch, Kernel, KernelSpec, OutboxBatch
from .lifecycle import _Retired, gate_of
from ..messages import RING_HEADER_BYTES
from ..coordinator.plans import MigrationRequest, MigrationState

log = logging.getLogger(__name__)

__all__ = ["migrate_live", "build_twin", "destroy_engines"]

#: Kernel attributes that belong to its device (swapped between a kernel and its twin).
DEVICE_ATTRS = ("ctx", "region_users", "region_harvested", "outbox_batches", "local_slot", "buffers", "sets",
                "deliver_sets", "survey_set", "outbox_bytes", "outbox_region", "h2k_bytes", "h2k_region",
                "k2h_region", "inbox", "outbox", "control", "states", "h2k_buffer", "k2h", "kernel_pass",
                "kernel_set", "finish_set", "last_value", "spec", "kernel_type")
_DELIVER_PUSH = struct.Struct("<8I")
_STATUS_WORDS = 4


# -- twins ------------------------------------------------------------------------------------

class _Twin(Kernel):
    """A kernel being built on a target device: its device-local buffers come from
    the runtime's migration pool where one of the size is free; state buffers
    given as `states` (already being filled by the copies) are adopted."""

    def __init__(self, *args: Any, states: list | None = None):
        self._presets = list(states) if states is not None else None
        super().__init__(*args)

    def _state_buffer(self, index: int, size: int) -> Any:
        presets = self._presets
        if presets is not None and presets[index] is not None:
            b, presets[index] = presets[index], None
            self.buffers.append(b)   # the twin owns it from here (freed or pooled with the rest)
            return b
        return super()._state_buffer(index, size)

    def _buffer(self, size: int, mapped: bool = False, exported: bool = False) -> Any:
        if not mapped and not exported:   # (an exported outbox is made for the kernel: other devices import it)
            b = self.runtime._buffer_pool().take(self.ctx.index, size)
            if b is not None:
                self.buffers.append(b)
                return b
        return super()._buffer(size, mapped, exported)


def _check_state_sizes(rt: Any, k: Kernel, device: int, spec: KernelSpec) -> Any:
    ctx, _ = rt._device(device)
    for i, n in enumerate(spec.state_sizes):
        if n > ctx.max_storage_range:
            raise MigrationError(f"state buffer {i} of {k.id!r} is {n} bytes; GPU {device} binds at most "
                                 f"{ctx.max_storage_range} (maxStorageBufferRange)")
    return ctx


def state_buffers(rt: Any, k: Kernel, device: int) -> list[Buffer]:
    """Device-local buffers on `device` for k's state (from the migration pool where
    it has them), to copy into before the twin exists (build_twin(states=...))."""
    ctx = _check_state_sizes(rt, k, device, k.spec)
    out: list[Buffer] = []
    try:
        for n in k.spec.state_sizes:
            b = rt._buffer_pool().take(ctx.index, n)
            out.append(b if b is not None else Buffer(ctx.slot, n))
    except BaseException:
        for b in out:
            b.destroy()
        raise
    return out


def build_twin(rt: Any, k: Kernel, device: int, spec: KernelSpec | None = None,
               states: list[Buffer] | None = None) -> Kernel:
    """A Kernel with k's id, address, tenant and params, its resources on `device`,
    initialised (rings zeroed, headers written) except its state buffers, which
    the caller fills whole (or `states`, buffers of that device it adopts: the
    caller keeps those it did not adopt, None in the list marking adopted ones);
    not registered anywhere."""
    spec = spec or k.spec
    ctx = _check_state_sizes(rt, k, device, spec)
    with ctx.lock:
        ctx.check()
        twin = _Twin(rt, ctx, spec, k.id, k.address, k.tenant, tuple(k.params), states=states)
    if states is not None:
        states[:] = twin._presets   # adopted ones are None now
    try:
        ctx.run_once(twin.init_commands([np.zeros(0, np.uint8)] * len(spec.state_sizes)))   # empty: left as is
    except BaseException:
        with ctx.lock:
            twin.free()
        raise
    return twin


def _swap_halves(k: Kernel, twin: Kernel) -> None:
    for name in DEVICE_ATTRS:
        a, b = getattr(k, name), getattr(twin, name)
        setattr(k, name, b)
        setattr(twin, name, a)
    if k.local_slot >= 0:
        k.ctx.local[k.local_slot] = k
    if twin.local_slot >= 0:
        twin.ctx.local[twin.local_slot] = twin


def _free_twin(twin: Kernel) -> None:
    """Free a twin that never became the kernel (the GPU no longer uses it)."""
    ctx = twin.ctx
    twin.destroyed = True
    try:
        with ctx.lock:
            twin.free()
    except VkmError as exc:
        log.warning("could not free the migration target's resources on GPU %d: %s", ctx.index, exc)


def _retire_half(rt: Any, half: Kernel, lost: bool) -> None:
    """Free what a moved kernel left on its old device: at once, except its outbox
    while batches it sent there are not yet delivered."""
    ctx = half.ctx
    half.destroyed = True
    outbox = half.outbox
    stepper = rt._contexts.get(ctx.index, (None, None))[1]
    pending = [] if lost or stepper is None else \
        [b for b in stepper.batches if isinstance(b, OutboxBatch) and b.buffer is outbox and not b.done]
    keep = [] if lost else [outbox]
    pool = rt._buffer_pool()
    try:
        with ctx.lock:
            for s in half.sets + list(half.deliver_sets.values()):
                if ctx.alive:
                    ctx.free_set(s)
            half.sets, half.deliver_sets = [], {}
            if half.local_slot >= 0:
                if ctx.local[half.local_slot] is half:
                    ctx.release_local_slot(half.local_slot)
                half.local_slot = -1
        for b in half.buffers:
            if b in keep:
                continue
            if lost or isinstance(b, MappedBuffer):
                b.destroy()
            else:
                pool.put(b)   # no GPU work uses it any more: the runtime's steps and the copies are done
    except VkmError as exc:
        log.warning("could not free a moved kernel's resources on GPU %d: %s", ctx.index, exc)
    half.buffers = []
    if keep:
        rt._retire(_Retired(ctx, keep, pending, outbox.handle_int))


# -- quiesce ----------------------------------------------------------------------------------

def _deadline(timeout: float | None) -> float:
    return time.monotonic() + (timeout if timeout is not None else 1e18)


def _left(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise VkmTimeout(f"{what} did not finish in time")
    return left


def _wait_kernel(rt: Any, k: Kernel, deadline: float) -> None:
    if k.last_value:
        rt._wait_points([k.ctx.point(k.last_value)], _left(deadline, f"the steps of {k.id!r}"))


def _wait_jobs(rt: Any, device: int, deadline: float) -> None:
    """Wait for the runtime's own GPU jobs on `device` (policy captures reading state)."""
    ext = rt.__dict__.get("_extras_by_device", {}).get(device)
    if ext is not None and ext.jobs.value:
        ext.jobs.wait(ext.jobs.point(ext.jobs.value), _left(deadline, f"GPU {device}'s checkpoint captures"))


def _pump_router(rt: Any) -> int:
    """Let the router submit what it can of its queued moves (their batches land as
    inbound batches); returns how many still wait (their edges' landings full).
    Called with the runtime's gate held (no step runs)."""
    for listener in list(rt._listeners):
        listener([])   # a step without batches: the router submits waiting moves
    feed = rt.outbox_feed
    eng = getattr(feed, "_engine", None)
    if eng is None:
        return 0
    with feed._delivery_lock:
        return eng.queued_moves()


# -- the staging batch --------------------------------------------------------------------------

def _stage(rt: Any, k: Kernel, deadline: float) -> tuple[Buffer | None, int]:
    """Take every message waiting for k in batches on its device into a staging
    batch on that device (one GPU pass per batch, in the stepper's order);
    returns the buffer (None when there were none) and the message count."""
    ctx, stepper = rt._device(k.device_index)
    with ctx.lock:
        stepper.harvest()
        batches = [b for b in stepper.batches if not b.done and (b.pending is None or k in b.pending)
                   and k not in b.cleared]
    if not batches:
        return None, 0
    cap = 0
    for b in batches:
        cap += (b.size - RING_HEADER_BYTES) // k.slot_size if isinstance(b, InboundBatch) \
            else b.kernel.spec.outbox_capacity
    size = RING_HEADER_BYTES + cap * k.slot_size
    ring = Buffer(ctx.slot, size)
    status = MappedBuffer(ctx.slot, 4 * _STATUS_WORDS * len(batches))
    sets: list[Any] = []
    try:
        for b in batches:
            hook = getattr(b, "submitted", None)
            if hook is not None and b.waits:
                hook(_left(deadline, "a landing's transfer submit"))
        with ctx.lock:
            for b in batches:
                sets.append(ctx.descriptor_set(ctx.deliver, [(b.buffer.handle, 0, b.size), (ring.handle, 0, WHOLE_SIZE),
                                                             (status.handle, 0, WHOLE_SIZE)]))
        header = np.array([0, 0, cap, k.slot_words], np.uint32).tobytes()
        waits = [(p.semaphore, p.value) for b in batches for p in b.waits]
        layout, pipe = ctx.deliver.layout, ctx.deliver.pipeline

        def record(cmd: Any) -> None:
            cmds.barrier(cmd)
            cmds.fill(cmd, ring.handle, 0, RING_HEADER_BYTES)
            cmds.barrier(cmd)
            cmds.update(cmd, ring.handle, 0, header)
            cmds.barrier(cmd)
            cmds.bind_pipeline(cmd, pipe)
            for i, (b, (_, dset)) in enumerate(zip(batches, sets)):
                cmds.bind_set(cmd, layout, dset, (b.offset,))
                cmds.push(cmd, layout, _DELIVER_PUSH.pack(k.address, k.tenant, i * _STATUS_WORDS,
                                                         getattr(b, "hops", 0), 0, 0, 0, 0))
                cmds.dispatch(cmd, 1)
                cmds.barrier(cmd)
            # ring -> batch form: header word 0 (head, 0) becomes the count (the tail)
            vk.vkCmdCopyBuffer(cmd, ring.handle, ring.handle, 1, [vk.VkBufferCopy(srcOffset=4, dstOffset=0, size=4)])
            cmds.barrier(cmd, host=True)
        jobs = rt._extras(ctx.index).jobs
        point = jobs.submit(record, waits)
        jobs.wait(point, _left(deadline, "the staging pass"))
        counts = status.words[:_STATUS_WORDS * len(batches)].reshape(-1, _STATUS_WORDS)
        total = 0
        with ctx.lock:
            for b, (taken, left, rejected, _) in zip(batches, counts.tolist()):
                if left:
                    raise MigrationError(f"{left} message(s) for {k.id!r} did not fit the staging batch")
                total += taken
                b.delivered += taken
                b.rejected += rejected
                if rejected and b.source is not None and not b.source.destroyed:
                    b.source.stats.rejected += rejected
                    b.source.errors.append(f"{rejected} message(s) rejected by kernel {k.id!r} of tenant "
                                           f"{k.tenant}: a message may not cross tenants")
                b.cleared.add(k)
                if b.pending is not None:
                    b.pending.discard(k)
                b.finish_if_done(ctx.completed())
            ctx.cond.notify_all()
    except BaseException:
        ring.destroy()
        raise
    finally:
        with ctx.lock:
            for s in sets:
                ctx.free_set(s)
        status.destroy()
    if total == 0:
        ring.destroy()
        return None, 0
    return ring, total


def _hand_back(rt: Any, device: int, rings: list[Buffer], front: bool = False) -> None:
    """Give staging batches to the kernels of `device`, in order (freed once
    delivered); `front`: before every batch already there (their messages are
    older than any still waiting there)."""
    ctx, stepper = rt._device(device)
    for i, ring in enumerate(rings):
        b = rt.accept_batch(device, ring, 0, ring.size)
        if front:
            with ctx.lock:
                stepper.batches.remove(b)
                stepper.batches.insert(i, b)
        rt._retire(_Retired(ctx, [ring], [b]))


# -- transfers --------------------------------------------------------------------------------

def _engine(rt: Any, a: int, b: int) -> tuple[str, Engine]:
    """The transfer engine for a -> b with the pair's best method (kept per runtime)."""
    cache = rt.__dict__.setdefault("_move_engines", {})
    method = rt.coordinator.transfer_method(a, b) if callable(getattr(rt.coordinator, "transfer_method", None)) \
        else None
    if method is None or method == "none":
        class _Src:
            device_index = a
        method = select_transfer_method(_Src(), rt.manager.capabilities, dst_index=b)
    cached = cache.get((a, b))
    if cached is not None and cached[0] == method and not cached[1]._destroyed:
        return cached
    eng = Engine(rt.manager.slot(a), rt.manager.slot(b), method)
    cache[(a, b)] = (method, eng)
    return method, eng


def destroy_engines(rt: Any, timeout: float) -> None:
    """Destroy the transfer engines migrations made (the runtime's destroy())."""
    for _, eng in rt.__dict__.pop("_move_engines", {}).values():
        try:
            eng.destroy(timeout)
        except VkmError as exc:
            log.warning("a migration transfer did not finish at teardown: %s", exc)


# -- finishing a move -----------------------------------------------------------------------------

def _finish_move(rt: Any, k: Kernel, twin: Kernel, source_alive: bool) -> None:
    """The swap (runtime gate held): k takes the twin's resources, the directory
    is rewritten everywhere, batches on other devices stop delivering to k."""
    old_ctx, new_ctx = k.ctx, twin.ctx
    locks = sorted({old_ctx.index: old_ctx, new_ctx.index: new_ctx}.items())
    for _, c in locks:
        c.lock.acquire()
    try:
        _swap_halves(k, twin)
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


def _assign(rt: Any, k: Kernel, device: int, request: MigrationRequest | None) -> None:
    coord = rt.coordinator
    if request is not None:
        coord.complete_migration(request)
    elif coord.get_kernel_device(k.id) != device:
        coord.assign_kernel(k.id, device)


def _source_usable(ctx: Any, rt: Any = None) -> bool:
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


# -- the switch ---------------------------------------------------------------------------------

def switch_at_step_boundary(rt: Any, k: Kernel, deadline: float, rings: list[Buffer],
                            switch: Any) -> tuple[Any, float, int]:
    """Run `switch(rings)` with the runtime's gate held, once every submitted step
    is done, the router has submitted its queued moves and every message waiting
    for k on its device is in `rings` (staging batches, oldest first). While the
    router's moves wait for room, the gate is let go between rounds so the
    other kernels step and free it (what they sent k meanwhile is staged in the
    next round). Returns (switch's result, seconds spent quiescing, messages staged)."""
    gate = gate_of(rt)
    src = k.device_index
    quiesce = 0.0
    staged = 0
    while True:
        with gate.exclusive(_left(deadline, "waiting for the runtime's steps"), f"moving {k.id!r}"):
            t0 = time.monotonic()
            k.check()
            rt.synchronize(_left(deadline, "the runtime's submitted steps"))
            _wait_jobs(rt, src, deadline)
            waiting = _pump_router(rt)
            ring, n = _stage(rt, k, deadline)   # also frees landings that wait only for k
            if ring is not None:
                rings.append(ring)
                staged += n
            quiesce += time.monotonic() - t0
            if not waiting:
                return switch(rings), quiesce, staged
        if time.monotonic() >= deadline:
            raise VkmTimeout(f"the K2K router still has {waiting} move(s) waiting for room on their edges (their "
                             f"destinations' landings are full: step the other kernels, then migrate again)")
        time.sleep(0.002)   # the others step meanwhile


# -- live migration -----------------------------------------------------------------------------

_CLOSE_TIMEOUT = 30.0


def _hash_on_arrival(rt: Any, dst: int, buffers: list, tickets: list, deadline: float) -> Any:
    """The destination's CRC32 job of `buffers` (whole), ordered after the copies
    `tickets` by their timeline points (the device waits, not the host). The
    shader's submit waits on its own queue, which a single-queue device shares
    with the copies: their GPU work is submitted first (wait_submitted)."""
    crc = rt._crc(dst)
    if getattr(crc, "kind", "shader") == "shader":
        for t in tickets:
            t.wait_submitted(_left(deadline, "the copies' submission"))
    return crc.submit([(b, 0, b.size) for b in buffers], [t.dst_ready for t in tickets])


def _switch(rt: Any, k: Kernel, twin: Kernel, request: MigrationRequest, eng: Engine, tickets: list,
            rings: list[Buffer], crcs: list, verify: bool, deadline: float) -> tuple:
    """The end of a migration, with the gate held and nothing left to stage: control
    block, inbox and staging batches follow the state, the CRC32s are compared
    (`crcs`: the state buffers' jobs on the source and the destination, submitted
    when the copy was), the kernel swaps to the twin. Returns (transfer s,
    verify s, match, restore s, bytes)."""
    src, dst = k.device_index, twin.device_index
    t0 = time.monotonic()
    small = [(k.control, twin.control), (k.inbox, twin.inbox)]
    landings = [Buffer(twin.ctx.slot, ring.size) for ring in rings]
    try:
        small += list(zip(rings, landings))
        if verify and len(crcs) == 1:
            # the shader's job would wait for the copies on the target's step queue and hold back
            # the steps queued behind it: it is queued now, when no step runs (the gate is held)
            crcs.append(_hash_on_arrival(rt, dst, twin.states, tickets, deadline))
        more = [eng.submit(src_buffer=a, dst_buffer=b, size=a.size) for a, b in small]
        if verify:   # final on the source (gate held, staged); on the target once they landed
            crcs.append(rt._crc(src).submit([(a, 0, a.size) for a, _ in small]))
            crcs.append(_hash_on_arrival(rt, dst, [b for _, b in small], more, deadline))
        for t in tickets + more:
            t.wait(_left(deadline, "the GPU-to-GPU copies"))
        transfer_d = time.monotonic() - t0
        request.state = MigrationState.RESTORING
        t0 = time.monotonic()
        match = None
        verify_d = 0.0
        if verify:
            src_states, dst_states, src_small, dst_small = crcs
            want = src_states.result(_left(deadline, "the source's CRC32")) + \
                src_small.result(_left(deadline, "the source's CRC32"))
            got = dst_states.result(_left(deadline, "the destination's CRC32")) + \
                dst_small.result(_left(deadline, "the destination's CRC32"))
            names = [f"state{i}" for i in range(len(k.states))] + ["control", "inbox"] + \
                [f"staging{i}" for i in range(len(rings))]
            bad = [n for n, a, b in zip(names, want, got) if a != b]
            verify_d = time.monotonic() - t0
            if bad:
                raise MigrationError(f"CRC32 mismatch after the copy to GPU {dst}: {', '.join(bad)} "
                                     f"(source {[hex(w) for w in want]}, destination {[hex(g) for g in got]})"[:900])
            match = True
        k.check()
    except BaseException:
        for job in crcs:   # nothing may still read the landings when they are freed
            job.close(_CLOSE_TIMEOUT)
        for b in landings:
            b.destroy()
        raise
    _finish_move(rt, k, twin, True)   # nothing below raises: the kernel has moved
    if landings:
        _hand_back(rt, dst, landings)
    _assign(rt, k, dst, request)
    return transfer_d, verify_d, match, time.monotonic() - t0, sum(a.size for a, _ in small)


def migrate_live(rt: Any, k: Kernel, request: MigrationRequest, timeout: float | None, verify: bool) -> Any:
    from .migrator import MigrationResult

    start = time.monotonic()
    deadline = _deadline(timeout)
    request.started_at = start
    src, dst = k.device_index, request.target_device
    if request.source_device != src:
        raise MigrationError(f"the request moves {k.id!r} from GPU {request.source_device}, but it runs on GPU {src}")
    if dst == src:
        raise MigrationError(f"kernel {k.id!r} already runs on GPU {dst}")
    if not 0 <= dst < rt.manager.device_count:
        raise MigrationError(f"GPU {dst} is not a device of this runtime's manager ({rt.manager.device_count})")
    request.state = MigrationState.QUIESCING
    why = f"migrating to GPU {dst}"
    rt._hold(k, why, moving=True)
    twin = None
    rings: list[Buffer] = []
    crcs: list[Any] = []   # CRC32 jobs: source, destination states; source, destination small buffers
    presets: list[Any] = []   # the twin's state buffers until it adopts them
    staged = 0
    swapped = False
    try:
        t0 = time.monotonic()
        # a step() that took k before the hold may still be recording: once the gate
        # is granted it has submitted (and set k.last_value), and no later step takes k
        with gate_of(rt).exclusive(_left(deadline, "waiting for the runtime's steps"), f"quiescing {k.id!r}"):
            pass
        _wait_kernel(rt, k, deadline)
        k.check()
        quiesce_d = time.monotonic() - t0

        request.state = MigrationState.CHECKPOINTING
        t0 = time.monotonic()
        if verify:   # the source's state no longer changes: hash it while the copy runs and the twin is built
            crcs.append(rt._crc(src).submit([(s, 0, s.size) for s in k.states]))
        presets = state_buffers(rt, k, dst)
        checkpoint_d = time.monotonic() - t0

        request.state = MigrationState.TRANSFERRING
        t0 = time.monotonic()
        method, eng = _engine(rt, src, dst)
        tickets = [eng.submit(src_buffer=a, dst_buffer=b, size=a.size) for a, b in zip(k.states, presets)]
        moved = sum(s.size for s in k.states)
        twin = build_twin(rt, k, dst, states=presets)   # while the state copies run
        if verify and rt._crc(dst).kind == "host":   # hashes as soon as the copies land (a host wait)
            crcs.append(_hash_on_arrival(rt, dst, twin.states, tickets, deadline))
        transfer_d = time.monotonic() - t0

        def switch(rings: list[Buffer]) -> tuple:
            nonlocal swapped
            out = _switch(rt, k, twin, request, eng, tickets, rings, crcs, verify, deadline)
            swapped = True
            return out
        result, quiesce_add, staged = switch_at_step_boundary(rt, k, deadline, rings, switch)
        quiesce_d += quiesce_add
        transfer_add, verify_d, match, restore_d, small_bytes = result
        transfer_d += transfer_add
        moved += small_bytes
        old, twin = twin, None
        _retire_half(rt, old, lost=False)
        for ring in rings:
            ring.destroy()
        rings = []
    except BaseException as exc:
        for job in crcs:   # nothing may still read the twin's buffers when they are freed
            job.close(_CLOSE_TIMEOUT)
        if not swapped:
            if rings:
                try:
                    _hand_back(rt, src, rings, front=True)   # the messages taken go back to the kernel where it is
                    rings = []
                except VkmError as back:
                    log.error("migration of %r failed and %d staged message(s) could not be handed back: %s",
                              k.id, staged, back)
            if twin is not None:
                _free_twin(twin)
            for b in presets:   # those no twin adopted (their destroy() waits for the copies into them)
                if b is not None:
                    b.destroy()
        if isinstance(exc, MigrationError):
            raise
        raise MigrationError(f"live migration of {k.id!r} from GPU {src} to GPU {dst} failed: {exc}") from exc
    finally:
        for ring in rings:
            ring.destroy()
        rt._release(k, why, moving=True)
    request.state = MigrationState.COMPLETED
    total = time.monotonic() - start
    return MigrationResult(k.id, src, dst, moved, checkpoint_d, transfer_d, restore_d, total, quiesce_d, verify_d,
                           moved, staged, method, match, live=True)
