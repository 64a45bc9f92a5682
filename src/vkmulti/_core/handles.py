"""Handle conversion: accept `vulkan` (cffi) handles or plain integers."""
from __future__ import annotations

from typing import Any

import vulkan as vk
from .checks import short_repr

_ffi = vk.ffi


def handle_int(value: Any, kind: str) -> int:
    """The integer value of a Vulkan handle of type `kind` (e.g. "VkDevice").

    Raises TypeError for anything that is not a cffi handle of that type or an
    int, and ValueError for a null handle.
    """
    if isinstance(value, bool):
        raise TypeError(f"{kind} handle expected, got bool {value!r}")
    if isinstance(value, int):
        if value <= 0 or value >= 1 << 64:
            raise ValueError(f"{kind} handle must be a non-null 64-bit value, got {short_repr(value)}")
        return value
    if isinstance(value, _ffi.CData):
        t = _ffi.typeof(value)
        expected = _ffi.typeof(kind)
        if t is not expected:
            raise TypeError(f"{kind} handle expected, got a cffi {t.cname}")
        n = int(_ffi.cast("uintptr_t", value))
        if n == 0:
            raise ValueError(f"{kind} handle is null")
        return n
    raise TypeError(f"{kind} handle expected (a `vulkan` package handle or an int), got {type(value).__name__}")


def to_cffi(value: Any, kind: str) -> Any:
    """The `vulkan` package handle for `value` (validated like handle_int)."""
    n = handle_int(value, kind)
    if isinstance(value, _ffi.CData):
        return value
    return _ffi.cast(kind, n)


def cstr(raw: Any) -> str:
    """A C char array from a cffi struct as str."""
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace")
    if isinstance(raw, str):
        return raw
    return _ffi.string(raw).decode("utf-8", "replace")


def handle_hex(value: Any) -> str:
    """A Vulkan handle (cffi or int) as 0x..., or None/'?' where it has none."""
    if value is None:
        return "None"
    try:
        return f"0x{int(_ffi.cast('uintptr_t', value)) if isinstance(value, _ffi.CData) else int(value):x}"
    except (TypeError, ValueError):
        return "?"
