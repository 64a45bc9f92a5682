"""The checkpoint policy of a KernelRuntime: when kernels are captured by
themselves (CheckpointPolicy), and the captures in flight and completed
(PolicyState, which also owns the replay log the failover restores lost
kernels with). The runtime's Lifecycle (lifecycle.py) installs it.

A capture due after a step is copied by that step itself (its command
buffer ends with the copies: `plan`), its host-side part taken once the
step() call returns (`after_step`); a capture the step could not take is a
GPU job queued behind it. A completed capture stays in its host-visible
buffer until its Checkpoint is asked for (`latest`, the failover, a
storage that saves each): a newer one of the same kernel recycles it
unread, so a capture after every step costs the host little."""
from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

import vulkan as vk

from ..._core.checks import int_in

from ...errors import DeviceLostError, TimeoutError as VkmTimeout, VkmError
from ..checkpoint.format import Checkpoint
from ..checkpoint.storage import CheckpointStorage
from ..engine import recording as cmds
from ..engine.device_context import MappedBuffer
from ..engine.gpu_jobs import GpuJobs, StepTimeline
from ..engine.step_ops import copy_op
from ..ids import KernelId, as_kernel_id
from ..engine.kernel import Kernel
from .image import KernelImage, fill_image, image_meta, image_sources, record_image_copy, to_checkpoint
from .replay_log import ReplayLog, keep_spare
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
    image: KernelImage | None    # everything but the device bytes (None: the kernel was destroyed)
    buffer: MappedBuffer
    sizes: list[int]
    jobs: GpuJobs | StepTimeline
    point: Any


class _Completed:
    """A completed capture: its Checkpoint is made from the buffer the first time it is
    asked for (`get`). Used with the policy state's lock held; the buffers they let go
    (`take_buffer`) are spared by the caller after."""

    __slots__ = ("image", "buffer", "sizes", "cp", "read")

    def __init__(self, image: KernelImage, buffer: MappedBuffer, sizes: list[int]):
        self.image, self.sizes = image, sizes
        self.buffer: MappedBuffer | None = buffer
        self.cp: Checkpoint | None = None
        self.read = False   # the image holds the device bytes

    @property
    def steps(self) -> int:
        return self.image.steps

    def filled(self) -> KernelImage:
        """The kernel's image, its device bytes read from the buffer the first time."""
        if not self.read:
            fill_image(self.image, self.buffer.bytes, self.sizes)  # type: ignore[union-attr]
            self.read = True
        return self.image

    def get(self) -> Checkpoint:
        """The Checkpoint (made from the image the first time)."""
        if self.cp is None:
            self.cp = to_checkpoint(self.filled())
        return self.cp

    def take_buffer(self) -> MappedBuffer | None:
        """The buffer, once its Checkpoint is made or will never be (None: let go already)."""
        buf, self.buffer = self.buffer, None
        return buf


