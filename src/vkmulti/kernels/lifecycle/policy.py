"""The checkpoint policy of a KernelRuntime: when kernels are captured by
themselves (CheckpointPolicy), and the captures in flight and completed
(PolicyState, which also owns the replay log the failover restores lost
kernels with). The runtime's Lifecycle (lifecycle.py) installs it.

A capture due after a step is copied by that step itself (its command
buffer ends with the copies: `plan`; its host-side part is taken right
after the submit, under the device's lock); a capture the step could not
take is a GPU job queued behind the step() call (`after_step`). A completed
capture's bytes are read into host memory at once (a lost device's memory
is not read later); the Checkpoint is made from them only when asked for
(`latest`, a storage that saves each; the failover restores from the
image itself), so a capture after every step costs the host little."""
from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

import vulkan as vk

from ..._core.checks import int_in
from ..._core.lifetime import Deadline

from ...errors import DeviceLostError, TimeoutError as VkmTimeout, VkmError
from ..checkpoint.format import Checkpoint
from ..checkpoint.storage import CheckpointStorage
from ...memory.buffer import MappedBuffer
from ..engine.gpu_jobs import GpuJobs, StepTimeline
from ..ids import KernelId, as_kernel_id
from ..engine.kernel import Kernel
from .image import KernelImage, fill_image, image_copy_ops, image_meta, image_sources, queue_image_copy, to_checkpoint
from ...memory.staging import SpareBuffers
from .replay_log import ReplayLog, still_running
from .twin import LifecycleView

log = logging.getLogger(__name__)

__all__ = ["CheckpointPolicy", "PolicyState"]


@dataclass
class CheckpointPolicy:
    """When the runtime checkpoints its kernels by itself: after every
    `every_steps`-th step of each kernel (0: never) and after every step of the
    kernels named in `critical`; `keep` checkpoints per kernel are kept in memory;
    `storage` (optional) also gets each, saved as f"{kernel_id}@{step}"."""
    every_steps: int = 0
    critical: Iterable[str] = ()
    keep: int = 1
    storage: CheckpointStorage | None = None

    def __post_init__(self) -> None:
        int_in(self.every_steps, "every_steps", 0, 1 << 40)
        int_in(self.keep, "keep", 1, 1 << 16)
        if isinstance(self.critical, str):
            raise TypeError("critical must be a collection of kernel ids, not one str")
        self.critical = frozenset(as_kernel_id(k, "critical kernel id") for k in self.critical)
        if self.storage is not None and not isinstance(self.storage, CheckpointStorage):
            raise TypeError(f"storage must be a CheckpointStorage, got {type(self.storage).__name__}")

    def __repr__(self) -> str:
        return (f"CheckpointPolicy(every_steps={self.every_steps}, {len(self.critical)} critical, keep={self.keep}, "  # type: ignore[arg-type]
                f"storage={type(self.storage).__name__ if self.storage is not None else None})")

    def due(self, kernel_id: str, steps: int) -> bool:
        """Whether a kernel that has made `steps` steps gets a checkpoint now."""
        if kernel_id in self.critical:
            return True
        return self.every_steps > 0 and steps % self.every_steps == 0


@dataclass
class _Capture:
    """A checkpoint being copied to host-visible memory on the GPU."""
    kernel: Kernel
    image: KernelImage           # everything but the device bytes
    buffer: MappedBuffer
    sizes: list[int]
    jobs: GpuJobs | StepTimeline
    point: Any
    stale: bool = False          # of an earlier kernel of its id, or of a state replaced since (restart)


class _Completed:
    """A completed capture (its image, device bytes included): its Checkpoint is made
    the first time one is asked for (`get`, with the policy state's lock held)."""

    __slots__ = ("image", "cp")

    def __init__(self, image: KernelImage):
        self.image = image
        self.cp: Checkpoint | None = None

    @property
    def steps(self) -> int:
        return self.image.steps

    def get(self) -> Checkpoint:
        if self.cp is None:
            self.cp = to_checkpoint(self.image)
        return self.cp


class _CapturePlan:
    """Captures copied at the end of one step (a StepCapture): kernel, buffer, sizes and its
    step count after the step, each."""

    __slots__ = ("state", "ctx", "items", "copies")

    def __init__(self, state: "PolicyState", ctx: Any, items: list[tuple[Kernel, MappedBuffer, list[int], int]],
                 copies: list[bytes]):
        self.state, self.ctx, self.items, self.copies = state, ctx, items, copies

    def submitted(self, point: Any) -> None:
        """The step ran (its device's lock still held): each capture's host-side part now,
        at the step count it has after this step."""
        caps = []
        for k, buf, sizes, steps in self.items:
            img = image_meta(k)
            img.steps = steps
            caps.append(_Capture(k, img, buf, sizes, StepTimeline(self.ctx), point))
        with self.state.lock:
            self.state.pending += caps

    def abandon(self) -> None:
        for _, buf, _, _ in self.items:
            self.state.spares.give(buf)


