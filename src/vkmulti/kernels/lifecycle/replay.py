"""Bringing the kernels of a lost GPU back on the survivors (the failover's
restore; Failover calls `restore_lost_kernels`).

For each kernel of the lost device that has a policy checkpoint:

1. the survivors' submitted steps are waited for and harvested, and the
   replay log (replay_log.py) reads every completed copy: the consumption of
   every kernel is then known up to its newest step;
2. the kernel is rebuilt from its latest checkpoint (step C) on the device the
   coordinator's unregister plan names (`restore(..., into=k)`: same object,
   id and address; the per-destination sequence numbers come back with it);
3. its steps C..L-1 (L: the steps it had made) run again, submitted back to
   back (the step engine's window paces them) and waited for once per run of
   steps, each taking exactly the message slots the original step consumed
   (host and K2K messages, from the log) and nothing else; what the replayed
   steps send is not delivered, and what they send the host is dropped for
   the steps whose messages the host had already received; a
   send() to the kernel meanwhile (another thread) waits until its host
   queue is its own again (Kernel.restoring);
4. the messages nobody consumed yet are handed again, in order, through the
   host queue of their receiver: those the lost kernels sent (their batches
   still on the survivors are withdrawn) and those sent to the lost kernels
   (their copies waiting on the survivors are cleared for them). Per pair the
   receiver consumed a prefix (FIFO), so each message arrives exactly once.

A kernel without a checkpoint, or whose inputs since it are not all logged
(a real loss: the copies of the steps in flight are not trusted), is
released and listed in `lost_kernels` as before.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import struct
import time
from typing import Any

from ...errors import VkmError
from ...errors import TimeoutError as VkmTimeout
from .restore import restore_into
from .twin import LifecycleView, RuntimeView
from ..._core.checks import short_repr

log = logging.getLogger(__name__)

__all__ = ["restore_lost_kernels", "RECOVERY_TIMEOUT"]

#: seconds the restore of one lost device may take in all (waits for the survivors, replays)
RECOVERY_TIMEOUT = 60.0
#: the hold a failover keeps on a kernel it restores and replays
_RESTORING = "restored after its GPU was lost"


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise VkmTimeout("the restore of a lost device's kernels ran out of time")
    return left


def _survivors(rt: RuntimeView, lost: int) -> list[tuple[Any, Any]]:
    with rt._lock:
        return [(c, s) for i, (c, s) in rt._contexts.items() if i != lost and c.alive]


def _quiesce_survivors(rt: RuntimeView, lost: int, deadline: float) -> None:
    """Wait for every submitted step of the surviving devices and harvest it."""
    for ctx, _ in _survivors(rt, lost):
        if ctx.value:
            rt._wait_point(ctx.point(ctx.value), deadline, _left(deadline))


def _target(rt: RuntimeView, k: Any, lost: set[int]) -> int:
    get = getattr(rt.coordinator, "get_kernel_device", None)
    dev = get(k.id) if callable(get) else None
    if isinstance(dev, int) and dev not in lost and 0 <= dev < rt.manager.device_count:
        return dev
    return rt.coordinator.select_device()


def _replay_steps(rt: RuntimeView, k: Any, inputs: list[list[bytes]], keep_k2h: bool, deadline: float) -> None:
    """Run steps of k again back to back, each taking its logged input slots `inputs[i]`
    (the step engine's in-flight window and region checks pace them), then wait for the
    last: what they send is not delivered; what they send the host is dropped unless
    `keep_k2h` (the host never received it: those steps were in flight at the loss)."""
    ctx, stepper = rt._device(k.device_index)
    n0 = len(k.received)
    before = dataclasses.replace(k.stats)
    errors = len(k.errors)
    point = None
    for slots in inputs:
        with ctx.lock:
            k.h2k.clear()
            k.h2k.extend(slots)
            point, ran, held, new = stepper.step([k], [], deadline, 0)
            if not ran:
                raise VkmError(f"kernel {short_repr(k.id)}: its replayed step {k.steps} was held back: {held}")
            for b in new:   # what it sends again is handed from the log to those who have not consumed it
                b.done = True
                b.event.set()
            ctx.cond.notify_all()
    if point is None:
        return
    rt._wait_point(point, deadline, _left(deadline))
    with ctx.lock:
        if keep_k2h:   # (their submits were counted once, by the original run)
            k.stats.steps_submitted = before.steps_submitted
        else:   # the host received these steps' messages, counts and errors from the original run
            while len(k.received) > n0:
                k.received.pop()
            del k.errors[errors:]
            for f in dataclasses.fields(before):
                if f.name not in ("steps_completed", "clock"):   # (the clock is the replay's: not replayed)
                    setattr(k.stats, f.name, getattr(before, f.name))
        ctx.cond.notify_all()


def restore_lost_kernels(life: LifecycleView, device: int, kernels: list[Any], pair: Any, drained: bool,
                         lost_devices: set[int]) -> tuple[list[Any], list[Any], int, int]:
    """Restore `kernels` (of lost `device`, whose (context, stepper) is `pair`) on the
    survivors; returns (restored, not restored, steps replayed, messages handed again).
    `life`: the runtime's Lifecycle (its policy holds the checkpoints and the replay log)."""
    rt = life.rt
    state = life.policy_state
    if state is None or not kernels:
        return [], list(kernels), 0, 0
    replay = state.replay
    deadline = time.monotonic() + RECOVERY_TIMEOUT
    unharvested: dict[int, set[int]] = {}   # (kernel -> steps whose reports the host never read)
    if pair is not None:
        with pair[0].lock:
            if drained:   # they all ran: their reports (host messages, counts) are read as a harvest would
                pair[1].read_drained()
            for rec in pair[1].inflight:
                for k, _, step in rec.kernels:
                    unharvested.setdefault(id(k), set()).add(step)
    _quiesce_survivors(rt, device, deadline)
    try:
        state.materialize(wait=True, timeout=_left(deadline), drained=frozenset({device}) if drained else frozenset())
    except VkmError as exc:
        log.warning("failover: not every checkpoint capture could be read: %s", exc)
    state.drop_device(device)
    replay.materialize(wait=True, timeout=_left(deadline), drained=frozenset({device}) if drained else frozenset())
    replay.drop_device(device)   # copies not trusted (a real loss): those steps are not logged
    restored, gone = [], []
    replayed = 0
    for k in kernels:
        if k.device_index != device:   # (a move or a restore of another call took it off the device meanwhile)
            continue
        img = state.latest_image(k.id)   # (the newest capture as it is: no Checkpoint made and parsed)
        kl = replay.kernels.get(k.id)
        if img is None:
            log.error("failover: kernel %r cannot be restored: it has no completed checkpoint", k.id)
            gone.append(k)
            continue
        start, end = img.steps, k.steps
        if start > end or (start < end and (kl is None or kl.address != k.address or not kl.covers(start, end))):
            log.error("failover: kernel %r cannot be restored exactly: its checkpoint is at step %d, its inputs "
                      "of steps %d..%d are not all logged", k.id, start, start, end - 1)
            gone.append(k)
            continue
        target = _target(rt, k, lost_devices)
        old_ctx = k.ctx
        with old_ctx.lock:   # calls on k wait until its queues and state are its own again (another thread's
            if k.destroyed or k.ctx is not old_ctx or old_ctx.index != device:   # send would be taken by a
                continue   # replayed step, or cleared with the replay's inputs; a read would see a step between)
            k.restoring = True
            pending = list(k.h2k)   # host messages it had not taken yet
        ok = False
        life.hold(k, _RESTORING, moving=True)   # (write_state, destroy_kernel, moves: after the replay)
        try:
            k.check()   # (destroyed meanwhile: not restored)
            restore_into(life, k, img, target, _left(deadline), failover=True)
            k.replaying = True
            kept = unharvested.get(id(k), set())
            try:   # (runs of steps whose host messages are dropped or kept: one wait each)
                for keep, run in itertools.groupby(range(start, end), key=lambda step: step in kept):
                    _replay_steps(rt, k, [kl.inputs[step] for step in run], keep, deadline)
            finally:
                k.replaying = False
            ok = True
        except VkmError as exc:
            if k.destroyed or k.device_index == device:
                log.error("failover: kernel %r could not be restored on GPU %d: %s", k.id, target, exc)
        finally:
            _end_restoring(k, old_ctx, pending if ok else [])
            life.release(k, _RESTORING, moving=True)
        if not ok:
            if k.destroyed or k.device_index == device:
                gone.append(k)
            continue   # (else a move or a restore of another call took it off the device first: it lives on)
        replayed += end - start
        restored.append(k)
    handed = _hand_again(rt, replay, device, restored, gone)
    return restored, gone, replayed, handed


def _end_restoring(k: Any, old_ctx: Any, pending: list[bytes]) -> None:
    """k's host queue back to the messages it had not taken before its restore (none if the
    restore failed), and the sends that waited meanwhile go on."""
    ctx = k.ctx
    with ctx.lock:
        k.h2k.clear()
        k.h2k.extend(pending)
        k.restoring = False
        ctx.cond.notify_all()
    if old_ctx is not ctx:
        with old_ctx.lock:
            old_ctx.cond.notify_all()


def _hand_again(rt: RuntimeView, replay: Any, device: int, restored: list[Any], gone: list[Any]) -> int:
    """Hand the messages nobody consumed yet to their receivers again (see the module
    docstring, 4); the number handed."""
    moved = {id(k) for k in restored} | {id(k) for k in gone}   # (what a lost kernel had sent is still due)
    lost_addresses = {k.address for k in restored} | {k.address for k in gone}
    for ctx, stepper in _survivors(rt, device):
        with ctx.lock:
            for b in list(stepper.batches):
                origin = getattr(b, "k2k_origin", None)
                src = b.source if b.source is not None else getattr(origin, "kernel", None)
                if src is not None and id(src) in moved and not b.done:
                    b.done = True   # its messages are handed again from the log
                    b.event.set()
            ctx.cond.notify_all()
    per_dest: dict[int, list[tuple[int, int, int, bytes]]] = {}
    for src, dst in replay.pairs_with(lost_addresses):
        crossed = (src in lost_addresses) != (dst in lost_addresses)   # (between the lost GPU and another)
        for seq, call, slot in replay.unconsumed(src, dst):
            per_dest.setdefault(dst, []).append((call, src, seq, _crossed(slot) if crossed else slot))
    handed = 0
    for dst, items in per_dest.items():
        k = rt._by_index.get(dst % rt.max_kernels)
        if k is None or k.address != dst or k.destroyed:
            if dst not in {g.address for g in gone}:
                continue
            log.error("failover: %d message(s) for the lost kernel at address %d are dropped with it", len(items),
                      dst)
            continue
        items.sort(key=lambda e: (e[0], e[1], e[2]))
        replay.hand(k, [(call, slot) for call, _, _, slot in items])
        handed += len(items)
    return handed


#: where a packed message's hop count is (messages.ENVELOPE: its ninth field, VKM_HOPS)
_HOPS_AT = struct.calcsize("<IIQQIIII")


def _crossed(slot: bytes) -> bytes:
    """`slot` with one hop more: a message handed again through its receiver's host queue
    counts the device it would have crossed on the way it was sent (the router's move)."""
    out = bytearray(slot)
    struct.pack_into("<I", out, _HOPS_AT, struct.unpack_from("<I", out, _HOPS_AT)[0] + 1)
    return bytes(out)
