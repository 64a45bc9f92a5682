"""compact_repr: a one-line repr under 200 characters for data classes and named tuples.

A class body says `__repr__ = compact_repr` (dataclasses keep a __repr__ the
class defines). Fields print as name=value like the generated repr, but bytes
as their length, arrays as shape and dtype, long strings and lists cut short,
enums by member name, nested data classes compacted too; fields that do not
fit are left out as "...". A hand-written repr shows its fields through
short_value (and a name through checks.short_text) to stay as short.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any

from .checks import short_repr

__all__ = ["compact_repr", "short_value", "LIMIT"]

LIMIT = 199


def short_value(v: Any, room: int = 60) -> str:
    """A short text for one field value, on one line (at most about `room` characters)."""
    text = _short_value(v, room)
    return text if "\n" not in text and "\r" not in text else f"<{type(v).__name__}>"


def _short_value(v: Any, room: int) -> str:
    if isinstance(v, enum.Enum):
        return f"{type(v).__name__}.{v.name}"
    if isinstance(v, (bytes, bytearray, memoryview)):
        return f"<{len(v)} bytes>"
    shape = getattr(v, "shape", None)
    if shape is not None and hasattr(v, "dtype"):
        return f"array({tuple(shape)}, {v.dtype})"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        text = short_repr(v, room + 1)
        return text if len(text) <= room else f"{type(v).__name__}(...)"
    if isinstance(v, str):
        text = short_repr(v, room + 1)
        if len(text) <= room:
            return text
        cut = repr(str.__getitem__(v, slice(0, room - 5)) + "...")
        return cut if len(cut) <= room else short_repr(v, room)   # (escapes made it long)
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple, set, frozenset)):
        items = list(v)
        shown = [short_value(x, 24) for x in items[:4]]
        more = f", ... ({len(items)})" if len(items) > 4 else ""
        inner = ", ".join(shown) + more
        if len(inner) > room:
            inner = f"{len(items)} items"
        return {list: f"[{inner}]", tuple: f"({inner}{',' if len(items) == 1 else ''})"}.get(type(v), f"{{{inner}}}")
    if isinstance(v, dict):
        text = short_repr(v, room + 1)
        return text if len(text) <= room else f"{{{len(v)} items}}"
    text = short_repr(v, room + 1)   # (bounded, and a caller's object whose repr raises is named by its type)
    return text if len(text) <= room else f"<{type(v).__name__}>"


def compact_repr(self: Any) -> str:
    """`Name(field=value, ...)` on one line, under 200 characters."""
    name = type(self).__name__
    if dataclasses.is_dataclass(self):
        items = [(f.name, getattr(self, f.name, None)) for f in dataclasses.fields(self) if f.repr]
    elif isinstance(self, tuple) and hasattr(self, "_fields"):   # a named tuple
        items = list(zip(self._fields, self))
    else:
        items = [(k, v) for k, v in vars(self).items() if not k.startswith("_")]
    out = name + "("
    for i, (key, value) in enumerate(items):
        part = f"{key}={short_value(value)}"
        sep = ", " if i else ""
        if len(out) + len(sep) + len(part) + 1 > LIMIT - 5:
            return out + sep + "...)"
        out += sep + part
    return out + ")"
