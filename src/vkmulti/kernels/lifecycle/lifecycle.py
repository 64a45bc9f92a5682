"""Checkpoint, restore, live migration and checkpoint policy of runtime kernels
(KernelRuntime's methods for issue 16; the mixin KernelRuntime inherits).

API (the contract the failover code builds on):

``runtime.checkpoint(kernel, *, timeout=60.0) -> Checkpoint``
    A consistent snapshot of `kernel` at a step boundary (ordered after its
    submitted steps, before later ones): the control block (address, tenant,
    step, HLC, per-destination sequence numbers) as CONTROL_BLOCK, the inbox
    ring as CUSTOM chunk `INBOX_CHUNK`, each state buffer i as DEVICE_MEMORY
    named ``f"state{i}"``, host messages not yet on the GPU as H2K_QUEUE,
    messages for the host not yet received as K2H_QUEUE, the SPIR-V as
    CUSTOM chunk `SPIRV_CHUNK`; metadata: kernel id and type, steps so far,
    workgroups (grid) and local size (tile), the kernel's HLC, and the spec,
    address, tenant and params in `custom`. Read through the host (it is the
    portable form: storage, another process, another machine).

``runtime.restore(checkpoint, *, device=None, kernel_id=None, into=None, timeout=60.0) -> Kernel``
    Bring a checkpoint back. `into=None`: launch a new kernel (id: the
    checkpoint's unless `kernel_id`; a new address) on `device` (default: the
    coordinator's choice). `into=k`, a Kernel of this runtime (for example one
    whose device was lost): k keeps its object, id and address and is rebuilt
    on `device` (default: its own device if that is still usable, else the
    coordinator's choice) with the checkpoint's state; its old resources are
    freed (waits on a lost device are skipped). Either way the kernel resumes
    with the checkpoint's step count, clock and sequence numbers, and its
    directory entry is rewritten on every device at their next steps.

``runtime.migrate(kernel, device, *, timeout=60.0) -> MigrationResult``
    Live migration (what ``KernelMigrator.migrate_with_checkpoint`` does for a
    runtime kernel): quiesce, move state GPU to GPU, check CRC32 on both GPUs,
    rewire the directory (and so the K2K router), resume. FAILED leaves the
    kernel running where it was.

``runtime.set_checkpoint_policy(policy)`` / ``runtime.checkpoint_policy``
    ``CheckpointPolicy(every_steps=0, critical=(), keep=1, storage=None)``:
    after every `every_steps`-th step of a kernel (every step for the kernel
    ids in `critical`) the runtime captures a checkpoint: a GPU copy into
    host-visible memory queued right behind the step (no host wait), turned
    into a Checkpoint in host memory once it completed (at the next step,
    poll() or latest_checkpoint()). `keep` captures per kernel are kept;
    `storage` also saves each under ``f"{kernel_id}@{step}"``. None: off.
    While a policy is set the runtime also keeps the replay log (what each
    kernel consumed and sent since its checkpoint; kernels/replay_log.py), so
    the kernels of a lost GPU are restored and replayed (docs/failover.md).

``runtime.latest_checkpoint(kernel) -> Checkpoint | None``
    The newest completed capture of the policy for a kernel (Kernel or id,
    also of a destroyed or lost one), None if there is none.

The Kernel methods of the seed's traits (CheckpointableKernel,
MigratableKernel, HotReloadableKernel) call these.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from ...errors import InvalidCheckpointError, TimeoutError as VkmTimeout, VkmError
from ..checkpoint.format import Checkpoint
from ..engine.device_context import MappedBuffer
from ..engine.gate import gate_of, gated
from ..engine.gpu_jobs import GpuJobs
from ..runtime.host_io import _timeout
from ..ids import KernelId, as_kernel_id
from ..engine.kernel import Kernel
from .policy import CheckpointPolicy, _PolicyState
from .image import (SPIRV_CHUNK, INBOX_CHUNK, KernelImage, fill_image, from_checkpoint, image_sources,
                    record_image_copy, to_checkpoint)

log = logging.getLogger(__name__)

__all__ = ["KernelLifecycle", "CheckpointPolicy", "gated_step", "SPIRV_CHUNK", "INBOX_CHUNK"]

_CREATE = threading.Lock()


def gated_step(fn: Callable) -> Callable:
    """KernelRuntime.step under the gate: kernels being migrated or reloaded are held
    back (deferred, with the reason), and the checkpoint policy captures after."""
    @functools.wraps(fn)
    def wrapper(self: Any, kernels: Any = None, *, wait: Any = None, timeout: float | None = 60.0) -> Any:
        with gate_of(self).shared():
            self._reap_retired()
            policy: _PolicyState | None = self.__dict__.get("_policy")
            if policy is not None:
                policy.materialize()
                policy.replay.materialize()
                policy.replay.begin_call()
            held: dict = self.__dict__.get("_held") or {}
            extra: list = []
            if held:
                targets = _targets(self, kernels)
                extra = [(k, held[k][-1] if held.get(k) else "held") for k in targets if k in held]
                if extra:
                    kernels = [k for k in targets if k not in held]
                    if wait is not None:
                        devices = {k.device_index for k in kernels}
                        points = [wait] if not isinstance(wait, (list, tuple)) else list(wait)
                        wait = [p for p in points if getattr(p, "device_index", None) in devices] or None
            ticket = fn(self, kernels, wait=wait, timeout=timeout)
            for k, why in extra:
                k.stats.deferred_steps += 1
                ticket.deferred.append((k, why))
            if policy is not None and ticket.launched:
                policy.after_step(ticket.launched)
                policy.replay.after_step(ticket.launched)
            return ticket
    return wrapper


def _targets(rt: Any, kernels: Any) -> list[Kernel]:
    if kernels is None:
        return rt.kernels
    if isinstance(kernels, (Kernel, str)):
        return [rt._resolve(kernels)]
    try:
        return [rt._resolve(k, "kernels item") for k in kernels]
    except TypeError as exc:
        if "not iterable" in str(exc):
            raise TypeError(f"kernels must be a Kernel, an id, a list of them or None, "
                            f"got {type(kernels).__name__}") from None
        raise


class BufferPool:
    """Device buffers a moved kernel left behind, kept for the next kernel that
    moves onto that device with buffers of the same sizes (a migration back
    and forth allocates nothing, and on CPU devices touches no new pages), up
    to `limit` bytes per device; the rest are freed."""

    def __init__(self, limit: int):
        self.limit = limit
        self._lock = threading.Lock()
        self._free: dict[tuple[int, int], list[Any]] = {}
        self._bytes: dict[int, int] = {}

    def take(self, device: int, size: int) -> Any | None:
        with self._lock:
            free = self._free.get((device, size))
            if not free:
                return None
            self._bytes[device] -= size
            return free.pop()

    def put(self, buffer: Any) -> None:
        device, size = buffer.slot.index, buffer.size
        with self._lock:
            if buffer.handle is not None and self._bytes.get(device, 0) + size <= self.limit:
                self._free.setdefault((device, size), []).append(buffer)
                self._bytes[device] = self._bytes.get(device, 0) + size
                return
        buffer.destroy()

    def clear(self) -> None:
        with self._lock:
            free, self._free, self._bytes = self._free, {}, {}
        for bufs in free.values():
            for b in bufs:
                try:
                    b.destroy()
                except VkmError as exc:   # a lost device: its memory goes with it
                    log.warning("could not free a pooled migration buffer: %s", exc)


@dataclass
class _Extras:
    """Per device: asynchronous jobs on the step queue (policy captures, staging
    passes), and the CRC32 pass with jobs of its own (so waiting for the
    captures does not wait for a hash)."""
    jobs: GpuJobs
    crc: dict = field(default_factory=dict)   # engine kind ("shader", "host") -> engine
    crc_jobs: GpuJobs | None = None


@dataclass
class _Retired:
    """Device resources a moved kernel left behind, freed once nothing uses them."""
    ctx: Any
    buffers: list[Any]
    batches: list[Any] = field(default_factory=list)   # batches that must be done first
    handle: int | None = None                          # an outbox whose receivers' sets go too


class KernelLifecycle:
    """checkpoint / restore / migrate / checkpoint policy of KernelRuntime (see the module docstring)."""

    _lock: Any
    _contexts: dict
    coordinator: Any
    manager: Any

    # -- plumbing ----------------------------------------------------------------------

    def _extras(self, device: int) -> _Extras:
        ext = self.__dict__.setdefault("_extras_by_device", {})
        e = ext.get(device)
        if e is None:
            ctx = self._context(device)
            with _CREATE:
                e = ext.get(device)
                if e is None:
                    e = ext[device] = _Extras(GpuJobs(ctx.slot, ctx.queue))
        return e

    @property
    def migration_crc(self) -> str:
        """Which engine checks a live migration's CRC32s on a device: "auto" (the
        host's zlib on the device's own mapped memory for a CPU device whose
        memory is all host-visible, e.g. lavapipe; the GPU shader elsewhere),
        "shader" (always the GPU shader) or "host" (UnsupportedError on a GPU)."""
        return self.__dict__.get("_migration_crc", "auto")

    @migration_crc.setter
    def migration_crc(self, choice: str) -> None:
        from .crc import check_choice
        self.__dict__["_migration_crc"] = check_choice(choice)

    def _crc(self, device: int) -> Any:
        """The CRC32 engine of `device` chosen by migration_crc (made once per kind)."""
        from .crc import crc_engine
        return crc_engine(self._extras(device), self._context(device), self.migration_crc, _CREATE)

    def _hold_cond(self) -> threading.Condition:
        c = self.__dict__.get("_held_cond")
        if c is None:
            with _CREATE:
                c = self.__dict__.setdefault("_held_cond", threading.Condition(threading.Lock()))
        return c

    def _hold(self, kernel: Kernel, why: str, moving: bool = False) -> None:
        """Hold `kernel` back from stepping (holds nest; each _release undoes one).
        `moving`: its device resources are about to be replaced (a migration or a
        restore): calls that use them (write_state, destroy_kernel) wait for it."""
        with self._hold_cond():
            self.__dict__.setdefault("_held", {}).setdefault(kernel, []).append(why)
            if moving:
                moves = self.__dict__.setdefault("_moving", {})
                moves[kernel] = moves.get(kernel, 0) + 1

    def _release(self, kernel: Kernel, why: str | None = None, moving: bool = False) -> None:
        """Undo one _hold (the one with reason `why` when given)."""
        cond = self._hold_cond()
        with cond:
            if moving:
                moves = self.__dict__.setdefault("_moving", {})
                left = moves.get(kernel, 0) - 1
                if left > 0:
                    moves[kernel] = left
                else:
                    moves.pop(kernel, None)
            held = self.__dict__.setdefault("_held", {})
            reasons = held.get(kernel)
            if reasons:
                if why is not None and why in reasons:
                    reasons.remove(why)
                else:
                    reasons.pop()
                if not reasons:
                    del held[kernel]
            cond.notify_all()

    def _is_held_now(self, kernel: Kernel) -> bool:
        return kernel in (self.__dict__.get("_held") or {})

    def _is_moving(self, kernel: Kernel) -> bool:
        return kernel in (self.__dict__.get("_moving") or {})

    def _wait_unheld(self, kernel: Kernel, deadline: float) -> None:
        """Wait until no migration or restore is replacing `kernel`'s device resources."""
        cond = self._hold_cond()
        with cond:
            while self._is_moving(kernel):
                left = deadline - time.monotonic()
                if left <= 0:
                    why = (self.__dict__.get("_held") or {}).get(kernel, ["moved"])[-1]
                    raise VkmTimeout(f"kernel {kernel.id!r} is still being {why} (its device resources are "
                                     f"being replaced)")
                cond.wait(min(left, 0.25))

    def is_held(self, kernel: Any) -> bool:
        """Whether `kernel` is held back from stepping (being migrated or reloaded)."""
        return self._is_held_now(self._resolve(kernel))

    def _retire(self, item: _Retired) -> None:
        with self._lock:
            self.__dict__.setdefault("_retired", []).append(item)
        self._reap_retired()

    def _reap_retired(self, force: bool = False) -> None:
        items = self.__dict__.get("_retired")
        if not items:
            return
        with self._lock:
            ready = [r for r in items if force or all(b.done for b in r.batches)]
            for r in ready:
                items.remove(r)
        for r in ready:
            _free_retired(self, r)

    #: Bytes of buffers per device that migrations keep for kernels moving onto
    #: that device later (see BufferPool); 0 frees them at once.
    migration_pool_bytes = 512 << 20

    def _buffer_pool(self) -> BufferPool:
        pool = self.__dict__.get("_pool")
        if pool is None:
            with _CREATE:
                pool = self.__dict__.setdefault("_pool", BufferPool(self.migration_pool_bytes))
        pool.limit = self.migration_pool_bytes
        return pool

    def release_migration_buffers(self) -> None:
        """Free the buffers migrations kept for later moves (see migration_pool_bytes)."""
        pool = self.__dict__.get("_pool")
        if pool is not None:
            pool.clear()

    def _lifecycle_destroy(self, timeout: float | None) -> None:
        """Free what this mixin holds (called by destroy() before the device contexts go)."""
        policy = self.__dict__.pop("_policy", None)
        if policy is not None:
            policy.destroy()
        self._reap_retired(force=True)
        self.release_migration_buffers()
        from .live_migration import destroy_engines
        destroy_engines(self, timeout if timeout is not None and timeout != float("inf") else 30.0)
        for e in list(self.__dict__.pop("_extras_by_device", {}).values()):
            for eng in e.crc.values():
                eng.destroy()
            if e.crc_jobs is not None:
                e.crc_jobs.destroy(timeout if timeout is not None and timeout != float("inf") else 30.0)
            e.jobs.destroy(timeout if timeout is not None and timeout != float("inf") else 30.0)

    # -- checkpoints ---------------------------------------------------------------------

    def _image_meta(self, k: Kernel) -> KernelImage:
        """The host-side part of a kernel's image (called with its device lock held)."""
        return KernelImage(k.spec, k.id, k.address, k.tenant, tuple(k.params), k.steps, k.host_seq,
                           k.payload_size, b"", b"", [], list(k.h2k), list(k.received), k.device_index)

    @gated
    def checkpoint(self, kernel: Any, *, timeout: float | None = 60.0) -> Checkpoint:
        """A Checkpoint of `kernel` after its submitted steps (see the module docstring)."""
        k = self._resolve(kernel)
        timeout = _timeout(timeout)
        ctx = k.ctx
        srcs, sizes = image_sources(k)
        staging = MappedBuffer(ctx.slot, sum(sizes))
        try:
            with ctx.lock:
                k.check()
                img = self._image_meta(k)
                ctx.run_once(lambda cmd: record_image_copy(cmd, srcs, sizes, staging), timeout=timeout)
            fill_image(img, staging.bytes, sizes)
        finally:
            staging.destroy()
        return to_checkpoint(img)

    def set_checkpoint_policy(self, policy: CheckpointPolicy | None) -> None:
        """Install (None: remove) the policy by which the runtime checkpoints its kernels."""
        if policy is not None and not isinstance(policy, CheckpointPolicy):
            raise TypeError(f"policy must be a CheckpointPolicy or None, got {type(policy).__name__}")
        old = self.__dict__.get("_policy")
        if old is not None and old.policy is policy:
            return
        new = _PolicyState(self, policy) if policy is not None else None
        if old is not None:
            if new is not None:   # the replay log goes on under the new policy
                new.replay, old.replay = old.replay, new.replay
            new_done = old.done if new is not None else None
            old.destroy()
            if new is not None and new_done:
                new.done = {kid: deque(q, maxlen=policy.keep) for kid, q in new_done.items()}
        self.__dict__["_policy"] = new

    @property
    def checkpoint_policy(self) -> CheckpointPolicy | None:
        st = self.__dict__.get("_policy")
        return None if st is None else st.policy

    def latest_checkpoint(self, kernel: Any) -> Checkpoint | None:
        """The newest completed policy checkpoint of a kernel (a Kernel or its id;
        also one destroyed or lost since), None if there is none."""
        kid = kernel.id if isinstance(kernel, Kernel) else as_kernel_id(kernel, "kernel")
        st = self.__dict__.get("_policy")
        return None if st is None else st.latest(KernelId(kid))

    # -- restore and migrate -------------------------------------------------------------------

    def restore(self, checkpoint: Checkpoint, *, device: int | None = None, kernel_id: str | None = None,
                into: Kernel | None = None, timeout: float | None = 60.0) -> Kernel:
        """Bring a checkpoint back as a new kernel, or into an existing one (see the
        module docstring)."""
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"checkpoint must be a Checkpoint, got {type(checkpoint).__name__}")
        img = from_checkpoint(checkpoint)
        if img.payload_size != self.payload_size:
            raise InvalidCheckpointError(f"the checkpoint's messages have {img.payload_size}-byte payloads; this "
                                         f"runtime's have {self.payload_size}")
        timeout = _timeout(timeout)
        if into is not None:
            if not isinstance(into, Kernel):
                raise TypeError(f"into must be a Kernel of this runtime, got {type(into).__name__}")
            if into.runtime is not self:
                raise ValueError(f"kernel {into.id!r} belongs to another KernelRuntime")
            into.check()
            from .restore import restore_into
            return restore_into(self, into, img, device, timeout)
        from .restore import restore_new
        return restore_new(self, img, device, kernel_id, timeout)

    def migrate(self, kernel: Any, device: int, *, timeout: float | None = 60.0, verify: bool = True) -> Any:
        """Live-migrate `kernel` to `device` (a MigrationResult; see KernelMigrator)."""
        k = self._resolve(kernel)
        request = self.coordinator.request_migration(k.id, device)
        from .migrator import KernelMigrator
        return KernelMigrator(self.coordinator).migrate_with_checkpoint(k, request, timeout=timeout, verify=verify)

    def _migrate_live(self, kernel: Kernel, request: Any, *, timeout: float | None, verify: bool) -> Any:
        from .live_migration import migrate_live
        return migrate_live(self, kernel, request, _timeout(timeout), verify)


def _free_retired(rt: Any, r: _Retired) -> None:
    ctx = r.ctx
    if r.handle is not None and ctx.alive:
        with rt._lock:
            kernels = [k for k in rt._kernels.values() if k is not None]
        pair = rt._contexts.get(ctx.index)
        with ctx.lock:
            for other in kernels:
                if other.ctx is ctx and not other.destroyed:
                    for key in [key for key in other.deliver_sets if key[0] == r.handle]:
                        s = other.deliver_sets.pop(key)
                        if pair is not None:
                            pair[1].retired.append((ctx.value, s))
                        else:
                            ctx.free_set(s)
    for b in r.buffers:
        try:
            b.destroy()
        except VkmError as exc:   # a lost device: its memory goes with it
            log.warning("could not free a moved kernel's buffer on GPU %d: %s", ctx.index, exc)
