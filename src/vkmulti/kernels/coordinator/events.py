"""What MultiGpuCoordinator tells its listeners: CoordinatorEventKind,
CoordinatorEvent, and Listeners, which hands them out in the order of the changes."""
from __future__ import annotations

import enum
import logging
import threading
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..._core.reprs import compact_repr
from ..ids import KernelId
from .records import DeviceUnregisterResult
from ..._core.checks import short_repr

log = logging.getLogger(__name__)

__all__ = ["CoordinatorEventKind", "CoordinatorEvent", "Listeners"]


class CoordinatorEventKind(enum.Enum):
    """What a CoordinatorEvent reports (listeners get one per change of the registry)."""

    DEVICE_REGISTERED = "device_registered"
    DEVICE_UNREGISTERED = "device_unregistered"
    KERNEL_ASSIGNED = "kernel_assigned"
    KERNEL_REMOVED = "kernel_removed"
    KERNEL_MIGRATED = "kernel_migrated"


@dataclass(frozen=True)
class CoordinatorEvent:
    """A change to the registry, handed to listeners after it happened.

    `device_index` is the device concerned (the new one for assignments and
    migrations), `previous_device` where a kernel came from, `result` the
    DeviceUnregisterResult of DEVICE_UNREGISTERED (its plans are what a
    failover must carry out).
    """

    __repr__ = compact_repr

    kind: CoordinatorEventKind
    device_index: int | None
    kernel_id: KernelId | None = None
    previous_device: int | None = None
    result: DeviceUnregisterResult | None = None


class Listeners:
    """The callables a coordinator hands its events to, in the order they were added,
    and the events in the order the changes were applied.

    A change runs inside `change(lock)`: its events are queued while the
    coordinator's lock is held (so the queue's order is the changes' order), then
    handed out after the lock is released by one thread at a time: the thread that
    made the change, or, while another thread is handing out events, that thread
    (which hands out every queued event before it returns). So no listener is
    called under the coordinator's lock, a listener may call the coordinator (the
    events of its change come after the event it is handling), and no thread waits
    for another's listeners. An event goes to the listeners added before its
    change and not removed since."""

    def __init__(self) -> None:
        self._lock = threading.Lock()   # the listeners, the queue and who delivers (never held while calling)
        self._fns: tuple[Callable[[CoordinatorEvent], Any], ...] = ()
        self._queue: deque[tuple[tuple[Callable[[CoordinatorEvent], Any], ...], list[CoordinatorEvent]]] = deque()
        self._delivering = False   # whether a thread is handing out the queue

    def add(self, listener: Callable[[CoordinatorEvent], Any]) -> None:
        """Call `listener(event)` for the changes from now on."""
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {type(listener).__name__}")
        with self._lock:
            self._fns = self._fns + (listener,)

    def remove(self, listener: Callable[[CoordinatorEvent], Any]) -> None:
        """Stop calling `listener` (also for events still queued); ValueError when it was not added."""
        with self._lock:
            fns = list(self._fns)
            try:
                fns.remove(listener)
            except ValueError:
                raise ValueError(f"listener {short_repr(listener)} is not registered") from None
            self._fns = tuple(fns)

    @contextmanager
    def change(self, lock: Any) -> Iterator[Callable[..., None]]:
        """Hold the coordinator's `lock` for a change; the events given to the yielded
        `emit(*events)` are queued in the change's place and handed out once the lock
        is released (not when the change raises: it emits nothing then)."""
        with lock:
            yield self._emit
        self.deliver()

    def _emit(self, *events: CoordinatorEvent) -> None:
        if events:
            with self._lock:
                if self._fns:
                    self._queue.append((self._fns, list(events)))

    def deliver(self) -> None:
        """Hand the queued events out, in order (see the class docstring); a listener's
        exception is logged, not raised."""
        with self._lock:
            if self._delivering or not self._queue:
                return   # (the thread delivering, this one or another, takes this change's events too)
            self._delivering = True
        try:
            while True:
                with self._lock:
                    if not self._queue:
                        self._delivering = False
                        return
                    fns, events = self._queue.popleft()
                for e, ev in enumerate(events):
                    for f, fn in enumerate(fns):
                        if fn not in self._fns:   # (removed meanwhile)
                            continue
                        try:
                            fn(ev)
                        except Exception:   # a listener's failure must not undo the change
                            log.exception("coordinator listener %r failed on %s", fn, ev.kind.name)
                        except BaseException:   # (KeyboardInterrupt: the next change hands out the rest)
                            self._requeue(fns[f + 1:], ev, fns, events[e + 1:])
                            raise
        except BaseException:
            with self._lock:   # (however it ended: another thread or change delivers from here)
                self._delivering = False
            raise

    def _requeue(self, fns_left: tuple[Callable[[CoordinatorEvent], Any], ...], ev: CoordinatorEvent,
                 fns: tuple[Callable[[CoordinatorEvent], Any], ...], events_left: list[CoordinatorEvent]) -> None:
        """Put what a delivery interrupted by a BaseException did not hand out back at the
        front of the queue (`ev` for `fns_left`, then `events_left` for `fns`), in order."""
        with self._lock:
            if events_left:
                self._queue.appendleft((fns, events_left))
            if fns_left:
                self._queue.appendleft((fns_left, [ev]))
