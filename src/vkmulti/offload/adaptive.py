"""Measured device speeds for SRU planning: seconds per unit of SRU cost, damped frame to frame.

`SpeedMeter` times each device's renders every frame (their points are waited
for on timer threads, without the GIL): the seconds the device was busy, each
render counted from its submit (or the previous render's end, if later) to its
end, so a device that waits for the host to submit its next render is not
charged the wait. It divides by the cost that device rendered and keeps a
damped figure per device. Its speeds, fed to assign_srus as weights, make
devices of unequal speed finish a frame together: at the fixed point every
device's share takes the same time (the rule Blender Cycles uses to balance a
frame over unequal devices).

Clocks that were tried and ran away, each making a device look slower the less
work it had: timing from the frame's start (GPU 0 was charged the host's time
submitting the secondaries' work); timing a secondary until its images were on
GPU 0 (`dst_ready`: GPU 0's own renders are queued ahead of the landing
copies, so an equal pair measured 0.22-0.5); until the transfers' source side
was done (`src_done`: past the link ring's depth a source slot frees only when
an earlier landing copy is done on GPU 0, so GPU 1 stuck at ~0.55 on an equal
pair). SRUOffloadCoordinator also queues the transfers only after every render
of the frame: between renders they held the renders behind them up, so each
device's renders waited for the other's progress (an equal pair then ran away
either way, up to GPU 1 = 4.8x GPU 0). `transfer_cost` in the plan can charge
the moves per SRU.
"""
from __future__ import annotations

import builtins
import logging
import math
import queue
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .._core.lifetime import Deadline
from .._core.timeline import TimelinePoint
from .._core.checks import short_repr

log = logging.getLogger(__name__)

__all__ = ["SpeedMeter", "AdaptivePlanner"]


@dataclass
class _FrameTiming:
    """One frame being timed: cost rendered per device, a waiter (and its queue of points with
    their submit times) per device."""

    costs: dict[int, float] = field(default_factory=dict)
    queues: dict[int, queue.SimpleQueue] = field(default_factory=dict)
    futures: dict[int, Future] = field(default_factory=dict)
    ended: bool = False
    done: TimelinePoint | None = None   # the frame's last point: every share is in by then
    cancelled: bool = False             # waiters stop at their next slice


