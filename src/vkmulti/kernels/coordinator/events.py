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


class _Pending:
    """A change's events still to hand out: event `at` goes to `fns[told:]`, the events
    after it to every one of `fns` (the listeners when the change was applied)."""

    __slots__ = ("fns", "events", "at", "told")

    def __init__(self, fns: tuple[Callable[[CoordinatorEvent], Any], ...], events: list[CoordinatorEvent]):
        self.fns, self.events, self.at, self.told = fns, events, 0, 0


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
    change and not removed since. Where the handing out stands is kept in the queue
    and moved on before each call: a KeyboardInterrupt (in a listener, or while a
    listener's failure is logged) reaches the caller, and the next change hands out
    the rest first; the listener it interrupted is not told that event again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()   # the listeners, the queue and who delivers (never held while calling)
        self._fns: tuple[Callable[[CoordinatorEvent], Any], ...] = ()
        self._queue: deque[_Pending] = deque()
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
                    self._queue.append(_Pending(self._fns, list(events)))

    def deliver(self) -> None:
        """Hand the queued events out, in order (see the class docstring); a listener's
        exception is logged, not raised."""
        mine = False   # (set with the flag: however this ends, a flag it set is cleared)
        try:
            with self._lock:
                if self._delivering or not self._queue:
                    return   # (the thread delivering, this one or another, takes this change's events too)
                self._delivering = mine = True
            while True:
                with self._lock:
                    call = self._next_locked()
                    if call is None:
                        self._delivering = mine = False
                        return
                fn, ev = call
                try:
                    fn(ev)
                except Exception:   # a listener's failure must not undo the change
                    log.exception("coordinator listener %r failed on %s", fn, ev.kind.name)
        except BaseException:
            if mine:
                with self._lock:   # (another thread or change delivers from where it stopped)
                    self._delivering = False
            raise

    def _next_locked(self) -> tuple[Callable[[CoordinatorEvent], Any], CoordinatorEvent] | None:
        """The next (listener, event) to call, the queue moved past it; None when all are told."""
        while self._queue:
            p = self._queue[0]
            if p.at == len(p.events):
                self._queue.popleft()
            elif p.told == len(p.fns):
                p.at, p.told = p.at + 1, 0
            else:
                fn = p.fns[p.told]
                p.told += 1
                if fn in self._fns:   # (not removed meanwhile)
                    return fn, p.events[p.at]
        return None
