"""SRU offload: OffloadRoute and SRUOffloadCoordinator, from plan to composited frame.

The coordinator plans which GPU renders each scene-render-unit (SRU), renders
the offloaded ones on their secondaries concurrently, moves each image to the
primary with the asynchronous transfer engine, and composites on the primary
once each transfer's `dst_ready` is reached (a GPU-side wait). When a
secondary's renderer raises or its device is lost, the SRU is rendered on the
primary for this frame and the device is left out of later plans; a device lost
after its image was composited makes the frame composite again
(failover.py), so the frame still comes out. The per-SRU images and transfers
are kept from frame to frame (cache.py).
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from .._core.checks import check_index, timeout_seconds, short_repr, short_str
from .._core.lifetime import Lifetime, operation
from ..device.manager import MultiDeviceManager
from ..errors import DestroyedError, DeviceLostError, PrimaryDeviceLostError
from ..memory.image import Image
from .._core.timeline import TimelinePoint, as_wait_points
from ..transfer.cross_device import CrossDeviceTransfer
from ..transfer.link import TransferTicket
from ..transfer.methods import select_transfer_method
from .adaptive import AdaptivePlanner
from .cache import SruCache
from .compositor import Compositor, scale_pair
from .failover import DEVICE_ERRORS, FrameFailover, FrameInFlight
from .partition import SRUAssignment, assign_srus, interleaved
from .render import SRU_FORMAT
from .types import (FrameReport, OffloadRoute, RendererMissingError, SecondaryRenderContext, SruEntry, check_weights,
                    default_cost, int_list, check_frame_srus, weak_hook)

if TYPE_CHECKING:
    from .types import S, SS, Renderer, RenderCapabilities, RenderCapabilitiesLike, SizedSRU, SruId
log = logging.getLogger(__name__)

__all__ = ["OffloadRoute", "SRUOffloadCoordinator", "SecondaryRenderContext", "FrameReport", "RendererMissingError"]


class SRUOffloadCoordinator:
    """Plans SRUs over the GPUs, renders offloaded ones on secondaries and brings their images to GPU 0.

    The seed's constructor and members, plus: `devices` (slot indices it may
    use, GPU 0 first; default all), per-device speed `weights`, and
    `hysteresis` (None: plan every frame afresh, as the seed; a number in
    [0, 1): keep the previous plan unless a new one shortens the frame by more
    than that fraction, so temporal history stays on one device).

    `adaptive=True` measures, every frame, how long each device takes per unit of SRU cost (the
    time its renders kept it busy; adaptive.py) and plans with damped speed weights from it, so
    that devices of unequal speed finish a frame together (`weights`, if given, are the starting
    guess; `adaptive_damping` is the share of the newest measurement; hysteresis defaults to
    ADAPTIVE_HYSTERESIS). It is off by default: plans then stay a pure function of the SRUs, as
    in the seed, and equal devices see no plan churn from timing noise. `measured_weights`
    exposes what it measured (AdaptivePlanner and SpeedMeter, adaptive.py).

    `secondary_renderer_factory(context)` gets a SecondaryRenderContext and
    returns a renderer; a renderer attached to a slot
    (`MultiDeviceManager.attach_renderer`) is used in preference. A renderer
    with `render(sru, target, *, wait=None) -> TimelinePoint` (ReferenceRenderer)
    runs asynchronously; otherwise the seed's `render_sru_offscreen(sru, target)`
    is called and is complete when it returns (or returns a TimelinePoint).
    """

    def __init__(self, manager: MultiDeviceManager, capabilities: RenderCapabilities | RenderCapabilitiesLike | None
                 = None, *, prefer_dmabuf: bool = True, content_scale: tuple[float, float] = (1.0, 1.0),
                 secondary_renderer_factory: Callable[[SecondaryRenderContext], Renderer] | None = None,
                 devices: Sequence[int] | None = None, weights: Sequence[float] | None = None,
                 hysteresis: float | None = None, timeout: float = 60.0, adaptive: bool = False,
                 adaptive_damping: float = 0.5):
        if not isinstance(manager, MultiDeviceManager):
            raise TypeError(f"manager must be a MultiDeviceManager, got {type(manager).__name__}")
        if secondary_renderer_factory is not None and not callable(secondary_renderer_factory):
            raise TypeError("secondary_renderer_factory must be callable or None")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {short_repr(timeout)}")
        count = manager.device_count
        if devices is None:
            devices = list(range(count))
        devices = int_list(devices, "devices")
        for d in devices:
            if not 0 <= d < count:
                raise IndexError(f"device {short_repr(d)} out of range: the manager has {count} slot(s)")
        if not devices or devices[0] != 0 or len(set(devices)) != len(devices):
            raise ValueError(f"devices must list distinct slot indices starting with 0 (the primary), "
                             f"got {short_repr(devices)}")
        if weights is not None:
            weights = check_weights(weights, count)
        if hysteresis is not None:
            if isinstance(hysteresis, bool) or not isinstance(hysteresis, (int, float)) \
                    or not 0.0 <= hysteresis < 1.0:
                raise ValueError(f"hysteresis must be None or a number in [0, 1), got {short_repr(hysteresis)}")
        self.manager = manager
        self.capabilities = capabilities
        self.prefer_dmabuf = bool(prefer_dmabuf)
        self.content_scale = scale_pair(content_scale)
        self.secondary_renderer_factory = secondary_renderer_factory
        self.devices = devices
        self.weights = weights
        self.hysteresis = None if hysteresis is None else float(hysteresis)
        self.timeout: float = timeout_seconds(timeout) or 0.0   # (> 0 checked above; an int beyond any float: inf)
        timeout = self.timeout
        self._routes: dict[Any, OffloadRoute] = {}
        self._contexts: dict[int, SecondaryRenderContext] = {}
        self._unavailable: dict[int, str] = {}
        self._compositor: Compositor | None = None
        self._last_frame: TimelinePoint | None = None
        self._lock = threading.RLock()
        self._life = Lifetime(self, "SRUOffloadCoordinator", (manager._life,))
        self._planner = AdaptivePlanner(manager, adaptive=adaptive, damping=adaptive_damping, timeout=timeout)
        self._cache = SruCache(manager, lambda: self.timeout, make_transfer=self.transfer_for,
                               last_composite=self._last_composite)
        self._failover = FrameFailover(manager, self._unavailable, mark_unavailable=self._mark_unavailable,
                                       drop_device=self._drop_device, render_fallback=self._render_fallback,
                                       composited=self._composited)
        #: what lost devices cost this coordinator (devices, SRUs rendered again, frames repaired, times)
        self.failover_stats = self._failover.stats
        manager._life.adopt(self)   # destroyed with the manager unless destroyed first
        manager.register_teardown(weak_hook(self.destroy))   # as the seed: before hooks registered later

    # -- the seed's API ----------------------------------------------------

    @property
    def active(self) -> bool:
        """True when the manager drives more than one GPU."""
        return self._life.open and self.manager.multi_gpu

    @property
    def unavailable(self) -> dict[int, str]:
        """Devices left out of plans after a failure: index -> reason."""
        return dict(self._unavailable)

    def usable_devices(self) -> list[int]:
        """The devices the next plan may use (GPU 0 first)."""
        if not self.active:
            return [0]
        return [d for d in self.devices if d == 0 or d not in self._unavailable]

    #: hysteresis of plans in adaptive mode when none was given: timing noise alone moves no SRU
    ADAPTIVE_HYSTERESIS = 0.05

    @property
    def adaptive(self) -> bool:
        """Whether plans use speed weights measured every frame (see the class docstring)."""
        return self._planner.enabled

    @adaptive.setter
    def adaptive(self, value: bool) -> None:
        self._planner.enabled = value

    @property
    def adaptive_damping(self) -> float:
        """Share of the newest frame in the damped speeds, in (0, 1]."""
        return self._planner.meter.damping

    @adaptive_damping.setter
    def adaptive_damping(self, value: float) -> None:
        self._planner.meter.damping = value

    @property
    def seconds_per_cost_unit(self) -> list[float | None]:
        """Per manager slot: damped measured seconds per unit of SRU cost (None: not measured yet)."""
        return self._planner.meter.seconds_per_cost_unit

    @property
    def measured_weights(self) -> list[float | None]:
        """Per manager slot: measured speed relative to the fastest measured device (1.0); None: not measured."""
        return self._planner.meter.relative_speeds

    def reset_measurements(self) -> None:
        """Forget every measured speed (plans start again from `weights`)."""
        with self._lock:
            self._planner.meter.reset()

    def restore_device(self, index: int) -> None:
        """Let a device marked unavailable take part in plans again (not a lost one:
        DeviceLostError; its objects are never used again)."""
        index = self.manager.slot(check_index(index, "index")).index   # (True == 1 to the dict below: no index)
        if self.manager.device_lost(index):
            raise DeviceLostError(-4, "restore_device", f"GPU {index} is lost: it cannot take part in plans again")
        self._unavailable.pop(index, None)

    @operation
    def plan(self, srus: Iterable[S], *, sru_id: Callable[[S], SruId] | None = None,
             cost: Callable[[S], float] | None = None, transfer_cost: Callable[[S], float] | None = None,
             offloadable: Callable[[S], bool] | None = None) -> list[OffloadRoute]:
        """Assign every SRU a device (assign_srus) and a transfer method per pair; routes in input order.

        cost defaults to `sru.render_cost` when SRUs have it, else the seed's
        instance count. The route cache is replaced.
        """
        self._life.check()
        srus = list(srus)
        usable = self.usable_devices()
        previous = None
        hysteresis = self.hysteresis
        if hysteresis is None and self.adaptive:
            hysteresis = self.ADAPTIVE_HYSTERESIS
        if hysteresis is not None and self._routes:
            previous = {r.sru_id: usable.index(r.device_index) for r in self._routes.values()
                        if r.device_index in usable}
        weights = self._planner.weights(usable, self.weights)
        assigned = assign_srus(srus, len(usable), sru_id=sru_id, cost=cost or default_cost, weights=weights,
                               transfer_cost=transfer_cost, offloadable=offloadable, previous=previous,
                               hysteresis=hysteresis or 0.0)
        caps = self._caps()
        methods: dict[int, str] = {}
        routes = []
        for a in assigned:
            d = usable[a.device_index]
            if d not in methods:
                methods[d] = select_transfer_method(SRUAssignment(a.sru_id, d), caps,
                                                    prefer_dmabuf=self.prefer_dmabuf)
            routes.append(OffloadRoute(a.sru_id, d, methods[d]))
        self._routes = {r.sru_id: r for r in routes}
        return routes

    def route_for(self, sru_id: SruId) -> OffloadRoute | None:
        """The route of the latest plan, or None (render on the primary)."""
        return self._routes.get(sru_id)

    def transfer_for(self, route: OffloadRoute, *, width: int = 0, height: int = 0) -> CrossDeviceTransfer:
        """A new transfer from the route's device to the primary (the caller destroys it)."""
        if not isinstance(route, OffloadRoute):
            raise TypeError(f"route must be an OffloadRoute, got {type(route).__name__}")
        return CrossDeviceTransfer(self.manager.slot(route.device_index), self.manager.primary, route.transfer,
                                   width=width, height=height, bytes_per_pixel=8)

    def render_offloaded(self, route: OffloadRoute) -> Renderer:
        """The renderer for the route's device: the slot's attached one, else the factory's."""
        if not isinstance(route, OffloadRoute):
            raise TypeError(f"route must be an OffloadRoute, got {type(route).__name__}")
        return self._renderer_for(route.device_index)

    @operation
    def render_sru_offloaded(self, sru: SizedSRU, primary_dst_image: Image, *,
                             dst_wait: TimelinePoint | None = None, wait: bool = True) -> bool:
        """Render `sru` on its secondary and move its image into `primary_dst_image`.

        False when the SRU is not offloaded (no route, routed to GPU 0, or its
        device failed now or before): the caller renders it on the primary.
        True once the image is on the primary, as the seed; with wait=False once
        the transfer is under way (`ticket_for(sru.sru_id)`: its dst_ready, or
        wait()). `dst_wait`: a TimelinePoint on the primary to reach first."""
        self._life.check()
        sid = getattr(sru, "sru_id", None)
        route = self._routes.get(sid) if sid is not None else None
        if route is None or not route.offloaded or route.device_index in self._unavailable:
            return False
        renderer = self.render_offloaded(route)
        with self._lock:
            entry = self._cache.entry(sru, route, landing=False)
            if not self._offload(entry, sru, renderer, primary_dst_image, dst_wait):
                return False
            ticket = entry.ticket
        if wait and ticket is not None:
            try:
                ticket.wait(self.timeout)
            except DEVICE_ERRORS as exc:
                self._mark_unavailable(route.device_index, "its transfer failed", exc)
                return False
        return True

    def ticket_for(self, sru_id: SruId) -> TransferTicket | None:
        """The latest transfer of that SRU's image to the primary, or None."""
        e = self._cache.entries.get(sru_id)
        return e.ticket if e is not None else None

    _teardown_rank = 5   # first: it owns transfers, images, a compositor and renderer contexts

    @property
    def destroyed(self) -> bool:
        """True once destroy() was called."""
        return not self._life.open

    _destroyed = destroyed

    def destroy(self, timeout: float | None = None) -> None:
        """Wait for in-flight work, then free targets, transfers, compositor and contexts (idempotent).

        Calls running on other threads are waited for first, and every wait
        is bounded by `timeout` (None: this coordinator's `timeout` per wait);
        on vkmulti.TimeoutError or Ctrl-C what the GPU may still use is kept,
        and destroy() may be called again.
        """
        with self._life.ending(timeout) as dl:
            if dl is None:
                return
            self._planner.meter.close(dl)   # no timer thread may still wait on a semaphore freed below
            with self._lock:
                errors: list[BaseException] = []
                steps = self._cache.teardown_steps(dl)
                if self._compositor is not None:
                    steps.append(lambda: self._compositor.destroy(self._cache.left(dl)))  # type: ignore[union-attr]
                steps += [lambda ctx=ctx: ctx.destroy() for ctx in self._contexts.values()]  # type: ignore[misc]
                for step in steps:     # free as much as possible; report the first failure
                    try:
                        step()
                    except TimeoutError:
                        raise
                    except Exception as exc:
                        log.warning("SRUOffloadCoordinator teardown step failed: %r", exc)
                        errors.append(exc)
                self._cache.clear()
                self._compositor = None
                self._contexts.clear()
                self._routes.clear()
        if errors:
            raise errors[0]

    def __enter__(self) -> "SRUOffloadCoordinator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- a whole frame -----------------------------------------------------

    @operation
    def render_frame(self, srus: Iterable[SS], frame: Image, *, sru_id: Callable[[SS], SruId] | None = None,
                     cost: Callable[[SS], float] | None = None, transfer_cost: Callable[[SS], float] | None = None,
                     offloadable: Callable[[SS], bool] | None = None,
                     clear: Sequence[float] | None = (0.0, 0.0, 0.0, 1.0), wait: bool = True) -> FrameReport:
        """Plan, render offloaded SRUs on their secondaries (concurrently), transfer them
        asynchronously, render the rest on the primary, and composite into `frame`.

        Each SRU needs `x`, `y` (its place in the frame, logical units) besides
        `width` and `height`. With `wait` the call returns when the frame is
        complete; otherwise wait for `report.done` (GPU or `wait_frame`).

        A secondary lost before or during the frame costs nothing: its SRUs are
        rendered on the primary (`report.lost`, `failover_stats`). The primary
        lost: PrimaryDeviceLostError.
        """
        try:
            return self._render_frame(srus, frame, sru_id, cost, transfer_cost, offloadable, clear, wait)
        except DeviceLostError as exc:
            if isinstance(exc, PrimaryDeviceLostError) or not self.manager.device_lost(0):
                raise
            self.manager.check_devices()
            raise self._failover.primary_lost(f"{type(exc).__name__}: {short_str(exc)}") from None

    def _render_frame(self, srus: Iterable[Any], frame: Image, sru_id: Any, cost: Any, transfer_cost: Any,
                      offloadable: Any, clear: Any, wait: bool) -> FrameReport:
        self._life.check()
        srus = list(srus)
        compositor = self._ensure_compositor()
        compositor.check_frame(frame, SRU_FORMAT, "an SRU image")
        key = sru_id or (lambda s: s.sru_id)
        check_frame_srus(srus, key)
        with self._lock:
            self._failover.check_previous_frame()   # wait=False frames never waited for
            self._planner.meter.settle()   # the previous frame's measurement, before any resource is freed
            lost_before = len(self.failover_stats.devices_lost)
            self._failover.sync_lost_devices(self.devices)   # PrimaryDeviceLostError when GPU 0 is gone
            self._cache.prune({key(s) for s in srus})
            routes = self.plan(srus, sru_id=sru_id, cost=cost, transfer_cost=transfer_cost, offloadable=offloadable)
            self._planner.begin()
            prev = [self._last_frame] if self._last_frame is not None else []
            images: dict[Any, Image] = {}
            rendered_on: dict[Any, int] = {}
            waits: list[TimelinePoint] = []
            pending: list[tuple[Any, SruEntry]] = []
            fallbacks: list[Any] = []
            sent = 0
            by_id = {key(s): s for s in srus}
            # 1. every SRU's resources before any render is queued: making an image runs a one-off
            #    command on its device and waits for it, which on a busy queue means waiting for the
            #    renders queued ahead of it (an SRU that moved device needs new ones)
            jobs: list[tuple[Any, SruEntry, Any]] = []
            for r in routes:   # moved SRUs first give their resources up, so moves both ways swap them
                e = self._cache.entries.get(r.sru_id)
                if e is not None and e.device_index != r.device_index:
                    self._cache.park(e)
            for r in routes:
                sru = by_id[r.sru_id]
                if not r.offloaded:
                    jobs.append((sru, self._cache.entry(sru, r, landing=False), None))
                    continue
                if r.device_index in self._unavailable:   # failed earlier in this frame
                    fallbacks.append(sru)
                    continue
                try:
                    renderer = self._renderer_for(r.device_index)
                    jobs.append((sru, self._cache.entry(sru, r, landing=True), renderer))
                except RendererMissingError:
                    raise
                except Exception as exc:   # the factory or the device failed: this device sits out
                    self._mark_unavailable(r.device_index, "its renderer or render target could not be made", exc)
                    fallbacks.append(sru)
            if self._cache.spares:
                self._cache.trim_spares({(e.width, e.height) for e in self._cache.entries.values()}, len(srus))
            # 2. submit every device's SRUs in turn, each device's k-th of n at k/n of the way, so
            #    every device starts at once and its queue fills at the pace it drains (submitting
            #    one device's whole share first leaves the others idle meanwhile)
            rendered: list[tuple[Any, SruEntry]] = []
            for sru, e, renderer in interleaved(jobs):
                if renderer is None:   # the primary's own SRU
                    points = self._render(self._renderer_for(0), sru, e.target, prev, 0)
                    self._planner.watch(0, points)
                    waits += points
                    images[e.sru_id], rendered_on[e.sru_id] = e.target, 0
                elif e.device_index in self._unavailable:   # its device failed earlier in this frame
                    fallbacks.append(sru)
                elif self._render_offloaded(e, sru, renderer):
                    rendered.append((sru, e))
                else:
                    fallbacks.append(sru)
            # 2b. the transfers once every render is queued: queued between renders, a transfer's copies
            #     hold up the renders queued behind them (a landing copy waits on GPU 0's queue for its
            #     source side; a full link ring holds the source side until GPU 0 lands an earlier one),
            #     so each device would wait for the other's progress
            for sru, e in rendered:   # rendered before a later render on its device failed: still sent
                if self._send(e, e.landing, self._last_frame):
                    pending.append((sru, e))
                else:
                    fallbacks.append(sru)
            # 3. transfers: the composite waits for dst_ready on the GPU; waiting here until each
            #    transfer is submitted orders it after them on a one-queue primary and reveals a
            #    source device that failed (the primary keeps rendering meanwhile)
            landing: list[tuple[Any, SruEntry]] = []
            for sru, e in pending:
                try:
                    e.ticket.wait_submitted(self.timeout)  # type: ignore[union-attr]
                except DEVICE_ERRORS as exc:
                    self._mark_unavailable(e.device_index, "its transfer failed", exc)
                    fallbacks.append(sru)
                    continue
                landing.append((sru, e))
                waits.append(e.ticket.dst_ready)  # type: ignore[union-attr]
                images[e.sru_id], rendered_on[e.sru_id] = e.landing, e.device_index  # type: ignore[assignment]
                sent += e.width * e.height * 8
            # 4. fallbacks render on the primary, into an image no transfer writes
            for sru in fallbacks:
                sid = key(sru)
                images[sid], points = self._render_fallback(sru, sid, prev)
                waits += points
                rendered_on[sid] = 0
            # 5. composite after every render and every dst_ready, in input order
            placements = [(images[key(s)], s.x, s.y) for s in srus]
            done = compositor.composite(frame, placements, wait=waits, clear=clear)
            self._last_frame = done
            self._failover.in_flight = FrameInFlight(frame, [(key(s), images[key(s)], s.x, s.y) for s in srus],
                                                     landing, rendered_on, fallbacks, clear, done)
            self._planner.end(rendered_on, by_id, cost or default_cost, done)
        seconds: dict[int, float] = {}
        repaired = None
        if wait:
            self._failover.wait_composite(compositor, done, self.timeout)
            with self._lock:
                repaired = self._failover.verify_frame(compositor, self.timeout)
                seconds = self._planner.meter.settle()
                self._failover.losses_recovered()
        if repaired is not None:
            done = repaired.done
        lost = self.failover_stats.devices_lost[lost_before:]
        return FrameReport(routes, rendered_on, [key(s) for s in fallbacks], done, sent, seconds, lost,
                           repaired is not None)

    def _render_fallback(self, sru: Any, sid: Any, prev: list[TimelinePoint]) -> tuple[Image, list[TimelinePoint]]:
        """Render `sru` on the primary into its fallback image (no transfer writes it)."""
        image = self._cache.fallback(sru, sid, self._routes)
        points = self._render(self._renderer_for(0), sru, image, prev, 0)
        self._planner.watch(0, points)
        return image, points

    @operation
    def wait_frame(self, timeout: float | None = None) -> None:
        """Block until the latest frame is composited. A frame made with wait=False
        whose transferred images did not all arrive (a device lost mid-frame) is
        repaired here: those SRUs are rendered on the primary and the frame is
        composited again before this returns."""
        timeout = self.timeout if timeout is None else timeout_seconds(timeout)   # (checked with no frame too)
        if self._compositor is not None and self._last_frame is not None:
            self._failover.wait_composite(self._compositor, self._last_frame, timeout)  # type: ignore[arg-type]
            with self._lock:
                self._failover.verify_frame(self._compositor, self.timeout)
                self._failover.losses_recovered()

    # -- helpers -------------------------------------------------------------

    def _caps(self) -> Any:
        caps = self.capabilities
        if caps is not None and len(getattr(caps, "devices", ())) >= self.manager.device_count:
            return caps
        return self.manager.capabilities

    def _context(self, index: int) -> SecondaryRenderContext | None:
        with self._lock:   # one context per device when threads ask at once; none after destroy()
            ctx = self._contexts.get(index)
            if ctx is None and self.secondary_renderer_factory is not None:
                self._life.check()
                ctx = self._contexts[index] = SecondaryRenderContext._made(
                    self.manager.slot(index), self.secondary_renderer_factory, capabilities=self._caps(),
                    content_scale=self.content_scale)
            return ctx

    def _renderer_for(self, index: int) -> Any:
        slot = self.manager.slot(index)
        if slot.renderer is not None:
            return slot.renderer
        ctx = self._context(index)
        if ctx is None or ctx.renderer is None:
            raise RendererMissingError(
                f"rendering on device {index} ({slot.name!r}) needs that device's own renderer (pipelines, "
                f"descriptor pools, resources on that device); pass secondary_renderer_factory to "
                f"SRUOffloadCoordinator or bind one with MultiDeviceManager.attach_renderer({index}, renderer)")
        return ctx.renderer

    def _ensure_compositor(self) -> Compositor:
        if self._compositor is None:
            self._compositor = Compositor(self.manager.primary, content_scale=self.content_scale)
        return self._compositor

    def _render(self, renderer: Any, sru: Any, target: Image, wait: list[TimelinePoint],
                index: int) -> list[TimelinePoint]:
        """Run a renderer: asynchronously when it can (returns its point), else synchronously."""
        render = getattr(renderer, "render", None)
        if callable(render):
            point = render(sru, target, wait=wait)
        else:
            slot = self.manager.slot(index)
            for p in wait:
                slot.native.wait_timeline(p.semaphore, p.value, self.timeout)  # type: ignore[union-attr]
            point = renderer.render_sru_offscreen(sru, target)
        if point is None:
            return []
        return as_wait_points(point, index, "the renderer's result", self.manager.slot(index).native)

    def _offload(self, e: SruEntry, sru: Any, renderer: Any, dst_image: Any, dst_wait: Any) -> bool:
        """Render on the secondary and submit the transfer; False (device marked) on failure."""
        if dst_wait is not None and not isinstance(dst_wait, TimelinePoint):
            raise TypeError(f"dst_wait must be a TimelinePoint on the primary or None, got {short_repr(dst_wait)}")
        return self._render_offloaded(e, sru, renderer) and self._send(e, dst_image, dst_wait)

    def _render_offloaded(self, e: SruEntry, sru: Any, renderer: Any) -> bool:
        """Submit the render of an offloaded SRU on its device; False (device marked) on failure."""
        d = e.device_index
        try:
            waits: list[TimelinePoint] = []
            if e.ticket is not None:
                # the previous transfer must have read the target; its signal must be submitted first
                e.ticket.wait_submitted(self.timeout)
                waits.append(e.ticket.src_done)
            points = self._render(renderer, sru, e.target, waits, d)  # type: ignore[arg-type]
        except (DestroyedError, RendererMissingError):
            raise
        except Exception as exc:   # whatever a renderer raises: the frame goes on without this device
            self._mark_unavailable(d, "its renderer raised", exc)
            return False
        e.points = points
        # the device's speed is its renders' (adaptive.py says why not dst_ready or src_done)
        self._planner.watch(d, points)
        return True

    def _send(self, e: SruEntry, dst_image: Any, dst_wait: TimelinePoint | None) -> bool:
        """Submit the transfer of a rendered SRU's image to GPU 0; False (device marked) on failure."""
        try:
            e.ticket = e.transfer.submit(src_image=e.target, dst_image=dst_image,  # type: ignore[union-attr]
                                         src_wait=e.points[-1] if e.points else None, dst_wait=dst_wait)
        except DEVICE_ERRORS as exc:
            self._mark_unavailable(e.device_index, "its transfer could not start", exc)
            return False
        return True

    def _mark_unavailable(self, index: int, why: str, exc: BaseException) -> None:
        name = self.manager._slots[index].name   # also while the manager's destroy() runs
        self._failover.note_failure(index, exc)
        if index in self._unavailable:   # the first failure says why
            return
        self._unavailable[index] = f"{why}: {exc!r}"
        lost = self.manager.device_lost(index)   # the manager logged the loss: no traceback needed
        log.error("GPU %d (%s) left out of later plans, %s%s; its SRUs render on the primary this frame",
                  index, name, why, f" (device lost: {exc})" if lost else "", exc_info=None if lost else exc)

    def _last_composite(self) -> tuple[Compositor, TimelinePoint] | None:
        """The compositor and the latest composite, for the cache's waits (None before any frame)."""
        if self._last_frame is None or self._compositor is None:
            return None
        return self._compositor, self._last_frame

    def _composited(self, done: TimelinePoint) -> None:
        """The frame was composited again (failover): `done` is its latest point."""
        self._last_frame = done

    def _drop_device(self, d: int) -> int:
        """Free what this coordinator keeps on device `d` (lost): never waits on it."""
        n = self._cache.drop_device(d)
        ctx = self._contexts.pop(d, None)
        if ctx is not None:
            try:
                ctx.destroy()
            except Exception as exc:   # logged: the lost device's renderer is never used again
                log.warning("renderer context of lost GPU %d: destroy failed (%r)", d, exc)
        return n

