"""Checks on a DeviceSlot as the objects made on it see it: a live device, its queues, its lifetime.

Duck-typed on purpose: a slot made by hand (a passthrough primary, a test's
double) passes when it has the fields an object needs.
"""
from __future__ import annotations

from typing import Any

from .._core.checks import short_repr
from .._core.lifetime import Lifetime
from .logical import Queue

__all__ = ["check_slot", "slot_queue", "slot_lifetime", "enabled_names"]


def check_slot(slot: Any) -> None:
    """TypeError unless `slot` is a DeviceSlot; ValueError unless it has a live
    device with a native table."""
    if isinstance(slot, (str, bytes, int, float)) or not (hasattr(slot, "device") and hasattr(slot, "native")):
        raise TypeError(f"slot must be a DeviceSlot (e.g. mgr.slot(0)), got {type(slot).__name__} "
                        f"{short_repr(slot)}")
    if getattr(slot, "device", None) is None or getattr(slot, "native", None) is None:
        raise ValueError("slot has no live device (destroyed, or a passthrough primary without a native table); "
                         "use a slot of an active MultiDeviceManager")


def slot_queue(slot: Any, queue: Any, default: Any) -> Any:
    """`queue` if it is one of the slot's queues, `default` for None; else TypeError/ValueError."""
    if queue is None:
        return default
    if not isinstance(queue, Queue):
        raise TypeError(f"queue must be a vkmulti Queue of the slot (e.g. slot.graphics_queue), "
                        f"got {type(queue).__name__}")
    queues = getattr(slot, "queues", None)
    if callable(queues) and all(int(queue) != int(q) for q in queues()):
        raise ValueError(f"queue {short_repr(queue)} is not a queue of GPU {slot.index}")
    return queue


def slot_lifetime(slot: Any) -> Lifetime:
    """The lifetime of the manager that owns `slot` (a fresh, untracked one for a
    slot made by hand)."""
    life = getattr(slot, "lifetime", None)
    return life if isinstance(life, Lifetime) else Lifetime(slot, "device slot")


def enabled_names(value: Any, label: str) -> frozenset[str]:
    """A set of extension or feature names a device was made with, from an iterable of str
    (None: none); TypeError naming `label` otherwise."""
    if value is None:
        return frozenset()
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{label} must be an iterable of names (e.g. a list), got {type(value).__name__}")
    out = frozenset(value)
    bad = [v for v in out if not isinstance(v, str)]
    if bad:
        raise TypeError(f"{label} must hold str names, got {type(bad[0]).__name__} {short_repr(bad[0])}")
    return out
