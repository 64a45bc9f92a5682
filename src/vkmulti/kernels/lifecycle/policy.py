"""The checkpoint policy of a KernelRuntime: when kernels are captured by
themselves (CheckpointPolicy), and the captures in flight and completed
(PolicyState, which also owns the replay log the failover restores lost
kernels with). The runtime's Lifecycle (lifecycle.py) installs it."""
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
from ..engine.gpu_jobs import GpuJobs
from ..ids import KernelId, as_kernel_id
from ..engine.kernel import Kernel
from .image import KernelImage, fill_image, image_meta, image_sources, record_image_copy, to_checkpoint
from .replay_log import ReplayLog
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
    jobs: GpuJobs
    point: Any


class PolicyState:
    """The policy's captures of one runtime (`life`: its Lifecycle, whose GPU jobs copy them)."""

    def __init__(self, life: LifecycleView, policy: CheckpointPolicy):
        self.life, self.policy = life, policy
        self.lock = threading.Lock()
        self.pending: list[_Capture] = []
        self.done: dict[KernelId, deque[Checkpoint]] = {}
        self.spare: dict[tuple[int, int], list[MappedBuffer]] = {}
        #: what the kernels consumed and sent since their checkpoints (the failover's replay input)
        self.replay = ReplayLog(life)

    def covers(self, kernel_id: str) -> bool:
        """Whether the policy checkpoints this kernel at all (so it can be restored)."""
        return self.policy.every_steps > 0 or kernel_id in self.policy.critical

    def after_step(self, launched: list[Kernel]) -> None:
        for k in launched:
            if k.destroyed or not self.covers(k.id):
                continue
            if not self.policy.due(k.id, k.steps):
                with self.lock:   # a first checkpoint at once: a loss before the first due one is covered
                    first = k.id not in self.done and not any(c.kernel is k for c in self.pending)
                if not first:
                    continue
            try:
                self._capture(k)
            except (VkmError, vk.VkError, MemoryError) as exc:
                log.warning("checkpoint policy: could not capture kernel %r at step %d: %s", k.id, k.steps, exc)

    def _capture(self, k: Kernel) -> None:
        ctx = k.ctx
        srcs, sizes = image_sources(k)
        total = sum(sizes)
        jobs = self.life.extras(ctx.index).jobs
        with self.lock:
            pool = self.spare.get((ctx.index, total))
            buf = pool.pop() if pool else None
        if buf is None:
            buf = MappedBuffer(ctx.slot, total)
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
            img = fill_image(c.image, c.buffer.bytes, c.sizes)
            cp = to_checkpoint(img)
            with self.lock:
                q = self.done.setdefault(img.kernel_id, deque(maxlen=self.policy.keep))  # type: ignore[arg-type]
                q.append(cp)
                stats = getattr(self.life.rt, "failover_stats", None)
                if stats is not None:
                    stats.checkpoints_taken += 1
                key = (c.buffer.slot.index, c.buffer.size)
                pool = self.spare.setdefault(key, [])
                if len(pool) < 2:
                    pool.append(c.buffer)
                    c.buffer = None  # type: ignore[assignment]
            if c.buffer is not None:
                c.buffer.destroy()
            if self.policy.storage is not None:
                try:
                    self.policy.storage.save(cp, f"{img.kernel_id}@{img.steps}")
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

    def latest(self, kernel_id: KernelId) -> Checkpoint | None:
        self.materialize()
        with self.lock:
            q = self.done.get(kernel_id)
            return q[-1] if q else None

    def destroy(self) -> None:
        try:
            self.materialize(wait=True, timeout=30.0)
        except VkmError:
            pass
        self.replay.destroy()
        with self.lock:
            pending, self.pending = self.pending, []
            spare, self.spare = self.spare, {}
        for c in pending:
            c.buffer.destroy()
        for pool in spare.values():
            for b in pool:
                b.destroy()
