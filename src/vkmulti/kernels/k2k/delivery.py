"""The K2K router's delivery engine: moves the outbox batches of a KernelRuntime's
steps to the other devices with the transfer engine, hop by hop along the
router's routes, and hands them to the runtime there.

Per step and source device S, the new outbox batches go to every device S's
route tree reaches (which of them a batch addresses is only known on the GPU,
after the step): one move per (S, next hop) carries all of them (gathered into
one egress region on S by a device copy when there are several). A landing
region on the next hop receives the move; the runtime there takes the
messages addressed to its kernels (the step after waits on the GPU for the
transfer's `dst_ready`), and the landing is forwarded as is to the next hops
of S's tree. Every device gets each batch once, so every message is delivered
once; a batch's order is kept on every edge, so per-pair FIFO holds.

Between devices that share memory (DMABUF) nothing is copied: the next hop
reads the batch in place through an import of the sender's outbox, after a
relay of the sending step's point (peer_delivery.py).

Back-pressure: each edge has at most `max_landings` landing regions in use;
a move that finds none waits in its edge's queue (in order), and the outbox
batches it carries stay retained, so their kernels are deferred before their
regions are reused (KernelRuntime's deferral) instead of anything being
dropped.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import vulkan as vk

from ...errors import DestroyedError, DeviceLostError, TimeoutError as VkmTimeout, VkmError
from ...memory.image import Buffer
from ..._core.timeline import TimelinePoint
from ...transfer.cross_device import CrossDeviceTransfer
from ...transfer.methods import TransferMethod, select_transfer_method
from ..coordinator import transfer_spec
from ..engine.device_context import shares_step_queue
from ..engine.kernel import InboundBatch, Kernel, OutboxBatch
from ..engine.stepper import QUIET_BATCHES
from ..runtime.ports import RuntimePort
from .landing import Gather, LandingPool, align, nothing_left, reached
from .peer_delivery import PeerEdges, direct_guess
from .routing import CrossGpuRouterStats, RouteTrees

log = logging.getLogger(__name__)

__all__ = ["DeliveryEngine"]

#: After a step, landings are recycled (and what they delivered counted) at most this often,
#: unless moves wait or an edge has half its landings in use.
REAP_SECONDS = 0.02

def let_go(b: Any) -> None:
    """Release a batch the router held, whatever its device's state (a lost one's
    batches are simply forgotten: the count drops before the device is asked)."""
    try:
        b.release()
    except (VkmError, ValueError) as exc:
        log.info("K2K router: %s", exc)


@dataclass
class Part:
    """One outbox batch's bytes inside a region: its sender, where it sits, how big."""
    kernel: Kernel
    batch: OutboxBatch
    offset: int
    size: int


@dataclass
class Region:
    """Bytes on one device that moves read: an outbox batch ('outbox'), a gathered
    egress region ('egress') or a landing region ('landing')."""
    kind: str
    device: int
    buffer: Any
    offset: int
    size: int
    parts: list[Part]
    origin: int                      # the device whose kernels sent it
    hops: int = 0                    # device crossings so far (added to each message's hop count)
    ready: TimelinePoint | None = None
    ticket: Any = None               # the transfer that filled a landing
    batches: list[OutboxBatch] = field(default_factory=list)   # retained outbox batches it carries
    readers: int = 0                 # moves still to submit that read it
    reads: list[TimelinePoint] = field(default_factory=list)   # reached when its readers are done
    inbounds: list[InboundBatch] = field(default_factory=list)
    edge: tuple[int, int] | None = None
    created: float = field(default_factory=time.monotonic)
    counted: bool = False


@dataclass
class Move:
    edge: tuple[int, int]
    region: Region
    hops: int                        # the landing's hop count