class _StepPlans:
    """Several StepCaptures of one step as one."""

    __slots__ = ("plans", "copies")

    def __init__(self, plans: list[Any]):
        self.plans = plans
        self.copies = [c for p in plans for c in p.copies]

    def submitted(self, point: Any) -> None:
        for p in self.plans:
            p.submitted(point)

    def abandon(self) -> None:
        for p in self.plans:
            p.abandon()


class PolicyState:
    """The policy's captures of one runtime (`life`: its Lifecycle, whose GPU jobs copy them)."""

    def __init__(self, life: LifecycleView, policy: CheckpointPolicy):
        self.life, self.policy = life, policy
        self.lock = threading.Lock()
        self.pending: list[_Capture] = []
        self.done: dict[KernelId, deque[_Completed]] = {}
        self.spares = SpareBuffers()   # capture buffers whose copies were read, for later ones
        #: what the kernels consumed and sent since their checkpoints (the failover's replay input)
        self.replay = ReplayLog(life)

    def covers(self, kernel_id: str) -> bool:
        """Whether the policy checkpoints this kernel at all (so it can be restored)."""
        return self.policy.every_steps > 0 or kernel_id in self.policy.critical

    def _wants(self, k: Kernel, steps: int) -> bool:
        """Whether k, once it made `steps` steps, gets a capture (no step of k runs meanwhile:
        its device's lock held, or the step() call's turn)."""
        if not self.covers(k.id):
            return False
        if self.policy.due(k.id, steps):
            return True
        with self.lock:   # a first checkpoint at once: a loss before the first due one is covered
            return k.id not in self.done and not any(c.kernel is k and not c.stale for c in self.pending)

    def plan(self, ctx: Any, ks: list[Kernel]) -> Any:
        """What the step of `ks` about to be recorded on `ctx` copies at its end (a
        StepCapture, or None): the replay log's rings and the captures due after it."""
        logged = self.replay.plan(ctx, ks)
        try:
            captures = self._plan_captures(ctx, ks)
        except BaseException:
            if logged is not None:
                logged.abandon()
            raise
        plans = [p for p in (logged, captures) if p is not None]
        return None if not plans else plans[0] if len(plans) == 1 else _StepPlans(plans)

    def _plan_captures(self, ctx: Any, ks: list[Kernel]) -> _CapturePlan | None:
        items: list[tuple[Kernel, MappedBuffer, list[int], int]] = []
        copies: list[bytes] = []
        for k in ks:
            if k.destroyed or k.ctx is not ctx or k.replaying or not self._wants(k, k.steps + 1):
                continue
            srcs, sizes = image_sources(k)
            try:
                buf = self.spares.get(ctx.slot, sum(sizes))
            except (VkmError, vk.VkError, MemoryError):
                continue   # (after_step tries again, and says why if it cannot either)
            copies += image_copy_ops(srcs, sizes, buf)
            items.append((k, buf, sizes, k.steps + 1))
        return _CapturePlan(self, ctx, items, copies) if items else None

    def after_step(self, launched: list[Kernel]) -> None:
        """The captures due after a step() call that its steps did not copy themselves
        (no plan: the policy came mid-call, or a buffer could not be made then), or of
        kernels just launched or restored, queued now as GPU jobs behind their steps
        (queue_image_copy takes the step count and queues the copy under the device lock)."""
        for k in launched:
            if k.destroyed:
                continue
            with self.lock:   # (by its step, or a job already: pending, or read back since)
                q = self.done.get(KernelId(k.id))
                copied = any(c.kernel is k and not c.stale and c.image.steps == k.steps for c in self.pending) or \
                    (q is not None and q[-1].steps == k.steps)
            if copied or not self._wants(k, k.steps):
                continue
            try:
                self._capture(k)
            except (VkmError, vk.VkError, MemoryError) as exc:
                log.warning("checkpoint policy: could not capture kernel %r at step %d: %s", k.id, k.steps, exc)

    def restart(self, k: Kernel, replaced: bool) -> None:
        """Forget the captures under k's id that do not hold k's state: those of an earlier
        kernel of that id (k was just launched), or all of them (`replaced`: k's state was
        just restored from a checkpoint), so that k's next capture is taken at once and
        is the one its restore after a loss starts from."""
        with self.lock:
            q = self.done.get(KernelId(k.id))
            if q is not None:
                mine = deque(e for e in q if not replaced and e.image.address == k.address)
                if mine:
                    self.done[KernelId(k.id)] = mine
                else:
                    del self.done[KernelId(k.id)]
            for c in self.pending:
                if c.kernel.id == k.id and (replaced or c.kernel is not k):
                    c.stale = True

    def _capture(self, k: Kernel) -> None:
        ctx = k.ctx
        srcs, sizes = image_sources(k)
        jobs = self.life.extras(ctx.index).jobs
        buf = self.spares.get(ctx.slot, sum(sizes))
        try:
            img, point = queue_image_copy(k, jobs, srcs, sizes, buf)
        except BaseException:
            buf.destroy()
            raise
        with self.lock:
            self.pending.append(_Capture(k, img, buf, sizes, jobs, point))

    def materialize(self, wait: bool = False, timeout: float | None = None,
                    drained: frozenset[int] = frozenset()) -> None:
        """Turn completed captures into Checkpoints (all of them, waiting, with `wait`, within
        `timeout` s for them all; on the lost devices in `drained`, known to have run all
        their work, all of them)."""
        deadline = Deadline(timeout)
        with self.lock:
            pending, self.pending = self.pending, []
        keep = []
        for c in pending:
            try:
                if c.jobs.slot.index in drained:
                    pass
                elif wait:
                    c.jobs.wait(c.point, deadline.left())
                elif c.jobs.completed() < c.point.value:
                    keep.append(c)
                    continue
            except (DeviceLostError, VkmTimeout):
                keep.append(c)   # (a lost device's: the failover reads it or drops it, drop_device)
                continue
            img = fill_image(c.image, c.buffer.bytes, c.sizes)
            self.spares.give(c.buffer)
            entry = _Completed(img)
            with self.lock:
                if c.stale:   # (not its kernel's state any more: see restart)
                    continue
                q = self.done.setdefault(img.kernel_id, deque())  # type: ignore[arg-type]
                at = len(q)   # in step order: another thread's read of a newer capture may have come first
                while at and q[at - 1].steps > img.steps:
                    at -= 1
                q.insert(at, entry)
                while len(q) > self.policy.keep:
                    q.popleft()
                stats = getattr(self.life.rt, "failover_stats", None)
                if stats is not None:
                    stats.checkpoints_taken += 1
                cp = entry.get() if self.policy.storage is not None else None
            if cp is not None:
                try:
                    self.policy.storage.save(cp, f"{img.kernel_id}@{img.steps}")  # type: ignore[union-attr]
                except (VkmError, OSError, ValueError) as exc:
                    log.warning("checkpoint policy: could not store the checkpoint of %r: %s", img.kernel_id, exc)
        with self.lock:
            self.pending = keep + self.pending

    def drop_device(self, device: int) -> None:
        """Forget the captures still pending on lost GPU `device` (their copies are not trusted)."""
        with self.lock:
            lost = [c for c in self.pending if c.jobs.slot.index == device]
            self.pending = [c for c in self.pending if c.jobs.slot.index != device]
        for c in lost:
            log.warning("checkpoint policy: the capture of %r at step %d was lost with its device",
                        c.image.kernel_id, c.image.steps)
            try:
                c.buffer.destroy()
            except VkmError:
                pass

    def latest_image(self, kernel_id: KernelId) -> KernelImage | None:
        """The image of the newest completed capture of a kernel (what its Checkpoint holds,
        without making one: the failover restores from it), or None."""
        with self.lock:
            q = self.done.get(kernel_id)
            return q[-1].image if q else None

    def latest(self, kernel_id: KernelId) -> Checkpoint | None:
        self.materialize()
        with self.lock:
            q = self.done.get(kernel_id)
            return q[-1].get() if q else None

    def destroy(self) -> None:
        try:
            self.materialize(wait=True, timeout=30.0)
        except VkmError:
            pass
        self.replay.destroy()
        with self.lock:
            pending, self.pending = self.pending, []
        for c in pending:
            if still_running(c):   # nothing the GPU may still write is freed
                log.warning("checkpoint policy: a capture of %r still runs at destroy(); its buffer is left to "
                            "its device's destruction", c.image.kernel_id)
                continue
            c.buffer.destroy()
        self.spares.destroy()

