"""KernelId (ringkernel's kernel identifier) and the argument checks the kernels layer shares."""
from __future__ import annotations

import math
import operator
from typing import Any

__all__ = ["KernelId", "as_kernel_id", "check_index", "check_count", "check_number"]


class KernelId(str):
    """A kernel's id. A `str` subclass: every parameter that takes a KernelId
    also takes a plain `str`, and both hash and compare alike."""

    __slots__ = ()

    def __new__(cls, value: Any = "") -> "KernelId":
        if type(value) is cls:
            return value
        if not isinstance(value, str):
            raise TypeError(f"a kernel id must be a str, got {type(value).__name__} {_short(value)}")
        return super().__new__(cls, value)

    def as_str(self) -> str:
        """The id as a plain str (ringkernel's `as_str()`)."""
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"KernelId({str.__repr__(self)})"


def as_kernel_id(value: Any, label: str = "kernel_id") -> KernelId:
    """`value` as a KernelId; TypeError naming `label` and the value for a non-str."""
    if type(value) is KernelId:
        return value
    if not isinstance(value, str):
        raise TypeError(f"{label} must be a str or KernelId, got {type(value).__name__} {_short(value)}")
    return KernelId(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_index(value: Any, label: str) -> int:
    """A device index: a non-negative int (numpy integers too, never bool)."""
    if isinstance(value, bool):
        raise TypeError(f"{label} must be an int, got bool {value!r}")
    try:
        i = operator.index(value)
    except TypeError:
        raise TypeError(f"{label} must be an int, got {type(value).__name__} {_short(value)}") from None
    if i < 0:
        raise ValueError(f"{label} must be >= 0, got {i}")
    return i


def check_count(value: Any, label: str, minimum: int = 0) -> int:
    """An int >= `minimum` (bytes, counts, sizes)."""
    if isinstance(value, bool):
        raise TypeError(f"{label} must be an int, got bool {value!r}")
    try:
        i = operator.index(value)
    except TypeError:
        raise TypeError(f"{label} must be an int, got {type(value).__name__} {_short(value)}") from None
    if i < minimum:
        raise ValueError(f"{label} must be >= {minimum}, got {i}")
    return i


def check_number(value: Any, label: str, *, positive: bool = False) -> float:
    """A finite float >= 0 (> 0 when `positive`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"{label} must be a number, got {type(value).__name__} {_short(value)}")
    f = float(value)
    if not math.isfinite(f) or f < 0 or (positive and f == 0):
        raise ValueError(f"{label} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return f