class DeliveryEngine:
    """Moves a runtime's cross-device K2K traffic (see the module docstring): talks
    to the runtime through `port` (its RuntimePort), reads the routes and the
    transfer methods of `router`, counts in the router's `stats`. All methods
    run with the router's delivery lock held."""

    def __init__(self, router: Any, port: RuntimePort, stats: CrossGpuRouterStats, *, max_landings: int,
                 submit_timeout: float):
        self.router, self.port, self.stats = router, port, stats
        self.mgr = port.manager
        self.max_landings = max_landings
        self.submit_timeout = submit_timeout
        self.queues: dict[tuple[int, int], deque[Move]] = defaultdict(deque)
        self.landings: dict[tuple[int, int], list[Region]] = defaultdict(list)
        self.egress: list[Region] = []
        self.pools: dict[int, LandingPool] = {}
        self.gathers: dict[int, Gather] = {}
        self.links: dict[tuple[int, int], tuple[str, CrossDeviceTransfer]] = {}   # (from, to) -> (method, link)
        self.dead: list[Region] = []           # landings of a lost device's moves, freed at destroy
        self.dead_links: list[tuple[str, CrossDeviceTransfer]] = []   # links of a lost device, destroyed at destroy
        self._trees: RouteTrees | None = None
        self._trees_key: Any = None
        self._trees_now: RouteTrees | None = None
        self.kernel_devices: frozenset[int] = frozenset()   # where kernels run, as of the latest trees()
        self._reaped = 0.0
        self.moves_submitted = 0
        self.edge_bytes: dict[tuple[int, int], int] = defaultdict(int)   # bytes moved per (from, to) device
        self.edge_moves: dict[tuple[int, int], int] = defaultdict(int)
        #: outbox batches holding points of this engine's semaphores (cleared at destroy, when they go)
        self.held: list[tuple[OutboxBatch, TimelinePoint]] = []
        self._shared_cache: dict[tuple[int, str | None], bool] = {}
        self.peers = PeerEdges(self)   # in-place moves between devices that share memory

    # -- routes and links ----------------------------------------------------------

    def trees(self) -> RouteTrees:
        if self._trees_now is not None:   # fixed for the rest of one step's moves
            return self._trees_now
        devices = self.kernel_devices = frozenset(k.device_index for k in self.port.kernels)
        coord = self.router.coordinator
        key = (devices, getattr(coord, "topology_generation", None))
        if self._trees is None or key != self._trees_key:
            self._trees = RouteTrees(self.router.topology(), devices)
            self._trees_key = key
        self._trees_now = self._trees
        return self._trees

    def method_for(self, a: int, b: int, host: bool) -> str:
        """The transfer method of edge a -> b: the router's `transfer_methods`, a host
        method for host-mediated edges, else the coordinator's (the pair's best)."""
        method = self.router.transfer_methods.get((a, b))
        if method is not None:
            return method
        if host:
            return transfer_spec.CrossDeviceTransfer(a, b, 1).without_p2p().method(self.mgr)
        method = self.router.coordinator.transfer_method(a, b) if hasattr(
            self.router.coordinator, "transfer_method") else None
        if method is None:
            method = select_transfer_method(self.mgr.slot(a), self.mgr.slot(b))
        return method

    def _link(self, a: int, b: int, host: bool) -> CrossDeviceTransfer:
        """The transfer that moves batches on edge a -> b (made again when its method changes)."""
        method = self.method_for(a, b, host)
        cached = self.links.get((a, b))
        if cached is not None and cached[0] == method:
            return cached[1]
        if cached is not None:
            cached[1].destroy(self.submit_timeout)
        link = CrossDeviceTransfer(self.mgr.slot(a), self.mgr.slot(b), method)
        self.links[(a, b)] = (method, link)
        return link

    def method(self, a: int, b: int) -> str | None:
        """The method batches went by on edge a -> b (None: none went yet)."""
        cached = self.links.get((a, b))
        if cached:
            return cached[0]
        if any(key[:2] == (a, b) for key in self.peers.relays):
            return TransferMethod.DMABUF
        return None

    def _pool(self, device: int) -> LandingPool:
        p = self.pools.get(device)
        if p is None:
            p = self.pools[device] = LandingPool(self.mgr.slot(device))
        return p

    # -- a step's batches -----------------------------------------------------------

    def on_step(self, batches: list[OutboxBatch]) -> None:
        now = time.monotonic()
        if self.queues or now - self._reaped > REAP_SECONDS or \
                (self.landings and any(len(v) * 2 >= self.max_landings for v in self.landings.values())):
            self.reap()
        self._trees_now = None
        by_device: dict[int, list[OutboxBatch]] = defaultdict(list)
        for b in batches:
            if b.kernel.destroyed:   # destroyed since its step: its outbox is gone
                b.k2k_moves, b.k2k_landings = 0, []  # type: ignore[attr-defined]
                b.release()
                continue
            by_device[b.device_index].append(b)
        trees = self.trees() if by_device else None
        for s, bs in sorted(by_device.items()):
            children = trees.children(s, s)  # type: ignore[union-attr]
            for b in bs:
                b.k2k_moves = 0  # type: ignore[attr-defined]
                b.k2k_landings = []  # type: ignore[attr-defined]
            # devices that share memory with s read the batches in place; the others get moves
            children = [c for c in children if not (self.peers.usable(s, c, trees, bs)
                                                    and self.peers.land(s, c, bs, trees))]
            if not children:   # nowhere (else) to go: the runtime retained them for us until now
                for b in bs:
                    b.release()
                continue
            region = self._source_region(s, bs)
            if region is None:
                continue
            for c in children:
                region.readers += 1
                for b in region.batches:
                    b.k2k_moves += 1  # type: ignore[attr-defined]
                self.queues[(s, c)].append(Move((s, c), region, trees.edge_hops(s, c)))  # type: ignore[union-attr]
        self.pump()
        self._trees_now = None

    def _source_region(self, s: int, bs: list[OutboxBatch]) -> Region | None:
        """The region the moves of S's new batches read: the one outbox batch, or an egress
        region they were gathered into. The batches come retained (the runtime's
        `retain=True` listener) until every move that reads them is submitted."""
        if len(bs) == 1:
            b = bs[0]
            return Region("outbox", s, b.buffer, b.offset, b.size, [Part(b.kernel, b, 0, b.size)], s,
                          ready=b.ready, batches=[b])
        parts, at = [], 0
        for b in bs:
            parts.append(Part(b.kernel, b, at, b.size))
            at += align(b.size)
        buf = None
        try:
            buf = self._pool(s).get(at)
            gather = self.gathers.get(s)
            if gather is None:
                gather = self.gathers[s] = Gather(self.mgr.slot(s))
            point = gather.copy([(b.buffer, b.offset, b.size) for b in bs], buf, [bs[-1].ready])
        except (VkmError, vk.VkError, MemoryError) as exc:
            live = [b for b in bs if not b.kernel.destroyed]
            if isinstance(exc, DestroyedError) and len(live) < len(bs):   # senders destroyed since: the rest go
                if buf is not None:
                    self._pool(s).put(buf)
                for b in (b for b in bs if b.kernel.destroyed):
                    b.k2k_moves = 0  # type: ignore[attr-defined]
                    b.release()
                return self._source_region(s, live) if live else None
            self._fail_parts(parts, f"could not gather its outbox on GPU {s} for another device: {exc}")
            for b in bs:
                b.release()
            return None
        for b in bs:
            b.hold(point)
            self.held.append((b, point))
        region = Region("egress", s, buf, 0, at, parts, s, ready=point, batches=list(bs))
        self.egress.append(region)
        return region

    # -- moving ----------------------------------------------------------------------

    def pump(self) -> None:
        """Submit queued moves, each edge in order, until none can go."""
        progress = True
        while progress:
            progress = False
            for edge in list(self.queues):
                q = self.queues[edge]
                while q:
                    if not self._try_submit(q[0]):
                        break
                    q.popleft()
                    progress = True
                if not q:
                    del self.queues[edge]

    def queued_moves(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def _try_submit(self, m: Move) -> bool:
        a, b = m.edge
        if len(self.landings[m.edge]) >= self.max_landings:
            self.reap()
            if len(self.landings[m.edge]) >= self.max_landings:
                return False
        src = m.region
        trees = self.trees()
        if self._needless(src, trees.subtree(src.origin, b)):   # harvested: nothing in it goes there
            for p in src.parts:
                p.batch.k2k_moves -= 1  # type: ignore[attr-defined]
            self._read_done(src, None)
            return True
        buf = None
        try:
            if src.kind == "landing":   # its own transfer must be queued before a wait on it
                src.ticket.wait_submitted(self.submit_timeout)
            buf = self._pool(b).get(src.size)
            link = self._link(a, b, trees.is_host_mediated(a, b))
            ticket = link.submit(src_buffer=src.buffer, dst_buffer=buf, src_offset=src.offset, size=src.size,
                                 src_wait=src.ready)
        except (VkmError, vk.VkError, MemoryError, ValueError) as exc:
            if buf is not None:
                self._pool(b).put(buf)
            self._fail_parts(src.parts, f"could not move its messages from GPU {a} to GPU {b}: {exc}")
            for p in src.parts:
                p.batch.k2k_moves -= 1  # type: ignore[attr-defined]
            self._read_done(src, None)
            return True
        self.moves_submitted += 1
        self.edge_bytes[m.edge] += src.size
        self.edge_moves[m.edge] += 1
        self.stats.add_moved(len(src.parts), src.size)
        self._read_done(src, ticket.src_done, ticket.wait_submitted if self._shared(a, link.method) else None)
        landing = Region("landing", b, buf, 0, src.size, src.parts, src.origin, hops=m.hops, ready=ticket.dst_ready,
                         ticket=ticket, edge=m.edge)
        self.landings[m.edge].append(landing)
        self._accept(landing, ticket, not trees.children(src.origin, b))
        for c in trees.children(src.origin, b):
            landing.readers += 1
            for p in src.parts:
                p.batch.k2k_moves += 1  # type: ignore[attr-defined]
            self.queues[(b, c)].append(Move((b, c), landing, m.hops + trees.edge_hops(b, c)))
        for p in src.parts:
            p.batch.k2k_moves -= 1  # type: ignore[attr-defined]
        return True

    @staticmethod
    def _needless(region: Region, devices: set[int]) -> bool:
        """Whether every batch in the region was surveyed on its own device and none
        of them holds a message for `devices` (a move there can be dropped)."""
        mask = sum(1 << d for d in devices if d < 32)
        for p in region.parts:
            b = p.batch
            if b.pending is None or b.remote_devices & mask or any(d >= 32 for d in devices):
                return False
        return True

    def _shared(self, device: int, method: str | None) -> bool:
        """Whether a transfer's submits on `device` share a queue with its kernel steps
        (the transfer engine uses the copy queue, CUDA_PEER the universal one)."""
        key = (device, method)
        hit = self._shared_cache.get(key)
        if hit is None:
            hit = self._shared_cache[key] = shares_step_queue(self.mgr.slot(device), method)
        return hit

    def _read_done(self, region: Region, point: TimelinePoint | None, submitted: Any = None) -> None:
        """One move that reads `region` was submitted (reading it until `point`) or dropped."""
        region.readers -= 1
        if point is not None:
            region.reads.append(point)
            if region.kind == "outbox":
                for b in region.batches:
                    b.hold(point, submitted)
                    self.held.append((b, point))
        if region.readers <= 0:
            for b in region.batches:
                b.release()
            region.batches = []

    def _accept(self, landing: Region, ticket: Any, exclusive: bool) -> None:
        """Hand each part of a landing to the kernels of its device (if it runs any);
        `exclusive`: no move forwards the landing (a kernel a part is all for may
        read it in place)."""
        dev = landing.device
        if not any(k.device_index == dev for k in self.port.kernels):
            return
        shared = self._shared(dev, self.method(*landing.edge))  # type: ignore[misc]
        for p in landing.parts:
            source = p.kernel if not p.kernel.destroyed else None
            x, slots = direct_guess(self.port, p.kernel, dev)
            try:
                inbound = self.port.accept_batch(dev, landing.buffer, offset=p.offset, size=p.size,
                                                 wait=ticket.dst_ready, source=source, hops=min(landing.hops, 255),
                                                 report_unknown=False, reuse_sets=True,
                                                 submitted=ticket.wait_submitted if shared else None,
                                                 direct=x, direct_slots=slots,
                                                 lazy=p.kernel.quiet_batches >= QUIET_BATCHES)
            except DeviceLostError:   # forgotten with the device (device_lost); a policy's failover hands them again
                continue
            except (VkmError, ValueError) as exc:
                self._fail_parts([p], f"GPU {dev} could not take its messages: {exc}")
                continue
            inbound.k2k_origin = p.batch
            inbound.exclusive = exclusive
            landing.inbounds.append(inbound)
            p.batch.k2k_landings.append((dev, inbound))  # type: ignore[attr-defined]

    def _fail_parts(self, parts: list[Part], text: str) -> None:
        """Tell each live sender (its next step raises KernelMessageError) and count failures."""
        for p in (p for p in parts if not p.kernel.destroyed):   # (a destroyed one's went with it)
            self.stats.add_failures(1)
            self.port.fail_delivery(p.kernel, p.batch.step, text)

    def fail_batch(self, b: OutboxBatch, text: str) -> None:
        self._fail_parts([Part(b.kernel, b, 0, b.size)], text)

    def forward_region(self, c: int, view: Any, b: OutboxBatch, origin: int, hops: int, ticket: Any,
                       onward: list[int], trees: Any) -> Region:
        """A batch read in place on device c, as a region that moves take on to the
        devices after c (its memory is the sender's outbox: the in-place landing
        keeps the batch until those moves have read it)."""
        region = Region("landing", c, view, b.offset, b.size, [Part(b.kernel, b, 0, b.size)], origin, hops=hops,
                        ready=ticket.dst_ready, ticket=ticket, edge=(origin, c))
        for gc in onward:
            region.readers += 1
            b.k2k_moves += 1  # type: ignore[attr-defined]
            self.queues[(c, gc)].append(Move((c, gc), region, hops + trees.edge_hops(c, gc)))
        return region

    # -- recycling -------------------------------------------------------------------

    def reap(self) -> None:
        """Return landing and egress regions nobody reads any more to their pools,
        and count what they delivered. A landed batch that holds nothing more for the
        landing's device (landing.nothing_left) is taken back at once (no step there
        has to survey it first)."""
        self.port.poll()
        now = self._reaped = time.monotonic()
        self.peers.reap(now)
        if len(self.held) > 64:   # a hold matters until its region is reused
            self.held = [(b, p) for b, p in self.held
                         if not b.kernel.destroyed and b.kernel.outbox_batches[b.region] is b]
        for edge, regions in list(self.landings.items()):
            keep = []
            slot = self.mgr.slot(edge[1])
            for r in regions:
                for i in r.inbounds:
                    if nothing_left(i, r.device):
                        self.port.let_go_batch(i)
                if not r.counted and r.inbounds and all(i.done for i in r.inbounds):
                    self._count(r, now)
                if self._free(r, slot):
                    self._count(r, now)
                    self._pool(r.device).put(r.buffer)
                else:
                    keep.append(r)
            if keep:
                self.landings[edge] = keep
            else:
                del self.landings[edge]
        keep = []
        for r in self.egress:
            if r.readers <= 0 and all(reached(self.mgr.slot(r.device), p) for p in r.reads):
                self._pool(r.device).put(r.buffer)
            else:
                keep.append(r)
        self.egress = keep

    def _free(self, r: Region, slot: Any) -> bool:
        if r.readers > 0 or not all(i.done for i in r.inbounds):
            return False
        if not all(reached(slot, p) for p in r.reads):
            return False
        return r.ticket.done()

    def _count(self, r: Region, now: float) -> None:
        if r.counted:
            return
        r.counted = True
        delivered = sum(i.delivered for i in r.inbounds)
        rejected = sum(i.rejected for i in r.inbounds)
        if delivered:
            self.stats.add_routed(delivered, 0, int((now - r.created) * 1e6) * delivered)
        if rejected:
            self.stats.add_failures(rejected)

    def busy(self) -> bool:
        """Whether moves wait or landings are still in use."""
        return bool(self.queues) or any(self.landings.values()) or bool(self.egress) or self.peers.busy()

    def settle_idle(self, deadline: float) -> bool:
        """Whether nothing is on its way once idle senders' in-place landings are settled
        (PeerEdges.settle_idle) and reaped; False at once where a move or a region is in use."""
        if self.queues or any(self.landings.values()) or self.egress or not self.peers.settle_idle(deadline):
            return False
        self.reap()
        return not self.busy()

    def prepare(self, kernels: list[Kernel], timeout: float | None) -> None:
        """Before a step: let go of batches other devices finished reading in place
        when a kernel of the step would find its next outbox region still held,
        waiting for those reads up to what is left of the step's `timeout` (None: none)
        and submit_timeout."""
        self.peers.settle(kernels, self.submit_timeout if timeout is None else min(timeout, self.submit_timeout))

    # -- a lost device ---------------------------------------------------------------

    def drop_device(self, d: int) -> None:
        """GPU d was lost (the runtime's failover restored or released its kernels and
        hands again what was not consumed): forget every move, landing and in-place
        read that involves it without touching it, letting the batches they held go."""
        for edge in [e for e in self.queues if d in e]:
            for m in self.queues.pop(edge):
                for p in m.region.parts:
                    p.batch.k2k_moves -= 1  # type: ignore[attr-defined]
                m.region.readers -= 1
                if m.region.readers <= 0:
                    for b in m.region.batches:
                        let_go(b)
                    m.region.batches = []
        for edge in [e for e in self.landings if d in e]:
            for r in self.landings.pop(edge):
                for i in r.inbounds:
                    if not i.done:   # (on a survivor: what it held is handed again by the failover)
                        i.done = True
                        i.event.set()
                r.readers = 0
                for b in r.batches:
                    let_go(b)
                r.batches = []
                if r.device != d:
                    self.dead.append(r)
        self.egress = [r for r in self.egress if r.device != d]
        for key in [k for k in self.links if d in k]:
            self.dead_links.append(self.links.pop(key))
        self.peers.drop_device(d)
        self._trees, self._trees_now = None, None

    # -- teardown --------------------------------------------------------------------

    def destroy(self, timeout: float) -> None:
        """Drop queued moves (their senders are told), take undelivered landings back from
        the runtime, wait for every transfer (TimeoutError: call again), free everything."""
        for q in self.queues.values():
            for m in q:
                self._fail_parts(m.region.parts, "the K2K router was detached before the move")
                self._read_done(m.region, None)
        self.queues.clear()
        deadline = time.monotonic() + timeout
        for regions in self.landings.values():
            for r in regions:
                for i in r.inbounds:
                    if i.done:
                        continue
                    try:
                        left = self.port.withdraw_batch(i, timeout=max(0.0, deadline - time.monotonic()))
                    except DestroyedError:   # the runtime went first: its steps are over
                        continue
                    if left:
                        self.stats.add_failures(left)
                        log.warning("K2K router detached: %d message(s) for GPU %d not delivered", left, r.device)
        stuck = {}
        for key, (x, link) in self.links.items():
            try:
                link.destroy(max(0.0, deadline - time.monotonic()))
            except VkmTimeout:   # kept, with every buffer it writes, for the next detach()
                stuck[key] = (x, link)
        self.links = stuck
        if stuck:
            raise VkmTimeout(f"K2K router: {len(stuck)} transfer(s) still run after {timeout:.1f} s; nothing freed")
        for _, link in self.dead_links:   # links of a lost device (its waits fail at once)
            try:
                link.destroy(max(0.0, deadline - time.monotonic()))
            except VkmError as exc:
                log.info("K2K router: a link of a lost device: %s", exc)
        self.dead_links = []
        for r in self.dead:
            self._pool(r.device).put(r.buffer)
        self.dead = []
        self.peers.destroy(deadline)
        for g in self.gathers.values():
            g.destroy(max(0.0, deadline - time.monotonic()))
        self.gathers.clear()
        for b, point in self.held:   # every transfer is done: no later step may wait on their semaphores
            with b.ctx.lock:
                if point in b.holds:
                    b.holds.remove(point)
                b.hold_hooks.clear()
        self.held = []
        for r in [*self.egress, *(r for regions in self.landings.values() for r in regions)]:
            for b in r.batches:
                b.release()
        self.landings.clear()
        self.egress = []
        for p in self.pools.values():
            self._forget(p.all)
            try:
                p.destroy(max(0.0, deadline - time.monotonic()))
            except (VkmTimeout, DestroyedError):
                log.warning("K2K router: a landing buffer was still in use at destroy")
        self.pools.clear()

    def _forget(self, buffers: list[Buffer]) -> None:
        for b in buffers:
            try:
                self.port.forget_buffer(b)
            except DestroyedError:   # the runtime went first: its sets went with it
                return