class SpeedMeter:
    """Damped seconds per cost unit per device, measured a frame at a time.

    Per frame: begin(), watch(device, points) as work is submitted, end(costs),
    then settle() (also called by the next begin) folds the figures in.
    `wait_point(point, timeout)` blocks until a TimelinePoint is reached
    (raising on failure). `damping` in (0, 1] is the share of the newest
    frame; one frame moves a device's figure by at most a factor MAX_STEP, so
    a single stalled frame cannot shut a device out.
    """

    MAX_STEP = 4.0
    #: waiters wait in slices this long, so a point that will never come (a failed transfer) is given up
    SLICE = 0.02

    def __init__(self, device_count: int, wait_point: Callable[[TimelinePoint, float], None], *,
                 damping: float = 0.5, timeout: float = 60.0):
        self.device_count = device_count
        self.damping = damping
        self.timeout = timeout
        self._wait_point = wait_point
        self._seconds: dict[int, float] = {}
        self._pending: _FrameTiming | None = None
        self._timer: ThreadPoolExecutor | None = None

    @property
    def damping(self) -> float:
        """Share of the newest frame in the damped figures, in (0, 1]."""
        return self._damping

    @damping.setter
    def damping(self, value: float) -> None:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError(f"damping must be a number in (0, 1], got {short_repr(value)}")
        try:
            v = float(value)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"damping must be a number in (0, 1], got {short_repr(value)}") from None
        if not 0.0 < v <= 1.0:
            raise ValueError(f"damping must be in (0, 1], got {short_repr(value)}")
        self._damping = v

    @property
    def seconds_per_cost_unit(self) -> list[float | None]:
        """Per device: damped seconds per cost unit, None when not measured yet."""
        return [self._seconds.get(d) for d in range(self.device_count)]

    @property
    def relative_speeds(self) -> list[float | None]:
        """Per device: speed relative to the fastest measured device (1.0); None when not measured."""
        speeds = {d: 1.0 / t for d, t in self._seconds.items()}
        top = max(speeds.values(), default=0.0)
        return [speeds[d] / top if d in speeds else None for d in range(self.device_count)]

    def weights_for(self, devices: Sequence[int], prior: Sequence[float] | None = None) -> list[float] | None:
        """Weights (cost units per second) for `devices`; one not measured yet gets its `prior`
        (default 1) scaled like the measured ones. None when nothing is measured and no prior."""
        known = {d: 1.0 / self._seconds[d] for d in devices if d in self._seconds}
        if not known:
            return [prior[d] for d in devices] if prior is not None else None
        base = prior if prior is not None else [1.0] * self.device_count
        ratios = [known[d] / base[d] for d in known if math.isfinite(base[d]) and base[d] > 0]
        scale = math.fsum(ratios) / len(ratios) if ratios else 1.0
        return [known.get(d, base[d] * scale) for d in devices]   # a bad prior reaches assign_srus, which names it

    def begin(self) -> None:
        """Start timing a frame (settles a pending one)."""
        self.settle()
        self._pending = _FrameTiming()

    def watch(self, device: int, points: Sequence[TimelinePoint]) -> None:
        """Points that must be reached before `device`'s share of the frame is done, given as soon
        as they are submitted: the device's waiter blocks on them (no GIL) and notes the time."""
        timing = self._pending
        if timing is None or timing.ended or not points:
            return
        q = timing.queues.get(device)
        if q is None:
            if self._timer is None:
                self._timer = ThreadPoolExecutor(max_workers=max(1, min(32, self.device_count)),
                                                 thread_name_prefix="vkmulti-frame-timer")
            q = timing.queues[device] = queue.SimpleQueue()
            timing.futures[device] = self._timer.submit(self._arrivals, q, timing)
        now = time.perf_counter()
        for p in points:
            q.put((p, now))

    def end(self, costs: Mapping[int, float], done: TimelinePoint | None = None) -> None:
        """Every point of the frame is given: `costs` is the SRU cost each device rendered, `done`
        a point reached only after every share (the composite): a waiter still waiting then waits
        for a point that will not come, and is stopped."""
        timing = self._pending
        if timing is not None and not timing.ended:
            timing.costs = dict(costs)
            timing.done = done
            self._close_queues(timing)

    @staticmethod
    def _close_queues(timing: _FrameTiming) -> None:
        timing.ended = True
        for q in timing.queues.values():
            q.put(None)

    def _arrivals(self, q: queue.SimpleQueue, timing: _FrameTiming) -> float | None:
        """A device's waiter: wait for each point as it comes; the seconds the device was busy (None
        when a point was not reached before the frame was settled or within the timeout).

        Busy: from each point's submit, or the previous point's arrival if later, to its arrival.
        A gap in which the device had done everything submitted so far (the host still submitting
        other devices' work) is not counted, so interleaved submission does not make a device that
        renders faster than the host submits look slower."""
        busy, last = 0.0, None
        while (item := q.get()) is not None:
            p, submitted = item
            deadline = time.monotonic() + self.timeout
            while True:
                try:
                    self._wait_point(p, self.SLICE)
                    break
                except builtins.TimeoutError:
                    if timing.cancelled or time.monotonic() > deadline:
                        return None
            now = time.perf_counter()
            busy += now - (submitted if last is None else max(submitted, last))
            last = now
        return None if last is None else busy

    def settle(self, deadline: Deadline | None = None) -> dict[int, float]:
        """Wait for the pending frame and fold it in; returns the busy seconds of each device that
        rendered part of it ({} if none). The wait for its last point is bounded by `timeout` (a
        frame not done by then folds nothing) or, given, by `deadline` (vkmulti.TimeoutError);
        a TimeoutError there or Ctrl-C leaves the frame pending."""
        timing = self._pending
        if timing is None:
            return {}
        if not timing.ended:   # the frame failed before end(): stop its waiters, fold nothing
            self._close_queues(timing)
        elif timing.done is not None and deadline is not None:
            left = deadline.left()
            self._wait_point(timing.done, self.timeout if left is None else left)
        elif timing.done is not None:
            try:
                self._wait_point(timing.done, self.timeout)
            except Exception as exc:
                log.warning("frame timing: the frame's last point was not reached (%r)", exc)
        self._pending = None
        timing.cancelled = True
        seconds: dict[int, float] = {}
        for d, fut in timing.futures.items():
            try:
                done = fut.result()   # within one SLICE once cancelled
            except Exception as exc:   # a lost device: no figure for it this frame
                log.warning("GPU %d: frame timing failed (%r); its speed is not updated", d, exc)
                continue
            if done is None:
                log.warning("GPU %d: its share of the frame was not seen done; its speed is not updated", d)
            else:
                seconds[d] = done
        seconds = {d: secs for d, secs in seconds.items() if timing.costs.get(d, 0.0) > 0.0}
        for d, secs in seconds.items():   # a device whose SRUs all fell back rendered none of the frame
            if secs > 0.0:
                self._fold(d, secs / timing.costs[d])
        return seconds

    def _fold(self, device: int, measured: float) -> None:
        old = self._seconds.get(device)
        if old is None:
            self._seconds[device] = measured
            return
        measured = min(max(measured, old / self.MAX_STEP), old * self.MAX_STEP)
        self._seconds[device] = old + self._damping * (measured - old)

    def reset(self) -> None:
        """Forget every figure and the pending frame's timing (waiting for nothing: its
        waiters stop within a slice)."""
        timing, self._pending = self._pending, None
        if timing is not None:
            if not timing.ended:
                self._close_queues(timing)
            timing.cancelled = True
        self._seconds.clear()

    def close(self, deadline: Deadline | None = None) -> None:
        """Settle the pending frame (within `deadline`, see settle) and stop the timer threads
        (idempotent)."""
        self.settle(deadline)
        if self._timer is not None:
            self._timer.shutdown(wait=True)
            self._timer = None


