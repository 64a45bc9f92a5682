"""Restoring a runtime kernel from a checkpoint's image: as a new kernel, or into
an existing one (same object, id and address) on any device, on the twin
mechanism of twin.py (its messages waiting on a live old device
are carried over as a migration does; a lost device's resources are freed
without waiting, and the restore may then run inside a step: the failover)."""
from __future__ import annotations

import logging
import time
import struct

from typing import Any

import numpy as np

from ...errors import MigrationError, TimeoutError as VkmTimeout, VkmError
from ...memory.image import Buffer
from ..checkpoint.restorable import check_restore_target
from ..engine.gate import gate_of
from ..engine.kernel import Kernel
from ..engine.step_ops import BARRIER
from .image import KernelImage, StagedUpload, patch_control, readdress_slots, staged_copies, upload_many
from .live_migration import switch_at_step_boundary
from .twin import (LifecycleView, RuntimeView, assign, build_twin, check_residency, deadline_of, drained_lost,
                   finish_move, free_twin, hand_back, retire_half, source_usable, time_left, wait_jobs, wait_kernel)
from ..._core.checks import short_repr

log = logging.getLogger(__name__)

__all__ = ["restore_into", "restore_new"]


def _uploads(k: Kernel, img: KernelImage, keep_sequences: bool) -> list[tuple[Any, int, np.ndarray]]:
    """(buffer, offset, bytes) of k's control block, inbox and states from `img`."""
    control = patch_control(img.control, k.address, k.tenant, k.ctx.table_size, keep_sequences)
    inbox = np.frombuffer(img.inbox, np.uint8)
    if inbox.nbytes != k.inbox.size:
        raise MigrationError(f"the checkpoint's inbox is {inbox.nbytes} bytes, the kernel's {k.inbox.size}")
    return [(k.control, 0, control), (k.inbox, 0, inbox)] + \
        [(buf, 0, np.frombuffer(data, np.uint8)) for buf, data in zip(k.states, img.states)]


class _Staged:
    """The uploads of a restore: recorded into the twin's initialising submit
    (build_twin's `then`), or into a ready twin as a native job (`fill`); the
    staging buffer goes back to the device's StagingBuffers once that submit is
    done (done()), else it is destroyed (free(); one that a submit whose wait gave
    up still reads is left to the manager's teardown, never freed under it)."""

    def __init__(self, img: KernelImage, keep_sequences: bool):
        self.img, self.keep = img, keep_sequences
        self.upload: StagedUpload | None = None
        self.staging: Any = None   # the StagingBuffers of the twin's device

    def _stage(self, twin: Kernel) -> StagedUpload | None:
        self.staging = twin.ctx.staging
        self.upload = staged_copies(self.staging, _uploads(twin, self.img, self.keep))
        return self.upload

    def __call__(self, twin: Kernel) -> tuple[Any, list[Buffer]]:
        up = self._stage(twin)
        return (up.record, [up.buffer]) if up is not None else (lambda cmd: None, [])

    def fill(self, life: LifecycleView, twin: Kernel, deadline: float) -> None:
        """Write the uploads into a ready twin (initialised when it was made): one job
        on its device's step queue, recorded and submitted natively, waited for."""
        try:
            up = self._stage(twin)
            if up is not None:
                jobs = life.extras(twin.device_index).jobs
                point = jobs.submit_ops(b"".join([BARRIER, *up.ops(), BARRIER]), users=[*twin.buffers, up.buffer])
                jobs.wait(point, time_left(deadline, "the restore's upload"))
        except BaseException:
            free_twin(twin)
            raise

    def done(self) -> None:
        if self.upload is not None:
            self.staging.give_back(self.upload.buffer)
            self.upload = None

    def free(self) -> None:
        if self.upload is not None:
            buffer, self.upload = self.upload.buffer, None
            try:
                buffer.destroy(0.0)   # (at once: the caller's deadline is spent, or its submit is done)
            except VkmTimeout:   # a submit whose wait gave up still reads it: the manager frees it later
                log.info("a failed restore's staging buffer stays until the GPU is done with it")


def _apply_host_side(k: Kernel, img: KernelImage, fresh: bool) -> None:
    k.steps = img.steps
    k.stats.clock = img.clock
    if fresh:
        k.host_seq = img.host_seq
        k.h2k.clear()
        k.h2k.extend(readdress_slots(img.h2k, k.address))
        k.received.clear()
        k.received.extend(img.received)
        return
    newer = [s for s in k.h2k if struct.unpack_from("<Q", s, 8)[0] >= img.host_seq]
    k.h2k.clear()
    k.h2k.extend(readdress_slots(img.h2k, k.address) + newer)


