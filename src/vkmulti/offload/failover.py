"""A lost GPU costs no frame: FrameFailover, the failover side of SRUOffloadCoordinator.

At a frame's start the coordinator asks the manager which devices are lost
(`MultiDeviceManager.check_devices`: one atomic read of each device's native
lost flag) and plans over the survivors; the resources it cached on a lost
device are released without waiting on it. A device lost *during* a frame
shows as its renders or transfers failing with DeviceLostError: its SRUs are
rendered on the primary and, when the composite already ran with images that
never arrived, the frame is composited again, so the frame still comes out
and no exception reaches the caller. Losing the primary is the caller's
PrimaryDeviceLostError.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import DeviceLostError, PrimaryDeviceLostError, TimeoutError, TransferError, UnsupportedError, VulkanError
from ..device.failover import FailoverStats
from .._core.timeline import TimelinePoint
from .._core.checks import short_str

log = logging.getLogger(__name__)

__all__ = ["FrameFailover", "FrameInFlight", "DEVICE_ERRORS"]

#: Errors of a device or its renderer that make an SRU fall back to the primary.
DEVICE_ERRORS = (VulkanError, TransferError, UnsupportedError, TimeoutError)


@dataclass
class FrameInFlight:
    """What a composited frame was made of, kept until its transfers are known to have
    landed (render_frame(wait=True) at once; wait=False: wait_frame())."""

    frame: Any
    placements: list[tuple[Any, Any, int, int]]   # (sru id, image, x, y) in input order
    pending: list[tuple[Any, Any]]                  # (sru, SruEntry) whose images came by transfer
    rendered_on: dict[Any, int]
    fallbacks: list[Any]
    clear: Any
    done: TimelinePoint
    started: float = field(default_factory=time.perf_counter)


class FrameFailover:
    """Failover of SRUOffloadCoordinator (see the module docstring): what lost devices cost
    (`stats`), the record of the frame in flight, and the repair of a frame whose images never
    arrived. The coordinator gives it the dict of devices left out of plans and the callbacks
    that act on its own resources: `mark_unavailable(index, why, exc)`, `drop_device(index) ->
    SRUs released`, `render_fallback(sru, sru_id, wait) -> (image, points)` and
    `composited(done)` (a frame was composited again)."""

    def __init__(self, manager: Any, unavailable: dict[int, str], *,
                 mark_unavailable: Callable[[int, str, BaseException], None], drop_device: Callable[[int], int],
                 render_fallback: Callable[..., Any], composited: Callable[[TimelinePoint], None]):
        self.manager = manager
        #: what lost devices cost (devices, SRUs rendered again, frames repaired, times)
        self.stats = FailoverStats()
        #: the latest composited frame until its transfers are known to have landed
        self.in_flight: FrameInFlight | None = None
        self._unavailable = unavailable
        self._mark_unavailable = mark_unavailable
        self._drop_device = drop_device
        self._render_fallback = render_fallback
        self._composited = composited
        self._loss_noticed: dict[int, float] = {}   # device -> when a frame's work on it failed

    # -- at a frame's start -------------------------------------------------------

    def primary_lost(self, reason: str) -> PrimaryDeviceLostError:
        """The error that says GPU 0 is lost (`reason`) and what to do about it."""
        slot = self.manager._slots[0]
        return PrimaryDeviceLostError(-4, "render_frame", (
            f"the primary GPU 0 ({slot.name!r}) was lost ({short_str(reason)}): it composites every frame, so no frame "
            f"can come out; destroy this manager (its objects are released without touching the lost device) "
            f"and make a new one"))

    def sync_lost_devices(self, devices: list[int]) -> list[int]:
        """Leave devices found lost out of plans (and release what was cached on
        them); the newly lost ones. PrimaryDeviceLostError when GPU 0 is lost."""
        lost = self.manager.check_devices()
        if 0 in lost:
            raise self.primary_lost(lost[0])
        new = []
        for d, why in lost.items():
            if d in devices and self.stats.lost(d):
                self._unavailable[d] = f"lost: {why}"
                new.append(d)
                t0 = time.perf_counter()
                n = self._drop_device(d)
                self.stats.recovered(d, f"released the resources of {n} SRU(s) on the lost device", t0, why)
                log.warning("SRUOffloadCoordinator: GPU %d is lost (%s); frames are planned on the other GPUs",
                            d, why)
        return new

    def note_failure(self, index: int, exc: BaseException) -> None:
        """A device's work failed: when the device is lost (its native lost flag is
        set: the driver said VK_ERROR_DEVICE_LOST, or a test's lose_device), tell the
        manager (once). A DeviceLostError that no driver returned (a renderer's own)
        leaves the device merely unavailable."""
        if self.manager.device_lost(index):
            self.manager.check_devices()
            if self.stats.lost(index):
                self._loss_noticed.setdefault(index, time.perf_counter())
                log.warning("SRUOffloadCoordinator: GPU %d lost during a frame; its SRUs render on the primary",
                            index)

    def losses_recovered(self) -> None:
        """The frame in which devices were found lost is complete: record how long it took."""
        for d, t0 in sorted(self._loss_noticed.items()):
            self.stats.recovered(d, "its SRUs rendered on the primary; the frame complete", t0,
                                 self.manager.lost_devices.get(d, ""))
        self._loss_noticed.clear()

    def wait_composite(self, compositor: Any, done: TimelinePoint, timeout: float) -> None:
        """Wait for a composite on the primary; its loss is PrimaryDeviceLostError."""
        try:
            compositor.wait(done, timeout)
        except DeviceLostError as exc:
            self.manager.report_device_lost(0, f"{type(exc).__name__}: {short_str(exc)}")
            raise self.primary_lost(str(exc)) from None

    # -- after the composite ---------------------------------------------------------

    def check_previous_frame(self) -> None:
        """A frame made with wait=False and never waited for: look (without blocking)
        at its transfers; a failed one leaves its device out from now on (that frame
        was not repaired: wait_frame() repairs)."""
        st, self.in_flight = self.in_flight, None
        if st is None:
            return
        for sru, e in st.pending:
            try:
                if e.ticket is not None:
                    e.ticket.done()
            except DEVICE_ERRORS as exc:
                self.note_failure(e.device_index, exc)
                self._mark_unavailable(e.device_index, "its transfer of the previous frame failed", exc)

    def verify_frame(self, compositor: Any, timeout: float) -> FrameInFlight | None:
        """After the composite: every transferred image must have landed. For those
        that did not (their device failed or was lost mid-frame), render the SRUs on
        the primary and composite the frame again. Returns the repaired frame's
        record, None when nothing was missing."""
        st, self.in_flight = self.in_flight, None
        if st is None:
            return None
        failed = []
        for sru, e in st.pending:
            try:
                e.ticket.wait(timeout)   # the composite waited for dst_ready: answered at once
            except DEVICE_ERRORS as exc:
                failed.append((sru, e, exc))
        if not failed:
            return None
        t0 = time.perf_counter()
        lost = sorted({e.device_index for _, e, _ in failed})
        for sru, e, exc in failed:  # type: ignore[misc]
            self.note_failure(e.device_index, exc)  # type: ignore[misc]
            self._mark_unavailable(e.device_index, "its transfer failed during the frame", exc)  # type: ignore[misc]
        if 0 in self.manager.check_devices():
            raise self.primary_lost(self.manager.lost_devices[0])
        images = {sid: img for sid, img, _, _ in st.placements}
        waits = [st.done]
        for sru, e, _ in failed:
            sid = e.sru_id
            img, points = self._render_fallback(sru, sid, [st.done])
            images[sid] = img
            st.rendered_on[sid] = 0
            st.fallbacks.append(sru)
            waits += points
        placements = [(images[sid], x, y) for sid, _, x, y in st.placements]
        done = compositor.composite(st.frame, placements, wait=waits, clear=st.clear)
        self._composited(done)
        compositor.wait(done, timeout)
        self.stats.srus_rerendered += len(failed)
        self.stats.frames_repaired += 1
        for d in lost:
            self.stats.recovered(d, f"re-rendered {sum(e.device_index == d for _, e, _ in failed)} "
                                 f"SRU(s) on the primary and composited the frame again", t0)
        st.placements = [(sid, images[sid], x, y) for sid, _, x, y in st.placements]
        st.done = done
        st.pending = [(s, e) for s, e in st.pending if all(e is not f for _, f, _ in failed)]
        return st