class AdaptivePlanner:
    """The adaptive mode of SRUOffloadCoordinator: whether it is on, and the SpeedMeter that times
    each device's renders (waiting on the manager's slots) and turns the timings into plan weights."""

    def __init__(self, manager: Any, *, adaptive: bool = False, damping: float = 0.5, timeout: float = 60.0):
        self.manager = manager
        self._enabled = False
        self.enabled = adaptive
        self.meter = SpeedMeter(manager.device_count, self._wait_point, damping=damping, timeout=timeout)

    @property
    def enabled(self) -> bool:
        """Whether plans use speed weights measured every frame."""
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"adaptive must be a bool, got {short_repr(value)}")
        self._enabled = value

    def weights(self, usable: list[int], given: list[float] | None) -> list[float] | None:
        """The plan's weights for the `usable` devices: measured ones (with `given` as the prior) in
        adaptive mode, else `given` (per manager slot) or None."""
        if self._enabled:
            return self.meter.weights_for(usable, given)
        return [given[d] for d in usable] if given is not None else None

    def begin(self) -> None:
        """A frame starts: time it when adaptive."""
        if self._enabled:
            self.meter.begin()

    def watch(self, device: int, points: Sequence[TimelinePoint]) -> None:
        """Device's share of this frame is done when `points` are reached."""
        if self._enabled:
            self.meter.watch(device, points)

    def end(self, rendered_on: dict[Any, int], by_id: dict[Any, Any], cost: Callable[[Any], float],
            done: TimelinePoint) -> None:
        """Every point of the frame is given: the cost each device rendered (SRU id -> device in
        `rendered_on`, id -> SRU in `by_id`) and the frame's last point."""
        if self._enabled:
            costs: dict[int, float] = {}
            for sid, d in rendered_on.items():
                costs[d] = costs.get(d, 0.0) + float(cost(by_id[sid]))
            self.meter.end(costs, done)

    def _wait_point(self, point: TimelinePoint, timeout: float) -> None:
        self.manager.slot(point.device_index).native.wait_timeline(point.semaphore, point.value, timeout)