def restore_into(life: LifecycleView, k: Kernel, img: KernelImage, device: int | None, timeout: float | None,
                 failover: bool = False) -> Kernel:
    """Rebuild `k` (same object, id and address) from `img` on `device` (`life`: the runtime's
    Lifecycle); `failover`: the failover's restore of a kernel of a lost device (Kernel.restoring)."""
    rt = life.rt
    deadline = deadline_of(timeout)
    old_ctx, res = k.ctx, k.residency
    alive = source_usable(old_ctx, rt)
    if device is None:
        device = k.device_index if alive else rt.coordinator.select_device()
    if not 0 <= device < rt.manager.device_count:
        raise ValueError(f"device {short_repr(device)} out of range: {rt.manager.device_count} device(s)")
    check_restore_target(rt, img.spec.groups, img.kernel_id, device)
    life.prebuild.ensure(img.spec, device, timeout)   # built ahead, or that build waited for: before the hold
    why = f"restored from a checkpoint onto GPU {device}"
    life.hold(k, why, moving=True)
    twin = None
    rings: list[Buffer] = []
    done = False
    try:
        if alive:
            wait_kernel(rt, k, deadline)
        staged = _Staged(img, keep_sequences=img.address == k.address)
        # its sequence numbers go back to the checkpoint's (not so for a failover's: its replay brings them
        # back to where they were): the replay log numbers its messages on from there
        policy = life.policy_state
        rebase = policy.replay if policy is not None and staged.keep and not failover else None
        try:   # the state, control block and inbox written in the twin's initialising submit
            twin = life.twins.take(k, device, deadline) if img.spec == k.spec else None   # (ready_twins.py)
            if twin is not None:
                staged.fill(life, twin, deadline)
            else:
                twin = build_twin(rt, life.pool, k, device, img.spec, then=staged,
                                  timeout=time_left(deadline, f"restoring {k.id!r} onto GPU {device}"))
            staged.done()
        finally:
            staged.free()

        def switch(rings: list[Buffer]) -> None:
            nonlocal done
            landings = []
            try:
                if rings:
                    _, eng = life.engines.get(old_ctx.index, device)
                    landings = [Buffer(twin.ctx.slot, r.size) for r in rings]  # type: ignore[union-attr]
                    tickets = [eng.submit(src_buffer=r, dst_buffer=b, size=r.size) for r, b in zip(rings, landings)]
                    for t in tickets:
                        t.wait(time_left(deadline, "the copy of the staged messages"))
                k.check()
                if rebase is not None:   # everything k sent so far in the log before its numbers go back
                    rebase.materialize(wait=True, timeout=time_left(deadline, "the replay log's copies"),
                                       drained=drained_lost(rt, old_ctx.index))
            except BaseException:
                for b in landings:
                    b.destroy()
                raise
            try:
                finish_move(rt, k, twin, res, failover)  # type: ignore[arg-type]
            except BaseException:
                for b in landings:
                    b.destroy()
                raise
            done = True
            if rebase is not None:
                rebase.rebase(k.address, patch_control(img.control, k.address, k.tenant, k.ctx.table_size, True))
            _apply_host_side(k, img, fresh=False)
            if landings:
                hand_back(life, device, landings)
            assign(rt.coordinator, k, device, None)

        if alive and old_ctx is not twin.ctx:
            switch_at_step_boundary(life, k, deadline, rings, switch, res)
        elif alive:
            with gate_of(rt).exclusive(time_left(deadline, "waiting for the runtime's steps"), f"restoring {short_repr(k.id)}"):
                k.check()
                check_residency(k, res)
                rt.synchronize(time_left(deadline, "the runtime's submitted steps"))
                wait_jobs(life, old_ctx.index, deadline)
                switch([])
        else:
            # From a lost device (a failover, maybe inside a step) the device locks suffice: nothing
            # runs there, and no message waits there that could still be taken over.
            switch([])
        half, twin = twin, None
        retire_half(life, half, lost=not alive)
    except BaseException:
        if not done:
            if rings:
                try:
                    hand_back(life, old_ctx.index, rings, front=True)
                    rings = []
                except VkmError:
                    log.exception("could not hand staged messages back to %r", k.id)
            if twin is not None:
                free_twin(twin)
        raise
    finally:
        for r in rings:
            r.destroy()
        life.release(k, why, moving=True)
    life.twins.request(k)   # its twins for the next move, from its new device
    return k


def restore_new(rt: RuntimeView, img: KernelImage, device: int | None, kernel_id: str | None,
                timeout: float | None) -> Kernel:
    """A new kernel (new address) from `img`, launched and filled within `timeout` s."""
    check_restore_target(rt, img.spec.groups, img.kernel_id, device)
    deadline = deadline_of(timeout)
    k = rt.launch(img.spec, kernel_id if kernel_id is not None else img.kernel_id, device=device,
                  params=img.params, tenant=img.tenant, timeout=time_left(deadline, "launching the restored kernel"))
    try:
        with k.ctx.lock:
            k.check()
            keep = False   # a new address: receivers count its messages from 0
            upload_many(k.ctx, _uploads(k, img, keep), time_left(deadline, f"restoring {k.id!r}'s state"))
            _apply_host_side(k, img, fresh=True)
    except BaseException:
        try:
            rt.destroy_kernel(k, timeout=max(0.0, deadline - time.monotonic()))
        except VkmError as exc:   # (stopped: the runtime's destroy() frees it; the error raised is the first)
            log.warning("the kernel of a restore that failed is not freed yet: %s", exc)
        raise
    return k
