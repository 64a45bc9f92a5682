"""SruCache: the per-SRU resources SRUOffloadCoordinator keeps from frame to frame.

Each SRU has an entry (SruEntry): its render target on its device, the image
it lands in on the primary, its fallback image on the primary and its
transfer. When a re-plan moves an SRU to another device its resources become
spares for the next SRU that moves their way, so a re-plan that moves SRUs
both ways makes almost nothing new.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from .._core.lifetime import Deadline
from ..errors import TimeoutError, VkmError
from ..memory.image import Image
from .._core.timeline import TimelinePoint
from ..transfer.cross_device import CrossDeviceTransfer
from .render import SRU_FORMAT, SRU_IMAGE_USAGE
from .types import OffloadRoute, SruEntry, sru_size

log = logging.getLogger(__name__)

__all__ = ["SruCache"]


class SruCache:
    """Per-SRU images and transfers of SRUOffloadCoordinator, and the spares of SRUs that moved.

    `make_transfer(route, width=, height=)` makes an SRU's transfer to the
    primary; `last_composite()` gives (compositor, point) of the latest
    composite, or None: nothing an SRU used is freed before it is reached.
    Every wait is bounded by `timeout()` seconds (the coordinator's timeout).
    """

    def __init__(self, manager: Any, timeout: Callable[[], float], *, make_transfer: Callable[..., CrossDeviceTransfer],
                 last_composite: Callable[[], tuple[Any, TimelinePoint] | None]):
        self.manager = manager
        self._timeout = timeout
        #: SRU id -> its cached resources
        self.entries: dict[Any, SruEntry] = {}
        #: resources of SRUs that moved device, for the next SRU that moves there: ("image", device, w, h)
        #: -> Images, ("transfer", device, w, h, method) -> CrossDeviceTransfers
        self.spares: dict[tuple, list[Any]] = {}
        self._make_transfer = make_transfer
        self._last_composite = last_composite

    def left(self, dl: Deadline) -> float:
        """Seconds left of `dl`, the timeout when it has no end."""
        left = dl.left()
        return self._timeout() if left is None else left

    def entry(self, sru: Any, route: OffloadRoute, *, landing: bool) -> SruEntry:
        """The SRU's entry for `route`, with a target (and, offloaded, a transfer, and a landing
        image when `landing`): resized or re-routed entries give their resources up first."""
        w, h = sru_size(sru)
        e = self.entries.get(route.sru_id)
        if e is not None and ((e.width, e.height) != (w, h)
                              or (e.transfer is not None and e.transfer.method != route.transfer)):
            self.release(e)   # resized or another method: free the old resources
            e = None
        elif e is not None and e.device_index != route.device_index:
            self.park(e)      # moved: its resources wait for the next SRU that moves their way
            e = None
        if e is None:
            e = self.entries[route.sru_id] = SruEntry(route.sru_id, route.device_index, w, h)
        if e.target is None:
            e.target = self.image(route.device_index, w, h)
        if route.offloaded and e.transfer is None:
            spare = self.spares.get(("transfer", route.device_index, w, h, route.transfer))
            e.transfer = spare.pop() if spare else self._make_transfer(route, width=w, height=h)
        if landing and route.offloaded and e.landing is None:
            e.landing = self.image(0, w, h)
        return e

    def image(self, device: int, w: int, h: int) -> Image:
        """An SRU image on `device`: a spare one, else a new one."""
        spare = self.spares.get(("image", device, w, h))
        if spare:
            return spare.pop()
        return Image(self.manager.slot(device), w, h, SRU_FORMAT, usage=SRU_IMAGE_USAGE, timeout=self._timeout())

    def fallback(self, sru: Any, sru_id: Any, routes: dict[Any, OffloadRoute]) -> Image:
        """The SRU's fallback image on the primary (no transfer writes it), made on first use; a new
        entry takes its device from `routes`."""
        e = self.entries.get(sru_id)
        if e is None:
            w, h = sru_size(sru)
            e = self.entries[sru_id] = SruEntry(sru_id, routes[sru_id].device_index, w, h)
        if e.fallback is None:
            e.fallback = Image(self.manager.primary, e.width, e.height, SRU_FORMAT, usage=SRU_IMAGE_USAGE,
                               timeout=self._timeout())
        return e.fallback

    def park(self, e: SruEntry) -> None:
        """Take a moved SRU's entry out once nothing in flight uses it; keep its images (the target on
        its device, the landing and fallback on GPU 0) and its transfer as spares, as many as there
        are SRUs (more are freed)."""
        self.settle(e, Deadline(None))
        d, size = e.device_index, (e.width, e.height)
        parked = [(("image", d) + size, e.target), (("image", 0) + size, e.landing),
                  (("image", 0) + size, e.fallback)]
        if e.transfer is not None:
            parked.append((("transfer", d) + size + (e.transfer.method,), e.transfer))  # type: ignore[arg-type]
        e.target = e.landing = e.fallback = e.transfer = e.ticket = None
        e.points = []
        if self.entries.get(e.sru_id) is e:
            del self.entries[e.sru_id]
        for k, obj in parked:
            if obj is None:
                continue
            if not self.manager.device_lost(k[1]):
                self.spares.setdefault(k, []).append(obj)
            else:
                obj.destroy(self._timeout())

    def trim_spares(self, sizes: set[tuple[int, int]], keep: int) -> None:
        """Free the spares of sizes no SRU has now, and beyond `keep` of a kind per device and size."""
        for k in list(self.spares):
            objs = self.spares[k]
            extra = objs if k[2:4] not in sizes else objs[keep:]
            for obj in extra:
                obj.destroy(self._timeout())
            del objs[len(objs) - len(extra):]
            if not objs:
                del self.spares[k]

    def drop_spares(self, device: int) -> None:
        """Free the spares on `device` (lost: nothing is waited for on it)."""
        for k in [k for k in self.spares if k[1] == device]:
            for obj in self.spares.pop(k):
                try:
                    obj.destroy(self._timeout())
                except Exception as exc:   # a lost device's objects: logged, never used again
                    log.warning("spare %s on GPU %d: destroy failed (%r)", k[0], device, exc)

    def settle(self, e: SruEntry, dl: Deadline) -> None:
        """Wait until nothing in flight uses the entry's resources. vkmulti.TimeoutError
        keeps them; other failures (a lost device) are logged and do not."""
        waits: list[Callable[[], Any]] = []
        if e.ticket is not None:
            ticket = e.ticket
            waits.append(lambda: ticket.wait(self.left(dl)))
        for p in e.points:
            if self.manager.device_lost(p.device_index):
                continue   # a lost device runs nothing more: nothing to wait for
            slot = self.manager._slots[p.device_index]   # also while the manager's destroy() runs
            waits.append(lambda p=p, slot=slot: slot.native.wait_timeline(p.semaphore, p.value, self.left(dl)))  # type: ignore[misc]
        composite = self._last_composite()
        if composite is not None:
            compositor, frame = composite
            waits.append(lambda: compositor.slot.native.wait_timeline(frame.semaphore, frame.value,
                                                                      self.left(dl)))
        for w in waits:
            try:
                w()
            except TimeoutError:
                raise
            except VkmError as exc:
                known = self.manager.device_lost(e.device_index)   # a loss already told: no news
                log.log(logging.DEBUG if known else logging.WARNING,
                        "SRU %r: waiting for in-flight work failed (%r); freeing its resources", e.sru_id, exc)

    def release(self, e: SruEntry, dl: Deadline | None = None) -> None:
        """Free the entry's resources once nothing in flight uses them, and take it out."""
        dl = dl or Deadline(None)
        self.settle(e, dl)
        if e.transfer is not None:
            e.transfer.destroy(self.left(dl))
            e.transfer = e.ticket = None
        for name in ("target", "landing", "fallback"):
            img = getattr(e, name)
            if img is not None:
                img.destroy(self.left(dl))
                setattr(e, name, None)
        e.points = []
        if self.entries.get(e.sru_id) is e:
            del self.entries[e.sru_id]

    def prune(self, live: set) -> None:
        """Free the resources of SRUs that are not in the coming frame."""
        for sid in [s for s in self.entries if s not in live]:
            self.release(self.entries[sid])

    def drop_device(self, device: int) -> int:
        """Free the entries and spares on `device` (lost); how many entries were freed."""
        gone = [e for e in self.entries.values() if e.device_index == device]
        for e in gone:
            self.release(e)
        self.drop_spares(device)
        return len(gone)

    def teardown_steps(self, dl: Deadline) -> list[Callable[[], Any]]:
        """One step per entry and spare that frees it within `dl` (the coordinator's destroy)."""
        steps: list[Callable[[], Any]] = [lambda e=e: self.release(e, dl) for e in list(self.entries.values())]  # type: ignore[misc]
        steps += [lambda obj=obj: obj.destroy(self.left(dl)) for objs in self.spares.values() for obj in objs]  # type: ignore[misc]
        return steps

    def clear(self) -> None:
        """Forget every entry and spare (after teardown)."""
        self.entries.clear()
        self.spares.clear()
