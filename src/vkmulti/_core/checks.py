"""The argument checks every layer shares: ints, counts, indices, numbers and timeouts.

One set, so that the same mistake gets the same typed error and the same
message wherever it is made. Each check returns the value in its canonical
type (a numpy integer comes back as an int), so callers write
``n = check_count(n, "n")``. `bool` is never an int here, and the value in a
message is shortened so that a huge argument cannot flood a log.
"""
from __future__ import annotations

import math
import threading
import operator
from typing import Any

__all__ = ["is_int", "short_repr", "int_in", "positive_int", "check_index", "check_count", "check_number",
           "timeout_seconds", "wait_bound", "seconds_text", "U32_MAX", "U64_MAX"]

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1


def is_int(value: Any) -> bool:
    """True for a Python int (not a bool); the predicate behind every int check."""
    return isinstance(value, int) and not isinstance(value, bool)


def short_repr(value: Any, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def int_in(value: Any, label: str, lo: int = 0, hi: int | None = U32_MAX) -> int:
    """An int in [lo, hi] (hi None: no upper bound); ValueError otherwise, wrong types included."""
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        top = "inf" if hi is None else hi
        raise ValueError(f"{label} must be an int in [{lo}, {top}], got {short_repr(value)}")
    return value


def positive_int(value: Any, label: str, hi: int | None = None) -> int:
    """An int >= 1 (and <= hi when given); ValueError otherwise."""
    return int_in(value, label, 1, hi)


def _index(value: Any, label: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{label} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{label} must be an int, got {type(value).__name__} {short_repr(value)}") from None


def check_index(value: Any, label: str) -> int:
    """A device index: a non-negative int (numpy integers too, never bool); TypeError / ValueError."""
    i = _index(value, label)
    if i < 0:
        raise ValueError(f"{label} must be >= 0, got {i}")
    return i


def check_count(value: Any, label: str, minimum: int = 0) -> int:
    """An int >= `minimum` (bytes, counts, sizes; numpy integers too); TypeError / ValueError."""
    i = _index(value, label)
    if i < minimum:
        raise ValueError(f"{label} must be >= {minimum}, got {i}")
    return i


def check_number(value: Any, label: str, *, positive: bool = False) -> float:
    """A finite float >= 0 (> 0 when `positive`); TypeError / ValueError. Bools (numpy's
    too) are not numbers here, and an int past float range is a ValueError."""
    if isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", None) == "b" \
            or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"{label} must be a number, got {type(value).__name__} {short_repr(value)}")
    try:
        f = float(value)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f) or f < 0 or (positive and f == 0):
        raise ValueError(f"{label} must be a finite number {'> 0' if positive else '>= 0'}, got {short_repr(value)}")
    return f


def timeout_seconds(value: Any, label: str = "timeout") -> float | None:
    """A timeout: None (wait as long as it takes) or a number of seconds >= 0; ValueError otherwise."""
    if value is None:
        return None
    if type(value) is float and value >= 0:   # (the common case, checked without calls; NaN fails >= 0)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise ValueError(f"{label} must be a number of seconds >= 0 or None, got {short_repr(value)}")
    try:
        return float(value)
    except OverflowError:   # an int beyond any float: longer than any wait
        return math.inf


def wait_bound(seconds: float | None) -> float | None:
    """A checked timeout (timeout_seconds') as Python's lock, event, future and process waits
    take it: None (no limit) where it is longer than they can express (inf, 10**400, a far
    deadline), which would raise OverflowError there."""
    return None if seconds is None or seconds >= threading.TIMEOUT_MAX else seconds


def seconds_text(value: Any) -> str:
    """A number of seconds for a message, rounded to the millisecond ("0.099", "30");
    what a wait was given may be the remainder of a deadline, with float noise."""
    if value is None:
        return "unbounded"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return short_repr(value)
    return f"{round(float(value), 3):g}"
