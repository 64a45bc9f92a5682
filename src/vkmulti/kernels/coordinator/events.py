"""What MultiGpuCoordinator tells its listeners: CoordinatorEventKind,
CoordinatorEvent, and Listeners, the list it calls after each change."""
from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..._core.reprs import compact_repr
from ..ids import KernelId
from .records import DeviceUnregisterResult

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
    """The callables a coordinator hands its events to, in the order they were added."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fns: list[Callable[[CoordinatorEvent], Any]] = []

    def add(self, listener: Callable[[CoordinatorEvent], Any]) -> None:
        """Call `listener(event)` from now on."""
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {type(listener).__name__}")
        with self._lock:
            self._fns.append(listener)

    def remove(self, listener: Callable[[CoordinatorEvent], Any]) -> None:
        """Stop calling `listener`; ValueError when it was not added."""
        with self._lock:
            try:
                self._fns.remove(listener)
            except ValueError:
                raise ValueError(f"listener {listener!r} is not registered") from None

    def notify(self, events: list[CoordinatorEvent]) -> None:
        """Hand each event to each listener (call it outside the coordinator's lock);
        a listener's exception is logged, not raised."""
        fns = self._fns
        if not fns or not events:
            return
        for fn in list(fns):
            for ev in events:
                try:
                    fn(ev)
                except Exception:   # a listener's failure must not undo the change
                    log.exception("coordinator listener %r failed on %s", fn, ev.kind.name)
