"""Recording one step of a device into its command buffer (DeviceStepper's
recorder): which batches the step reads and how (copied, taken directly or read
in place), the delivery passes into the kernels' inboxes, the surveys, the
kernels' dispatches and their finish passes. The phases are in stepper.py's
docstring; the stepper submits what this records.
"""
from __future__ import annotations

import struct
import time
from typing import Any, Sequence

import numpy as np

from ..messages import RING_HEADER_BYTES
from .recording import handle_value
from .step_ops import BARRIER, HOST_BARRIER, KernelOps, copy_op, pass_op, update_op
from .device_context import DELIVER_RECORD, STATUS_WORDS, SURVEY_RECORD, WHOLE_SIZE, DeviceContext
from .kernel import Batch, InboundBatch, Kernel, OutboxBatch, finish_buffers

__all__ = ["StepRecorder", "InFlight", "quiet_survey_offsets", "PLANNED_DELIVERY_PAYLOAD", "READ_IN_PLACE",
           "MODE_COPY", "MODE_PLAN", "MODE_DIRECT", "MODE_DIRECT_KNOWN", "MODE_IN_PLACE"]

_KERNEL_PUSH = struct.Struct("<8I4I")
_FINISH_PUSH = struct.Struct("<8I")
_DELIVER_PUSH = struct.Struct("<8I")
_SURVEY_PUSH = struct.Struct("<4I")
#: Payloads from this size on are delivered in two passes: a plan, then a copy with one
#: workgroup per message (all invocations on its words) instead of one invocation per message.
PLANNED_DELIVERY_PAYLOAD = 1024
#: Delivery pass modes (kernel_deliver.comp's `plan` word): copy, plan (a copy pass follows),
#: direct (the step copied the batch into the inbox with a copy command: take it in place),
#: in place (no copy: the kernel's step reads the batch where it lies, as its inbox).
MODE_COPY, MODE_PLAN, MODE_DIRECT, MODE_DIRECT_KNOWN, MODE_IN_PLACE = 0, 1, 2, 3, 4
#: Whether a kernel's step may read an inbound batch that is all its own where it lies (as its
#: inbox) instead of a copy in its inbox (False: always the copy; tests use it to reach the copy
#: paths, bench/k2k.py --no-in-place to measure them).
READ_IN_PLACE = True


class InFlight:
    """What the host must read back once the step with `value` completes (one per
    device step: a plain slotted class, cheaper to make than a dataclass with list
    factories)."""

    __slots__ = ("value", "region", "kernels", "delivers", "surveys", "directory", "directs", "in_place", "waits",
                 "quiet")

    def __init__(self, value: int, region: int):
        self.value, self.region = value, region
        self.kernels: list[tuple[Kernel, int, int]] = []      # kernel, region, step
        self.delivers: list[tuple[Batch | None, Kernel, int]] = []   # batch (None: h2k), kernel, offset
        self.surveys: list[tuple[Batch, int]] = []
        self.directory: list[int] = []    # directory entries this step rewrote
        self.directs: list[tuple[InboundBatch, Kernel]] = []   # batches taken in place
        self.in_place = 0   # of them, read by their kernel's step where they lie (no copy)
        self.waits: Sequence[tuple[int, int]] = ()   # (timeline, value) the GPU waits for first (set at the submit)
        self.quiet: tuple[Kernel, ...] | None = None   # a quiet step of these kernels (a native run's), or None

    def __repr__(self) -> str:
        return f"InFlight(value={self.value}, region={self.region}, kernels={[k.id for k, _, _ in self.kernels]})"


