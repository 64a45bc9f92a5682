"""KernelId, ringkernel's kernel identifier, and its conversion from a str."""
from __future__ import annotations

from typing import Any

from .._core.checks import short_repr, short_text

__all__ = ["KernelId", "as_kernel_id"]


class KernelId(str):
    """A kernel's id. A `str` subclass: every parameter that takes a KernelId
    also takes a plain `str`, and both hash and compare alike."""

    __slots__ = ()

    def __new__(cls, value: Any = "") -> "KernelId":
        if type(value) is cls:
            return value
        if not isinstance(value, str):
            raise TypeError(f"a kernel id must be a str, got {type(value).__name__} {short_repr(value)}")
        return super().__new__(cls, value)

    def as_str(self) -> str:
        """The id as a plain str (ringkernel's `as_str()`)."""
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"KernelId({short_text(self, 100)})"


def as_kernel_id(value: Any, label: str = "kernel_id") -> KernelId:
    """`value` as a KernelId; TypeError naming `label` and the value for a non-str."""
    if type(value) is KernelId:
        return value
    if not isinstance(value, str):
        raise TypeError(f"{label} must be a str or KernelId, got {type(value).__name__} {short_repr(value)}")
    return KernelId(value)
