"""Checkpoint, restore, live migration and checkpoint policy of runtime kernels:
the Lifecycle that KernelRuntime builds and owns, and which CRC32 engine
checks a live migration on a device (`KernelRuntime.migration_crc`).

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
    A kernel launched (or restored as new) while a policy covers it is
    captured at once, so a loss before its first due step is covered too.
    While a policy is set the runtime also keeps the replay log (what each
    kernel consumed and sent since its checkpoint; kernels/replay_log.py), so
    the kernels of a lost GPU are restored and replayed (docs/explanation/failover.md).

``runtime.latest_checkpoint(kernel) -> Checkpoint | None``
    The newest completed capture of the policy for a kernel (Kernel or id,
    also of a destroyed or lost one), None if there is none.

The Kernel methods of the traits (CheckpointableKernel, ...) call these.

CRC32 engines: "shader", the GPU shader (gpu_crc.GpuCrc) on the device's queue,
always available; "host", zlib over the device's mapped memory (host_crc.HostCrc)
for a CPU device whose memory is all host-visible (lavapipe: several times faster
than the shader there); "auto" (the default) takes "host" where it suits.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ..._core.checks import check_index, seconds_text, timeout_seconds, short_repr
from ..._core.lifetime import Deadline
from ...errors import DestroyedError, InvalidCheckpointError, TimeoutError as VkmTimeout, VkmError
from ..checkpoint.format import Checkpoint
from ...memory.buffer import MappedBuffer
from ..engine.device_context import StepCondition
from ..engine.gate import gate_of
from ..engine.gpu_jobs import GpuJobs
from ..engine.kernel import Kernel
from ..ids import KernelId, as_kernel_id
from ..engine.prebuild import Prebuilder
from .gpu_crc import GpuCrc, crc_pass_spec
from .host_crc import HostCrc
from .image import (SPIRV_CHUNK, INBOX_CHUNK, KernelMoved, fill_image, from_checkpoint, image_sources,
                    queue_image_copy, to_checkpoint)
from .live_migration import migrate_live
from .migrator import KernelMigrator, MigrationResult
from .policy import CheckpointPolicy, PolicyState
from ...memory.staging import SpareBuffers
from .ready_twins import ReadyTwins
from .restore import restore_into, restore_new
from .twin import (MigrationPool, MoveEngines, Retired, RuntimeView, free_retired, twin_buffer_sizes,
                   twin_mapped_sizes)

log = logging.getLogger(__name__)

__all__ = ["Lifecycle", "CheckpointPolicy", "CHOICES", "check_choice", "SPIRV_CHUNK", "INBOX_CHUNK"]

#: The CRC32 engines a live migration can check with (see the module docstring).
CHOICES = ("auto", "shader", "host")
#: The largest checkpoint() copy buffer kept for the next checkpoint of that size (and 4x this in all)
CHECKPOINT_STAGING_BYTES = 16 << 20


def check_choice(choice: Any) -> str:
    """`choice` if it is one of CHOICES; ValueError otherwise."""
    if not isinstance(choice, str) or choice not in CHOICES:
        raise ValueError(f"migration_crc must be 'auto', 'shader' or 'host', got {short_repr(choice)}")
    return choice


@dataclass
class Extras:
    """Per device: asynchronous jobs on the step queue (policy captures, staging
    passes), and the CRC32 pass with jobs of its own (so waiting for the
    captures does not wait for a hash)."""
    jobs: GpuJobs
    crc: dict = field(default_factory=dict)   # engine kind ("shader", "host") -> engine
    crc_jobs: GpuJobs | None = None


class Lifecycle:
    """checkpoint / restore / migrate / checkpoint policy of one KernelRuntime `rt`
    (see the module docstring), and what they keep: the holds on kernels being
    moved, the GPU jobs and CRC32 engines per device, the buffers moved kernels
    left behind (retired until unused, pooled up to `pool_limit()` bytes per
    device), the transfer engines of the moves, the policy's state."""

    def __init__(self, rt: RuntimeView, pool_limit: Callable[[], int]):
        self.rt = rt
        self._create = threading.Lock()
        self._making_crc = threading.Lock()   # (apart: an engine's set-up waits on the GPU)
        self._held_cond = threading.Condition(threading.Lock())
        self._held: dict[Kernel, list[str]] = {}     # kernel -> reasons it is held back from stepping
        self._moving: dict[Kernel, int] = {}         # kernel -> holds whose move replaces its Residency
        self._extras: dict[int, Extras] = {}
        self._closed = False   # destroy() took the extras: no more are made (under _create)
        self._retired: list[Retired] = []
        #: (jobs, point, staging buffer) of checkpoint copies whose wait gave up: freed once done
        self._parked: list[tuple[GpuJobs, Any, MappedBuffer]] = []
        #: checkpoint() copy buffers whose bytes were read, for later checkpoints of the same size
        #: (small ones only: a large kernel's checkpoint allocates its own each time)
        self._staging = SpareBuffers(largest=CHECKPOINT_STAGING_BYTES, total=4 * CHECKPOINT_STAGING_BYTES)
        self._pool_limit = pool_limit
        self._pool = MigrationPool(pool_limit())
        #: the transfer engines of moves between two devices
        self.engines = MoveEngines(rt.coordinator, rt.manager)
        #: the engine kind of `KernelRuntime.migration_crc`
        self.crc_choice = "auto"
        #: the installed checkpoint policy's captures and replay log, or None
        self.policy_state: PolicyState | None = None
        self._gate = gate_of(rt)   # (made by the runtime before the lifecycle)
        self._stepped_lock = threading.Lock()
        self._stepped = StepCondition(self._stepped_lock)   # (notifies only while someone waits)
        #: steps made through gated_step so far (the switch of a move waits for the next one)
        self.steps_done = 0
        #: one step() at a time: submits, the router's hand-off and the replay log follow one order
        self._turn = threading.RLock()
        #: the kernels' pipelines built ahead on the devices they may move to (engine/prebuild.py)
        self.prebuild = Prebuilder(rt._context, lambda: rt.manager.device_count,
                                   lambda d: not rt.device_lost(d), self._move_passes, self.crc, self._reserve,
                                   self._pair, self._prebuilt,
                                   lambda: tuple(rt._kernels.values()))   # (no lock: asked under device locks)
        #: the twins of the kernels made ahead on the devices they may move to (ready_twins.py)
        self.twins = ReadyTwins(self, self.prebuild.targets)
        self._restoring = threading.local()   # .active: restore_new's own launch (its image comes after)

    def launched(self, kernel: Kernel) -> None:
        """A kernel the runtime just launched: its pipelines built ahead, and under a policy
        that covers it a capture of its launch state (a loss before its first step or its
        first due capture is restored from it). restore_new's launch is captured once its
        image is written (restore), not here: a capture now would hold the blank state."""
        self.prebuild.launched(kernel)
        if not getattr(self._restoring, "active", False):
            self._capture_now(kernel, replaced=False)

    def _capture_now(self, kernel: Kernel, replaced: bool, timeout: float | None = None) -> None:
        """Under a policy, `kernel`'s captures that are not of its present state dropped
        (an earlier kernel's of its id; all, when `replaced` by a restore, with its replay
        log, read first within `timeout`) and its capture queued now."""
        state = self.policy_state
        if state is None:
            return
        if replaced:
            try:   # (its old steps' copies read, then dropped)
                state.replay.materialize(wait=True, timeout=timeout)
            except VkmError as exc:
                log.warning("checkpoint policy: the replay log's copies before %r's restore not all read: %s",
                            kernel.id, exc)
            state.replay.forget(kernel.id)
        state.restart(kernel, replaced)
        state.after_step([kernel])

    def _prebuilt(self, kernel: Kernel) -> None:
        """A kernel's pipelines were built ahead: its twins next (in their own thread)."""
        if not kernel.destroyed:
            self.twins.request(kernel)

    # -- per device ----------------------------------------------------------------------

    def extras(self, device: int) -> Extras:
        """The GPU jobs and CRC32 engines of `device` (made on first use; DestroyedError
        once destroy() took them: nothing made after it would be freed)."""
        e = self._extras.get(device)
        if e is None:
            ctx = self.rt._context(device)
            with self._create:
                self._check_open()
                e = self._extras.get(device)
                if e is None:
                    e = self._extras[device] = Extras(GpuJobs(ctx.slot, ctx.queue))
        return e

    def _check_open(self) -> None:
        """DestroyedError once destroy() began freeing what the lifecycle made (`_create` held)."""
        if self._closed:
            raise DestroyedError("KernelRuntime used after destroy()")

    def extras_if_made(self, device: int) -> Extras | None:
        """The Extras of `device` if any were made, else None."""
        return self._extras.get(device)

    def crc_kind(self, ctx: Any) -> str:
        """The CRC32 engine kind crc_choice picks on the device of `ctx`."""
        choice = self.crc_choice
        return "shader" if choice == "shader" or (choice == "auto" and not HostCrc.suits(ctx.slot)) else "host"

    def _move_passes(self, ctx: Any) -> list:
        """The runtime's own pipelines a move onto or off the device of `ctx` uses."""
        return [crc_pass_spec()] if self.crc_kind(ctx) == "shader" else []

    def _reserve(self, kernel: Kernel, device: int, limit: int) -> None:
        """Buffers for a twin of `kernel` on `device`, made ahead into the migration pool."""
        ctx = self.rt._context(device)
        self.pool.reserve(ctx, twin_buffer_sizes(self.rt, kernel, ctx), limit, twin_mapped_sizes(kernel, ctx))

    def _pair(self, a: int, b: int) -> None:
        """The transfer engines of moves between devices `a` and `b`, both ways, with
        their links made (rings allocated and, on a CPU device, touched): a first
        move between them creates nothing."""
        for x, y in ((a, b), (b, a)):
            if self.rt.device_lost(x) or self.rt.device_lost(y):
                continue
            self.engines.get(x, y)[1].ensure_staging()

    def crc(self, device: int, timeout: float | None = 60.0) -> Any:
        """The CRC32 engine of `device` chosen by crc_choice, made once per kind and
        kept; the shader's jobs get their own timeline. `timeout`: for making the
        shader's engine, or for another thread's making of it (a prebuild warms it)."""
        extras, ctx = self.extras(device), self.rt._context(device)
        kind = self.crc_kind(ctx)
        if (eng := extras.crc.get(kind)) is not None:
            return eng
        deadline = Deadline(timeout)
        while not self._making_crc.acquire(timeout=deadline.slice()):   # (in slices: Ctrl-C lands)
            if deadline.expired():
                raise VkmTimeout(f"the CRC32 engine of GPU {device} that another thread makes was not ready "
                                 f"within {seconds_text(timeout)} s")
        try:
            eng = extras.crc.get(kind)
            if eng is None:
                if kind == "host":
                    eng = HostCrc(ctx)
                else:
                    with self._create:   # (quick to make; destroy() frees it or it is refused)
                        self._check_open()
                        if extras.crc_jobs is None:
                            extras.crc_jobs = GpuJobs(ctx.slot, ctx.queue)
                    eng = GpuCrc(ctx, extras.crc_jobs, timeout=deadline.left())
                with self._create:   # (made outside it: its set-up waits on the GPU)
                    if self._closed:
                        eng.destroy()
                    self._check_open()
                    extras.crc[kind] = eng
        finally:
            self._making_crc.release()
        return eng

    @property
    def pool(self) -> MigrationPool:
        """The buffers migrations keep for later moves (its limit: `pool_limit()`)."""
        self._pool.limit = self._pool_limit()
        return self._pool

    # -- holds ---------------------------------------------------------------------------

    def hold(self, kernel: Kernel, why: str, moving: bool = False) -> None:
        """Hold `kernel` back from stepping (holds nest; each release undoes one).
        `moving`: its Residency is about to be replaced (a migration or a
        restore): calls that use it (write_state, destroy_kernel) wait for it."""
        with self._held_cond:
            self._held.setdefault(kernel, []).append(why)
            if moving:
                self._moving[kernel] = self._moving.get(kernel, 0) + 1

    def release(self, kernel: Kernel, why: str | None = None, moving: bool = False) -> None:
        """Undo one hold (the one with reason `why` when given: none if `kernel` has no hold
        for that reason, as a cancel_migration() without a prepare_for_migration() must
        not let go of a move's or a reload's hold)."""
        with self._held_cond:
            if moving:
                left = self._moving.get(kernel, 0) - 1
                if left > 0:
                    self._moving[kernel] = left
                else:
                    self._moving.pop(kernel, None)
            reasons = self._held.get(kernel)
            if reasons and (why is None or why in reasons):
                if why is not None:
                    reasons.remove(why)
                else:
                    reasons.pop()
                if not reasons:
                    del self._held[kernel]
            self._held_cond.notify_all()

    def is_held(self, kernel: Kernel) -> bool:
        """Whether `kernel` is held back from stepping."""
        return kernel in self._held

    def is_moving(self, kernel: Kernel) -> bool:
        """Whether a migration or restore is replacing `kernel`'s Residency."""
        return kernel in self._moving

    def wait_unheld(self, kernel: Kernel, deadline: float) -> None:
        """Wait until no migration or restore is replacing `kernel`'s Residency."""
        with self._held_cond:
            while kernel in self._moving:
                left = deadline - time.monotonic()
                if left <= 0:
                    why = self._held.get(kernel, ["moved"])[-1]
                    raise VkmTimeout(f"kernel {short_repr(kernel.id)} is still being {why} (its device resources are "
                                     f"being replaced)")
                self._held_cond.wait(min(left, 0.25))

    # -- stepping ------------------------------------------------------------------------

    def gated_step(self, step: Callable[..., Any], kernels: Any, wait: Any, timeout: float | None) -> Any:
        """Run the runtime's `step` under the gate: kernels being migrated or reloaded
        are held back (deferred, with the reason), and the checkpoint policy captures
        after."""
        timeout = timeout_seconds(timeout)   # (checked before the wait for the turn, too)
        try:
            gate = self._gate
            token = gate.enter_shared()   # (plain calls: this runs once per step)
            try:
                self._take_turn(timeout)
                try:
                    return self._step(step, kernels, wait, timeout)
                finally:
                    self._turn.release()
            finally:
                gate.leave_shared(token)
        finally:
            with self._stepped_lock:
                self.steps_done += 1
                self._stepped.notify_all()

    @contextmanager
    def turn(self, timeout: float | None) -> Iterator[None]:
        """Pass the gate shared and hold the steps' turn, as a step does (see _take_turn): a
        failover begun outside a step (from a wait) runs between two steps, never inside one,
        nor while a move's switch or a reload's swap holds the gate."""
        with self._gate.shared():
            self._take_turn(timeout)
            try:
                yield
            finally:
                self._turn.release()

    def _take_turn(self, timeout: float | None) -> None:
        """Wait (interruptibly, in slices) until no other thread is inside a step.

        Steps of several threads run one after the other: each one's submits on
        every device and the hand-off of its outbox batches to the router happen
        together, so per sender the batches reach the router in step order (FIFO
        per pair) and the replay log sees whole calls."""
        if self._turn.acquire(blocking=False):   # (no other thread inside a step)
            return
        deadline = time.monotonic() + (timeout if timeout is not None else 1e18)
        while True:
            left = deadline - time.monotonic()
            if self._turn.acquire(timeout=max(0.0, min(left, 0.25))):
                return
            if left <= 0:
                raise VkmTimeout(f"step(): the step of another thread did not end within {timeout} s")

    def _step(self, step: Callable[..., Any], kernels: Any, wait: Any, timeout: float | None) -> Any:
        if self._parked or self._retired:
            self.reap_retired()
        policy = self.policy_state
        if policy is not None:
            policy.materialize()
            policy.replay.materialize()
            policy.replay.begin_call()
        held = self._held
        extra: list = []
        if held:
            targets = self._targets(kernels)
            extra = [(k, held[k][-1] if held.get(k) else "held") for k in targets if k in held]
            if extra:
                kernels = [k for k in targets if k not in held]
                if wait is not None:
                    devices = {k.device_index for k in kernels}
                    points = [wait] if not isinstance(wait, (list, tuple)) else list(wait)
                    wait = [p for p in points if getattr(p, "device_index", None) in devices] or None
        ticket = step(kernels, wait=wait, timeout=timeout)
        for k, why in extra:
            k.stats.deferred_steps += 1
            ticket.deferred.append((k, why))
        if policy is not None and ticket.launched:
            policy.after_step(ticket.launched)
            policy.replay.after_step(ticket.launched)
        return ticket

    def _targets(self, kernels: Any) -> list[Kernel]:
        rt = self.rt
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

    def wait_for_step(self, seen: int, timeout: float) -> None:
        """Wait (at most `timeout` s) until a step ends after the first `seen` ones."""
        with self._stepped:
            self._stepped.wait_for(lambda: self.steps_done > seen, timeout)

    # -- what moved kernels left behind --------------------------------------------------

    def retire(self, item: Retired) -> None:
        """Free `item` once the batches it waits for are done."""
        with self.rt._lock:
            self._retired.append(item)
        self.reap_retired()

    def reap_retired(self, force: bool = False) -> None:
        """Free the retired resources nothing uses any more (`force`: all of them)."""
        if self._parked:
            self._reap_parked(force)
        if not self._retired:
            return
        with self.rt._lock:
            ready = [r for r in self._retired if force or all(b.done for b in r.batches)]
            for r in ready:
                self._retired.remove(r)
        for r in ready:
            free_retired(self.rt, r)

    def _reap_parked(self, force: bool) -> None:
        with self.rt._lock:
            parked, self._parked = self._parked, []
        keep = []
        for jobs, point, staging in parked:
            try:
                done = force or jobs.completed() >= point.value
            except VkmError:   # (its device lost: the jobs' destroy() waits for the driver)
                done = False
            if done:
                staging.destroy()
            else:
                keep.append((jobs, point, staging))
        if keep:
            with self.rt._lock:
                self._parked += keep

    def destroy(self, timeout: float | None) -> None:
        """Free what the lifecycle holds (the runtime's destroy(), before the device contexts go)."""
        self.prebuild.destroy(timeout if timeout is not None and timeout != float("inf") else 30.0)
        self.twins.destroy(timeout if timeout is not None and timeout != float("inf") else 30.0)
        policy, self.policy_state = self.policy_state, None
        if policy is not None:
            policy.destroy()
        self.reap_retired(force=True)
        self._pool.clear()
        timeout = timeout if timeout is not None and timeout != float("inf") else 30.0
        self.engines.destroy(timeout)
        with self._create:   # (a creation under way ends first; later ones are refused)
            self._closed = True
            extras, self._extras = self._extras, {}
        for e in extras.values():
            for eng in e.crc.values():
                eng.destroy()
            if e.crc_jobs is not None:
                e.crc_jobs.destroy(timeout)
            e.jobs.destroy(timeout)
        self._reap_parked(force=True)
        self._staging.destroy()

    # -- checkpoints ---------------------------------------------------------------------

    def checkpoint(self, kernel: Any, timeout: float | None) -> Checkpoint:
        """A Checkpoint of `kernel` after its submitted steps (see the module docstring)."""
        k = self.rt._resolve(kernel)
        timeout = timeout_seconds(timeout)
        while True:   # (again on its new device if a failover's restore or a move takes it meanwhile)
            ctx = k.ctx
            srcs, sizes = image_sources(k)
            jobs = self.extras(ctx.index).jobs
            # a kept buffer (a first allocation of host-visible memory can hold up the device's other
            # work on a GPU's driver); the copy is waited for without the device lock: the device's
            # other kernels go on stepping meanwhile
            staging = self._staging.get(ctx.slot, sum(sizes))
            try:
                img, point = queue_image_copy(k, jobs, srcs, sizes, staging)
                break
            except KernelMoved:
                self._staging.give(staging)
            except BaseException:
                staging.destroy()
                raise
        try:
            jobs.wait(point, timeout)
        except BaseException:
            with self.rt._lock:   # (still queued: freed once it is done)
                self._parked.append((jobs, point, staging))
            raise
        try:
            fill_image(img, staging.bytes, sizes)
        except BaseException:
            staging.destroy()
            raise
        self._staging.give(staging)
        return to_checkpoint(img)

    def set_policy(self, policy: CheckpointPolicy | None) -> None:
        """Install (None: remove) the checkpoint policy; the replay log goes on under a new one."""
        if policy is not None and not isinstance(policy, CheckpointPolicy):
            raise TypeError(f"policy must be a CheckpointPolicy or None, got {type(policy).__name__}")
        old = self.policy_state
        if old is not None and old.policy is policy:
            return
        new = PolicyState(self, policy) if policy is not None else None
        if old is not None:
            if new is not None:   # the replay log goes on under the new policy
                new.replay, old.replay = old.replay, new.replay
            new_done = old.done if new is not None else None
            old.destroy()
            if new is not None and new_done:
                new.done = {kid: deque(list(q)[-policy.keep:]) for kid, q in new_done.items()}  # type: ignore[union-attr]
        self.policy_state = new

    def latest_checkpoint(self, kernel: Any) -> Checkpoint | None:
        """The newest completed policy checkpoint of a kernel (a Kernel or its id), or None."""
        kid = kernel.id if isinstance(kernel, Kernel) else as_kernel_id(kernel, "kernel")
        st = self.policy_state
        return None if st is None else st.latest(KernelId(kid))

    # -- restore and migrate -------------------------------------------------------------------

    def restore(self, checkpoint: Checkpoint, device: int | None, kernel_id: str | None, into: Kernel | None,
                timeout: float | None) -> Kernel:
        """Bring a checkpoint back as a new kernel, or into an existing one (see the
        module docstring)."""
        rt = self.rt
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"checkpoint must be a Checkpoint, got {type(checkpoint).__name__}")
        img = from_checkpoint(checkpoint)
        if img.payload_size != rt.payload_size:
            raise InvalidCheckpointError(f"the checkpoint's messages have {img.payload_size}-byte payloads; this "
                                         f"runtime's have {rt.payload_size}")
        timeout = timeout_seconds(timeout)
        if device is not None:   # (bools, floats and strs refused, numpy integers taken, on both paths)
            device = check_index(device, "device")
        if into is not None:
            if not isinstance(into, Kernel):
                raise TypeError(f"into must be a Kernel of this runtime, got {type(into).__name__}")
            if into.runtime is not rt:
                raise ValueError(f"kernel {short_repr(into.id)} belongs to another KernelRuntime")
            into.check()
            if kernel_id is not None and kernel_id != into.id:   # (into keeps its id: a new one is not given)
                raise ValueError(f"kernel_id {short_repr(kernel_id)} names no kernel to make: restore(into={short_repr(into.id)}) "
                                 f"restores into that kernel, which keeps its id")
            k = restore_into(self, into, img, device, timeout)
            self._capture_now(k, replaced=True, timeout=timeout)   # (its captures held the state it had)
            return k
        self._restoring.active = True
        try:
            k = restore_new(rt, img, device, kernel_id, timeout)
        finally:
            self._restoring.active = False
        self._capture_now(k, replaced=False)
        return k

    def migrate(self, kernel: Any, device: int, timeout: float | None, verify: bool) -> MigrationResult:
        """Live-migrate `kernel` to `device` (a MigrationResult; see KernelMigrator)."""
        k = self.rt._resolve(kernel)
        request = self.rt.coordinator.request_migration(k.id, device)
        return KernelMigrator(self.rt.coordinator).migrate_with_checkpoint(k, request, timeout=timeout,
                                                                           verify=verify)

    def migrate_live(self, kernel: Kernel, request: Any, timeout: float | None, verify: bool) -> MigrationResult:
        """The live migration itself (live_migration.migrate_live)."""
        return migrate_live(self, kernel, request, timeout_seconds(timeout), verify)
