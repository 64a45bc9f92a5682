"""The replay log: what each kernel consumed and sent per step since its latest
policy checkpoint, kept on the host so a kernel of a lost GPU can be rebuilt
from that checkpoint and run its steps again with the same inputs
(kernels/replay.py), and the messages nobody consumed yet can be handed again.

While a checkpoint policy is set, every step copies, at its end and in its
own command buffer, each stepped kernel's inbox ring, the outbox region the
step wrote and the header of its K2H report into host-visible memory (no
host wait, no submit of its own; a step the log could not join is copied
right behind it by a job on the same queue). Once the copy completed (at the
next step, poll() or the failover) the host keeps:

* per kernel and step, the message slots the step consumed (host messages and
  K2K messages alike, with their envelopes, in inbox order): the replay input;
* per (sender address, receiver address), the messages the sender's steps
  wrote that the receiver has not consumed yet (the consumption is read from
  the receiver's logged inboxes: per-pair FIFO makes it a prefix, one number,
  the next the receiver expects; PairStreams, which also keeps the count
  across a restore that sets a sender's sequence numbers back);
* per kernel, the steps whose K2H messages the host has received.

Per-step inputs older than the kernel's latest completed checkpoint are
dropped; sent messages once their receiver consumed them.
"""
from __future__ import annotations

import logging
import struct
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import vulkan as vk

from ..._core import vkapi
from ..._core.checks import short_repr
from ..._core.lifetime import Deadline
from ...errors import DeviceLostError, TimeoutError as VkmTimeout, VkmError
from ..engine import recording as cmds
from ...memory.buffer import MappedBuffer
from ...memory.staging import SpareBuffers
from ..engine.gpu_jobs import StepTimeline
from ..engine.step_ops import copy_op
from ..messages import ENVELOPE_BYTES, RING_HEADER_BYTES
from .host_crc import HostCrc
from .image import CONTROL_HEADER_BYTES
from .twin import LifecycleView

log = logging.getLogger(__name__)

__all__ = ["ReplayLog", "KernelLog", "PairStreams", "StepPlan", "still_running"]

_HEAD = struct.Struct("<4I")
_ENV = struct.Struct("<IIQ")          # source, destination, sequence (the envelope's first words)
_REPORT_BYTES = 64


@dataclass
class KernelLog:
    """The logged steps of one kernel (by id)."""
    address: int
    inputs: dict[int, list[bytes]] = field(default_factory=dict)   # step -> consumed slots, in order
    last: int = -1                 # the newest step logged (-1: none)
    first: int = 0                 # steps before this are not logged (policy set later, pruned)
    gap: int | None = None         # a step that could not be logged (inputs from there on are unknown)

    def covers(self, start: int, end: int) -> bool:
        """Whether the inputs of steps start..end-1 are all logged."""
        if self.gap is not None and start <= self.gap < end:
            return False
        return all(s in self.inputs for s in range(start, end))


@dataclass
class _Entry:
    kernel: Any
    kid: str
    address: int
    step: int
    slot: int                       # slot bytes
    inbox_at: int
    inbox_size: int
    outbox_at: int
    report_at: int
    before: tuple[int, int | None] = (-1, None)   # the kernel's log's (last, gap) before this entry
    epoch: int = 0                  # the kernel's sequence epoch when the step was recorded (PairStreams)


@dataclass
class _Capture:
    device: int
    buffer: MappedBuffer | None     # None: read from the kernels' own memory once the device is drained
    jobs: Any                       # what `point` is on: completed() and wait(point, timeout)
    point: Any
    entries: list[_Entry]
    call: int = 0                   # the step() call that launched the steps
    size: int = 0                   # bytes of the copy


