"""Submitting the steps of one device (KernelRuntime's engine): room in the
in-flight window, the submit and its bookkeeping. StepRecorder
(step_recorder.py) records each step, StepHarvest (harvest.py) reads it back.

One step of a set of kernels on a device is one command buffer on the
device's queue that signals the next value of the device's timeline:

  1. directory updates; each stepping kernel's outbox region header reset
  2. delivery passes: each kernel's host messages (h2k), then every pending
     batch on the device (outboxes of earlier steps, router batches) into the
     inboxes of the kernels that are addressed in it; surveys of new batches
  3. the kernels' own dispatches
  4. the finish pass of each kernel (HLC, stamps, host messages, consume),
     which ends with the survey of its new outbox (who it addresses), for the host
A barrier separates the phases; the last makes everything visible to the
host and to the router's transfers. The host learns what happened when it
harvests a completed step (counts in the status ring and the K2H regions).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable, Protocol, Sequence

from ...errors import TimeoutError as VkmTimeout, VkmError
from ..._core import _native
from ..._core.timeline import TimelinePoint
from ..messages import HlcTimestamp
from .device_context import STATUS_WORDS, SURVEY_RECORD, DeviceContext
from .harvest import StepHarvest
from .kernel import Batch, InboundBatch, Kernel, OutboxBatch
from .step_recorder import InFlight, StepRecorder, quiet_survey_offsets

log = logging.getLogger(__name__)

__all__ = ["DeviceStepper", "QUIET_BATCHES", "StepCapture", "CaptureFactory"]

#: A kernel whose latest this many outbox batches held nothing has its next ones read lazily: by
#: the first step recorded once they are written (here: once their step is done; from another
#: device: once the relay reached them), not by one that waits for them.
QUIET_BATCHES = 2
#: Whether a native run of quiet steps waits for room by reading the timeline between naps
#: (vkm_nap_wait: the device's pace learnt and kept per device) instead of the driver's
#: blocking wait (bench/k2k.py --section run compares the two: naps cost more CPU on lavapipe
#: and on NVIDIA's driver alike, for no wall time saved).
RUN_NAPS = False


class StepCapture(Protocol):
    """Copies a step records after everything else it does (a replay log's capture of
    the rings the step consumed and wrote): `copies` are packed copy ops (step_ops.copy_op);
    exactly one of submitted(point) (the step ran: `point` marks it and the copies done) or
    abandon() (nothing was submitted) follows."""

    copies: list[bytes]

    def submitted(self, point: TimelinePoint) -> None: ...
    def abandon(self) -> None: ...


#: Made per device step: (the device's context, the kernels it launches) -> a capture, or None.
CaptureFactory = Callable[[DeviceContext, list[Kernel]], "StepCapture | None"]


class DeviceStepper:
    """The step engine of one DeviceContext (all methods run with ctx.lock held);
    its recorder records each step, its readback (StepHarvest) reads each completed one back."""

    def __init__(self, runtime: Any, ctx: DeviceContext):
        self.rt, self.ctx = runtime, ctx
        self.inflight: deque[InFlight] = deque()
        self.batches: list[Batch] = []     # batches on this device not yet fully delivered
        self.nsteps = 0
        self.harvested = 0                  # the last timeline value harvested
        self.retired: list[tuple[int, Any]] = []   # (value, descriptor set) to free once completed
        self.pace_ns = 0                    # the device's time per quiet step, as native runs' naps learnt it
        self.recorder = StepRecorder(runtime, ctx)
        self.readback = StepHarvest(runtime, ctx)

    def drop(self, k: Any) -> None:
        """No batch of `k` (being destroyed) is delivered from here, and no kernel of
        this device reads its outbox after its last step."""
        ctx = self.ctx
        for b in list(self.batches):
            if b.source is k:
                self.batches.remove(b)
                b.done = True
                b.event.set()
            elif b.pending is not None:
                b.pending.discard(k)
        for other in ctx.local:
            if other is not None and other is not k:
                key = next((key for key in other.deliver_sets if key[0] == k.outbox.handle_int), None)
                if key is not None:
                    self.retired.append((k.last_value, other.deliver_sets.pop(key)))
        ctx.cond.notify_all()

    def close(self, timeout: float) -> None:
        """The runtime's destroy(): what the steps left is read back and freed, then the context."""
        ctx = self.ctx
        with ctx.lock:
            self.harvest()
            for _, s in self.retired:
                ctx.free_set(s)
            self.retired = []
        ctx.destroy(timeout)

    # -- harvest ---------------------------------------------------------------------

    def harvest(self) -> None:
        """Read back every completed step: host messages, counts, delivery results."""
        inflight = self.inflight
        if not inflight and not self.retired:
            return
        done = self.ctx.completed()
        if inflight and inflight[0].value <= done:
            read = self.readback.read
            while inflight and inflight[0].value <= done:
                rec = inflight.popleft()
                read(rec)
                self.harvested = rec.value
            self._finish_batches(done)
        if self.retired:
            keep = []
            for value, pool_set in self.retired:
                if value <= done:
                    self.ctx.free_set(pool_set)
                else:
                    keep.append((value, pool_set))
            self.retired = keep

    def read_drained(self) -> None:
        """A lost device whose submitted steps all ran to their end (drained): the kernels'
        reports of the steps not harvested yet are read from their host-visible regions, in
        step order, as a harvest would (host messages for receive(), counts); nothing is
        asked of the device, and those steps count as harvested (ctx lock held)."""
        inflight = self.inflight
        while inflight:
            self.readback.read_reports(inflight.popleft())

    def _finish_batches(self, done: int) -> None:
        """Drop the batches fully delivered by the steps up to `done` (read back)."""
        live: list[Batch] = []
        for b in self.batches:
            pending = b.pending
            if pending and any(k.destroyed for k in pending):
                b.pending = {k for k in pending if not k.destroyed}
            if b.finish_if_done(done):
                if isinstance(b, InboundBatch):
                    self.retire_sets(b)
            else:
                live.append(b)
        if len(live) != len(self.batches):
            self.batches[:] = live   # (in place: the runtime's accept appends to this list)
        self.ctx.cond.notify_all()

    def retire_sets(self, b: InboundBatch) -> None:
        """Free the descriptor sets made for inbound batch b once the steps that read it
        (up to its last_value) are done (with the lock held)."""
        self.retired += [(b.last_value, s) for s in b.sets]
        b.sets = []

    def stalled(self) -> str:
        """What the device's oldest unfinished step waits for, for a timeout's message:
        each timeline it waits on that has not reached the value it needs (a transfer's
        landing, a relay, a caller's wait point), with the value it has now."""
        try:
            done = self.ctx.completed()
        except VkmError as exc:
            return f"its timeline cannot be read ({exc})"
        rec = next((r for r in self.inflight if r.value > done), None)
        if rec is None:
            return f"it completed step {done}"
        short = []
        for sem, value in rec.waits:
            try:
                now: Any = self.ctx.slot.native.timeline_value(sem)
            except VkmError:
                now = "?"
            if now == "?" or now < value:
                short.append(f"timeline {sem:#x} at {now} of {value}")
        kernels = ", ".join(sorted({k.id for k, _, _ in rec.kernels}))
        return (f"it completed step {done}; step {rec.value} ({kernels}) waits for "
                + (", ".join(short) if short else "no timeline still short of its value (the GPU runs it)"))

    # -- waiting for room ------------------------------------------------------------

    def _blocking_value(self, kernels: list[Kernel]) -> int:
        """A timeline value the host must see complete before this step can be recorded (0: none)."""
        d = self.ctx.in_flight
        if len(self.inflight) >= d:
            return self.inflight[0].value
        for k in kernels:
            j = k.steps % d
            res = k.residency
            if not res.region_harvested[j]:
                return res.region_users[j]
            old = res.outbox_batches[j]
            if old is not None and not old.done and old.last_value > self.harvested:
                return old.last_value   # its delivery results are not known yet
        return 0

    def make_room(self, kernels: list[Kernel], deadline: float) -> None:
        """Wait (harvesting) until the next step of `kernels` can be recorded."""
        self._wait_for(lambda: self._blocking_value(kernels), deadline, kernels, "; nothing was submitted")

    def _wait_for(self, need: Callable[[], int], deadline: float, kernels: Sequence[Kernel] = (),
                  after: str = "") -> None:
        """Wait (harvesting, the lock let go while waiting) until need() is 0; need()
        gives the timeline value to wait for meanwhile. VkmTimeout at `deadline`."""
        while True:
            self.harvest()
            self.ctx.check()
            for k in kernels:
                k.check()
            value = need()
            if not value:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise VkmTimeout(f"GPU {self.ctx.index}: earlier kernel steps did not finish in time "
                                 f"(waiting for timeline value {value}; {self.stalled()}){after}")
            try:
                self.ctx.wait_unlocked(value, min(left, 0.25))
            except VkmTimeout:
                pass

    def _await_submitted(self, kernels: list[Kernel], deadline: float) -> None:
        """Points this step may wait on that a transfer on this step's queue signals
        (inbound batches' arrival, holds on outbox regions about to be reused):
        that transfer's submits must be queued first (an in-order queue cannot run
        a wait placed before its signal). The transfer's worker never needs this
        device's lock, so waiting with it held cannot deadlock."""
        for b in self.batches:
            hook = b.submitted
            if hook is not None and not b.done and b.waits:
                self._run_hook(hook, deadline)
                b.submitted = None
        d = self.ctx.in_flight
        for k in kernels:
            old = k.outbox_batches[k.steps % d]
            while old is not None and old.hold_hooks:
                self._run_hook(old.hold_hooks[0], deadline)
                old.hold_hooks.pop(0)

    def _run_hook(self, hook: Any, deadline: float) -> None:
        """Run a submitted(timeout) hook with the time left until `deadline`."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise VkmTimeout(f"GPU {self.ctx.index}: a transfer this step waits for was not submitted "
                             f"in time; nothing was submitted")
        hook(left)

    # -- one step ---------------------------------------------------------------------

    def step(self, kernels: list[Kernel], waits: Sequence[TimelinePoint], deadline: float, retain: int = 0,
             capture: CaptureFactory | None = None) \
            -> tuple[TimelinePoint | None, list[Kernel], list[tuple[Kernel, str]], list[OutboxBatch]]:
        """One step of `kernels` on this device (see the module docstring); `capture`
        gives copies recorded at the step's end (the replay log's)."""
        self.make_room(kernels, deadline)
        self._await_submitted(kernels, deadline)
        d = self.ctx.in_flight
        launched, deferred = [], []
        for k in kernels:
            # (moved or freed while the lock was let go for room: a restore from a lost GPU takes no turn)
            if k.destroyed or k.ctx is not self.ctx:
                deferred.append((k, "moved off this GPU (or freed) while the step waited"))
                continue
            old = k.residency.outbox_batches[k.steps % d]
            if old is not None and not old.done:
                deferred.append((k, "outbox: messages of an earlier step still wait for room in local inboxes"))
            elif len(k.received) >= k.k2h_capacity:
                deferred.append((k, f"host receive queue full ({k.k2h_capacity} messages): receive() them"))
            else:
                launched.append(k)
        for k, _ in deferred:
            k.stats.deferred_steps += 1
        if not launched:
            return None, [], deferred, []
        value = self.ctx.value + 1
        rec = InFlight(value, self.nsteps % d)
        taken_h2k: list[tuple[Kernel, list[bytes]]] = []
        plan: StepCapture | None = None
        try:
            plan = capture(self.ctx, launched) if capture is not None else None
            gpu_waits, survey_offsets = self.recorder.record(rec, launched, taken_h2k, self.batches, self.retired,
                                                             plan.copies if plan is not None else ())
            if waits:
                gpu_waits += [(p.semaphore, p.value) for p in waits]
            rec.waits = gpu_waits
            ctx = self.ctx
            ctx.step_cmds.submit(ctx.queue_lock, ctx.cmd_ints[rec.region], gpu_waits, ctx.timeline, value)  # type: ignore[arg-type]
        except BaseException as exc:
            if self.ctx.step_cmds.submitted == value:   # an interrupt (Ctrl-C) that came after the submit
                point, _ = self._submitted(value, launched, rec, survey_offsets, retain)
                if plan is not None:
                    plan.submitted(point)
                raise
            if plan is not None:
                plan.abandon()
            for k, slots in reversed(taken_h2k):   # nothing ran: the host messages are still to send
                k.h2k.extendleft(reversed(slots))
            for k in launched:
                if k.injecting is not None and k.injecting[0] == k.steps:
                    items, k.injecting = k.injecting[1], None
                    self.rt.settle_injected(k, None, [], items)
            for b, _ in rec.surveys:
                b.surveyed = False
            for b, x in rec.directs:
                b.cleared.discard(x)
                b.surveyed = False
            with self.ctx.dir_lock:
                self.ctx.dir_dirty.update(rec.directory)
            raise
        try:
            point, new = self._submitted(value, launched, rec, survey_offsets, retain)
        finally:   # (the step ran: its copies are registered even if an interrupt came meanwhile)
            if plan is not None:
                plan.submitted(self.ctx.point(value))
        return point, launched, deferred, new

    def _submitted(self, value: int, launched: list[Kernel], rec: InFlight, survey_offsets: Sequence[int | None],
                   retain: int) -> tuple[Any, list[OutboxBatch]]:
        """The bookkeeping of a step the driver accepted (nothing here may raise): its
        point and its new outbox batches."""
        ctx = self.ctx
        d = ctx.in_flight
        ctx.value = value
        self.nsteps += 1
        point = ctx.point(value)
        new: list[OutboxBatch] = []
        surveys, ran = rec.surveys, rec.kernels
        for k, off in zip(launched, survey_offsets):
            step = k.steps
            j = step % d
            b = OutboxBatch(k, step, j, point)
            b.retained = retain
            b.surveyed = True
            b.lazy = k.quiet_batches >= QUIET_BATCHES   # probably empty: read once its step is done
            new.append(b)
            surveys.append((b, off))  # type: ignore[arg-type]
            res = k.residency
            res.outbox_batches[j] = b
            res.region_users[j] = value
            res.region_harvested[j] = False
            ran.append((k, j, step))
            k.steps = step + 1
            k.stats.steps_submitted += 1
            res.last_value = value
        for b, k, _ in rec.delivers:  # type: ignore[assignment]
            k.last_value = value
            if b is not None:
                b.waits = []
                b.last_value = value
                if b.source is not None and b.source.ctx is ctx:   # (an inbound batch's source is elsewhere)
                    b.source.last_value = value
        for sb, _ in surveys:
            sb.waits = []
            sb.last_value = value
        self.batches += new
        self.inflight.append(rec)
        ctx.cond.notify_all()
        return point, new

    # -- runs of quiet steps (the native run) ------------------------------------------

    def read_back_for_quiet(self, kernels: list[Kernel], deadline: float) -> None:
        """Wait (harvesting) until the steps in flight that are not quiet steps of `kernels`
        are done and read back: quiet_run's wait, made with only this device's lock held
        (the lock is let go while waiting; taking it back while holding another device's
        could deadlock)."""
        shape = tuple(kernels)
        if any(rec.quiet != shape for rec in self.inflight):
            self._wait_for(lambda: self.inflight[-1].value if self.inflight else 0, deadline)

    def quiet_run(self, kernels: list[Kernel], deadline: float, wait: bool = True) -> Any:
        """A native plan (StepRun) of quiet steps of `kernels`, or None where their next
        step may do more than a quiet one does (StepRecorder.quiet_template): deliver
        or survey a batch, take host messages or routed ones, update the directory,
        capture for a replay log, wait on another timeline, defer a kernel (the caller
        asked the step listeners and the outbox feed first, before taking the device
        locks: Inbound.listeners_quiet). Steps in flight that are not quiet steps of
        these kernels are waited for and read back first (`wait`; else None: see
        read_back_for_quiet). With the lock held."""
        ctx, d = self.ctx, self.ctx.in_flight
        shape = tuple(kernels)
        if ctx.dir_dirty or len(kernels) * SURVEY_RECORD > STATUS_WORDS or d > _native.RUN_MAX_DEPTH:
            return None
        if any(rec.quiet != shape for rec in self.inflight):   # (every step in flight done and read back first)
            if not wait:
                return None
            self.read_back_for_quiet(kernels, deadline)
        else:
            self.harvest()
        ctx.check()
        if any(b.done for b in self.batches):   # (let go by a listener since their step was read back)
            self._finish_batches(self.harvested)
        foreign = {id(b) for rec in self.inflight for b, _ in rec.surveys}
        if any(id(b) not in foreign for b in self.batches):
            return None
        for k in kernels:
            k.check()
            if k.ctx is not ctx or k.replaying or k.restoring or k.errors or k.injecting is not None or k.h2k \
                    or len(k.received) >= k.k2h_capacity:
                return None
            for b in k.residency.outbox_batches:
                if b is not None and (b.holds or b.hold_hooks or (not b.done and id(b) not in foreign)):
                    return None
        templates = []
        for t in range(d):
            ops, patches, offsets = self.recorder.quiet_template(kernels, t, (self.nsteps + t) % d)
            checks: list[tuple[Any, int]] = []
            captures: list[tuple[Any, int, int]] = []
            for i, (k, off) in enumerate(zip(kernels, offsets)):
                base = (k.steps + t) % d * k.k2h_region // 4
                words = k.k2h.words
                checks += [(words, base), (words, base + 1), (words, base + 2), (words, base + 3),
                           (ctx.status.words, off + 12), (ctx.status.words, off + 13)]
                captures.append((words, base + 6, i))
            templates.append((ops, patches, checks, captures))
        for k in kernels:   # (no routed messages in any region: see StepRecorder._place_injected)
            words = k.k2h.words
            for j in range(d):
                words[j * k.k2h_region // 4 + 9] = 0
        timeline: Any = ctx.timeline
        return _native.StepRun(ctx.slot.native, ctx.queue_lock, timeline, ctx.cmd_ints, self.nsteps % d, ctx.value,
                               self.harvested, templates, len(kernels), naps=RUN_NAPS, pace_ns=self.pace_ns)


    def settle_run(self, run: Any, kernels: list[Kernel], retain: int) \
            -> tuple[TimelinePoint | None, int, list[OutboxBatch], list[OutboxBatch]]:
        """The bookkeeping of the native run `run` (made by quiet_run for `kernels`):
        steps it found quiet are read back as such (those it submitted itself in
        bulk), the others it submitted are in flight as if recorded here, their new
        outbox batches retained `retain` times. Returns the last step's point (None:
        none submitted), how many steps it submitted, the last step's new outbox
        batches and those of every step in flight, in step order (for the step
        listeners). With the lock held; nothing here may raise."""
        ctx, d = self.ctx, self.ctx.in_flight
        n, checked = run.submitted, run.checked
        self.pace_ns = run.pace_ns
        value0 = ctx.value
        clocks = {k: run.clock(i) for i, k in enumerate(kernels)}   # (of the last step checked, if any)
        inflight = self.inflight
        if inflight and inflight[0].value <= checked:
            while inflight and inflight[0].value <= checked:
                rec = inflight.popleft()
                self.readback.read_quiet(rec, clocks)
                self.harvested = rec.value
            self._finish_batches(checked)
        quiet = max(0, checked - value0)
        if quiet:
            for k in kernels:
                res, st = k.residency, k.stats
                for s in range(max(0, quiet - d), quiet):
                    j = (k.steps + s) % d
                    res.outbox_batches[j] = None
                    res.region_users[j] = value0 + 1 + s
                    res.region_harvested[j] = True
                k.steps += quiet
                k.quiet_batches += quiet
                st.steps_submitted += quiet
                st.steps_completed = k.steps
                res.last_value = value0 + quiet
                st.clock = HlcTimestamp.from_words(*clocks[k])
            ctx.value = self.harvested = value0 + quiet
            self.nsteps += quiet
        point: TimelinePoint | None = None
        new: list[OutboxBatch] = []
        every: list[OutboxBatch] = []
        shape = tuple(kernels)
        for i in range(quiet, n):
            value = value0 + 1 + i
            rec = InFlight(value, self.nsteps % d)
            rec.quiet = shape
            point, new = self._submitted(value, kernels, rec, quiet_survey_offsets(rec.region, len(kernels)), retain)
            every += new
        if n:
            point = ctx.point(value0 + n)
            ctx.cond.notify_all()
        return point, n, new, every

    def surveys_awaited(self) -> set[int]:
        """The devices whose sending steps' surveys, not read back yet, decide whether a
        direct landing here is read in place (KernelRuntime.step reads back the
        devices it stepped already, if their steps are done, before this one's).
        Read without the lock: a hint."""
        out = set()
        for b in list(self.batches):
            if b.direct is not None:
                origin = b.k2k_origin
                if origin is not None and origin.pending is None:
                    out.add(origin.device_index)
        return out