class StepRecorder:
    """Records the steps of one DeviceContext (its ctx lock held)."""

    def __init__(self, runtime: Any, ctx: DeviceContext):
        self.rt, self.ctx = runtime, ctx

    def record(self, rec: InFlight, launched: list[Kernel], taken_h2k: list, batches: list[Batch],
               retired: list, tail: Any = ()) -> tuple[list[tuple[int, int]], list[int | None]]:
        """Record the step `rec` of `launched` into the command buffer of its region,
        the packed copy ops `tail` last (after everything the step wrote).

        Fills `rec` with what the harvest reads back, appends the host messages it
        took to `taken_h2k` and descriptor sets to free once done to `retired`;
        `batches` are the device's batches not yet fully delivered. Returns the
        GPU waits of the submit and the status offsets of the new outboxes' surveys."""
        ctx = self.ctx
        c = ctx.step_cmds
        status_free = STATUS_WORDS
        offset = rec.region * STATUS_WORDS

        def take(words: int) -> int | None:
            nonlocal status_free
            if status_free < words:
                return None
            status_free -= words
            return offset + (STATUS_WORDS - status_free - words)

        # status records for the new outboxes' surveys come first: they are never skipped
        outbox_surveys = [take(SURVEY_RECORD) for _ in launched]
        gpu_waits: list[tuple[int, int]] = []
        waited: set[Batch] = set()

        def wait_for(b: Batch) -> None:
            if b.waits and b not in waited:   # (most batches were read before: no waits left)
                waited.add(b)
                gpu_waits.extend([(p.semaphore, p.value) for p in b.waits])
        ops: list[bytes | bytearray] = [BARRIER]
        self._record(ops, rec, launched, taken_h2k, batches, retired, take, outbox_surveys, gpu_waits, wait_for)
        if tail:   # (before the closing barrier, which makes them visible to the host too)
            ops[-1:] = [BARRIER, *tail, HOST_BARRIER]
        c.record(ctx.cmd_ints[rec.region], b"".join(ops))   # (the whole step in one native call)
        return gpu_waits, outbox_surveys

    def _record(self, ops: list[bytes | bytearray], rec: InFlight, launched: list[Kernel], taken_h2k: list,
                batches: list[Batch], retired: list, take: Any, outbox_surveys: list, gpu_waits: list,
                wait_for: Any) -> None:
        ctx, d = self.ctx, self.ctx.in_flight
        # 1. (after the barrier `ops` starts with) directory, outbox counts
        if ctx.dir_dirty:   # (an entry marked after this look is marked for the next step)
            with ctx.dir_lock:
                rec.directory = sorted(ctx.dir_dirty)
                ctx.dir_dirty.clear()
            for idx in rec.directory:
                entry = self.rt.directory_entry(idx)
                ops.append(update_op(ctx.directory.handle_int, idx * 16, entry))
        feed = self.rt.outbox_feed
        for k in launched:
            j = k.steps % d
            res = k.residency
            ops.append(res.step_ops[j].outbox_reset(res.outbox, res.spec, j * res.outbox_region))
            self._place_injected(k, j, feed)
            old = res.outbox_batches[j]
            if old is not None and old.holds:
                gpu_waits += [(p.semaphore, p.value) for p in old.holds]
        # direct landings: the batch's slots into the (empty) inbox at ring slot 0, by a copy command
        readable = self._readable(batches)
        directs = self._directs(launched, rec, take, readable)
        # kernel -> the (step, finish) sets that bind the batch it reads in place as its inbox
        in_place = {x: self._in_place_sets(x, b, retired) for x, b, _, copied in directs if copied < 0}
        for x, b, _, copied in directs:
            if copied > 0:
                ops.append(copy_op(handle_value(b.buffer.handle), x.inbox.handle_int, b.offset + RING_HEADER_BYTES,
                                   RING_HEADER_BYTES, copied * x.slot_size))
        ops.append(BARRIER)
        # 2. deliveries and surveys of new inbound batches
        mode = MODE_PLAN if self.rt.payload_size >= PLANNED_DELIVERY_PAYLOAD else MODE_COPY
        # kernel, set, offset, status, hops, slots, mode, slots copied in place
        passes: list[tuple[Kernel, Any, int, int, int, int, int, int]] = []
        for x, b, off, copied in directs:   # first: they start the inbox where the copy put the window
            dset = self._deliver_set(x, ("in", b.buffer, b.size) if b.reuse_sets else None, b.buffer,
                                     b.size, b)
            # the sending step's survey read back already: all the batch's messages are x's (and its tenant's,
            # stamped by the sender's finish pass), so the pass need not check them
            how = MODE_IN_PLACE if copied < 0 else MODE_DIRECT_KNOWN if _known(b.k2k_origin, x, copied) \
                else MODE_DIRECT
            passes.append((x, dset, b.offset, off, b.hops, 0, how, max(copied, 0)))
            rec.delivers.append((b, x, off))
            wait_for(b)
        for k in launched:
            if not k.h2k or k in in_place:   # (its step reads a batch in place: they go next step)
                continue
            j = k.steps % d
            n = min(len(k.h2k), k.spec.inbox_capacity)
            off = take(DELIVER_RECORD)
            if off is None:
                break
            slots = [k.h2k.popleft() for _ in range(n)]
            taken_h2k.append((k, slots))
            base = j * k.h2k_region
            region = k.h2k_buffer.bytes[base:base + k.h2k_bytes]
            region[RING_HEADER_BYTES:RING_HEADER_BYTES + n * k.slot_size] = np.frombuffer(b"".join(slots), np.uint8)
            k.h2k_buffer.words[base // 4] = n
            dset = self._deliver_set(k, (k.h2k_buffer.handle_int, k.h2k_bytes), k.h2k_buffer, k.h2k_bytes)
            passes.append((k, dset, base, off, 0, n, mode, 0))
            rec.delivers.append((None, k, off))
        for b in readable:  # type: ignore[assignment]
            for k in launched:
                if not b.takes(k) or k in in_place or k.replaying:   # (a replayed step takes only its logged inputs)
                    continue
                off = take(DELIVER_RECORD)
                if off is None:
                    break
                inbound = isinstance(b, InboundBatch)
                if not inbound:
                    key = (b.buffer.handle_int, b.size)
                else:
                    key = ("in", b.buffer, b.size) if b.reuse_sets else None  # type: ignore[assignment] # (by the object: never a stale handle)
                dset = self._deliver_set(k, key, b.buffer, b.size, b)
                slots = (b.size - RING_HEADER_BYTES) // k.slot_size if inbound else b.kernel.spec.outbox_capacity  # type: ignore[assignment, attr-defined]
                passes.append((k, dset, b.offset, off, b.hops, slots, mode, 0))  # type: ignore[arg-type]
                rec.delivers.append((b, k, off))
                b.passed.add(id(k))   # (some of its messages may be delivered already: never direct for k now)
                wait_for(b)
        if passes:
            self._record_deliveries(ops, passes)
        for b, _ in rec.directs:   # a direct pass that takes the whole batch tells as much as a survey
            b.surveyed = True
        new_inbound = [b for b in readable if not b.surveyed and isinstance(b, InboundBatch)]
        if new_inbound:
            for b in new_inbound:
                off = take(SURVEY_RECORD)
                if off is None:
                    break
                key = (b.buffer, b.size)
                pool_set = ctx.buffer_sets.get(key) if b.reuse_sets else None
                if pool_set is None:
                    pool_set = ctx.descriptor_set(ctx.survey, [(b.buffer.handle, 0, b.size),
                                                              (ctx.directory.handle, 0, WHOLE_SIZE),
                                                              (ctx.status.handle, 0, WHOLE_SIZE)])
                    if b.reuse_sets:
                        ctx.buffer_sets[key] = pool_set
                    else:
                        b.sets.append(pool_set)
                ops.append(self._survey(pool_set[1], b.offset, off))
                rec.surveys.append((b, off))
                b.surveyed = True
                wait_for(b)
        # 3.-5. the kernels, their finish passes, the surveys of their new outboxes
        now = time.time_ns() // 1000
        dispatches: list[bytes | bytearray] = [BARRIER]
        finishes: list[bytes | bytearray] = [BARRIER]
        for k, off in zip(launched, outbox_surveys):
            kops = self._kernel_ops(k, in_place.get(k), off, now)
            dispatches.append(kops.kernel)
            finishes.append(kops.finish)   # (each also surveys the outbox it stamped)
        ops += dispatches
        ops += finishes
        ops.append(HOST_BARRIER)

    def quiet_template(self, launched: list[Kernel], ahead: int, region: int) \
            -> tuple[bytes, list[tuple[int, int, int]], list[int]]:
        """The step `ahead` steps after the next of `launched` (every one stepping each
        step) as a quiet step records it (nothing to deliver, survey or update: see
        _record), in status region `region`: its packed ops, the (dispatch, finish
        pass) record indices to stamp with each kernel's step, and the status
        offsets of the outbox surveys. The stamps in the ops are placeholders."""
        d = self.ctx.in_flight
        offsets = quiet_survey_offsets(region, len(launched))
        resets, kernels, finishes = [], [], []
        for k, off in zip(launched, offsets):
            res = k.residency
            j = (k.steps + ahead) % d
            resets.append(res.step_ops[j].outbox_reset(res.outbox, res.spec, j * res.outbox_region))
            kops = self._kernel_ops(k, None, off, 0, ahead)
            kernels.append(bytes(kops.kernel))
            finishes.append(bytes(kops.finish))
        n = len(launched)
        first = n + 3   # (BARRIER, the resets, BARRIER, BARRIER: as _record orders them)
        patches = [(first + i, first + n + 1 + i, k.steps) for i, k in enumerate(launched)]
        ops = [BARRIER, *resets, BARRIER, BARRIER, *kernels, BARRIER, *finishes, HOST_BARRIER]
        return b"".join(ops), patches, offsets

    def _kernel_ops(self, k: Kernel, sets: tuple[Any, Any] | None, survey_offset: int | None,
                    now_us: int, ahead: int = 0) -> KernelOps:
        """k's dispatch and finish pass (which surveys the new outbox into the status record
        at `survey_offset`) of its next step, or the one `ahead` steps later (`sets`: the
        step's and the finish pass's sets where it reads a batch in place), kept packed per
        region (KernelOps): only the step and the clock (`now_us`) change from one step to
        the next, stamped in here."""
        j = (k.steps + ahead) % self.ctx.in_flight
        res = k.residency
        kp, spec = res.kernel_pass, res.spec
        kset, fset = (res.kernel_set, res.finish_set) if sets is None else sets
        # (by the set handles as they are: a cffi handle hashes and compares by its address)
        key = (kp.pipeline_int, kp.layout_int, kset, fset, survey_offset, k.address, k.tenant, k.params,
               spec.inbox_capacity, spec.outbox_capacity, spec.groups, k.payload_size)

        def make() -> tuple[bytes, bytes]:
            ctx = self.ctx
            out = j * res.outbox_region
            kernel = pass_op(kp.pipeline_int, kp.layout_int, handle_value(kset), (out,), _KERNEL_PUSH.pack(
                0, 0, k.address, k.tenant, spec.inbox_capacity, spec.outbox_capacity, k.payload_size // 4, 0,
                *k.params), spec.groups)
            survey = (survey_offset, ctx.index, ctx.table_size, 1) if survey_offset is not None else (0, 0, 1, 0)
            finish = pass_op(ctx.finish.pipeline_int, ctx.finish.layout_int, handle_value(fset),
                             (out, j * k.k2h_region), _FINISH_PUSH.pack(0, 0, 0, 0, *survey))
            return kernel, finish
        return res.step_ops[j].get(key, make, k.steps + ahead, now_us)

    def _readable(self, batches: list[Batch]) -> list[Batch]:
        """The batches this step reads: every one not done, except a lazy one (from a
        sender whose recent batches were empty) that is not known to hold messages
        here yet, which a later step reads (if it has any) instead of this one
        waiting on the GPU for the other device, and the batches after it from the
        same sender (FIFO). Known: a local batch once its step's survey is read
        back, and read anyway by its sender's last step before the region's reuse
        (else two local kernels sending to each other defer each other); a landing
        once its sending step's survey is and names this device
        (else the router takes it back unread) and its relay point is reached,
        or, without a sending step to ask (none, or destroyed), once its wait
        points are reached."""
        out: list[Batch] = []
        held: set[Kernel | None] = set()   # (None never added)
        native, here = self.ctx.slot.native, self.ctx.index
        for b in batches:
            if b.done or (b.pending is not None and not b.pending):   # (nothing more in it for a kernel here)
                continue
            src = b.source
            if held and src in held:
                continue
            if b.lazy:
                if isinstance(b, OutboxBatch):   # local: read at the latest by its sender's last step before reuse
                    ready = b.pending is not None or b.kernel.steps - b.step >= self.ctx.in_flight - 1
                else:
                    origin = b.k2k_origin
                    ready = (origin is None or origin.kernel.destroyed or
                             (origin.pending is not None and origin.remote_devices >> here & 1)) \
                        and all(native.timeline_value(p.semaphore) >= p.value for p in b.waits)
                if not ready:
                    if src is not None:
                        held.add(src)
                    continue
            out.append(b)
        return out

    def _directs(self, launched: list[Kernel], rec: InFlight, take: Any,
                 readable: list[Batch]) -> list[tuple[Kernel, InboundBatch, int, int]]:
        """The inbound batches launched kernels take in place this step (direct
        landings): for each kernel, the first batch guessed to be all its own,
        unless an older batch of the same sender may still hold messages for it
        (FIFO per pair). Each is cleared for its kernel now (the pass takes all of
        them, on the fast path or not). Returns (kernel, batch, status offset,
        slots to copy, or -1 where the kernel's step reads the batch in place)."""
        out: list[tuple[Kernel, InboundBatch, int, int]] = []
        if not any(b.direct is not None for b in readable):
            return out
        stepping = set(launched)
        taken: set[Kernel] = set()
        waiting: set[tuple[Kernel, Kernel]] = set()   # (sender, kernel): an older batch may hold messages for it
        for b in readable:
            x, src = b.direct, b.source
            slots = (b.size - RING_HEADER_BYTES) // self.rt.slot_size
            if x is not None and src is not None and x in stepping and x not in taken and \
                    not x.destroyed and not x.replaying and slots <= x.spec.inbox_capacity and b.takes(x) and \
                    id(x) not in b.passed and (src, x) not in waiting:   # (the empty inbox holds it all)
                off = take(DELIVER_RECORD)
                if off is None:
                    break
                taken.add(x)
                b.cleared.add(x)
                rec.directs.append((b, x))  # type: ignore[arg-type]
                copied = min(b.direct_slots, slots)
                if self._readable_in_place(b, x, readable):  # type: ignore[arg-type]
                    copied = -1
                    rec.in_place += 1
                out.append((x, b, off, copied))  # type: ignore[arg-type]
            if src is not None:
                for k in launched:
                    if b.takes(k):
                        waiting.add((src, k))
        return out

    def _readable_in_place(self, b: InboundBatch, x: Kernel, readable: list[Batch]) -> bool:
        """Whether x's step can read b (a direct landing for x: its whole batch fits
        x's inbox) where it lies instead of a copy in its inbox: no other device
        reads the region meanwhile (b.exclusive), the sending step's survey was
        read back and says every message is x's, x takes nothing else this step
        (no host message, no batch of another sender: they would wait a step;
        the same sender's later batches do wait, the next steps read them in
        turn, where the batch fills more than half of x's inbox: a backlog of
        smaller ones goes faster through the copy paths, several a step), and
        the region is aligned for a storage buffer binding."""
        if not (READ_IN_PLACE and b.exclusive):
            return False
        origin = b.k2k_origin
        if not (origin is not None and origin.pending is not None
                and not _inboxes_logged(self.rt)
                and not x.h2k and b.offset % self.ctx.min_offset_alignment == 0
                and _known(origin, x, (b.size - RING_HEADER_BYTES) // self.rt.slot_size)):
            return False
        src = b.source
        later = [o for o in readable if o is not b and o.takes(x)]
        if any(src is None or o.source is not src for o in later):
            return False
        return not later or 2 * origin.count > x.spec.inbox_capacity

    def _in_place_sets(self, k: Kernel, b: InboundBatch, retired: list) -> tuple[Any, Any]:
        """The descriptor sets of k's step and finish pass with the batch region as the
        inbox (kept per kernel, buffer and offset like delivery sets, or with the batch)."""
        ctx, whole = self.ctx, WHOLE_SIZE
        # (by the kernel's pipeline too: a hot reload gives it another, its old sets are let go)
        key = ("in", b.buffer, b.size, "in place", b.offset, id(k.kernel_pass)) if b.reuse_sets else None
        pair = k.deliver_sets.get(key + ("kernel",)) if key else None  # type: ignore[arg-type]
        if pair is not None:
            return pair[1], k.deliver_sets[key + ("finish",)][1]  # type: ignore[index, operator]
        stale = [x for x in k.deliver_sets if len(x) > 5 and x[3] == "in place" and x[5] != id(k.kernel_pass)]
        for x in stale:
            retired.append((ctx.value, k.deliver_sets.pop(x)))
        inbox = (b.buffer.handle, b.offset, b.size)
        kset = ctx.descriptor_set(k.kernel_pass, [inbox, (k.outbox.handle, 0, k.outbox_bytes)]
                                  + [(s.handle, 0, whole) for s in k.states])
        fset = ctx.descriptor_set(ctx.finish, finish_buffers(ctx, k, inbox))
        if key:
            k.deliver_sets[key + ("kernel",)], k.deliver_sets[key + ("finish",)] = kset, fset  # type: ignore[index]
        else:
            b.sets += [kset, fset]
        return kset[1], fset[1]

    def _place_injected(self, k: Kernel, j: int, feed: Any) -> None:
        """Messages the host routes as `k` (outbox feed) go into the last slots of the
        step's K2H region; the finish pass appends what fits after k's own. One
        such step per kernel is in flight at a time, so what did not fit goes
        back to the front of the feed before anything newer is placed."""
        base = j * k.k2h_region
        words = k.k2h.words
        words[base // 4 + 9] = 0
        if feed is None or k.injecting is not None or k.replaying:
            return
        items = feed.take(k, k.spec.outbox_capacity)
        if not items:
            return
        n = len(items)
        start = base + RING_HEADER_BYTES + (k.spec.outbox_capacity - n) * k.slot_size
        k.k2h.bytes[start:start + n * k.slot_size] = np.frombuffer(b"".join(slot for slot, _ in items), np.uint8)
        words[base // 4 + 9] = n
        k.injecting = (k.steps, items)

    def _deliver_set(self, k: Kernel, key: tuple | None, buffer: Any, size: int, batch: Batch | None = None) -> Any:
        """The descriptor set of a delivery pass from `buffer` into k's inbox (kept per
        kernel and buffer; an inbound batch's own sets live and die with it)."""
        ctx = self.ctx
        if key is None:
            pool_set = ctx.descriptor_set(ctx.deliver, [(buffer.handle, 0, size), (k.inbox.handle, 0, WHOLE_SIZE),
                                                        (ctx.status.handle, 0, WHOLE_SIZE)])
            batch.sets.append(pool_set)   # type: ignore[union-attr]
        else:
            pool_set = k.deliver_sets.get(key)  # type: ignore[assignment]
            if pool_set is None:
                pool_set = k.deliver_sets[key] = ctx.descriptor_set(
                    ctx.deliver, [(buffer.handle, 0, size), (k.inbox.handle, 0, WHOLE_SIZE),
                                  (ctx.status.handle, 0, WHOLE_SIZE)])
        return pool_set[1]

    def _record_deliveries(self, ops: list[bytes | bytearray],
                           passes: list[tuple[Kernel, Any, int, int, int, int, int, int]]) -> None:
        """The delivery passes, in rounds: passes into one inbox are ordered by a
        barrier (each reads and moves its tail), passes into different inboxes
        run side by side. Large messages go plan first, then a copy pass."""
        ctx = self.ctx
        rounds: list[list[tuple]] = []
        seen: dict[Kernel, int] = {}
        for p in passes:
            r = seen.get(p[0], 0)
            seen[p[0]] = r + 1
            if r == len(rounds):
                rounds.append([])
            rounds[r].append(p)
        deliver = ctx.deliver
        for i, group in enumerate(rounds):
            if i:
                ops.append(BARRIER)
            for k, dset, offset, status, hops, _, mode, copied in group:
                ops.append(pass_op(deliver.pipeline_int, deliver.layout_int, handle_value(dset), (offset,),
                                   _DELIVER_PUSH.pack(k.address, k.tenant, status, hops, mode, copied, 0, 0)))
            planned = [p for p in group if p[6] == MODE_PLAN]
            if planned:
                ops.append(BARRIER)
                copy = ctx.deliver_copy
                status_buffer = ctx.status.handle_int
                for k, dset, offset, status, hops, slots, _, _ in planned:
                    # as many workgroups as the plan found messages for (none: nothing runs)
                    ops.append(pass_op(copy.pipeline_int, copy.layout_int, handle_value(dset), (offset,),
                                       _DELIVER_PUSH.pack(k.address, k.tenant, status, hops, 1, 0, 0, 0),
                                       indirect=status_buffer, indirect_offset=4 * (status + 4)))

    def _survey(self, dset: Any, offset: int, status: int | None) -> bytes:
        ctx = self.ctx
        return pass_op(ctx.survey.pipeline_int, ctx.survey.layout_int, handle_value(dset), (offset,),
                       _SURVEY_PUSH.pack(status, ctx.index, ctx.table_size, 0))


def quiet_survey_offsets(region: int, n: int) -> list[int]:
    """The status offsets of the outbox surveys of a quiet step of `n` kernels in status
    region `region` (record() takes them first, in the kernels' order)."""
    return [region * STATUS_WORDS + i * SURVEY_RECORD for i in range(n)]


def _inboxes_logged(rt: Any) -> bool:
    """Whether the runtime's replay log (a checkpoint policy's) reads what each step consumed
    from its kernel's inbox ring (replay_log.py): then no step reads a batch in place, which
    would leave the inbox as it was (the log would keep stale slots as the step's input and
    miss what it consumed: a restored kernel replayed on stale inputs, messages it consumed
    handed again). The direct landing's copy command puts the batch in the inbox instead; the
    log would need that copy anyway."""
    return rt.checkpoint_policy is not None


def _known(origin: OutboxBatch | None, x: Kernel, copied: int) -> bool:
    """Whether the host read back the survey of a batch's sending step (`origin`, the batch's
    k2k_origin) and it says that all of its messages (at most `copied`) are x's, from a
    sender of x's tenant."""
    return origin is not None and origin.single_dest == x.address and origin.count <= copied \
        and origin.kernel.tenant == x.tenant
