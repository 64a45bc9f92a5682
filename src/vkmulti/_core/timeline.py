"""Timeline points: "this semaphore of this device reaches this value", as given by callers.

`TimelinePoint` is what vkmulti hands out (a transfer's `dst_ready`, a render's
done point); callers may also pass raw ``(semaphore, value)`` pairs. Both are
checked here before any of them reaches a submit: a null, negative or
mistyped handle, or a point of another device, is a clear error, never a
null semaphore in a VkSubmitInfo. A point vkmulti made remembers its VkDevice
(`TimelinePoint.of`): one of another manager's GPU of the same index is refused
too. The device's native table knows the live timelines vkmulti made on it: any
other handle (forged, of another device, destroyed since, or unpickled from
another process) is refused too, as Vulkan would take it on trust.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Protocol, TypeAlias

import vulkan as vk

from .checks import is_int, short_repr
from .handles import handle_int
from .vktypes import VkSemaphore
from .reprs import compact_repr

if TYPE_CHECKING:
    #: A point to wait for: a TimelinePoint, or a raw (semaphore, value) pair.
    Wait: TypeAlias = "TimelinePoint | tuple[VkSemaphore | int, int]"
    #: A wait argument: None, one point, or an iterable of them.
    Waits: TypeAlias = "Wait | Iterable[Wait] | None"
    #: The same with TimelinePoints only (as_wait_points).
    Points: TypeAlias = "TimelinePoint | Iterable[TimelinePoint] | None"

__all__ = ["TimelinePoint", "wait_point", "wait_points", "as_wait_points"]

_U64 = 1 << 64
#: Caller-given wait lists longer than this are refused (a submit carries them all).
MAX_WAITS = 64


class PointSlot(Protocol):
    """What TimelinePoint.of needs of a device slot: its index and native device."""

    @property
    def index(self) -> int: ...

    @property
    def native(self) -> object: ...


@dataclass(frozen=True)
class TimelinePoint:
    """A value of a timeline semaphore on one device: "done when it reaches `value`"."""

    __repr__ = compact_repr
    semaphore: int
    value: int
    device_index: int

    @property
    def handle(self) -> VkSemaphore:
        """The semaphore as a `vulkan` package handle (for VkSubmitInfo)."""
        return vk.ffi.cast("VkSemaphore", self.semaphore)

    @classmethod
    def _trusted(cls, semaphore: int, value: int, device_index: int, owner: Any = None) -> "TimelinePoint":
        """A point from vkmulti's own ints (a transfer's submit, once per job), made
        without the frozen dataclass's guarded setattr per field: half the cost;
        `owner`: the native device of the semaphore (see `of`)."""
        p = _new(cls)
        p.__dict__.update(semaphore=semaphore, value=value, device_index=device_index)
        if owner is not None:
            p.__dict__["_owner"] = owner
        return p

    @classmethod
    def of(cls, slot: PointSlot, semaphore: int, value: int) -> "TimelinePoint":
        """A point of a timeline vkmulti made on `slot`'s device. It remembers that
        device: a wait for it on another VkDevice (another manager's GPU of the same
        index) is refused instead of handing the driver a foreign semaphore."""
        return cls._trusted(semaphore, value, slot.index, slot.native)

    def __reduce__(self) -> tuple[Any, tuple[int, int, int]]:
        # (the fields only: the device it remembers means nothing in another process)
        return TimelinePoint, (self.semaphore, self.value, self.device_index)


_new = object.__new__


def wait_point(value: Any, slot: Any, label: str) -> tuple[int, int] | None:
    """(semaphore, value) from a TimelinePoint of `slot` or a (semaphore, value)
    pair; None for None. `label` names the argument in errors."""
    if value is None:
        return None
    if isinstance(value, TimelinePoint):
        return _checked_point(value, slot.index, getattr(slot, "native", None), label)
    if isinstance(value, (str, bytes, dict)):
        raise TypeError(f"{label} must be a TimelinePoint or a (semaphore, value) pair, "
                        f"got {type(value).__name__}")
    try:
        sem, v = value
    except (TypeError, ValueError):
        raise TypeError(f"{label} must be a TimelinePoint or a (semaphore, value) pair, "
                        f"got {type(value).__name__}") from None
    semaphore = handle_int(sem, "VkSemaphore")
    _check_live(semaphore, getattr(slot, "native", None), slot.index, label)
    return semaphore, _point_value(v, label)


def _checked_point(p: TimelinePoint, device_index: int, native: Any, label: str) -> tuple[int, int]:
    """(semaphore, value) of a TimelinePoint after the checks every point gets before a
    submit: of GPU `device_index`, made on the VkDevice of `native` (where both are known),
    a non-null handle and a value in [0, 2**64)."""
    if p.device_index != device_index:
        raise ValueError(f"{label} is a semaphore of GPU {short_repr(p.device_index)}, not of GPU {device_index}")
    owner = p.__dict__.get("_owner")
    # (by the VkDevice: two managers over one engine's device each have their own native object)
    if owner is not None and native is not None and owner is not native and owner.handle != native.handle:
        raise ValueError(f"{label} is a semaphore of another VkDevice (GPU {short_repr(p.device_index)} of another "
                         f"MultiDeviceManager, or a device made again since): it cannot be waited for here")
    try:
        semaphore = handle_int(p.semaphore, "VkSemaphore")
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{label}: {exc}"[:200]) from None
    _check_live(semaphore, native, device_index, label)
    return semaphore, _point_value(p.value, label)


def _check_live(semaphore: int, native: Any, device_index: int, label: str) -> None:
    """ValueError unless `semaphore` is a live timeline vkmulti made on the device of
    `native` (unchecked without one: no submit is made there)."""
    if native is not None and not native.owns_timeline(semaphore):
        raise ValueError(f"{label}: semaphore {semaphore:#x} is not a live timeline of GPU {device_index} made "
                         f"by vkmulti (a forged handle, one of another device, or one destroyed since)")


def _point_value(v: Any, label: str) -> int:
    if not is_int(v) or not 0 <= v < _U64:
        raise ValueError(f"{label} value must be an int in [0, 2**64), got {short_repr(v)}")
    return v


def _wait_items(waits: Any, label: str, limit: int | None) -> list[Any]:
    """The items of a wait argument: None -> [], one TimelinePoint -> [it], an
    iterable -> its list (at most `limit`); TypeError for anything else."""
    if waits is None:
        return []
    if isinstance(waits, TimelinePoint):
        return [waits]
    if isinstance(waits, (str, bytes, dict)):
        raise TypeError(f"{label} must be a list of TimelinePoints or (semaphore, value) pairs, "
                        f"got {type(waits).__name__}")
    try:
        items = list(waits)
    except TypeError:
        raise TypeError(f"{label} must be a list of TimelinePoints or (semaphore, value) pairs, "
                        f"got {type(waits).__name__}") from None
    if limit is not None and len(items) > limit:
        raise ValueError(f"{label} has {len(items)} points; at most {limit}")
    return items


def wait_points(waits: Any, slot: Any, label: str = "waits") -> list[tuple[int, int]]:
    """A checked list of (semaphore, value) from None, one point, or an iterable of
    TimelinePoints / (semaphore, value) pairs, all on `slot`'s device."""
    if isinstance(waits, TimelinePoint):
        return [wait_point(waits, slot, label)]   # type: ignore[list-item]
    out = []
    for k, w in enumerate(_wait_items(waits, label, MAX_WAITS)):
        if w is None:
            raise TypeError(f"{label}[{k}] is None; pass a TimelinePoint or a (semaphore, value) pair")
        out.append(wait_point(w, slot, f"{label}[{k}]"))
    return out  # type: ignore[return-value]


def as_wait_points(wait: Any, device_index: int, what: str = "wait", native: Any = None) -> list[TimelinePoint]:
    """wait_points' TimelinePoint shape: None, one TimelinePoint or an iterable of
    them -> a list of the points, all on `device_index` (raw pairs refused) and,
    where `native` (the device's native object) is given, made on that device."""
    points = _wait_items(wait, what, None)
    for p in points:
        if not isinstance(p, TimelinePoint):
            raise TypeError(f"{what} must be TimelinePoints, got {short_repr(p)}")
        _checked_point(p, device_index, native, f"{what} {short_repr(p, 120)}")   # (its fields go to the submit as they are)
    return points