class _CapturePlan:
    """Captures copied at the end of one step (a StepCapture): kernel, buffer, sizes each."""

    __slots__ = ("state", "ctx", "items", "copies")

    def __init__(self, state: "PolicyState", ctx: Any, items: list[tuple[Kernel, MappedBuffer, list[int]]],
                 copies: list[bytes]):
        self.state, self.ctx, self.items, self.copies = state, ctx, items, copies

    def submitted(self, point: Any) -> None:
        with self.state.lock:
            self.state.awaiting += [(k, buf, sizes, self.ctx, point) for k, buf, sizes in self.items]

    def abandon(self) -> None:
        for _, buf, _ in self.items:
            self.state._spared(buf)


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
        #: captures copied by their steps, whose host-side part after_step() takes
        self.awaiting: list[tuple[Kernel, MappedBuffer, list[int], Any, Any]] = []
        self.done: dict[KernelId, deque[_Completed]] = {}
        self.spare: dict[tuple[int, int], list[MappedBuffer]] = {}
        #: what the kernels consumed and sent since their checkpoints (the failover's replay input)
        self.replay = ReplayLog(life)

    def covers(self, kernel_id: str) -> bool:
        """Whether the policy checkpoints this kernel at all (so it can be restored)."""
        return self.policy.every_steps > 0 or kernel_id in self.policy.critical

    def _wants(self, k: Kernel, steps: int) -> bool:
        """Whether k, once it made `steps` steps, gets a capture (its lock held)."""
        if not self.covers(k.id):
            return False
        if self.policy.due(k.id, steps):
            return True
        with self.lock:   # a first checkpoint at once: a loss before the first due one is covered
            return k.id not in self.done and not any(c.kernel is k for c in self.pending) and \
                not any(a[0] is k for a in self.awaiting)

    def plan(self, ctx: Any, ks: list[Kernel]) -> Any:
        """What the step of `ks` about to be recorded on `ctx` copies at its end (a
        StepCapture, or None): the replay log's rings and the captures due after it."""
        plans = [p for p in (self.replay.plan(ctx, ks), self._plan_captures(ctx, ks)) if p is not None]
        return None if not plans else plans[0] if len(plans) == 1 else _StepPlans(plans)

    def _plan_captures(self, ctx: Any, ks: list[Kernel]) -> _CapturePlan | None:
        items: list[tuple[Kernel, MappedBuffer, list[int]]] = []
        copies: list[bytes] = []
        for k in ks:
            if k.destroyed or k.ctx is not ctx or k.replaying or not self._wants(k, k.steps + 1):
                continue
            srcs, sizes = image_sources(k)
            try:
                buf = self._buffer(ctx, sum(sizes))
            except (VkmError, vk.VkError, MemoryError):
                continue   # (after_step tries again, and says why if it cannot either)
            at = 0
            for src, n in zip(srcs, sizes):
                copies.append(copy_op(src.handle_int, buf.handle_int, 0, at, n))
                at += n
            items.append((k, buf, sizes))
        return _CapturePlan(self, ctx, items, copies) if items else None

    def _buffer(self, ctx: Any, total: int) -> MappedBuffer:
        with self.lock:
            pool = self.spare.get((ctx.index, total))
            buf = pool.pop() if pool else None
        return buf if buf is not None else MappedBuffer(ctx.slot, total)

    def _spared(self, buf: MappedBuffer) -> None:
        """Keep `buf` (nothing reads or writes it any more) for a later capture, or free it."""
        with self.lock:
            pool = self.spare.setdefault((buf.slot.index, buf.size), [])
            if keep_spare(pool, buf.size):
                pool.append(buf)
                return
        buf.destroy()

    def after_step(self, launched: list[Kernel]) -> None:
        """The captures due after a step() call: the host-side part of those its steps
        copied, the others queued now as GPU jobs behind the steps."""
        with self.lock:
            awaiting, self.awaiting = self.awaiting, []
        taken = set()
        for k, buf, sizes, ctx, point in awaiting:
            with ctx.lock:
                img = None if k.destroyed else image_meta(k)
            with self.lock:
                self.pending.append(_Capture(k, img, buf, sizes, StepTimeline(ctx), point))
            taken.add(id(k))
        for k in launched:
            if k.destroyed or id(k) in taken:
                continue
            with k.ctx.lock:
                wanted = self._wants(k, k.steps)
            if not wanted:
                continue
            try:
                self._capture(k)
            except (VkmError, vk.VkError, MemoryError) as exc:
                log.warning("checkpoint policy: could not capture kernel %r at step %d: %s", k.id, k.steps, exc)

    def _capture(self, k: Kernel) -> None:
        ctx = k.ctx
        srcs, sizes = image_sources(k)
        jobs = self.life.extras(ctx.index).jobs
        buf = self._buffer(ctx, sum(sizes))
        try:
            with ctx.lock:
                k.check()
                img = image_meta(k)

                def record(cmd: Any) -> None:
                    cmds.barrier(cmd)
                    record_image_copy(cmd, srcs, sizes, buf)
                    cmds.barrier(cmd, host=True)
                point = jobs.submit(record, users=[*srcs, buf])
        except BaseException:
            buf.destroy()
            raise
        with self.lock:
            self.pending.append(_Capture(k, img, buf, sizes, jobs, point))

    def materialize(self, wait: bool = False, timeout: float | None = None,
                    drained: frozenset[int] = frozenset()) -> None:
        """Turn completed captures into Checkpoints (all of them, waiting, with `wait`;
        on the lost devices in `drained`, known to have run all their work, all of them)."""
        with self.lock:
            pending, self.pending = self.pending, []
        keep = []
        for c in pending:
            try:
                if c.jobs.slot.index in drained:
                    pass
                elif wait:
                    c.jobs.wait(c.point, timeout)
                elif c.jobs.completed() < c.point.value:
                    keep.append(c)
                    continue
            except (DeviceLostError, VkmTimeout):
                keep.append(c)   # (a lost device's: the failover reads it or drops it, drop_device)
                continue
            img = c.image
            if img is None:   # its kernel was destroyed before the capture's host-side part was taken
                self._spared(c.buffer)
                continue
            entry = _Completed(img, c.buffer, c.sizes)
            with self.lock:
                q = self.done.setdefault(img.kernel_id, deque())  # type: ignore[arg-type]
                q.append(entry)
                freed = [q.popleft().take_buffer() for _ in range(len(q) - self.policy.keep)]   # (read or not)
                stats = getattr(self.life.rt, "failover_stats", None)
                if stats is not None:
                    stats.checkpoints_taken += 1
                cp = entry.get() if self.policy.storage is not None else None
                if cp is not None:
                    freed.append(entry.take_buffer())
            for buf in freed:
                if buf is not None:
                    self._spared(buf)
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
        with self.lock:   # copied by steps of the lost device: not trusted either
            gone = [a for a in self.awaiting if a[3].index == device]
            self.awaiting = [a for a in self.awaiting if a[3].index != device]
        for k, buf, *_ in gone:
            log.warning("checkpoint policy: the capture of %r was lost with its device", k.id)
            try:
                buf.destroy()
            except VkmError:
                pass
        for c in lost:
            log.warning("checkpoint policy: the capture of %r at step %d was lost with its device",
                        c.kernel.id, c.image.steps if c.image is not None else -1)
            try:
                c.buffer.destroy()
            except VkmError:
                pass

    def latest_image(self, kernel_id: KernelId) -> KernelImage | None:
        """The image of the newest completed capture of a kernel (what its Checkpoint holds,
        without making one: the failover restores from it), or None."""
        with self.lock:
            q = self.done.get(kernel_id)
            if not q:
                return None
            img = q[-1].filled()
            buf = q[-1].take_buffer()
        if buf is not None:
            self._spared(buf)
        return img

    def latest(self, kernel_id: KernelId) -> Checkpoint | None:
        self.materialize()
        with self.lock:
            q = self.done.get(kernel_id)
            if not q:
                return None
            cp = q[-1].get()
            buf = q[-1].take_buffer()
        if buf is not None:
            self._spared(buf)
        return cp

    def destroy(self) -> None:
        self.after_step([])   # (captures a failed step() call copied: waited for below like the others)
        try:
            self.materialize(wait=True, timeout=30.0)
        except VkmError:
            pass
        self.replay.destroy()
        with self.lock:
            pending, self.pending = self.pending, []
            awaiting, self.awaiting = self.awaiting, []
            done, self.done = self.done, {}
            kept = [e.take_buffer() for q in done.values() for e in q]
            spare, self.spare = self.spare, {}
        for c in pending:
            c.buffer.destroy()
        for a in awaiting:   # (after_step took those of before; no step runs now)
            a[1].destroy()
        for buf in kept:
            if buf is not None:
                buf.destroy()
        for pool in spare.values():
            for b in pool:
                b.destroy()
