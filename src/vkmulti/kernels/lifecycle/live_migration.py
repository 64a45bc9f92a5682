"""Moving a runtime kernel to another device: live migration (GPU to GPU), on
the twin mechanism of twin.py, which restore.py shares.

The twin is built and filled while the kernel stays where it is; then, at a
step boundary of the whole runtime (its gate held exclusively: no step is
being recorded or submitted), the kernel's Residency is swapped with the
twin's. What the twin is left with is freed once nothing reads it (its outbox
only after the batches it sent are delivered).

Live migration (`migrate_live`):

0. ahead: the pipelines it needs are found built on both devices (or their
   background build waited for), and the twin is built on the target (its
   buffers from the migration pool, its descriptor sets, zeroed rings) while
   the kernel still steps;
1. quiesce: the kernel is held back from stepping (a step() that took it
   before the hold is let finish submitting: the gate, once) and its
   submitted steps finish; its state can no longer change;
2. the source's control block, inbox and state buffers (final: only the
   kernel's own steps write them) are copied GPU to GPU with the pair's best
   transfer method into the twin's in chunks (chunked_copy.py), the small
   ones first, while the other kernels keep stepping; each chunk is hashed on both
   devices, the target's hash queued behind that chunk's timeline point (no
   host round trip between copy and hash): at once by the host engine, at
   the switch by a GPU's shader, one job for every chunk (its job waits on
   the step queue, which must not hold back the others' steps);
3. the switch, with the runtime's gate held: every submitted step finishes,
   the K2K router's queued moves are submitted (their batches land), then one
   GPU pass on the source takes every message still waiting for the kernel
   there (in local outboxes and landed batches, in delivery order) into a
   staging batch, marking them delivered where they were; the staging
   batches (if any) follow the state (behind its copies) and are hashed on
   both sides; the hashes are compared with the source's (a move makes as
   many submits and host waits whatever its chunk count);
4. the kernel's Residency is swapped with the twin's, its directory entry is
   rewritten on every device (their next steps), batches still on the other
   devices are told not to deliver to it (their copies of its messages were
   taken on the source), the staging batch is handed to the target; the
   coordinator completes the migration. Steps resume: messages sent during
   the move reach the kernel after those taken over, none twice.

The CRC32 engine of each device is `Lifecycle.crc(device)` (see
`KernelRuntime.migration_crc`): the GPU shader (gpu_crc.py), or on a CPU
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

from ...errors import MigrationError, TimeoutError as VkmTimeout, VkmError
from ...memory.image import Buffer
from ..engine import recording as cmds
from ...memory.buffer import MappedBuffer
from ..engine.device_context import WHOLE_SIZE
from ..engine.gate import gate_of
from ..engine.kernel import InboundBatch, Kernel, Residency
from ..messages import RING_HEADER_BYTES
from ..coordinator.records import MigrationRequest, MigrationState
from .chunked_copy import ChunkedCopy, HostChunkedCopy, chunked_copy
from .migrator import MigrationResult
from .twin import (LifecycleView, assign, build_twin, check_residency, deadline_of, finish_move, free_twin, hand_back,
                   retire_half, state_buffers, time_left, wait_jobs, wait_kernel)
from ..._core.checks import short_repr, short_str

log = logging.getLogger(__name__)

__all__ = ["migrate_live", "switch_at_step_boundary"]

_DELIVER_PUSH = struct.Struct("<8I")
_STATUS_WORDS = 4


def _pump_router(rt: Any) -> int:
    """Let the router (the runtime's outbox feed) submit what it can of its queued
    moves (their batches land as inbound batches); returns how many still wait
    (their edges' landings full). Called with the runtime's gate held (no step runs)."""
    feed = rt.outbox_feed
    return 0 if feed is None else feed.flush()


# -- the staging batch --------------------------------------------------------------------------

def _stage(life: LifecycleView, k: Kernel, deadline: float) -> tuple[Buffer | None, int]:
    """Take every message waiting for k in batches on its device into a staging
    batch on that device (one GPU pass per batch, in the stepper's order);
    returns the buffer (None when there were none) and the message count."""
    ctx, stepper = life.rt._device(k.device_index)
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
    ran = True   # False from the pass's submit until its wait saw it done
    try:
        for b in batches:
            hook = getattr(b, "submitted", None)
            if hook is not None and b.waits:
                hook(time_left(deadline, "a landing's transfer submit"))
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
        jobs = life.extras(ctx.index).jobs
        with ctx.lock:   # a batch the router took back since (withdraw_batch) may wait on a relay or link it freed
            if any(b.done for b in batches):
                raise MigrationError(f"messages landed for {short_repr(k.id)} were taken back by the K2K router "
                                     f"(detached) while they were staged; migrate it again")
            point = jobs.submit(record, waits, users=[ring, status, *(b.buffer for b in batches)])
            ran = False
        jobs.wait(point, time_left(deadline, "the staging pass"))
        ran = True
        counts = status.words[:_STATUS_WORDS * len(batches)].reshape(-1, _STATUS_WORDS)
        total = 0
        with ctx.lock:
            for b, (taken, left, rejected, _) in zip(batches, counts.tolist()):
                if left:
                    raise MigrationError(f"{left} message(s) for {short_repr(k.id)} did not fit the staging batch")
                total += taken
                b.delivered += taken
                b.rejected += rejected
                if rejected and b.source is not None and not b.source.destroyed:
                    b.source.stats.rejected += rejected
                    b.source.errors.append(f"{rejected} message(s) rejected by kernel {short_repr(k.id)} of tenant "
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
        if ran:   # (else the pass may still run, as on a reported loss: its sets go with the context's pools)
            with ctx.lock:
                for s in sets:
                    ctx.free_set(s)
        status.destroy()
    if total == 0:
        ring.destroy()
        return None, 0
    return ring, total


# -- the switch ---------------------------------------------------------------------------------

def switch_at_step_boundary(life: LifecycleView, k: Kernel, deadline: float, rings: list[Buffer],
                            switch: Any, residency: Residency) -> tuple[Any, float, int]:
    """Run `switch(rings)` with the runtime's gate held, once every submitted step
    is done, the router has submitted its queued moves and every message waiting
    for k on its device is in `rings` (staging batches, oldest first). While the
    router's moves wait for room, the gate is let go between rounds until the
    other kernels make a step and free it (what they sent k meanwhile is staged
    in the next round). `residency`: k's Residency when the caller began (a
    MigrationError, before anything is staged, once another move or restore has
    replaced it). Returns (switch's result, seconds spent quiescing, messages staged)."""
    rt = life.rt
    gate = gate_of(rt)
    src = k.device_index
    quiesce = 0.0
    staged = 0
    while True:
        with gate.exclusive(time_left(deadline, "waiting for the runtime's steps"), f"moving {short_repr(k.id)}"):
            t0 = time.monotonic()
            k.check()
            check_residency(k, residency)
            rt.synchronize(time_left(deadline, "the runtime's submitted steps"))
            wait_jobs(life, src, deadline)
            waiting = _pump_router(rt)
            ring, n = _stage(life, k, deadline)   # also frees landings that wait only for k
            if ring is not None:
                rings.append(ring)
                staged += n
            quiesce += time.monotonic() - t0
            if not waiting:
                return switch(rings), quiesce, staged
            steps = life.steps_done   # (no step runs while the gate is held)
        left = deadline - time.monotonic()
        if left <= 0:
            raise VkmTimeout(f"the K2K router still has {waiting} move(s) waiting for room on their edges (their "
                             f"destinations' landings are full: step the other kernels, then migrate again)")
        if ring is None:   # nothing freed by this round: the others step meanwhile
            life.wait_for_step(steps, min(left, _ROUND_WAIT))


# -- live migration -----------------------------------------------------------------------------

_CLOSE_TIMEOUT = 30.0
#: The longest wait between two rounds of the switch for another step (a move may also get room without one).
_ROUND_WAIT = 0.05


def _switch(life: LifecycleView, k: Kernel, twin: Kernel, request: MigrationRequest,
            copy: ChunkedCopy | HostChunkedCopy, rings: list[Buffer], crcs: list, verify: bool,
            deadline: float, residency: Residency) -> tuple:
    """The end of a migration, with the gate held and nothing left to stage: the
    staging batches follow the state (on a GPU appended to `copy`, between two
    CPU devices a host copy of their own, put in `crcs`), the CRC32s are
    compared chunk by chunk, the kernel swaps to the twin. Returns (transfer s,
    verify s, match, restore s, bytes of the staging batches)."""
    src, dst = k.device_index, twin.device_index
    t0 = time.monotonic()
    landings = [Buffer(twin.ctx.slot, ring.size) for ring in rings]
    staging = list(zip(rings, landings))
    try:
        names = [f"staging{i}" for i in range(len(rings))]
        tail: HostChunkedCopy | None = None
        if isinstance(copy, HostChunkedCopy):   # two CPU devices: by the host, hashed as copied
            if staging:
                tail = HostChunkedCopy(staging, life.crc(src), life.crc(dst), verify, names=names)
                crcs.append(tail)
        elif staging:   # behind the state's copies; hashed on the source now (gate held, staged: final)
            copy.follow(staging, names)
        # the shader's destination job waits for the copies on the target's step queue and would hold
        # back the steps queued behind it: it is queued now, when no step runs (the gate is held)
        copy.submit_landings(time_left(deadline, "the copies' submission"))
        copy.wait(time_left(deadline, "the GPU-to-GPU copies"))
        if tail is not None:
            tail.wait(time_left(deadline, "the host's copies"))
        transfer_d = time.monotonic() - t0
        request.state = MigrationState.RESTORING
        t0 = time.monotonic()
        match = None
        verify_d = 0.0
        if verify:
            bad = copy.mismatches(time_left(deadline, "the CRC32 of the state's chunks"))
            if tail is not None:
                bad += tail.mismatches(time_left(deadline, "the CRC32 of the staging batches"))
            verify_d = time.monotonic() - t0
            if bad:
                raise MigrationError(f"CRC32 mismatch after the copy to GPU {dst}: {', '.join(bad)}"[:900])
            match = True
        k.check()
    except BaseException:
        copy.close(_CLOSE_TIMEOUT)   # nothing may still read the twin's buffers or the landings when freed
        for job in crcs:
            job.close(_CLOSE_TIMEOUT)
        for b in landings:
            b.destroy()
        raise
    t0 = time.monotonic()   # (the restore phase: after the check, not counting it again)
    try:
        finish_move(life.rt, k, twin, residency)   # nothing below raises: the kernel has moved
    except BaseException:
        copy.close(_CLOSE_TIMEOUT)
        for job in crcs:
            job.close(_CLOSE_TIMEOUT)
        for b in landings:
            b.destroy()
        raise
    if landings:
        hand_back(life, dst, landings)
    assign(life.rt.coordinator, k, dst, request)
    return transfer_d, verify_d, match, time.monotonic() - t0, sum(a.size for a, _ in staging)


def _crc_engines(life: LifecycleView, src: int, dst: int, verify: bool, deadline: float) -> tuple[Any, Any]:
    """The CRC32 engines of the move's chunked copy: both devices' when it checks, or
    when both are the host's (two CPU devices: the host copies); else None, None
    (a move that does not check makes no GPU CRC32 engine). Made (once per device)
    before `deadline`."""
    if verify or all(life.crc_kind(life.rt._context(d)) == "host" for d in (src, dst)):
        made = life.crc(src, time_left(deadline, f"the CRC32 engine of GPU {src}"))
        return made, life.crc(dst, time_left(deadline, f"the CRC32 engine of GPU {dst}"))
    return None, None


def _failure(exc: BaseException, what: str) -> BaseException:
    """What a migration that failed with `exc` raises: `exc` itself for a MigrationError or
    Ctrl-C (KeyboardInterrupt), a vkmulti.TimeoutError for a wait that ran out of time,
    else a MigrationError naming `what`."""
    if isinstance(exc, MigrationError) or not isinstance(exc, Exception):
        return exc
    if isinstance(exc, VkmTimeout):
        return VkmTimeout(f"{what} did not finish in time: {short_str(exc)}")
    return MigrationError(f"{what} failed: {short_str(exc)}")


def _twin_ahead(life: LifecycleView, k: Kernel, dst: int, deadline: float) -> tuple[Kernel, list[Any], float]:
    """(twin on `dst` with its state buffers, what is left of the presets, seconds it
    took), built before the kernel is held: buffers (from the migration pool),
    descriptor sets and rings are ready before the quiesced window."""
    t0 = time.monotonic()
    presets: list[Any] = []
    twin = None
    try:
        presets = state_buffers(life.rt, life.pool, k, dst)
        twin = build_twin(life.rt, life.pool, k, dst, states=presets,
                          timeout=time_left(deadline, f"building {k.id!r}'s twin on GPU {dst}"))
    except BaseException as exc:
        if twin is not None:
            free_twin(twin)
        for b in presets:
            if b is not None:
                b.destroy()
        err = _failure(exc, f"live migration of {short_repr(k.id)} to GPU {dst}")
        if err is exc:
            raise
        raise err from exc
    return twin, presets, time.monotonic() - t0


def migrate_live(life: LifecycleView, k: Kernel, request: MigrationRequest, timeout: float | None,
                 verify: bool) -> MigrationResult:
    """Live-migrate k as `request` says (see the module docstring); `life`: the
    runtime's Lifecycle."""
    rt = life.rt
    start = time.monotonic()
    deadline = deadline_of(timeout)
    request.started_at = start
    src, dst = k.device_index, request.target_device
    if request.source_device != src:
        raise MigrationError(f"the request moves {short_repr(k.id)} from GPU {short_repr(request.source_device)}, "
                             f"but it runs on GPU {src}")
    if dst == src:
        raise MigrationError(f"kernel {short_repr(k.id)} already runs on GPU {dst}")
    if not 0 <= dst < rt.manager.device_count:
        raise MigrationError(f"GPU {short_repr(dst)} is not a device of this runtime's manager "
                             f"({rt.manager.device_count})")
    for device in (dst, src):   # pipelines built ahead (or that build waited for) while k still steps
        life.prebuild.ensure(k.spec, device, time_left(deadline, f"the pipelines of {short_repr(k.id)} on GPU {device}"))
    t0 = time.monotonic()
    twin = life.twins.take(k, dst, deadline)   # made ahead (ready_twins.py), or built now, while k still steps
    if twin is not None:
        presets: list[Any] = []
        prepare_d = time.monotonic() - t0
    else:
        twin, presets, prepare_d = _twin_ahead(life, k, dst, deadline)
    src_crc, dst_crc = _crc_engines(life, src, dst, verify, deadline)
    request.state = MigrationState.QUIESCING
    why = f"migrating to GPU {dst}"
    life.hold(k, why, moving=True)
    rings: list[Buffer] = []
    crcs: list[Any] = []   # the staging batches' host copy between two CPU devices (its CRC32 jobs)
    copy: ChunkedCopy | HostChunkedCopy | None = None
    staged = 0
    swapped = False
    try:
        t0 = time.monotonic()
        # a step() that took k before the hold may still be recording: once the gate
        # is granted it has submitted (and set k.last_value), and no later step takes k
        with gate_of(rt).exclusive(time_left(deadline, "waiting for the runtime's steps"), f"quiescing {short_repr(k.id)}"):
            pass
        wait_kernel(rt, k, deadline)
        k.check()
        quiesce_d = time.monotonic() - t0

        request.state = MigrationState.CHECKPOINTING
        checkpoint_d = prepare_d

        request.state = MigrationState.TRANSFERRING
        t0 = time.monotonic()
        method, eng = life.engines.get(src, dst)
        # control block, inbox and state in chunks, each hashed on both devices as it lands (the source's
        # bytes no longer change: only k's own steps write them, and k is held); the small ones first, so
        # that nothing lands after the state but what the switch stages
        res = k.residency   # (a restore into k or another move meanwhile replaces it: the switch refuses then)
        pairs = [(res.control, twin.control), (res.inbox, twin.inbox), *zip(res.states, twin.states)]
        copy = chunked_copy(eng, pairs, src_crc, dst_crc, verify,
                            names=["control", "inbox"] + [f"state{i}" for i in range(len(res.states))])
        moved = copy.bytes
        transfer_d = time.monotonic() - t0

        def switch(rings: list[Buffer]) -> tuple:
            nonlocal swapped
            if (twin.spec.spirv, twin.spec.entry_point) != (k.spec.spirv, k.spec.entry_point):
                raise MigrationError(f"the code of {short_repr(k.id)} was reloaded while it moved; migrate it again")
            out = _switch(life, k, twin, request, copy, rings, crcs, verify, deadline, res)
            swapped = True
            return out
        result, quiesce_add, staged = switch_at_step_boundary(life, k, deadline, rings, switch, res)
        quiesce_d += quiesce_add
        transfer_add, verify_d, match, restore_d, staged_bytes = result
        transfer_d += transfer_add
        moved += staged_bytes
        old, twin = twin, None
        if not life.twins.recycle(k, old):   # the twin for a move back, or freed
            retire_half(life, old, lost=False)
        for ring in rings:
            ring.destroy()
        rings = []
    except BaseException as exc:
        if copy is not None:   # nothing may still read the twin's buffers when they are freed
            copy.close(_CLOSE_TIMEOUT)
        for job in crcs:
            job.close(_CLOSE_TIMEOUT)
        if not swapped:
            if rings:
                try:
                    hand_back(life, src, rings, front=True)   # the messages taken go back to the kernel where it is
                    rings = []
                except VkmError as back:
                    log.error("migration of %r failed and %d staged message(s) could not be handed back: %s",
                              k.id, staged, back)
            if twin is not None:
                free_twin(twin)
            for b in presets:   # those no twin adopted (their destroy() waits for the copies into them)
                if b is not None:
                    b.destroy()
        err = _failure(exc, f"live migration of {short_repr(k.id)} from GPU {src} to GPU {dst}")
        if err is exc:
            raise
        raise err from exc
    finally:
        for ring in rings:
            ring.destroy()
        life.release(k, why, moving=True)
    request.state = MigrationState.COMPLETED
    total = time.monotonic() - start
    life.twins.request(k)   # its twins for the next move, from its new device
    return MigrationResult(k.id, src, dst, moved, checkpoint_d, transfer_d, restore_d, total, quiesce_d, verify_d,  # type: ignore[arg-type]
                           moved, staged, method, match, live=True)
