"""The K2K router's moves between devices that share memory (DMABUF): no copy.

A kernel's outbox is exported where another device of the manager can import
its memory (KernelRuntime.exports_outboxes). A batch such a kernel's step
wrote is then handed to the next hop's kernels *in place*: that device
imports the outbox (once per kernel), and its next step reads the batch
through the import, after a GPU wait on a relay (`TimelineRelay`: the
sending device's timeline mirrored on the receiving device by a native
thread that signals it from the host; no host wait, on any queue). Nothing
crosses through a transfer ring, and the one copy left is the receiving
step's: into the inbox, by a copy command where the batch is all for one
kernel (a direct landing), else by the delivery passes; none where the
sending step's survey, read back, says the batch is all for one kernel of the
one device that reads it: that kernel's step reads it where it lies, as its
inbox (the stepper's in-place reading).

The batch is retained (its kernel is deferred before the region is reused)
until every device that reads it in place is done: its kernels took their
messages, and the moves forwarding it to further hops read it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ...errors import DestroyedError, DeviceLostError, VkmError
from ...errors import TimeoutError as VkmTimeout
from ...transfer.methods import TransferMethod
from ...transfer.peer import ExportedBuffer, TimelineRelay, shares_memory
from ..engine.kernel import InboundBatch, Kernel, OutboxBatch
from ..engine.stepper import QUIET_BATCHES
from ..runtime.ports import RuntimePort
from .landing import nothing_left, reached

log = logging.getLogger(__name__)

__all__ = ["PeerLanding", "PeerEdges", "direct_guess"]


def direct_guess(port: RuntimePort, k: Kernel, device: int) -> tuple[Kernel | None, int | None]:
    """The kernel of `device` a batch of `k` is likely all for (its latest non-empty
    batch was), and the slots worth copying for it; (None, None) for no guess."""
    addr, count = k.dest_hint
    if not addr or not count:
        return None, None
    x = port.kernel_by_address(addr)
    if x is None or x.device_index != device or x.tenant != k.tenant:
        return None, None
    return x, min(k.spec.outbox_capacity, x.spec.inbox_capacity, 1 << (count - 1).bit_length())


@dataclass
class PeerLanding:
    """One batch read in place on one device: the batch, the device's inbound
    batch over its import (None where no kernel runs there), the relay, and
    the region that forwards it to further hops (None: none)."""
    edge: tuple[int, int]
    batch: OutboxBatch
    inbound: InboundBatch | None
    relay: Any
    forward: Any = None
    created: float = field(default_factory=time.monotonic)

    def finished(self, mgr: Any) -> bool:
        if self.inbound is not None and not self.inbound.done:
            return False
        f = self.forward
        if f is not None and (f.readers > 0 or not all(reached(mgr.slot(f.device), p) for p in f.reads)):
            return False
        return True


class PeerEdges:
    """The in-place moves of a DeliveryEngine (all methods run with the router's
    delivery lock held)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.port, self.mgr = engine.port, engine.mgr
        self.relays: dict[tuple[int, int, int], TimelineRelay] = {}   # (from, to, timeline followed)
        self.landings: list[PeerLanding] = []
        self._usable: dict[tuple[int, int], bool] = {}
        self._views: dict[tuple[int, int], Any] = {}   # (id of an outbox, device) -> its import there
        self.dead_relays: list[TimelineRelay] = []   # relays of a lost device (no landing uses them)

    def usable(self, a: int, b: int, trees: Any, batches: list[OutboxBatch]) -> bool:
        """Whether batches of device a go to b in place: a P2P edge whose method is
        DMABUF, between devices that share memory, from exported outboxes."""
        if not all(isinstance(x.buffer, ExportedBuffer) for x in batches):
            return False
        hit = self._usable.get((a, b))
        if hit is None:
            hit = not trees.is_host_mediated(a, b) and \
                self.engine.method_for(a, b, False) == TransferMethod.DMABUF and \
                shares_memory(self.mgr.slot(a), self.mgr.slot(b))
            self._usable[(a, b)] = hit
        return hit

    def land(self, s: int, c: int, batches: list[OutboxBatch], trees: Any) -> bool:
        """Hand one step's batches of device s to device c in place (and queue the
        moves that forward them on). False when the pair turned out unable to
        (nothing was handed over; the caller moves them through a link)."""
        eng = self.engine
        point = batches[-1].ready   # one step of s: one point for all its batches
        try:
            relay = self.relays.get((s, c, point.semaphore))
            if relay is None:
                relay = self.relays[(s, c, point.semaphore)] = TimelineRelay(self.mgr.slot(s), point.semaphore,
                                                                             self.mgr.slot(c))
            views = [self._view(b.buffer, c) for b in batches]   # (the outbox the batch was written in)
            ticket = relay.relay(point)
        except DestroyedError:   # a sender destroyed since its step (the caller drops its batch, moves the rest)
            return False
        except (VkmError, MemoryError) as exc:
            log.warning("K2K router: GPU %d cannot read GPU %d's batches in place (%s); moving them instead",
                        c, s, exc)
            self._usable[(s, c)] = False
            return False
        hops = min(trees.edge_hops(s, c), 255)
        serves = c in eng.kernel_devices   # (as of this step's trees(), which the caller took)
        onward = trees.children(s, c)
        total = sum(b.size for b in batches)
        eng.edge_moves[(s, c)] += 1
        eng.edge_bytes[(s, c)] += total
        eng.stats.add_moved(len(batches), total)
        waits = [ticket.dst_ready]
        # c is the one device that reads these regions: a kernel a batch is all for may read it in place
        exclusive = not onward and trees.children(s, s) == [c]
        for b, view in zip(batches, views):
            inbound = None
            if serves:
                x, slots = direct_guess(self.port, b.kernel, c)
                try:
                    inbound = self.port.accept_in_place(c, view, b, waits, hops, x, slots,
                                                        b.kernel.quiet_batches >= QUIET_BATCHES)
                except DeviceLostError:   # forgotten with the device; a policy's failover hands them again
                    continue
                except (VkmError, ValueError) as exc:
                    eng.fail_batch(b, f"GPU {c} could not take its messages: {exc}")
                    continue
                inbound.k2k_origin = b
                inbound.exclusive = exclusive
                b.k2k_landings.append((c, inbound))  # type: ignore[attr-defined]
            b.retain()   # until c and the hops after it are done reading it in place
            landing = PeerLanding((s, c), b, inbound, ticket)
            if onward:
                landing.forward = eng.forward_region(c, view, b, s, hops, ticket, onward, trees)
            self.landings.append(landing)
        return True

    def _view(self, outbox: ExportedBuffer, device: int) -> Any:
        """The import of `outbox` on `device` (made once; a destroyed one is made again)."""
        key = (id(outbox), device)
        v = self._views.get(key)
        if v is None or v.source is not outbox or v.destroyed:
            v = self._views[key] = outbox.import_on(self.mgr.slot(device))
        return v

    def forget_freed(self) -> None:
        """Let go of imports whose outbox was freed (a kernel destroyed or moved): the
        runtime's descriptor sets made for them too."""
        gone = [k for k, v in self._views.items() if v.destroyed]
        for k in gone:
            try:
                self.port.forget_buffer(self._views.pop(k))
            except DestroyedError:
                return

    def settle(self, kernels: list[Kernel], timeout: float) -> None:
        """Before a step of `kernels`: where a kernel's next outbox region is still
        read in place by steps already submitted on other devices (or by moves
        forwarding it), wait for those (bounded by `timeout`) and let it go, as a
        device waits for its own oldest step before reusing a region. A batch no
        submitted step has read yet stays held: its kernel is deferred."""
        if not self.landings:
            return
        held: set[OutboxBatch] = set()
        for k in kernels:
            b = k.outbox_batches[k.steps % k.ctx.in_flight] if not k.destroyed else None
            if b is not None and b.retained and not b.done:
                held.add(b)
        if not held:
            return
        read, link_points = [], []
        completed: dict[int, int] = {}   # (per device, read once: steps done there already need no wait)
        for p in self.landings:
            if p.batch not in held or p.finished(self.mgr):
                continue
            i = p.inbound
            if i is not None and not i.done and i.last_value:
                dev = i.device_index
                done = completed.get(dev)
                if done is None:
                    done = completed[dev] = self._completed(i)
                if i.last_value > done:
                    read.append(i)
            if p.forward is not None and p.forward.readers <= 0:
                link_points += [(p.forward.device, q) for q in p.forward.reads]
        try:
            if read:
                self.port.wait_reads(read, timeout)
            for dev, q in link_points:
                self.mgr.slot(dev).native.wait_timeline(q.semaphore, q.value, timeout)
        except VkmTimeout:
            pass   # still read: the kernel is deferred this time
        self._release(held)

    def settle_idle(self, deadline: float) -> bool:
        """Where every in-place landing is of a batch read lazily (its sender's recent batches
        held nothing) and forwards nowhere: wait (until `deadline`, monotonic s) for the steps
        that wrote them and for those that read them already, and read every device back, so
        that a reap lets go of those that hold nothing. False (nothing waited for) otherwise,
        and where a wait ran out or a device is gone."""
        if not all(p.batch.lazy and p.forward is None for p in self.landings):
            return False
        last: dict[tuple[int, int], int] = {}   # (device, timeline) -> the latest value to wait for: one wait each
        for p in self.landings:
            b, i = p.batch, p.inbound
            points = [(b.device_index, b.ready)]
            if i is not None and not i.done and i.last_value:
                points.append((i.device_index, i.ctx.point(i.last_value)))
            for dev, q in points:
                last[(dev, q.semaphore)] = max(q.value, last.get((dev, q.semaphore), 0))
        try:
            for (dev, semaphore), value in last.items():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.mgr.slot(dev).native.wait_timeline(semaphore, value, left)
        except (VkmTimeout, VkmError):   # (a lost device: the step path fails over from it)
            return False
        self.port.poll()
        return True

    def _release(self, held: set[OutboxBatch]) -> None:
        """Let go of the in-place landings of the held batches that every device
        finished reading, once the reading devices' harvests have finished their
        inbound batches; the rest of the router's reaping waits for its next turn."""
        self.port.poll()
        self._sweep(time.monotonic(), held)

    @staticmethod
    def _completed(i: Any) -> int:
        """The value the timeline of inbound batch i's device reached (0: not known)."""
        try:
            return i.ctx.completed()
        except VkmError:   # a lost or destroyed device: wait_reads says what to do
            return 0

    def reap(self, now: float) -> None:
        """Let go of batches every device finished reading in place; a landed batch that
        holds nothing more for its device (landing.nothing_left) is taken back."""
        self.forget_freed()
        self._sweep(now, None)

    def _sweep(self, now: float, only: set[OutboxBatch] | None) -> None:
        """Let go of the landings (of the batches in `only`; None: all) that hold
        nothing more and every device finished reading; let go of what a landed batch
        no longer holds for its device (landing.nothing_left)."""
        keep = []
        for p in self.landings:
            if only is None or p.batch in only:
                i = p.inbound
                if i is not None and nothing_left(i, p.edge[1]):
                    try:
                        self.port.let_go_batch(i)
                    except DestroyedError:
                        pass
                if p.finished(self.mgr):
                    self._count(p, now)
                    p.batch.release()
                    continue
            keep.append(p)
        self.landings = keep

    def _count(self, p: PeerLanding, now: float) -> None:
        i = p.inbound
        if i is None:
            return
        stats = self.engine.stats
        if i.delivered:
            stats.add_routed(i.delivered, 0, int((now - p.created) * 1e6) * i.delivered)
        if i.rejected:
            stats.add_failures(i.rejected)

    def busy(self) -> bool:
        return bool(self.landings)

    def drop_device(self, d: int) -> None:
        """GPU d was lost: forget the in-place reads to and from it (see DeliveryEngine.drop_device)
        and let go of the survivors' steps that wait on relays of its steps. Until now
        those relays followed what the lost device really ran (TimelineRelay.release):
        a survivor's step reads a batch in place only once its sending step wrote it."""
        keep = []
        for p in self.landings:
            if d not in p.edge:
                keep.append(p)
                continue
            i = p.inbound
            if i is not None and not i.done:
                i.done = True
                i.event.set()
            try:
                p.batch.release()
            except (VkmError, ValueError):   # a lost device's batch, or one let go with its kernel
                pass
        self.landings = keep
        for key in [k for k in self.relays if d in k[:2]]:
            relay = self.relays.pop(key)
            if key[0] == d:   # survivors' steps still waiting on its steps go now (their device was drained)
                try:
                    relay.release(f"GPU {d} was lost")
                except VkmError as exc:
                    log.info("K2K router: a relay of a lost device: %s", exc)
            self.dead_relays.append(relay)   # destroyed with the others
        for key in [k for k in self._views if k[1] == d]:  # type: ignore[assignment]
            self._views.pop(key)  # type: ignore[arg-type]

    def destroy(self, deadline: float) -> None:
        """Take back what was not delivered (counted as failures), wait for the
        relays, let every batch go."""
        stats = self.engine.stats
        for p in self.landings:
            i = p.inbound
            if i is not None and not i.done:
                try:
                    left = self.port.withdraw_batch(i, timeout=max(0.0, deadline - time.monotonic()))
                except DestroyedError:   # the runtime went first: its steps are over
                    left = 0
                if left:
                    stats.add_failures(left)
                    log.warning("K2K router detached: %d message(s) for GPU %d were not delivered", left, p.edge[1])
        stuck = []
        for relay in list(self.relays.values()) + self.dead_relays:   # no step waits on them any more
            try:
                relay.destroy(max(0.0, deadline - time.monotonic()))
            except VkmTimeout:   # kept, with the landings, for the next detach()
                stuck.append(relay)
            except VkmError as exc:   # a lost device's
                log.info("K2K router: a relay of a lost device: %s", exc)
        self.relays.clear()
        self.dead_relays = stuck
        if stuck:
            raise VkmTimeout(f"K2K router: {len(stuck)} relay(s) still in use; nothing they use was freed "
                             f"(detach() again)")
        for p in self.landings:
            try:
                p.batch.release()
            except ValueError:   # its kernel was destroyed and the batch let go with it
                pass
        self.landings = []