class ReplayLog:
    """The replay log of one KernelRuntime (see the module docstring)."""

    def __init__(self, life: LifecycleView):
        self.life, self.rt = life, life.rt
        self.lock = threading.Lock()
        self.kernels: dict[str, KernelLog] = {}
        self.pending: list[_Capture] = []
        #: per (source address, destination address): what was sent and not consumed yet, and how far
        #: the destination consumed
        self.streams = PairStreams()
        #: the runtime's step() calls so far (a message is consumed no earlier than the call after its own)
        self.call = 0
        #: kernel id -> [(step() call that sent it, slot)]: messages handed again, released to the
        #: kernel's host queue from the step() call after the one that sent each
        self.handed: dict[str, deque[tuple[int, bytes]]] = {}
        self.spares = SpareBuffers()   # copy buffers whose copies were read, for later ones
        #: bytes copied to the host per step, for the figures (docs/explanation/failover.md)
        self.bytes_logged = 0

    # -- capture -------------------------------------------------------------------------

    def after_step(self, launched: list[Any]) -> None:
        """Queue the copies of the kernels a step launched that are not logged yet (a
        no-op for those their steps logged already)."""
        by_device: dict[int, list[Any]] = {}
        for k in launched:
            if not k.destroyed:
                by_device.setdefault(k.device_index, []).append(k)
        for dev, ks in by_device.items():
            try:
                ctx = self.rt._context(dev)
            except VkmError as exc:   # (its device lost and released since)
                log.warning("replay log: could not log the step of %s on GPU %d: %s", [k.id for k in ks], dev, exc)
                with self.lock:
                    for k in ks:
                        kl = self._log_of(k, k.steps - 1)
                        if k.steps - 1 > kl.last and kl.gap is None:
                            kl.gap = k.steps - 1
                continue
            with ctx.lock:
                self.log_submitted(ctx, dev, ks)

    def plan(self, ctx: Any, ks: list[Any]) -> "StepPlan | None":
        """The copies of the step of `ks` about to be recorded on `ctx` (its lock held),
        recorded at the step's end (DeviceStepper.step's capture); None when none of
        them needs logging, or the copy's buffer could not be made (those steps are
        then not logged: a gap, as when a copy fails)."""
        entries, total = self._entries(ctx, ks, upcoming=True)
        if not entries:
            return None
        dev = ctx.index
        try:
            buf = self.spares.get(ctx.slot, total)
        except (VkmError, vk.VkError, MemoryError) as exc:
            self._gap(entries, dev, exc)
            return None
        d = ctx.in_flight
        copies = []
        for e in entries:
            k, j = e.kernel, e.step % d
            copies += [copy_op(k.inbox.handle_int, buf.handle_int, 0, e.inbox_at, e.inbox_size),
                       copy_op(k.outbox.handle_int, buf.handle_int, j * k.outbox_region, e.outbox_at,
                               k.outbox_bytes),
                       copy_op(k.k2h.handle_int, buf.handle_int, j * k.k2h_region, e.report_at, _REPORT_BYTES)]
        return StepPlan(self, ctx, buf, entries, total, copies)

    def log_submitted(self, ctx: Any, dev: int, ks: list[Any]) -> None:
        """Queue the copy of the step `ks` just submitted on device `dev` (its context's
        lock held since the submit: no other step of the device comes in between).

        A device marked lost between the step's submit and this copy's still runs
        the step (a loss injected by the fault hook, which drains it): where the
        host can read the device's memory, the failover reads the step's rings
        there once the device is drained, so the step stays logged."""
        entries, total = self._entries(ctx, ks)
        if not entries:
            return
        try:
            self._submit(ctx, dev, entries, total)
        except DeviceLostError as exc:
            if not HostCrc.suits(ctx.slot):
                self._gap(entries, dev, exc)
                return
            with self.lock:
                self.pending.append(_Capture(dev, None, None, None, entries, self.call, total))
        except (VkmError, vk.VkError, MemoryError) as exc:
            self._gap(entries, dev, exc)

    def _gap(self, entries: list[_Entry], dev: int, exc: BaseException) -> None:
        """The steps of `entries` are not logged: their kernels' inputs from there on are unknown."""
        log.warning("replay log: could not log the step of %s on GPU %d: %s", [e.kid for e in entries], dev, exc)
        with self.lock:
            for e in entries:
                kl = self.kernels.get(e.kid)
                if kl is not None and kl.address == e.address and (kl.gap is None or e.step < kl.gap):
                    kl.gap = e.step

    def _log_of(self, k: Any, step: int) -> KernelLog:
        kl = self.kernels.get(k.id)
        if kl is None or kl.address != k.address:
            kl = self.kernels[k.id] = KernelLog(k.address, first=step)
        return kl

    def _entries(self, ctx: Any, ks: list[Any], upcoming: bool = False) -> tuple[list[_Entry], int]:
        """Where each kernel's rings of its latest step (`upcoming`: of the step about to
        be recorded) go in the copy, and its size."""
        entries: list[_Entry] = []
        at = 0
        for k in ks:
            if k.destroyed or k.ctx is not ctx:
                continue
            step = k.steps if upcoming else k.steps - 1
            with self.lock:
                kl = self._log_of(k, step)
                if kl.address == k.address and step <= kl.last:
                    continue   # logged already (the failover logs a step's survivors first)
                before = (kl.last, kl.gap)
                if kl.last >= 0 and step != kl.last + 1 and kl.gap is None:
                    kl.gap = kl.last + 1   # stepped in between without a log: not logged
                kl.last = step
                epoch = self.streams.epoch(k.address)
            e = _Entry(k, k.id, k.address, step, k.slot_size, at, k.inbox.size, 0, 0, before, epoch)
            at += k.inbox.size
            e.outbox_at = at
            at += k.outbox_bytes
            e.report_at = at
            at += _REPORT_BYTES
            entries.append(e)
        return entries, at

    def _submit(self, ctx: Any, dev: int, entries: list[_Entry], total: int) -> None:
        """Record and submit the copy of `entries` on `ctx` (its lock held)."""
        jobs = self.life.extras(dev).jobs
        buf = self.spares.get(ctx.slot, total)
        d = ctx.in_flight

        def record(cmd: Any) -> None:
            cmds.barrier(cmd)
            for e in entries:
                k, j = e.kernel, e.step % d
                vk.vkCmdCopyBuffer(cmd, k.inbox.handle, buf.handle, 1, [
                    vk.VkBufferCopy(srcOffset=0, dstOffset=e.inbox_at, size=e.inbox_size)])
                vk.vkCmdCopyBuffer(cmd, k.outbox.handle, buf.handle, 1, [
                    vk.VkBufferCopy(srcOffset=j * k.outbox_region, dstOffset=e.outbox_at, size=k.outbox_bytes)])
                vk.vkCmdCopyBuffer(cmd, k.k2h.handle, buf.handle, 1, [
                    vk.VkBufferCopy(srcOffset=j * k.k2h_region, dstOffset=e.report_at, size=_REPORT_BYTES)])
            cmds.barrier(cmd, host=True)
        try:
            point = jobs.submit(record, users=[buf] + [b for e in entries for b in (e.kernel.inbox, e.kernel.outbox,
                                                                                  e.kernel.k2h)])
        except BaseException:
            buf.destroy()
            raise
        with self.lock:
            self.pending.append(_Capture(dev, buf, jobs, point, entries, self.call, total))
            self.bytes_logged += total

    def _host_copy(self, c: _Capture) -> np.ndarray:
        """What the copy of `c` would have held, read by the host from the kernels' own
        memory (a drained device whose memory is all host-visible: HostCrc.suits)."""
        out = np.zeros(c.size, np.uint8)
        for e in c.entries:
            k = e.kernel
            j = e.step % k.ctx.in_flight
            for buf, src, dst, size in ((k.inbox, 0, e.inbox_at, e.inbox_size),
                                        (k.outbox, j * k.outbox_region, e.outbox_at, k.outbox_bytes),
                                        (k.k2h, j * k.k2h_region, e.report_at, _REPORT_BYTES)):
                out[dst:dst + size] = _read_memory(k.ctx.slot, buf, src, size)
        return out

    # -- reading back --------------------------------------------------------------------

    def materialize(self, *, wait: bool = False, timeout: float | None = 30.0,
                    drained: frozenset[int] = frozenset()) -> None:
        """Read the completed copies into the host log (all of them with `wait`; on the
        devices in `drained`, lost but known to have run all their submitted work, all
        of them without asking the device); `timeout` bounds the waits of all of them."""
        deadline = Deadline(timeout)
        with self.lock:
            pending, self.pending = self.pending, []
        keep: list[_Capture] = []
        for c in pending:
            if c.buffer is None:   # to be read from the kernels' memory once the device is drained
                if c.device in drained:
                    self._read(c, self._host_copy(c))
                else:
                    keep.append(c)
                continue
            if c.device not in drained:
                try:
                    if wait:
                        c.jobs.wait(c.point, deadline.left())
                    elif c.jobs.completed() < c.point.value:
                        keep.append(c)
                        continue
                except DeviceLostError:
                    keep.append(c)   # the failover decides (drained or not)
                    continue
                except VkmTimeout:
                    keep.append(c)
                    continue
            self._read(c)
        with self.lock:
            self.pending = keep + self.pending
        self._prune()

    def drop_device(self, device: int) -> list[_Entry]:
        """Forget the copies still pending on a lost device whose work is unknown; the
        entries they held (those steps' inputs are not logged)."""
        with self.lock:
            lost = [c for c in self.pending if c.device == device]
            self.pending = [c for c in self.pending if c.device != device]
        out = []
        for c in lost:
            out += c.entries
            if c.buffer is None:
                continue
            try:
                c.buffer.destroy()
            except VkmError:
                pass
        with self.lock:
            for e in out:
                kl = self.kernels.get(e.kid)
                if kl is not None and (kl.gap is None or e.step < kl.gap):
                    kl.gap = e.step
        return out

    def _read(self, c: _Capture, raw: Any = None) -> None:
        state = self.life.policy_state
        covered = state.covers if state is not None else (lambda kid: False)
        raw = c.buffer.bytes if raw is None else raw  # type: ignore[union-attr]
        with self.lock:
            for e in c.entries:
                kl = self.kernels.get(e.kid)
                if kl is None or kl.address != e.address:
                    continue
                head = raw[e.report_at:e.report_at + 16].tobytes()
                _, out_count, _, in_count = _HEAD.unpack(head)
                ib = raw[e.inbox_at:e.inbox_at + e.inbox_size]
                _, tail, cap, _ = _HEAD.unpack(ib[:16].tobytes())
                slots = []
                for i in range(min(in_count, cap)):
                    at = RING_HEADER_BYTES + ((tail - in_count + i) % cap) * e.slot
                    s = ib[at:at + e.slot].tobytes()
                    slots.append(s)
                    src, dst, seq = _ENV.unpack_from(s)
                    if src:
                        self.streams.add_consumed((src, dst), seq)
                if covered(e.kid):   # (the others' inboxes count for what they consumed only)
                    kl.inputs[e.step] = slots
                ob = raw[e.outbox_at:e.outbox_at + RING_HEADER_BYTES + out_count * e.slot]
                cap_out = _HEAD.unpack(ob[:16].tobytes())[2]
                for i in range(min(out_count, cap_out)):
                    at = RING_HEADER_BYTES + i * e.slot
                    s = ob[at:at + e.slot].tobytes()
                    src, dst, seq = _ENV.unpack_from(s)
                    if dst:   # (0: a message for the host, received by the harvest)
                        self.streams.add_sent((src, dst), seq, e.epoch, c.call, s)
            buf, c.buffer = c.buffer, None
        if buf is not None:
            self.spares.give(buf)

    def _prune(self) -> None:
        """Drop inputs older than each kernel's latest completed checkpoint and sent
        messages their receivers consumed."""
        with self.lock:
            self.streams.prune()
            items = list(self.kernels.items())
        state = self.life.policy_state
        if state is None:
            return
        for kid, kl in items:
            with state.lock:   # (the completed checkpoints as they are: no read-back from here)
                q = state.done.get(kid)
                start = q[-1].steps if q else None
            if start is None:
                continue
            with self.lock:
                for s in [s for s in kl.inputs if s < start]:
                    del kl.inputs[s]
                kl.first = max(kl.first, start)
                if kl.gap is not None and kl.gap < start:
                    kl.gap = None

    def unconsumed(self, src: int, dst: int) -> list[tuple[int, int, bytes]]:
        """The logged messages from address `src` to `dst` that `dst` has not consumed, in order."""
        with self.lock:
            return self.streams.unconsumed((src, dst))

    def pairs_with(self, addresses: set[int]) -> list[tuple[int, int]]:
        with self.lock:
            return self.streams.pairs_with(addresses)

    def rebase(self, address: int, control: Any) -> None:
        """The kernel at `address` was restored, keeping its address, with the control block
        `control` (bytes-like): its per-destination sequence numbers are set back to those
        there (its steps before have all been read into the log; PairStreams)."""
        raw = np.frombuffer(bytes(control), np.uint8)[CONTROL_HEADER_BYTES:]
        table = raw[:len(raw) // 16 * 16].view(np.uint32).reshape(-1, 4)
        next_seqs = {int(d): int(lo) | int(hi) << 32 for d, lo, hi, _ in table.tolist() if d}
        with self.lock:
            self.streams.rebase(address, next_seqs)

    def begin_call(self) -> None:
        """A step() call begins: messages handed again that are due go to their kernels."""
        with self.lock:
            self.call += 1
        self.release_due()

    def hand(self, k: Any, items: list[tuple[int, bytes]]) -> None:
        """Queue messages handed again to kernel k ((sending call, slot), in order)."""
        with self.lock:
            self.handed.setdefault(k.id, deque()).extend(items)
        self.release_due()

    def release_due(self) -> None:
        """Put the handed-again messages sent before the current step() call at the end of
        their kernels' host queues: after the host messages sent before the call, as a step
        delivers its kernels' host messages first and the K2K batches after them."""
        rt = self.rt
        with self.lock:
            if not self.handed:
                return
            due: dict[str, list[bytes]] = {}
            for kid, q in list(self.handed.items()):
                while q and q[0][0] < self.call:
                    due.setdefault(kid, []).append(q.popleft()[1])
                if not q:
                    del self.handed[kid]
        for kid, slots in due.items():
            k = rt._kernels.get(kid)
            if k is None or k.destroyed:
                rt.record_dead_letters(f"{len(slots)} message(s) handed again to {short_repr(kid)}, which is gone", len(slots))
                continue
            with k.ctx.lock:
                k.h2k.extend(slots)

    def forget(self, kernel_id: str) -> None:
        with self.lock:
            self.kernels.pop(kernel_id, None)

    def destroy(self) -> None:
        try:
            self.materialize(wait=True, timeout=30.0)
        except VkmError:
            pass
        with self.lock:
            pending, self.pending = self.pending, []
        for c in pending:
            if c.buffer is None:
                continue
            if still_running(c):   # nothing the GPU may still write is freed
                log.warning("replay log: a copy still runs at destroy(); its buffer is left to its device's "
                            "destruction")
                continue
            c.buffer.destroy()
        self.spares.destroy()


def still_running(c: Any) -> bool:
    """Whether the copy of capture `c` (the replay log's or a policy checkpoint's, with
    `jobs` and `point`) may still run: its point not reached on a device that is not lost."""
    try:
        return c.jobs is not None and c.jobs.completed() < c.point.value
    except VkmError:   # (DeviceLostError among them: a lost device runs nothing more)
        return False


class StepPlan:
    """The replay log's copies recorded at the end of one step (a StepCapture)."""

    __slots__ = ("log", "ctx", "buffer", "entries", "total", "copies")

    def __init__(self, log: ReplayLog, ctx: Any, buffer: MappedBuffer, entries: list[_Entry], total: int,
                 copies: list[bytes]):
        self.log, self.ctx, self.buffer, self.entries, self.total, self.copies = log, ctx, buffer, entries, total, \
            copies

    def submitted(self, point: Any) -> None:
        """The step ran with the copies: read them back once `point` is reached."""
        rl = self.log
        with rl.lock:
            rl.pending.append(_Capture(self.ctx.index, self.buffer, StepTimeline(self.ctx), point, self.entries,
                                       rl.call, self.total))
            rl.bytes_logged += self.total

    def abandon(self) -> None:
        """Nothing was submitted: the kernels' logs are as they were, the buffer is spare."""
        rl = self.log
        with rl.lock:
            for e in self.entries:
                kl = rl.kernels.get(e.kid)
                if kl is not None and kl.address == e.address and kl.last == e.step:
                    kl.last, kl.gap = e.before
        rl.spares.give(self.buffer)


def _read_memory(slot: Any, buf: Any, offset: int, size: int) -> np.ndarray:
    """`size` bytes of `buf` from `offset`, read by the host through a mapping of its
    memory (a device whose memory is all host-visible; its work all done)."""
    mapped = getattr(buf, "bytes", None)
    if mapped is not None:
        return np.array(mapped[offset:offset + size])
    ptr = vkapi.vkMapMemory(slot.device, buf.memory, 0, buf.size, 0)
    try:
        return np.array(np.frombuffer(ptr, np.uint8, count=buf.size)[offset:offset + size])
    finally:
        vk.vkUnmapMemory(slot.device, buf.memory)


def envelope_of(slot: bytes) -> tuple[int, int, int]:
    """(source, destination, sequence) of a packed message slot."""
    return _ENV.unpack_from(slot)


assert ENVELOPE_BYTES >= _ENV.size


_Pair = tuple[int, int]


class PairStreams:
    """The replay log's message streams, one per (sender address, receiver address), used
    under its lock: what the sender's logged steps sent that the receiver has not consumed
    yet, and how far the receiver consumed (the next number it expects: FIFO per pair).

    `restore(cp, into=k)` sets k's sequence numbers back while its receivers consumed some
    of them and its later messages may still be on their way: its numbers repeat. So a
    pair counts on across it (`rebase`): k's later messages are numbered from where its
    earlier ones ended (sequence number plus the offset of k's epoch when their step was
    recorded), and a consumption goes to the oldest stretch that can hold it (FIFO)."""

    def __init__(self) -> None:
        #: pair -> the next stream number the receiver expects
        self.consumed: dict[_Pair, int] = {}
        #: pair -> [(stream number, step() call, slot bytes)] sent and not consumed yet, in order
        self.sent: dict[_Pair, deque[tuple[int, int, bytes]]] = {}
        #: sender address -> its epoch (restores that set its sequence numbers back)
        self.epochs: dict[int, int] = {}
        #: pair -> [(sender epoch, first stream number, offset)], one per epoch since the first rebase
        self._stretches: dict[_Pair, list[tuple[int, int, int]]] = {}

    def epoch(self, address: int) -> int:
        """The epoch of the sender at `address` (the step being recorded numbers its messages by it)."""
        return self.epochs.get(address, 0)

    def add_sent(self, key: _Pair, seq: int, epoch: int, call: int, slot: bytes) -> None:
        """A message the sender's step (recorded in `epoch`) sent, in order."""
        offset = 0
        for e, _, off in self._stretches.get(key, ()):
            if e <= epoch:
                offset = off
        self.sent.setdefault(key, deque()).append((seq + offset, call, slot))

    def add_consumed(self, key: _Pair, seq: int) -> None:
        """The receiver consumed the pair's message with sequence number `seq`."""
        head = self.consumed.get(key, 0)
        n = seq
        stretches = self._stretches.get(key)
        if stretches:
            n = seq + stretches[-1][2]
            for i, (_, first, off) in enumerate(stretches):
                end = stretches[i + 1][1] if i + 1 < len(stretches) else None
                if end is not None and end <= head:
                    continue   # (consumed to its end)
                if max(first, head) <= seq + off and (end is None or seq + off < end):
                    n = seq + off
                    break
        if n + 1 > head:
            self.consumed[key] = n + 1

    def rebase(self, address: int, next_seqs: dict[int, int]) -> None:
        """The sender at `address` restarts its sequence numbers at `next_seqs` (receiver
        address -> its next sequence number; 0 for a receiver not listed): its later
        messages are numbered after every one it sent so far (all of them read first)."""
        epoch = self.epochs[address] = self.epoch(address) + 1
        for key in {k for k in (*self.consumed, *self.sent) if k[0] == address}:
            q = self.sent.get(key)
            top = max(self.consumed.get(key, 0), q[-1][0] + 1 if q else 0)
            stretches = self._stretches.setdefault(key, [(0, 0, 0)])
            stretches.append((epoch, top, top - next_seqs.get(key[1], 0)))

    def prune(self) -> None:
        """Drop the sent messages their receivers consumed."""
        for key, q in self.sent.items():
            done = self.consumed.get(key, 0)
            while q and q[0][0] < done:
                q.popleft()

    def unconsumed(self, key: _Pair) -> list[tuple[int, int, bytes]]:
        """The pair's logged messages its receiver has not consumed, in order."""
        done = self.consumed.get(key, 0)
        return [e for e in self.sent.get(key, ()) if e[0] >= done]

    def pairs_with(self, addresses: set[int]) -> list[_Pair]:
        """The pairs with messages logged whose sender or receiver is at one of `addresses`."""
        return [key for key in self.sent if key[0] in addresses or key[1] in addresses]
